// AVX-512 row ops. One zmm accumulator holds the 16 canonical lanes; the tail (n % 16 elements)
// updates only its lanes through a mask, so each lane sees exactly the scalar sequence.

#include <immintrin.h>

#include "kernels/cpu/math_avx512.h"
#include "kernels/cpu/ops_internal.h"

namespace bitroll::kernels::internal {
namespace {

inline __mmask16 TailMask(int64_t rem) {
  return static_cast<__mmask16>((1u << rem) - 1u);
}

float SumSquares(const float* x, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    acc = _mm512_fmadd_ps(v, v, acc);
  }
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
    acc = _mm512_mask3_fmadd_ps(v, v, acc, m);
  }
  return ReduceSum16(acc);
}

float MaxValue(const float* x, int64_t n) {
  __m512 acc = _mm512_set1_ps(-__builtin_inff());
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) acc = _mm512_max_ps(_mm512_loadu_ps(x + i), acc);  // MaxKeep
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    acc = _mm512_mask_max_ps(acc, m, _mm512_maskz_loadu_ps(m, x + i), acc);
  }
  return ReduceMax16(acc);
}

float SumExpShifted(const float* x, int64_t n, float shift) {
  const __m512 sh = _mm512_set1_ps(shift);
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc = _mm512_add_ps(acc, Exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), sh)));
  }
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    const __m512 e = Exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), sh));
    acc = _mm512_mask_add_ps(acc, m, acc, e);
  }
  return ReduceSum16(acc);
}

void SubSub(const float* x, int64_t n, float a, float b, float* out) {
  const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? static_cast<__mmask16>(0xFFFF) : TailMask(n - i);
    const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
    _mm512_mask_storeu_ps(out + i, m, _mm512_sub_ps(_mm512_sub_ps(v, va), vb));
  }
}

void ScaleMul(const float* x, const float* weight, int64_t n, float inv, float* out) {
  const __m512 vi = _mm512_set1_ps(inv);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? static_cast<__mmask16>(0xFFFF) : TailMask(n - i);
    const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
    const __m512 w = _mm512_maskz_loadu_ps(m, weight + i);
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(w, _mm512_mul_ps(vi, v)));
  }
}

void SwiGlu(const float* gate, const float* up, int64_t n, float* out) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 sign = _mm512_set1_ps(-0.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? static_cast<__mmask16>(0xFFFF) : TailMask(n - i);
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
    const __m512 u = _mm512_maskz_loadu_ps(m, up + i);
    const __m512 e = Exp16(_mm512_xor_ps(g, sign));  // Exp(-g)
    const __m512 sig = _mm512_div_ps(one, _mm512_add_ps(one, e));
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(_mm512_mul_ps(g, sig), u));
  }
}

void Add(float* acc, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? static_cast<__mmask16>(0xFFFF) : TailMask(n - i);
    const __m512 a = _mm512_maskz_loadu_ps(m, acc + i);
    _mm512_mask_storeu_ps(acc + i, m, _mm512_add_ps(a, _mm512_maskz_loadu_ps(m, x + i)));
  }
}

// out0 = x0*c - x1*s; out1 = x0*s + x1*c on vectors of 16 pairs (half-split layout).
void RopeHalfSplit(float* v, int64_t half, const float* cos, const float* sin) {
  for (int64_t i = 0; i < half; i += 16) {
    const __mmask16 m = half - i >= 16 ? static_cast<__mmask16>(0xFFFF) : TailMask(half - i);
    const __m512 x0 = _mm512_maskz_loadu_ps(m, v + i);
    const __m512 x1 = _mm512_maskz_loadu_ps(m, v + half + i);
    const __m512 c = _mm512_maskz_loadu_ps(m, cos + i);
    const __m512 s = _mm512_maskz_loadu_ps(m, sin + i);
    _mm512_mask_storeu_ps(v + i, m, _mm512_sub_ps(_mm512_mul_ps(x0, c), _mm512_mul_ps(x1, s)));
    _mm512_mask_storeu_ps(v + half + i, m,
                          _mm512_add_ps(_mm512_mul_ps(x0, s), _mm512_mul_ps(x1, c)));
  }
}

// Interleaved layout: 8 pairs per zmm. A = x * c_dup = [x0 c, x1 c], B = swap(x) * s_dup =
// [x1 s, x0 s]; even lanes A - B = x0 c - x1 s, odd lanes A + B = x1 c + x0 s (IEEE addition is
// commutative, so this equals x0 s + x1 c).
void RopeInterleaved(float* v, int64_t half, const float* cos, const float* sin) {
  const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  for (int64_t i = 0; i < half; i += 8) {
    const int64_t pairs = half - i >= 8 ? 8 : half - i;
    const __mmask8 m8 = static_cast<__mmask8>((1u << pairs) - 1u);
    const __mmask16 m16 = TailMask(2 * pairs);
    const __m512 x = _mm512_maskz_loadu_ps(m16, v + 2 * i);
    const __m512 c =
        _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_maskz_loadu_ps(m8, cos + i)));
    const __m512 s =
        _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_maskz_loadu_ps(m8, sin + i)));
    const __m512 a = _mm512_mul_ps(x, c);
    const __m512 b = _mm512_mul_ps(_mm512_permute_ps(x, 0xB1), s);
    const __m512 r = _mm512_mask_sub_ps(_mm512_add_ps(a, b), 0x5555, a, b);
    _mm512_mask_storeu_ps(v + 2 * i, m16, r);
  }
}

void Rope(float* x, int64_t n_heads, int64_t head_dim, const float* cos, const float* sin,
          RopeLayout layout) {
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    if (layout == RopeLayout::kInterleaved) {
      RopeInterleaved(x + h * head_dim, half, cos, sin);
    } else {
      RopeHalfSplit(x + h * head_dim, half, cos, sin);
    }
  }
}

}  // namespace

const OpsTable kOpsAvx512 = {SumSquares, MaxValue, SumExpShifted, SubSub,
                             ScaleMul,   SwiGlu,   Add,           Rope};

}  // namespace bitroll::kernels::internal
