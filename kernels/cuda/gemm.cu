// Launchers of the bf16 GEMM (gemm.h): parameter checks, tile choice, and the split-K negative
// control's reduction.
#include <array>
#include <atomic>

#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/gemm.h"

namespace bitroll::kernels::cuda {

namespace {

// The compiled configurations. Every one gives the same bits (gemm.cuh); they differ in speed.
using Large = GemmShape<128, 128, 2, 4, 3>;  // 8 warps, 64 x 32 per warp
using Small = GemmShape<64, 64, 2, 2, 3>;    // 4 warps, 32 x 32 per warp

template <int BM, int BN, int WM, int WN, int STAGES>
cudaError_t Launch(const GemmKernelParams& kp, int splits, cudaStream_t stream) {
  using S = GemmShape<BM, BN, WM, WN, STAGES>;
  auto* kernel = &GemmBf16Kernel<BM, BN, WM, WN, STAGES>;
  // The shared-memory opt-in holds per device: set once per device and configuration, not on every
  // launch (a host call inside every timed GEMM otherwise).
  static std::array<std::atomic<bool>, 64> opted_in{};
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const bool cached = device >= 0 && device < 64;
  if (!cached || !opted_in[device].load(std::memory_order_acquire)) {
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmemBytes);
    if (err != cudaSuccess) return err;
    if (cached) opted_in[device].store(true, std::memory_order_release);
  }
  const dim3 grid((kp.n + BN - 1) / BN, (kp.m + BM - 1) / BM, splits);
  kernel<<<grid, S::kThreads, S::kSmemBytes, stream>>>(kp);
  return cudaGetLastError();
}

cudaError_t LaunchConfig(int id, const GemmKernelParams& kp, int splits, cudaStream_t stream) {
  switch (id) {
    case 0:
      return Launch<128, 128, 2, 4, 3>(kp, splits, stream);
    case 1:
      return Launch<64, 64, 2, 2, 3>(kp, splits, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

GemmKernelParams KernelParams(const CudaGemmParams& p) {
  GemmKernelParams kp;
  kp.x = p.x;
  kp.w = p.w;
  kp.y = p.y;
  kp.m = static_cast<int>(p.m);
  kp.n = static_cast<int>(p.n);
  kp.k = static_cast<int>(p.k);
  kp.ldx = p.ldx;
  kp.ldy = p.ldy;
  kp.out_bf16 = p.out == GemmOut::kBF16 ? 1 : 0;
  kp.k_split_len = kp.k;
  kp.y_split_stride = 0;
  return kp;
}

// Negative-control reduction: y[i] = ((ws[0][i] + ws[1][i]) + ws[2][i]) + ... in split order.
__global__ void GemmSplitKSumKernel(const float* ws, int splits, int m, int n, void* y, int64_t ldy,
                                    int out_bf16) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t total = static_cast<int64_t>(m) * n;
  if (i >= total) return;
  const int64_t row = i / n;
  const int64_t col = i % n;
  float s = ws[i];
  for (int z = 1; z < splits; ++z) s = __fadd_rn(s, ws[z * total + i]);
  if (out_bf16) {
    static_cast<uint16_t*>(y)[row * ldy + col] = ToBf16Bits(s);
  } else {
    static_cast<float*>(y)[row * ldy + col] = s;
  }
}

}  // namespace

GemmTileConfig CudaGemmConfig(int id) {
  if (id == 0) {
    return {0, 128, 128, kGemmBK, 2, 4, 3, static_cast<size_t>(Large::kSmemBytes)};
  }
  return {1, 64, 64, kGemmBK, 2, 2, 3, static_cast<size_t>(Small::kSmemBytes)};
}

// Wide outputs (LM head, MLP up/gate of large models) take the 128 x 128 tile; narrower ones the
// 64 x 64 tile, so that moderate M still fills the GPU. A function of (n, k) only.
GemmTileConfig CudaGemmTileConfigFor(int64_t n, int64_t k) {
  (void)k;
  return CudaGemmConfig(n >= 12288 ? 0 : 1);
}

cudaError_t CheckCudaGemmParams(const CudaGemmParams& p) {
  if (p.m < 0 || p.m >= (int64_t{1} << 21)) return cudaErrorInvalidValue;
  if (p.n < 1 || p.n >= (int64_t{1} << 30)) return cudaErrorInvalidValue;
  if (p.k < 8 || p.k % 8 != 0 || p.k >= (int64_t{1} << 30)) return cudaErrorInvalidValue;
  if (p.out != GemmOut::kF32 && p.out != GemmOut::kBF16) return cudaErrorInvalidValue;
  if (p.w == nullptr || reinterpret_cast<uintptr_t>(p.w) % 16 != 0) return cudaErrorInvalidValue;
  if (p.m == 0) return cudaSuccess;
  if (p.x == nullptr || p.y == nullptr) return cudaErrorInvalidValue;
  if (reinterpret_cast<uintptr_t>(p.x) % 16 != 0) return cudaErrorInvalidValue;
  if (p.ldx < p.k || p.ldx % 8 != 0 || p.ldy < p.n) return cudaErrorInvalidValue;
  const uintptr_t y_align = p.out == GemmOut::kF32 ? 4 : 2;
  if (reinterpret_cast<uintptr_t>(p.y) % y_align != 0) return cudaErrorInvalidValue;
  return cudaSuccess;
}

cudaError_t CudaGemmWithConfig(const CudaGemmParams& p, int config_id, cudaStream_t stream) {
  const cudaError_t err = CheckCudaGemmParams(p);
  if (err != cudaSuccess) return err;
  if (config_id < 0 || config_id >= kGemmNumConfigs) return cudaErrorInvalidValue;
  if (p.m == 0) return cudaSuccess;
  return LaunchConfig(config_id, KernelParams(p), 1, stream);
}

cudaError_t CudaGemm(const CudaGemmParams& p, cudaStream_t stream) {
  return CudaGemmWithConfig(p, CudaGemmTileConfigFor(p.n, p.k).id, stream);
}

int CudaGemmSplitKCount(int64_t m) {
  return m <= 32 ? 4 : (m <= 128 ? 2 : 1);
}

size_t CudaGemmSplitKWorkspaceBytes(int64_t m, int64_t n) {
  return static_cast<size_t>(CudaGemmSplitKCount(m)) * static_cast<size_t>(m) *
         static_cast<size_t>(n) * sizeof(float);
}

cudaError_t CudaGemmSplitKByM(const CudaGemmParams& p, float* workspace, size_t workspace_bytes,
                              cudaStream_t stream) {
  cudaError_t err = CheckCudaGemmParams(p);
  if (err != cudaSuccess) return err;
  if (p.m == 0) return cudaSuccess;
  if (workspace == nullptr || workspace_bytes < CudaGemmSplitKWorkspaceBytes(p.m, p.n)) {
    return cudaErrorInvalidValue;
  }
  const int splits = CudaGemmSplitKCount(p.m);
  GemmKernelParams kp = KernelParams(p);
  const int per = static_cast<int>((p.k + splits - 1) / splits);
  kp.k_split_len = (per + kGemmBK - 1) / kGemmBK * kGemmBK;
  const int used = static_cast<int>((p.k + kp.k_split_len - 1) / kp.k_split_len);
  kp.y = workspace;
  kp.ldy = p.n;
  kp.out_bf16 = 0;
  kp.y_split_stride = p.m * p.n;
  err = LaunchConfig(CudaGemmTileConfigFor(p.n, p.k).id, kp, used, stream);
  if (err != cudaSuccess) return err;
  const int64_t total = p.m * p.n;
  const int threads = 256;
  GemmSplitKSumKernel<<<static_cast<unsigned>((total + threads - 1) / threads), threads, 0,
                        stream>>>(workspace, used, kp.m, kp.n, p.y, p.ldy,
                                  p.out == GemmOut::kBF16 ? 1 : 0);
  return cudaGetLastError();
}

}  // namespace bitroll::kernels::cuda
