// AVX-512 twins of math.h (header-only). Include ONLY from sources compiled with
// bitroll_isa_sources(AVX512 ...), and call only when IsaSupported(Isa::kAvx512).
//
// deterministic: every lane equals the scalar function of math.h bit for bit (same operations in
// the same order, same constants; tested with memcmp in math_test.cc).
#pragma once

// GCC 12 emits false -Wuninitialized/-Wmaybe-uninitialized warnings from inside the AVX-512
// intrinsic headers (their `__Y = __Y` placeholders, GCC bug 105593) wherever they are inlined, so
// they are silenced for every file that includes this header.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/math.h"

namespace bitroll::kernels {

// 16 lanes of Exp(x); the same sequence as Exp() in math.h.
inline __m512 Exp16(__m512 x) {
  using namespace exp_detail;
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(kLog2e));
  const __m512 kd = _mm512_add_ps(t, _mm512_set1_ps(kRoundMagic));
  const __m512 n = _mm512_sub_ps(kd, _mm512_set1_ps(kRoundMagic));
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-kLn2Hi), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(-kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kC7);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kC6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kC5));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kC4));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kC3));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kC2));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  const __m512i bias = _mm512_set1_epi32(static_cast<int32_t>(127u - kRoundMagicBits));
  const __m512i scale = _mm512_slli_epi32(_mm512_add_epi32(_mm512_castps_si512(kd), bias), 23);
  __m512 result = _mm512_mul_ps(p, _mm512_castsi512_ps(scale));
  const __mmask16 under = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kMinX), _CMP_LT_OQ);
  const __mmask16 over = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kMaxX), _CMP_GT_OQ);
  result = _mm512_mask_blend_ps(under, result, _mm512_setzero_ps());
  result = _mm512_mask_blend_ps(over, result, _mm512_set1_ps(__builtin_inff()));
  return result;
}

// The canonical tree of math.h's ReduceSum16 on the 16 lanes of v.
inline float ReduceSum16(__m512 v) {
  const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

// The canonical tree of math.h's ReduceMax16 (max(hi, lo) == MaxKeep(lo, hi) on x86).
inline float ReduceMax16(__m512 v) {
  const __m256 s8 = _mm256_max_ps(_mm512_extractf32x8_ps(v, 1), _mm512_castps512_ps256(v));
  __m128 s = _mm_max_ps(_mm256_extractf128_ps(s8, 1), _mm256_castps256_ps128(s8));
  s = _mm_max_ps(_mm_movehl_ps(s, s), s);
  s = _mm_max_ss(_mm_shuffle_ps(s, s, 1), s);
  return _mm_cvtss_f32(s);
}

// Loads 16 bf16 values and widens them exactly to fp32.
inline __m512 LoadBf16x16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

}  // namespace bitroll::kernels
