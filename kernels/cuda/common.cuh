// Device-side building blocks shared by every CUDA kernel of bitroll (header-only, nvcc only).
//
// deterministic: every floating-point operation in kernels/cuda is written with an explicit
// round-to-nearest intrinsic (__fmaf_rn, __fmul_rn, __fadd_rn, __fsub_rn, __fdiv_rn, __fsqrt_rn,
// and the fp64 __dmul_rn / __dadd_rn / __ddiv_rn), so nvcc can never contract a multiply and an add
// into an FMA behind our back (the intrinsics are exempt from contraction). The library is also
// built with -fmad=false (kernels/cuda.cmake) as a second guard. Tensor-core mma instructions are
// the only other arithmetic; their order is documented in gemm.cuh.
//
// Exp and Log are the SAME operation sequences as kernels/cpu/math.h (Exp, Log), so they give the
// same bits as the CPU versions for every input.
#pragma once

#include <cstdint>

namespace bitroll::kernels::cuda {

// The canonical max step of kernels/cpu/math.h: keeps `acc` unless `x` is strictly greater.
__device__ __forceinline__ float MaxKeep(float acc, float x) {
  return x > acc ? x : acc;
}

// e^x, bit-identical to kernels/cpu/math.h Exp (same constants, same operation sequence).
__device__ __forceinline__ float DevExp(float x) {
  if (x < -87.0f) return 0.0f;
  if (x > 88.0f) return __int_as_float(0x7F800000);
  const float t = __fmul_rn(x, 1.44269504088896341f);
  const float kd = __fadd_rn(t, 12582912.0f);
  const float n = __fsub_rn(kd, 12582912.0f);
  float r = __fmaf_rn(n, -0.693359375f, x);
  r = __fmaf_rn(n, 2.12194440e-4f, r);  // -kLn2Lo
  float p = 1.9875691500e-4f;
  p = __fmaf_rn(p, r, 1.3981999507e-3f);
  p = __fmaf_rn(p, r, 8.3334519073e-3f);
  p = __fmaf_rn(p, r, 4.1665795894e-2f);
  p = __fmaf_rn(p, r, 1.6666665459e-1f);
  p = __fmaf_rn(p, r, 5.0000001201e-1f);
  p = __fmaf_rn(p, r, 1.0f);
  p = __fmaf_rn(p, r, 1.0f);
  const uint32_t scale_bits = (static_cast<uint32_t>(__float_as_int(kd)) - 0x4B400000u + 127u)
                              << 23;
  return __fmul_rn(p, __int_as_float(static_cast<int>(scale_bits)));
}

// Natural log, bit-identical to kernels/cpu/math.h Log.
__device__ __forceinline__ float DevLog(float x) {
  if (!(x > 0.0f)) {
    if (x == 0.0f) return __int_as_float(static_cast<int>(0xFF800000u));
    return __int_as_float(0x7FC00000);
  }
  if (x == __int_as_float(0x7F800000)) return x;
  uint32_t bits = static_cast<uint32_t>(__float_as_int(x));
  int e = 0;
  if (bits < 0x00800000u) {
    bits = static_cast<uint32_t>(__float_as_int(__fmul_rn(x, 8388608.0f)));
    e = -23;
  }
  e += static_cast<int>(bits >> 23) - 126;
  const float m = __int_as_float(static_cast<int>((bits & 0x007FFFFFu) | 0x3F000000u));
  float f;
  if (m < 0.707106781186547524f) {
    e -= 1;
    f = __fsub_rn(__fadd_rn(m, m), 1.0f);
  } else {
    f = __fsub_rn(m, 1.0f);
  }
  const float z = __fmul_rn(f, f);
  float y = 7.0376836292e-2f;
  y = __fmaf_rn(y, f, -1.1514610310e-1f);
  y = __fmaf_rn(y, f, 1.1676998740e-1f);
  y = __fmaf_rn(y, f, -1.2420140846e-1f);
  y = __fmaf_rn(y, f, 1.4249322787e-1f);
  y = __fmaf_rn(y, f, -1.6668057665e-1f);
  y = __fmaf_rn(y, f, 2.0000714765e-1f);
  y = __fmaf_rn(y, f, -2.4999993993e-1f);
  y = __fmaf_rn(y, f, 3.3333331174e-1f);
  y = __fmul_rn(__fmul_rn(y, f), z);
  const float fe = static_cast<float>(e);
  y = __fmaf_rn(fe, -2.12194440e-4f, y);
  y = __fmaf_rn(z, -0.5f, y);
  float result = __fadd_rn(f, y);
  result = __fmaf_rn(fe, 0.693359375f, result);
  return result;
}

// bf16 bits -> fp32 (exact) and fp32 -> bf16 bits (round to nearest even, NaN kept quiet): the
// same functions as kernels/cpu/math.h Bf16ToF32 / F32ToBf16.
__device__ __forceinline__ float Bf16Bits(uint16_t h) {
  return __int_as_float(static_cast<int>(static_cast<uint32_t>(h) << 16));
}
__device__ __forceinline__ uint16_t ToBf16Bits(float f) {
  const uint32_t bits = static_cast<uint32_t>(__float_as_int(f));
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  const uint32_t rounded = bits + 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

// A fixed-order CTA sum of one value per thread (kThreads a power of two, <= 1024): the pairwise
// tree  for w = kThreads/2 .. 1: s[t] = s[t] + s[t + w] (t < w); the result is s[0], returned to
// every thread. The order depends only on kThreads. `scratch` holds kThreads floats. Contains
// __syncthreads: every thread of the CTA must call it.
template <int kThreads>
__device__ __forceinline__ float CtaTreeSum(float v, float* scratch) {
  const int t = threadIdx.x;
  scratch[t] = v;
  __syncthreads();
#pragma unroll
  for (int w = kThreads / 2; w >= 1; w /= 2) {
    if (t < w) scratch[t] = __fadd_rn(scratch[t], scratch[t + w]);
    __syncthreads();
  }
  const float r = scratch[0];
  __syncthreads();
  return r;
}

// The same tree with MaxKeep (exact; the tree only fixes which of +0/-0 wins).
template <int kThreads>
__device__ __forceinline__ float CtaTreeMax(float v, float* scratch) {
  const int t = threadIdx.x;
  scratch[t] = v;
  __syncthreads();
#pragma unroll
  for (int w = kThreads / 2; w >= 1; w /= 2) {
    if (t < w) scratch[t] = MaxKeep(scratch[t], scratch[t + w]);
    __syncthreads();
  }
  const float r = scratch[0];
  __syncthreads();
  return r;
}

}  // namespace bitroll::kernels::cuda
