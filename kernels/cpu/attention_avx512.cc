// Attention chunk partial, AVX-512: the 16 keys of a chunk are the 16 lanes of one register.
// deterministic: same operations as ChunkPartialScalar, lane j = key j; value accumulation is a
// per-d fma chain over j in order.
#include <immintrin.h>

#include "kernels/cpu/attention_internal.h"
#include "kernels/cpu/math_avx512.h"

namespace bitroll::kernels::internal {

static_assert(kAttentionChunk == 16, "the AVX-512 attention kernel holds one chunk per register");

void ChunkPartialAvx512(const AttentionParams& p, const float* q, int32_t kvh,
                        const int32_t* blocks, int32_t position, int32_t chunk,
                        AttentionPartial* out) {
  const ChunkView c = ViewChunk(p, kvh, blocks, position, chunk);
  const int32_t hd = p.head_dim;
  const __mmask16 valid = static_cast<__mmask16>((1u << c.n_valid) - 1u);
  __m512 acc = _mm512_setzero_ps();
  for (int32_t d = 0; d < hd; ++d) {
    acc = _mm512_fmadd_ps(_mm512_set1_ps(q[d]), _mm512_loadu_ps(c.k + d * p.block_size), acc);
  }
  __m512 s = _mm512_mul_ps(acc, _mm512_set1_ps(p.scale));
  s = _mm512_mask_mov_ps(_mm512_set1_ps(-__builtin_inff()), valid, s);
  const float m = ReduceMax16(s);
  const __m512 e = _mm512_maskz_mov_ps(valid, Exp16(_mm512_sub_ps(s, _mm512_set1_ps(m))));
  alignas(64) float pj[16];
  _mm512_store_ps(pj, e);
  out->m = m;
  out->l = ReduceSum16(e);
  for (int32_t d0 = 0; d0 < hd; d0 += 16) {
    const int32_t left = hd - d0;
    const __mmask16 dm =
        left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1u);
    __m512 o = _mm512_setzero_ps();
    const float* v = c.v + d0;
    for (int32_t j = 0; j < c.n_valid; ++j) {
      o = _mm512_fmadd_ps(_mm512_set1_ps(pj[j]), _mm512_maskz_loadu_ps(dm, v + j * hd), o);
    }
    _mm512_mask_storeu_ps(out->o + d0, dm, o);
  }
}

}  // namespace bitroll::kernels::internal
