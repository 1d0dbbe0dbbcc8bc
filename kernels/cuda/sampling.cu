// Launchers of the GPU sampler and the Philox test hook (sampling.h).
#include "kernels/cuda/sampling.cuh"

namespace bitroll::kernels::cuda {

namespace {

constexpr int kSampleThreads = 256;

__global__ void PhiloxNoiseKernel(const CudaPhiloxQuery* q, int64_t n, double* uniform,
                                  double* gumbel) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const CudaPhiloxQuery c = q[i];
  uniform[i] = DevUniformOpen(c.seed, c.sample_index, c.position, c.token);
  gumbel[i] = DevGumbelNoise(c.seed, c.sample_index, c.position, c.token);
}

}  // namespace

bool CudaSamplingSupported(int32_t top_k, float top_p, float min_p) {
  return top_k <= 0 && top_p >= 1.0f && min_p <= 0.0f;
}

cudaError_t CudaSample(const float* logits, int64_t rows, int32_t vocab,
                       const CudaSampleRow* rows_params, int32_t* tokens, float* logprobs,
                       cudaStream_t stream) {
  if (rows < 0 || rows > 2147483647 || vocab < 1) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if (logits == nullptr || rows_params == nullptr || tokens == nullptr || logprobs == nullptr) {
    return cudaErrorInvalidValue;
  }
  SampleKernelParams p{logits, rows_params, tokens, logprobs, vocab};
  SampleKernel<kSampleThreads><<<static_cast<unsigned>(rows), kSampleThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t CudaPhiloxNoise(const CudaPhiloxQuery* queries, int64_t n, double* uniform,
                            double* gumbel, cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (queries == nullptr || uniform == nullptr || gumbel == nullptr) return cudaErrorInvalidValue;
  const int threads = 256;
  const int64_t blocks = (n + threads - 1) / threads;
  if (blocks > 2147483647) return cudaErrorInvalidValue;
  PhiloxNoiseKernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(queries, n, uniform,
                                                                           gumbel);
  return cudaGetLastError();
}

}  // namespace bitroll::kernels::cuda
