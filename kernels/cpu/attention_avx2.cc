// Attention chunk partial, AVX2: keys 0-7 and 8-15 of a chunk in two registers.
// deterministic: same operations as ChunkPartialScalar, lane j = key j; value accumulation is a
// per-d fma chain over j in order.
#include <immintrin.h>

#include "kernels/cpu/attention_internal.h"
#include "kernels/cpu/math_avx2.h"

namespace bitroll::kernels::internal {

static_assert(kAttentionChunk == 16, "the AVX2 attention kernel holds one chunk in two registers");

namespace {
// Lane mask: all ones for lanes < n (n may exceed 8 or be negative).
inline __m256 LaneMask(int32_t n) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx));
}
}  // namespace

void ChunkPartialAvx2(const AttentionParams& p, const float* q, int32_t kvh, const int32_t* blocks,
                      int32_t position, int32_t chunk, AttentionPartial* out) {
  const ChunkView c = ViewChunk(p, kvh, blocks, position, chunk);
  const int32_t hd = p.head_dim;
  const __m256 valid_lo = LaneMask(c.n_valid);
  const __m256 valid_hi = LaneMask(c.n_valid - 8);
  __m256 lo = _mm256_setzero_ps();
  __m256 hi = _mm256_setzero_ps();
  for (int32_t d = 0; d < hd; ++d) {
    const __m256 qd = _mm256_set1_ps(q[d]);
    const float* k = c.k + d * p.block_size;
    lo = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k), lo);
    hi = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k + 8), hi);
  }
  const __m256 scale = _mm256_set1_ps(p.scale);
  const __m256 ninf = _mm256_set1_ps(-__builtin_inff());
  lo = _mm256_blendv_ps(ninf, _mm256_mul_ps(lo, scale), valid_lo);
  hi = _mm256_blendv_ps(ninf, _mm256_mul_ps(hi, scale), valid_hi);
  const float m = ReduceMax16(lo, hi);
  const __m256 mv = _mm256_set1_ps(m);
  const __m256 e_lo = _mm256_and_ps(Exp8(_mm256_sub_ps(lo, mv)), valid_lo);
  const __m256 e_hi = _mm256_and_ps(Exp8(_mm256_sub_ps(hi, mv)), valid_hi);
  alignas(32) float pj[16];
  _mm256_store_ps(pj, e_lo);
  _mm256_store_ps(pj + 8, e_hi);
  out->m = m;
  out->l = ReduceSum16(e_lo, e_hi);
  int32_t d0 = 0;
  for (; d0 + 8 <= hd; d0 += 8) {
    __m256 o = _mm256_setzero_ps();
    const float* v = c.v + d0;
    for (int32_t j = 0; j < c.n_valid; ++j) {
      o = _mm256_fmadd_ps(_mm256_set1_ps(pj[j]), _mm256_loadu_ps(v + j * hd), o);
    }
    _mm256_storeu_ps(out->o + d0, o);
  }
  for (; d0 < hd; ++d0) {  // head_dim not a multiple of 8: the same chain, one lane at a time
    __m128 o = _mm_setzero_ps();
    for (int32_t j = 0; j < c.n_valid; ++j) {
      o = _mm_fmadd_ss(_mm_set_ss(pj[j]), _mm_load_ss(c.v + j * hd + d0), o);
    }
    out->o[d0] = _mm_cvtss_f32(o);
  }
}

}  // namespace bitroll::kernels::internal
