// The sampling kernel (contract in sampling.h).
#pragma once

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/philox.cuh"
#include "kernels/cuda/sampling.h"

namespace bitroll::kernels::cuda {

struct SampleKernelParams {
  const float* logits;
  const CudaSampleRow* rows;
  int32_t* tokens;
  float* logprobs;
  int32_t vocab;
};

namespace sample_detail {

// (score desc, id asc): a total order on non-NaN scores, so the CTA reduction is exact and its
// result independent of how ids are spread over threads. NaN never wins.
__device__ __forceinline__ bool Better(double s, int32_t id, double best, int32_t best_id) {
  return s > best || (s == best && id < best_id);
}

}  // namespace sample_detail

template <int kThreads>
__global__ void __launch_bounds__(kThreads) SampleKernel(SampleKernelParams p) {
  __shared__ float fscratch[kThreads];
  __shared__ double sscore[kThreads];
  __shared__ int32_t sid[kThreads];
  const int t = threadIdx.x;
  const int64_t row = blockIdx.x;
  const float* x = p.logits + row * p.vocab;
  const CudaSampleRow prm = p.rows[row];
  const float temp = prm.temperature;
  const float neg_inf = __int_as_float(static_cast<int>(0xFF800000u));
  const bool t_positive = temp > 0.0f;

  // Step 1: temperature; an overflowed scale samples the T -> 0 limit.
  bool greedy = !t_positive;
  {
    float mloc = neg_inf;
    if (!greedy) {
      for (int32_t i = t; i < p.vocab; i += kThreads) mloc = MaxKeep(mloc, __fdiv_rn(x[i], temp));
    }
    const float smax = CtaTreeMax<kThreads>(mloc, fscratch);
    if (!greedy && !isfinite(smax)) greedy = true;
  }

  // Step 6: argmax of the logits (greedy) or of scaled + Gumbel noise (fp64).
  double best = __longlong_as_double(static_cast<long long>(0xFFF0000000000000ull));
  int32_t best_id = 0x7FFFFFFF;
  for (int32_t i = t; i < p.vocab; i += kThreads) {
    double s;
    if (greedy) {
      s = static_cast<double>(x[i]);
    } else {
      s = __dadd_rn(static_cast<double>(__fdiv_rn(x[i], temp)),
                    DevGumbelNoise(prm.seed, prm.sample_index, prm.position, i));
    }
    if (sample_detail::Better(s, i, best, best_id)) {
      best = s;
      best_id = i;
    }
  }
  sscore[t] = best;
  sid[t] = best_id;
  __syncthreads();
  for (int w = kThreads / 2; w >= 1; w /= 2) {
    if (t < w && sample_detail::Better(sscore[t + w], sid[t + w], sscore[t], sid[t])) {
      sscore[t] = sscore[t + w];
      sid[t] = sid[t + w];
    }
    __syncthreads();
  }
  int32_t id = sid[0];
  if (id == 0x7FFFFFFF) id = 0;  // every score NaN: unspecified but in range

  // The logprob: log-softmax at id of logits (T == 0, or a scale that overflowed: scoring it would
  // give inf - inf = NaN) or of logits / T (as engine/sampler.h).
  const bool use_scaled = !greedy;
  float mloc = neg_inf;
  for (int32_t i = t; i < p.vocab; i += kThreads) {
    mloc = MaxKeep(mloc, use_scaled ? __fdiv_rn(x[i], temp) : x[i]);
  }
  const float m = CtaTreeMax<kThreads>(mloc, fscratch);
  float acc = 0.0f;
  for (int32_t i = t; i < p.vocab; i += kThreads) {
    const float v = use_scaled ? __fdiv_rn(x[i], temp) : x[i];
    acc = __fadd_rn(acc, DevExp(__fsub_rn(v, m)));
  }
  const float z = CtaTreeSum<kThreads>(acc, fscratch);
  if (t == 0) {
    const float v = use_scaled ? __fdiv_rn(x[id], temp) : x[id];
    p.tokens[row] = id;
    p.logprobs[row] = __fsub_rn(__fsub_rn(v, m), DevLog(z));
  }
}

}  // namespace bitroll::kernels::cuda
