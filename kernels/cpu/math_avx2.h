// AVX2 twins of math.h (header-only). Include ONLY from sources compiled with
// bitroll_isa_sources(AVX2 ...) or (AVX512 ...), and call only when IsaSupported(Isa::kAvx2).
//
// deterministic: every lane equals the scalar function of math.h bit for bit (same operations in
// the same order, same constants; tested with memcmp in math_test.cc).
//
// Lane-order convention: a 16-lane accumulator is held as two registers, lo = lanes 0-7 and
// hi = lanes 8-15.
#pragma once

// GCC 12 emits false -Wuninitialized/-Wmaybe-uninitialized warnings from inside the AVX/AVX-512
// intrinsic headers (their `__Y = __Y` placeholders, GCC bug 105593) wherever they are inlined, so
// they are silenced for every file that includes this header.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/math.h"

namespace bitroll::kernels {

// 8 lanes of Exp(x); the same sequence as Exp() in math.h.
inline __m256 Exp8(__m256 x) {
  using namespace exp_detail;
  const __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(kLog2e));
  const __m256 kd = _mm256_add_ps(t, _mm256_set1_ps(kRoundMagic));
  const __m256 n = _mm256_sub_ps(kd, _mm256_set1_ps(kRoundMagic));
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Hi), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kC7);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC5));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i bias = _mm256_set1_epi32(static_cast<int32_t>(127u - kRoundMagicBits));
  const __m256i scale = _mm256_slli_epi32(_mm256_add_epi32(_mm256_castps_si256(kd), bias), 23);
  __m256 result = _mm256_mul_ps(p, _mm256_castsi256_ps(scale));
  const __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(kMinX), _CMP_LT_OQ);
  const __m256 over = _mm256_cmp_ps(x, _mm256_set1_ps(kMaxX), _CMP_GT_OQ);
  result = _mm256_blendv_ps(result, _mm256_setzero_ps(), under);
  result = _mm256_blendv_ps(result, _mm256_set1_ps(__builtin_inff()), over);
  return result;
}

// The canonical tree of math.h's ReduceSum16 on lanes lo = 0-7, hi = 8-15.
inline float ReduceSum16(__m256 lo, __m256 hi) {
  const __m256 s8 = _mm256_add_ps(lo, hi);                                          // w = 8
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));  // w = 4
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));                                           // w = 2
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));                                       // w = 1
  return _mm_cvtss_f32(s);
}

// The canonical tree of math.h's ReduceMax16: lane[j] = MaxKeep(lane[j], lane[j + w]).
// x86 max(a, b) returns b unless a > b, i.e. max(hi, lo) == MaxKeep(lo, hi).
inline float ReduceMax16(__m256 lo, __m256 hi) {
  const __m256 s8 = _mm256_max_ps(hi, lo);
  __m128 s = _mm_max_ps(_mm256_extractf128_ps(s8, 1), _mm256_castps256_ps128(s8));
  s = _mm_max_ps(_mm_movehl_ps(s, s), s);
  s = _mm_max_ss(_mm_shuffle_ps(s, s, 1), s);
  return _mm_cvtss_f32(s);
}

// Loads 8 bf16 values and widens them exactly to fp32.
inline __m256 LoadBf16x8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

}  // namespace bitroll::kernels
