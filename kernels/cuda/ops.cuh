// Row-op kernels (see ops.h for the contract and the canonical orders).
#pragma once

#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace bitroll::kernels::cuda {

struct RmsNormParams {
  const float* x;
  const float* weight;
  float* out_f32;
  uint16_t* out_bf16;
  int64_t dim;
  float eps;
};

// One CTA per row; kThreads threads.
template <int kThreads>
__global__ void __launch_bounds__(kThreads) RmsNormKernel(RmsNormParams p) {
  __shared__ float scratch[kThreads];
  const int64_t row = blockIdx.x;
  const float* x = p.x + row * p.dim;
  float acc = 0.0f;
  for (int64_t i = threadIdx.x; i < p.dim; i += kThreads) acc = __fmaf_rn(x[i], x[i], acc);
  const float ss = CtaTreeSum<kThreads>(acc, scratch);
  const float inv =
      __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, static_cast<float>(p.dim)), p.eps)));
  for (int64_t i = threadIdx.x; i < p.dim; i += kThreads) {
    const float v = __fmul_rn(p.weight[i], __fmul_rn(inv, x[i]));
    if (p.out_f32 != nullptr) p.out_f32[row * p.dim + i] = v;
    if (p.out_bf16 != nullptr) p.out_bf16[row * p.dim + i] = ToBf16Bits(v);
  }
}

struct LogSoftmaxParams {
  const float* x;
  float* out;
  int64_t n;
};

template <int kThreads>
__global__ void __launch_bounds__(kThreads) LogSoftmaxKernel(LogSoftmaxParams p) {
  __shared__ float scratch[kThreads];
  const int64_t row = blockIdx.x;
  const float* x = p.x + row * p.n;
  float mx = __int_as_float(static_cast<int>(0xFF800000u));  // -inf
  for (int64_t i = threadIdx.x; i < p.n; i += kThreads) mx = MaxKeep(mx, x[i]);
  const float m = CtaTreeMax<kThreads>(mx, scratch);
  float acc = 0.0f;
  for (int64_t i = threadIdx.x; i < p.n; i += kThreads) {
    acc = __fadd_rn(acc, DevExp(__fsub_rn(x[i], m)));
  }
  const float log_z = DevLog(CtaTreeSum<kThreads>(acc, scratch));
  for (int64_t i = threadIdx.x; i < p.n; i += kThreads) {
    p.out[row * p.n + i] = __fsub_rn(__fsub_rn(x[i], m), log_z);
  }
}

struct RopeParams {
  float* x;
  const int32_t* positions;
  const float* cos_table;
  const float* sin_table;
  int64_t n_heads, head_dim, max_pos;
  int half_split;
};

// One thread per (token, head, pair); grid.y = token.
__global__ void RopeKernel(RopeParams p) {
  const int64_t half = p.head_dim / 2;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= p.n_heads * half) return;
  const int64_t token = blockIdx.y;
  const int32_t pos = p.positions[token];
  if (pos < 0 || pos >= p.max_pos) return;
  const int64_t h = idx / half;
  const int64_t i = idx % half;
  float* v = p.x + (token * p.n_heads + h) * p.head_dim;
  float* p0 = p.half_split ? v + i : v + 2 * i;
  float* p1 = p.half_split ? v + i + half : v + 2 * i + 1;
  const float x0 = *p0, x1 = *p1;
  const float c = p.cos_table[pos * half + i];
  const float s = p.sin_table[pos * half + i];
  *p0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
  *p1 = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

__global__ void SwiGluKernel(const float* gate, const float* up, int64_t n, float* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float g = gate[i];
  const float sig = __fdiv_rn(1.0f, __fadd_rn(1.0f, DevExp(-g)));
  out[i] = __fmul_rn(__fmul_rn(g, sig), up[i]);
}

}  // namespace bitroll::kernels::cuda
