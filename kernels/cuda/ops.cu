// Launchers of the row ops (ops.h).
#include "kernels/cuda/ops.cuh"
#include "kernels/cuda/ops.h"

namespace bitroll::kernels::cuda {

namespace {
constexpr int64_t kMaxGrid = 2147483647;
constexpr int64_t kMaxGridY = 65535;
}  // namespace

cudaError_t CudaRmsNorm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
                        float* out_f32, uint16_t* out_bf16, cudaStream_t stream) {
  if (rows < 0 || rows > kMaxGrid || dim < 1) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if (x == nullptr || weight == nullptr || (out_f32 == nullptr && out_bf16 == nullptr)) {
    return cudaErrorInvalidValue;
  }
  RmsNormParams p{x, weight, out_f32, out_bf16, dim, eps};
  RmsNormKernel<kOpsThreads><<<static_cast<unsigned>(rows), kOpsThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t CudaRope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim,
                     const int32_t* positions, const float* cos_table, const float* sin_table,
                     int64_t max_pos, bool half_split, cudaStream_t stream) {
  if (n_tokens < 0 || n_tokens > kMaxGridY || n_heads < 1 || head_dim < 2 || head_dim % 2 != 0 ||
      max_pos < 1) {
    return cudaErrorInvalidValue;
  }
  if (n_tokens == 0) return cudaSuccess;
  if (x == nullptr || positions == nullptr || cos_table == nullptr || sin_table == nullptr) {
    return cudaErrorInvalidValue;
  }
  RopeParams p{x, positions, cos_table, sin_table, n_heads, head_dim, max_pos, half_split ? 1 : 0};
  const int64_t pairs = n_heads * (head_dim / 2);
  const int threads = 128;
  const dim3 grid(static_cast<unsigned>((pairs + threads - 1) / threads),
                  static_cast<unsigned>(n_tokens));
  RopeKernel<<<grid, threads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t CudaSwiGlu(const float* gate, const float* up, int64_t n, float* out,
                       cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (gate == nullptr || up == nullptr || out == nullptr) return cudaErrorInvalidValue;
  const int threads = 256;
  const int64_t blocks = (n + threads - 1) / threads;
  if (blocks > kMaxGrid) return cudaErrorInvalidValue;
  SwiGluKernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(gate, up, n, out);
  return cudaGetLastError();
}

cudaError_t CudaLogSoftmax(const float* x, int64_t rows, int64_t n, float* out,
                           cudaStream_t stream) {
  if (rows < 0 || rows > kMaxGrid || n < 1) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if (x == nullptr || out == nullptr) return cudaErrorInvalidValue;
  LogSoftmaxParams p{x, out, n};
  LogSoftmaxKernel<kOpsThreads><<<static_cast<unsigned>(rows), kOpsThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace bitroll::kernels::cuda
