// AVX2 row ops. The 16 canonical lanes are two ymm registers (lo = lanes 0-7, hi = lanes 8-15);
// the tail updates only its lanes (blend), so each lane sees exactly the scalar sequence.
// Element-wise tails use the scalar formula (same IEEE operations, -ffp-contract=off).

#include <immintrin.h>

#include "kernels/cpu/math_avx2.h"
#include "kernels/cpu/ops_internal.h"

namespace bitroll::kernels::internal {
namespace {

// All-ones in lanes [0, valid) of an 8-lane register (valid may be <= 0 or >= 8).
inline __m256i LaneMask(int64_t valid) {
  const int v = valid <= 0 ? 0 : (valid >= 8 ? 8 : static_cast<int>(valid));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(v), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

float SumSquares(const float* x, int64_t n) {
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
    lo = _mm256_fmadd_ps(a, a, lo);
    hi = _mm256_fmadd_ps(b, b, hi);
  }
  if (i < n) {
    const __m256i m_lo = LaneMask(n - i), m_hi = LaneMask(n - i - 8);
    const __m256 a = _mm256_maskload_ps(x + i, m_lo), b = _mm256_maskload_ps(x + i + 8, m_hi);
    lo = _mm256_blendv_ps(lo, _mm256_fmadd_ps(a, a, lo), _mm256_castsi256_ps(m_lo));
    hi = _mm256_blendv_ps(hi, _mm256_fmadd_ps(b, b, hi), _mm256_castsi256_ps(m_hi));
  }
  return ReduceSum16(lo, hi);
}

float MaxValue(const float* x, int64_t n) {
  __m256 lo = _mm256_set1_ps(-__builtin_inff()), hi = lo;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    lo = _mm256_max_ps(_mm256_loadu_ps(x + i), lo);  // MaxKeep(lo, x)
    hi = _mm256_max_ps(_mm256_loadu_ps(x + i + 8), hi);
  }
  if (i < n) {
    const __m256i m_lo = LaneMask(n - i), m_hi = LaneMask(n - i - 8);
    const __m256 a = _mm256_maskload_ps(x + i, m_lo), b = _mm256_maskload_ps(x + i + 8, m_hi);
    lo = _mm256_blendv_ps(lo, _mm256_max_ps(a, lo), _mm256_castsi256_ps(m_lo));
    hi = _mm256_blendv_ps(hi, _mm256_max_ps(b, hi), _mm256_castsi256_ps(m_hi));
  }
  return ReduceMax16(lo, hi);
}

float SumExpShifted(const float* x, int64_t n, float shift) {
  const __m256 sh = _mm256_set1_ps(shift);
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    lo = _mm256_add_ps(lo, Exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), sh)));
    hi = _mm256_add_ps(hi, Exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8), sh)));
  }
  if (i < n) {
    const __m256i m_lo = LaneMask(n - i), m_hi = LaneMask(n - i - 8);
    const __m256 a = _mm256_maskload_ps(x + i, m_lo), b = _mm256_maskload_ps(x + i + 8, m_hi);
    const __m256 ea = Exp8(_mm256_sub_ps(a, sh)), eb = Exp8(_mm256_sub_ps(b, sh));
    lo = _mm256_blendv_ps(lo, _mm256_add_ps(lo, ea), _mm256_castsi256_ps(m_lo));
    hi = _mm256_blendv_ps(hi, _mm256_add_ps(hi, eb), _mm256_castsi256_ps(m_hi));
  }
  return ReduceSum16(lo, hi);
}

void SubSub(const float* x, int64_t n, float a, float b, float* out) {
  const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, _mm256_sub_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), va), vb));
  }
  for (; i < n; ++i) out[i] = (x[i] - a) - b;
}

void ScaleMul(const float* x, const float* weight, int64_t n, float inv, float* out) {
  const __m256 vi = _mm256_set1_ps(inv);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_mul_ps(vi, _mm256_loadu_ps(x + i));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(weight + i), v));
  }
  for (; i < n; ++i) out[i] = weight[i] * (inv * x[i]);
}

void SwiGlu(const float* gate, const float* up, int64_t n, float* out) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 sig = _mm256_div_ps(one, _mm256_add_ps(one, Exp8(_mm256_xor_ps(g, sign))));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(g, sig), _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) {
    const float g = gate[i];
    out[i] = (g * (1.0f / (1.0f + Exp(-g)))) * up[i];
  }
}

void Add(float* acc, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), _mm256_loadu_ps(x + i)));
  }
  for (; i < n; ++i) acc[i] = acc[i] + x[i];
}

void RopeHalfSplit(float* v, int64_t half, const float* cos, const float* sin) {
  int64_t i = 0;
  for (; i + 8 <= half; i += 8) {
    const __m256 x0 = _mm256_loadu_ps(v + i), x1 = _mm256_loadu_ps(v + half + i);
    const __m256 c = _mm256_loadu_ps(cos + i), s = _mm256_loadu_ps(sin + i);
    _mm256_storeu_ps(v + i, _mm256_sub_ps(_mm256_mul_ps(x0, c), _mm256_mul_ps(x1, s)));
    _mm256_storeu_ps(v + half + i, _mm256_add_ps(_mm256_mul_ps(x0, s), _mm256_mul_ps(x1, c)));
  }
  for (; i < half; ++i) {
    const float x0 = v[i], x1 = v[i + half], c = cos[i], s = sin[i];
    v[i] = x0 * c - x1 * s;
    v[i + half] = x0 * s + x1 * c;
  }
}

// 4 pairs per ymm; addsub gives even lanes A - B, odd lanes A + B (see ops_avx512.cc).
void RopeInterleaved(float* v, int64_t half, const float* cos, const float* sin) {
  const __m256i dup = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
  int64_t i = 0;
  for (; i + 4 <= half; i += 4) {
    const __m256 x = _mm256_loadu_ps(v + 2 * i);
    const __m256 c = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(cos + i)), dup);
    const __m256 s = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(sin + i)), dup);
    const __m256 a = _mm256_mul_ps(x, c);
    const __m256 b = _mm256_mul_ps(_mm256_permute_ps(x, 0xB1), s);
    _mm256_storeu_ps(v + 2 * i, _mm256_addsub_ps(a, b));
  }
  for (; i < half; ++i) {
    const float x0 = v[2 * i], x1 = v[2 * i + 1], c = cos[i], s = sin[i];
    v[2 * i] = x0 * c - x1 * s;
    v[2 * i + 1] = x0 * s + x1 * c;
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

const OpsTable kOpsAvx2 = {SumSquares, MaxValue, SumExpShifted, SubSub,
                           ScaleMul,   SwiGlu,   Add,           Rope};

}  // namespace bitroll::kernels::internal
