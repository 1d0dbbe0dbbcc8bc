// Token sampling on the GPU with the CPU sampler's semantics (engine/sampler.h), for the filters
// implemented so far: greedy (T == 0) and temperature. Public, C++-only launchers.
//
// Per row (one CTA per row):
//   T == 0 (or !(T > 0)), or logits / T overflowing: greedy = argmax of the logits, ties to the
//     lowest id; logprob = log-softmax of the logits at T == 1 (finite, never the NaN of inf - inf).
//   else: scaled[i] = logits[i] / T (one fp32 divide); token = argmax over i of
//     (double)scaled[i] + GumbelNoise(seed, sample_index, position, i), ties to the lowest id;
//     logprob = (scaled[id] - M) - Log(sum_i Exp(scaled[i] - M)), M = max scaled.
// The Philox stream and the fp64 Gumbel noise are bit-identical to kernels/cpu/philox.h, the
// division and the fp64 add are IEEE, and the argmax is exact, so the TOKEN equals the CPU
// sampler's for the same inputs. The logprob uses the GPU's fixed CTA reduction order
// (kernels/cuda/ops.h), so it agrees with the CPU within a few ulp, and is batch-invariant bitwise.
// top-k / top-p / min-p are not implemented on the GPU yet: callers must keep such requests on
// the CPU sampler (CudaSamplingSupported says which).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace bitroll::kernels::cuda {

struct CudaSampleRow {
  float temperature = 1.0f;
  uint32_t sample_index = 0;
  uint64_t seed = 0;
  int64_t position = 0;  // absolute position of the token being chosen
};

// True when (top_k, top_p, min_p) are all "off" (0, 1, 0): the GPU path gives the CPU's token.
bool CudaSamplingSupported(int32_t top_k, float top_p, float min_p);

// logits: device [rows][vocab]; rows_params: device [rows]; tokens / logprobs: device [rows].
// cudaErrorInvalidValue for rows < 0, vocab < 1 or null pointers (host-side check).
cudaError_t CudaSample(const float* logits, int64_t rows, int32_t vocab,
                       const CudaSampleRow* rows_params, int32_t* tokens, float* logprobs,
                       cudaStream_t stream);

// Test hook: for each query i (device arrays), uniform[i] = UniformOpen(...) and gumbel[i] =
// GumbelNoise(...) of kernels/cpu/philox.h, computed on the device.
struct CudaPhiloxQuery {
  uint64_t seed = 0;
  int64_t position = 0;
  uint32_t sample_index = 0;
  int32_t token = 0;
};
cudaError_t CudaPhiloxNoise(const CudaPhiloxQuery* queries, int64_t n, double* uniform,
                            double* gumbel, cudaStream_t stream);

}  // namespace bitroll::kernels::cuda
