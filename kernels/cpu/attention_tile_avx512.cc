// The AVX-512 prefill tile: up to 16 consecutive query rows of one sequence and head, one query
// per lane, walk their chunks together.
//
// deterministic: the canonical order of attention.h, lane i = query i, every step vertical:
//   s_j   = fma chain over d of q_i[d] * K[j][d] (register S[j], 16 of them), then * scale;
//           keys beyond a query's causal edge are -inf (the scalar code's mask);
//   m_c   = the ReduceMax16 tree over j on copies of S[j]: T[j] = max(T[j + w], T[j]) for
//           w = 8, 4, 2, 1, which is MaxKeep(T[j], T[j + w]) lane by lane;
//   p_j   = Exp16(s_j - m_c) where valid, 0 elsewhere; l_c = the ReduceSum16 tree over j;
//   o_c[d]= fma chain over the valid j in order, from 0 (masked fma: a lane past its edge keeps
//           its accumulator, as the scalar loop stops there);
//   merge = MergePartial's steps lane by lane (std::max emulated exactly, two Exp, the l and o
//           updates as separate multiplies and an add); the first chunk without sinks is copied,
//           not merged (the running state starts as chunk 0's partial); sinks start the state at
//           (m = sink, l = 1, o = 0);
//   out   = o[d] / l.
// Each lane therefore performs the scalar reference's operations on the same operands in the same
// order: a query's bits do not depend on which other queries share its tile (tested with memcmp
// against AttentionReference in attention_test.cc). Only the layout differs: the 16 scores of a
// key are one register instead of the 16 keys of a query.
#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/attention_internal.h"
#include "kernels/cpu/math_avx512.h"

namespace bitroll::kernels::internal {

static_assert(kAttentionChunk == 16 && kTileQueries == 16, "one chunk and one tile per register");

namespace {

// The tile's running state: m and l per lane, o transposed ([d][lane]).
struct TileState {
  __m512 m;
  __m512 l;
  alignas(64) float o[256][16];
};

// Scores of chunk `base` for the 16 lanes: S[j] lane i = s_j of query i (-inf where invalid).
inline void TileScores(const AttentionParams& p, const float (*qt)[16], const float* k,
                       const __mmask16* valid, __m512* s) {
  const int64_t bs = p.block_size;
#pragma GCC unroll 16
  for (int j = 0; j < 16; ++j) s[j] = _mm512_setzero_ps();
  for (int32_t d = 0; d < p.head_dim; ++d) {
    const __m512 qd = _mm512_load_ps(qt[d]);
    const float* kd = k + d * bs;
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) s[j] = _mm512_fmadd_ps(qd, _mm512_set1_ps(kd[j]), s[j]);
  }
  const __m512 scale = _mm512_set1_ps(p.scale);
  const __m512 ninf = _mm512_set1_ps(-__builtin_inff());
#pragma GCC unroll 16
  for (int j = 0; j < 16; ++j)
    s[j] = _mm512_mask_mov_ps(ninf, valid[j], _mm512_mul_ps(s[j], scale));
}

// The ReduceMax16 / ReduceSum16 tree over the 16 registers, lane by lane:
// t[j] = op(t[j], t[j + w]) for w = 8, 4, 2, 1.
template <typename Op>
inline __m512 Tree(const __m512* x, Op op) {
  __m512 t[16];
#pragma GCC unroll 16
  for (int j = 0; j < 16; ++j) t[j] = x[j];
#pragma GCC unroll 4
  for (int w = 8; w >= 1; w /= 2) {
#pragma GCC unroll 8
    for (int j = 0; j < w; ++j) t[j] = op(t[j], t[j + w]);
  }
  return t[0];
}

// MaxKeep(acc, x) = x > acc ? x : acc, which is the x86 max(x, acc).
inline __m512 MaxKeep16(__m512 acc, __m512 x) {
  return _mm512_max_ps(x, acc);
}
inline __m512 Add16(__m512 a, __m512 b) {
  return _mm512_add_ps(a, b);
}

// o_c[d0 .. d0 + NB) for the 16 lanes, then the state's o update on the lanes in `live`:
// copy (first chunk) or o * a + o_c * b. kMasked = false when every key of the chunk is valid in
// every live lane (the chunks below the diagonal): plain fmas, the same operations there.
template <int NB, bool kMasked>
inline void TileValues(int32_t hd, int32_t d0, const float* v, const __m512* pj,
                       const __mmask16* valid, __mmask16 live, bool copy, __m512 a, __m512 b,
                       TileState* st) {
  __m512 acc[NB];
#pragma GCC unroll 8
  for (int x = 0; x < NB; ++x) acc[x] = _mm512_setzero_ps();
#pragma GCC unroll 16
  for (int j = 0; j < 16; ++j) {
    const float* vj = v + static_cast<int64_t>(j) * hd + d0;
#pragma GCC unroll 8
    for (int x = 0; x < NB; ++x) {
      if constexpr (kMasked) {
        acc[x] = _mm512_mask3_fmadd_ps(pj[j], _mm512_set1_ps(vj[x]), acc[x], valid[j]);
      } else {
        acc[x] = _mm512_fmadd_ps(pj[j], _mm512_set1_ps(vj[x]), acc[x]);
      }
    }
  }
#pragma GCC unroll 8
  for (int x = 0; x < NB; ++x) {
    float* o = st->o[d0 + x];
    const __m512 old = _mm512_load_ps(o);
    __m512 merged = acc[x];
    if (!copy) merged = _mm512_add_ps(_mm512_mul_ps(old, a), _mm512_mul_ps(acc[x], b));
    _mm512_store_ps(o, _mm512_mask_mov_ps(old, live, merged));
  }
}

}  // namespace

void AttentionTileAvx512(const AttentionParams& p, int32_t first, int32_t n, int32_t head) {
  const int32_t hd = p.head_dim;
  const int32_t kvh = head / (p.n_heads / p.n_kv_heads);
  const int32_t* blocks = p.block_tables[first];
  alignas(64) float qt[256][16] = {};
  alignas(64) int32_t pos[16];
  int32_t max_pos = 0, min_pos = p.positions[first];
  for (int32_t i = 0; i < 16; ++i) {
    pos[i] = i < n ? p.positions[first + i] : -1;  // a lane past n is never valid
    max_pos = std::max(max_pos, pos[i]);
    if (i < n) min_pos = std::min(min_pos, pos[i]);
    if (i >= n) continue;
    const float* q = p.q + (static_cast<int64_t>(first + i) * p.n_heads + head) * hd;
    for (int32_t d = 0; d < hd; ++d) qt[d][i] = q[d];
  }
  const __m512i vpos = _mm512_load_si512(pos);
  const bool sink = p.sinks != nullptr;
  TileState st;
  st.m = _mm512_set1_ps(sink ? p.sinks[head] : 0.0f);
  st.l = _mm512_set1_ps(1.0f);
  for (int32_t d = 0; d < hd; ++d) _mm512_store_ps(st.o[d], _mm512_setzero_ps());

  for (int32_t c = 0; c <= max_pos / kAttentionChunk; ++c) {
    const int32_t base = c * kAttentionChunk;
    // Lanes whose query reaches this chunk, and per key j the lanes at or past it.
    const __mmask16 live = _mm512_cmpge_epi32_mask(vpos, _mm512_set1_epi32(base));
    __mmask16 valid[16];
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) {
      valid[j] = _mm512_cmpge_epi32_mask(vpos, _mm512_set1_epi32(base + j));
    }
    const int32_t block = blocks[base / p.block_size];
    const int64_t head_block = (static_cast<int64_t>(block) * p.n_kv_heads + kvh) *
                               static_cast<int64_t>(hd) * p.block_size;
    const int32_t offset = base % p.block_size;
    const float* k = static_cast<const float*>(p.k_cache) + head_block + offset;
    const float* v =
        static_cast<const float*>(p.v_cache) + head_block + static_cast<int64_t>(offset) * hd;

    __m512 s[16];
    TileScores(p, qt, k, valid, s);
    const __m512 m = Tree(s, MaxKeep16);
    __m512 e[16];
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j)
      e[j] = _mm512_maskz_mov_ps(valid[j], Exp16(_mm512_sub_ps(s[j], m)));
    const __m512 l = Tree(e, Add16);

    // The merge's scalars, lane by lane (MergePartial: m' = std::max(acc.m, m) = acc.m < m ? m :
    // acc.m; a = Exp(acc.m - m'); b = Exp(m - m'); l' = acc.l * a + l * b).
    const bool copy = c == 0 && !sink;
    __m512 a = _mm512_setzero_ps(), b = _mm512_setzero_ps();
    if (copy) {
      st.m = _mm512_mask_mov_ps(st.m, live, m);
      st.l = _mm512_mask_mov_ps(st.l, live, l);
    } else {
      const __m512 mn = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(st.m, m, _CMP_LT_OQ), st.m, m);
      a = Exp16(_mm512_sub_ps(st.m, mn));
      b = Exp16(_mm512_sub_ps(m, mn));
      const __m512 ln = _mm512_add_ps(_mm512_mul_ps(st.l, a), _mm512_mul_ps(l, b));
      st.l = _mm512_mask_mov_ps(st.l, live, ln);
      st.m = _mm512_mask_mov_ps(st.m, live, mn);
    }
    int32_t d0 = 0;
    if (base + kAttentionChunk - 1 <= min_pos) {  // every key valid in every real lane
      for (; d0 + 8 <= hd; d0 += 8)
        TileValues<8, false>(hd, d0, v, e, valid, live, copy, a, b, &st);
      for (; d0 < hd; ++d0) TileValues<1, false>(hd, d0, v, e, valid, live, copy, a, b, &st);
    } else {
      for (; d0 + 8 <= hd; d0 += 8) TileValues<8, true>(hd, d0, v, e, valid, live, copy, a, b, &st);
      for (; d0 < hd; ++d0) TileValues<1, true>(hd, d0, v, e, valid, live, copy, a, b, &st);
    }
  }

  alignas(64) float row[16];
  for (int32_t d = 0; d < hd; ++d) {
    _mm512_store_ps(row, _mm512_div_ps(_mm512_load_ps(st.o[d]), st.l));
    for (int32_t i = 0; i < n; ++i) {
      p.out[(static_cast<int64_t>(first + i) * p.n_heads + head) * hd + d] = row[i];
    }
  }
}

}  // namespace bitroll::kernels::internal
