// The AVX-512 prefill tile: up to 16 consecutive query rows of one sequence and head, one query
// per lane, walk their chunks together (and up to kTileRows / 16 such tiles in lockstep).
//
// deterministic: the canonical order of attention.h, lane i = query i, every step vertical:
//   s_j   = fma chain over d of q_i[d] * K[j][d] (register S[j], 16 of them), then * scale;
//           keys beyond a query's causal edge, or before its window's first key lo (sliding
//           window W > 0), are -inf (the scalar code's mask);
//   m_c   = the ReduceMax16 tree over j on copies of S[j]: T[j] = max(T[j + w], T[j]) for
//           w = 8, 4, 2, 1, which is MaxKeep(T[j], T[j + w]) lane by lane;
//   p_j   = Exp16(s_j - m_c) where valid, 0 elsewhere; l_c = the ReduceSum16 tree over j;
//   o_c[d]= fma chain over the valid j in order, from 0 (masked fma: a lane past its edge keeps
//           its accumulator, as the scalar loop stops there);
//   merge = MergePartial's steps lane by lane (std::max emulated exactly, two Exp, the l and o
//           updates as separate multiplies and an add); without sinks a lane's first chunk
//           (lo / 16, which differs from lane to lane with a window) is copied, not merged (its
//           running state starts as that chunk's partial); sinks start the state at (m = sink,
//           l = 1, o = 0) and every chunk merges; a lane keeps its state in the chunks outside
//           its first .. last chunk;
//   out   = o[d] / l.
// Each lane therefore performs the scalar reference's operations on the same operands in the same
// order: a query's bits do not depend on which other queries share its tile (tested with memcmp
// against AttentionReference in attention_test.cc). Only the layout differs: the 16 scores of a
// key are one register instead of the 16 keys of a query.
//
// Scheduling (no operation or order changes): the chunks are walked in spans of kSpan. Pass 1
// computes, chunk by chunk, the scores, p_j, l_c and the merge's m, l, a, b (the running m and l
// stay in registers) and keeps p_j, a, b in a small buffer; pass 2 then runs, per block of 8 d,
// the value chains of the span's chunks (two chunks at a time: 16 independent chains) and their o
// updates in chunk order with that block of o held in registers, so o is loaded and stored once
// per span instead of once per chunk. Up to kTileRows / 16 tiles of consecutive rows walk the
// spans in lockstep (pass 1 of every tile, then pass 2 of every tile), so a span's K and V are
// brought in once for all of them; the first tile prefetches each chunk's V and the next chunk's
// K while it computes scores. The queries and outputs move through 16 x 16 register transposes.
// With a window the spans start at the earliest first chunk of the tiles' rows (never at chunk 0:
// a long prefill with a small window does O(n * W) work), and each tile skips the chunks before
// its own rows' earliest first chunk.
// A bf16 KV pool: each span's K and V are first widened (exactly, as every reader widens them)
// into a small fp32 copy that the tile then reads like an fp32 pool.
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/attention_internal.h"
#include "kernels/cpu/math_avx512.h"

namespace bitroll::kernels::internal {

static_assert(kAttentionChunk == 16 && kTileQueries == 16, "one chunk and one tile per register");

namespace {

// The tile's running state: m and l per lane, o transposed ([d][lane]). o lives here only
// between spans; within a span a block of d of it is held in registers across the span's chunks.
struct TileState {
  __m512 m;
  __m512 l;
  alignas(64) float o[256][16];
};

// Chunks whose p_j and merge factors are computed (pass 1) before the value chains and o updates
// run over them (pass 2), so that o is loaded and stored once per span instead of once per chunk.
constexpr int32_t kSpan = 4;

// One chunk of a span, after pass 1.
struct SpanChunk {
  alignas(64) float p[16][16];  // p[j][lane]: p_j of each lane's query (0 where not valid)
  __m512 a, b;                  // the merge factors of MergePartial (unused when copy)
  const float* v;               // V rows of the chunk: v[j * head_dim + d]
  __mmask16 valid[16];          // lanes whose window (lo .. position) holds key j
  __mmask16 live;               // lanes whose window reaches into this chunk
  __mmask16 copy;               // live lanes whose first chunk this is, without sinks: their
                                // state starts as its partial (the other live lanes merge)
  bool masked;                  // some real lane's window starts or stops inside the chunk
};

// r[i] lane x <- r[x] lane i: a 16 x 16 transpose (moves only, no arithmetic).
inline void Transpose16(__m512* r) {
  __m512 t[16];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  // r[4g + k] now holds, in each 128-bit quarter q, rows 4g..4g+3 of column 4q + k.
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      t[8 * h + k] = _mm512_shuffle_f32x4(r[8 * h + k], r[8 * h + 4 + k], 0x88);
      t[8 * h + 4 + k] = _mm512_shuffle_f32x4(r[8 * h + k], r[8 * h + 4 + k], 0xDD);
    }
  }
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    r[k] = _mm512_shuffle_f32x4(t[k], t[8 + k], 0x88);
    r[8 + k] = _mm512_shuffle_f32x4(t[k], t[8 + k], 0xDD);
    r[4 + k] = _mm512_shuffle_f32x4(t[4 + k], t[12 + k], 0x88);
    r[12 + k] = _mm512_shuffle_f32x4(t[4 + k], t[12 + k], 0xDD);
  }
}

// Scores of chunk `base` for the 16 lanes: S[j] lane i = s_j of query i (-inf where invalid);
// key j's component d is k[d * bs + j]. Prefetches the chunk's V rows (pass 2 reads them) and, if
// k_next, the next chunk's K rows.
inline void TileScores(const AttentionParams& p, const float (*qt)[16], const float* k, int64_t bs,
                       const float* v, const float* k_next, const __mmask16* valid, __m512* s) {
#pragma GCC unroll 16
  for (int j = 0; j < 16; ++j) s[j] = _mm512_setzero_ps();
  for (int32_t d = 0; d < p.head_dim; ++d) {
    // The chunk's V is 16 * head_dim floats, head_dim cache lines: one per d.
    if (v != nullptr) _mm_prefetch(reinterpret_cast<const char*>(v + 16 * d), _MM_HINT_T0);
    if (k_next != nullptr)
      _mm_prefetch(reinterpret_cast<const char*>(k_next + d * bs), _MM_HINT_T0);
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

// Pass 2 for NC consecutive chunks of a span and the block d0 .. d0 + NB of o (in registers):
// each chunk's o_c chains (independent, interleaved), then the chunks' o updates in chunk order:
// copy on the chunk's copy lanes, o * a + o_c * b (separate multiplies and an add) on its other
// live lanes. kMasked: a lane's invalid key (past its causal edge, or before its window) keeps
// its accumulator (masked fma), as the scalar loop skips it; without it every key of the NC
// chunks is valid in every real lane (plain fmas, the same operations there). kFusedBreak (tests
// only): the o update as one fma instead, the wrong order that the tests must catch.
template <int NB, int NC, bool kMasked, bool kFusedBreak, bool kWindow>
inline void SpanValues(int32_t hd, int32_t d0, const SpanChunk* ch, __m512* o) {
  __m512 acc[NC][NB];
#pragma GCC unroll 2
  for (int c = 0; c < NC; ++c) {
#pragma GCC unroll 8
    for (int x = 0; x < NB; ++x) acc[c][x] = _mm512_setzero_ps();
  }
  const float* vj[NC];
#pragma GCC unroll 2
  for (int c = 0; c < NC; ++c) vj[c] = ch[c].v + d0;
    // Not unrolled over j: one row pointer per chunk, advanced by a row per key.
#pragma GCC unroll 1
  for (int j = 0; j < 16; ++j) {
#pragma GCC unroll 2
    for (int c = 0; c < NC; ++c) {
      const __m512 pj = _mm512_load_ps(ch[c].p[j]);
#pragma GCC unroll 8
      for (int x = 0; x < NB; ++x) {
        if constexpr (kMasked) {
          acc[c][x] =
              _mm512_mask3_fmadd_ps(pj, _mm512_set1_ps(vj[c][x]), acc[c][x], ch[c].valid[j]);
        } else {
          acc[c][x] = _mm512_fmadd_ps(pj, _mm512_set1_ps(vj[c][x]), acc[c][x]);
        }
      }
      vj[c] += hd;
    }
  }
#pragma GCC unroll 2
  for (int c = 0; c < NC; ++c) {
    const SpanChunk& k = ch[c];
    if constexpr (!kWindow) {  // full attention: every live lane copies, or every one merges
#pragma GCC unroll 8
      for (int x = 0; x < NB; ++x) {
        __m512 merged = acc[c][x];
        if (k.copy == 0) {
          if constexpr (kFusedBreak) {
            merged = _mm512_fmadd_ps(acc[c][x], k.b, _mm512_mul_ps(o[x], k.a));
          } else {
            merged = _mm512_add_ps(_mm512_mul_ps(o[x], k.a), _mm512_mul_ps(acc[c][x], k.b));
          }
        }
        o[x] = k.live == 0xFFFF ? merged : _mm512_mask_mov_ps(o[x], k.live, merged);
      }
      continue;
    }
#pragma GCC unroll 8
    for (int x = 0; x < NB; ++x) {
      const __mmask16 merge = k.live & static_cast<__mmask16>(~k.copy);
      if (merge != 0) {
        __m512 merged;
        if constexpr (kFusedBreak) {
          merged = _mm512_fmadd_ps(acc[c][x], k.b, _mm512_mul_ps(o[x], k.a));
        } else {
          merged = _mm512_add_ps(_mm512_mul_ps(o[x], k.a), _mm512_mul_ps(acc[c][x], k.b));
        }
        o[x] = merge == 0xFFFF ? merged : _mm512_mask_mov_ps(o[x], merge, merged);
      }
      if (k.copy != 0) {
        o[x] = k.copy == 0xFFFF ? acc[c][x] : _mm512_mask_mov_ps(o[x], k.copy, acc[c][x]);
      }
    }
  }
}

// Pass 2 over the n chunks of a span for o[d0 .. d0 + NB): o loaded once, the chunks in order
// (two at a time: 2 x NB independent chains), o stored once.
template <int NB, bool kFusedBreak, bool kWindow>
inline void SpanBlock(int32_t hd, int32_t d0, const SpanChunk* ch, int32_t n, TileState* st) {
  __m512 o[NB];
#pragma GCC unroll 8
  for (int x = 0; x < NB; ++x) o[x] = _mm512_load_ps(st->o[d0 + x]);
  int32_t c = 0;
  for (; c + 2 <= n; c += 2) {
    if (ch[c].masked || ch[c + 1].masked) {
      SpanValues<NB, 2, true, kFusedBreak, kWindow>(hd, d0, ch + c, o);
    } else {
      SpanValues<NB, 2, false, kFusedBreak, kWindow>(hd, d0, ch + c, o);
    }
  }
  if (c < n) {
    if (ch[c].masked) {
      SpanValues<NB, 1, true, kFusedBreak, kWindow>(hd, d0, ch + c, o);
    } else {
      SpanValues<NB, 1, false, kFusedBreak, kWindow>(hd, d0, ch + c, o);
    }
  }
#pragma GCC unroll 8
  for (int x = 0; x < NB; ++x) _mm512_store_ps(st->o[d0 + x], o[x]);
}

// One tile of up to 16 rows: its queries (transposed), positions and state.
struct TileRows {
  alignas(64) float qt[256][16];  // qt[d][lane]; rows d < head_dim hold the queries
  TileState st;
  SpanChunk span[kSpan];
  __m512i vpos;  // each lane's query position (-1 for a lane past the tile's rows)
  __m512i vlo;   // each lane's window lo (its first valid key; 0 without a window)
  // n_chunks: 1 + the last chunk of any row; first_chunk: the earliest first chunk of any row;
  // max_lo: the latest window start of any row.
  const TileLane* lanes;  // the tile's queries (row, head), n of them
  int32_t n, min_pos, max_lo, first_chunk, n_chunks;
};

// The head_dim floats of lane's (row, head) in x ([rows][n_heads][head_dim]: q or out).
template <typename T>
inline T* LaneRow(const AttentionParams& p, T* x, TileLane lane) {
  return x + (static_cast<int64_t>(lane.row) * p.n_heads + lane.head) * p.head_dim;
}

// Addresses of a span's chunks for one kv head: k[i], v[i] for chunk c0 + i; k[n] is the next
// span's first chunk, or nullptr. K is read in place (stride block_size) from an fp32 pool, or
// from a widened copy of the span (stride 16) from a bf16 pool.
struct SpanAddr {
  const float* k[kSpan + 1];
  const float* v[kSpan];
  int64_t k_stride;  // floats between a K row's components d and d + 1
};

void LoadTile(const AttentionParams& p, const TileLane* lanes, int32_t n, TileRows* t) {
  const int32_t hd = p.head_dim;
  alignas(64) int32_t pos[16];
  alignas(64) int32_t lo[16];
  alignas(64) float sink[16];
  int32_t max_pos = 0;
  t->lanes = lanes;
  t->n = n;
  t->min_pos = p.positions[lanes[0].row];
  t->max_lo = WindowLo(p, lanes[0].row);
  int32_t min_lo = t->max_lo;
  for (int32_t i = 0; i < 16; ++i) {
    pos[i] = i < n ? p.positions[lanes[i].row] : -1;  // a lane past n is never valid
    lo[i] = i < n ? WindowLo(p, lanes[i].row) : 0;
    sink[i] = i < n && p.sinks != nullptr ? p.sinks[lanes[i].head] : 0.0f;
    max_pos = std::max(max_pos, pos[i]);
    if (i < n) {
      t->min_pos = std::min(t->min_pos, pos[i]);
      t->max_lo = std::max(t->max_lo, lo[i]);
      min_lo = std::min(min_lo, lo[i]);
    }
  }
  t->vpos = _mm512_load_si512(pos);
  t->vlo = _mm512_load_si512(lo);
  t->n_chunks = max_pos / kAttentionChunk + 1;
  t->first_chunk = min_lo / kAttentionChunk;
  for (int32_t d0 = 0; d0 < hd; d0 += 16) {  // qt rows d0 .. d0 + 15 (<= 255): 16 x 16 blocks
    const __mmask16 dm = static_cast<__mmask16>(hd - d0 >= 16 ? 0xFFFF : (1u << (hd - d0)) - 1);
    __m512 r[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) {
      r[i] =
          i < n ? _mm512_maskz_loadu_ps(dm, LaneRow(p, p.q, lanes[i]) + d0) : _mm512_setzero_ps();
    }
    Transpose16(r);
#pragma GCC unroll 16
    for (int x = 0; x < 16; ++x) _mm512_store_ps(t->qt[d0 + x], r[x]);
  }
  t->st.m = _mm512_load_ps(sink);
  t->st.l = _mm512_set1_ps(1.0f);
  for (int32_t d = 0; d < hd; ++d) _mm512_store_ps(t->st.o[d], _mm512_setzero_ps());
}

// Pass 1 over chunks c0 + i0 .. c0 + i0 + cnt - 1 of tile t (the span starting at chunk c0,
// from its i0-th chunk), into t->span[0 .. cnt): scores, p_j, l_c and the merge's m, l, a, b of
// every chunk, in chunk order. With `prefetch`, each chunk's V and the next chunk's K are
// prefetched while its scores run. kWindow: the rows have sliding windows (lanes start at
// different chunks); without it every lane starts at chunk 0 and only the causal edge masks.
template <bool kWindow>
void Pass1(const AttentionParams& p, const SpanAddr& addr, int32_t c0, int32_t i0, int32_t cnt,
           bool prefetch, TileRows* t) {
  const bool sink = p.sinks != nullptr;
  TileState& st = t->st;
  for (int32_t i = 0; i < cnt; ++i) {
    const int32_t a = i0 + i;  // the chunk's index in the span
    const int32_t c = c0 + a;
    const int32_t base = c * kAttentionChunk;
    SpanChunk& sc = t->span[i];
    // Lanes whose window reaches into this chunk (lo <= its last key, position >= its first),
    // and per key j the lanes whose window holds it (lo <= base + j <= position).
    sc.live = _mm512_cmpge_epi32_mask(t->vpos, _mm512_set1_epi32(base));
    if constexpr (kWindow) {
      sc.live &= _mm512_cmplt_epi32_mask(t->vlo, _mm512_set1_epi32(base + kAttentionChunk));
    }
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) {
      sc.valid[j] = _mm512_cmpge_epi32_mask(t->vpos, _mm512_set1_epi32(base + j));
      if constexpr (kWindow) {
        sc.valid[j] &= _mm512_cmple_epi32_mask(t->vlo, _mm512_set1_epi32(base + j));
      }
    }
    // A live lane with lo >= base starts its window in this chunk: without sinks it copies.
    if constexpr (kWindow) {
      sc.copy = sink ? 0 : sc.live & _mm512_cmpge_epi32_mask(t->vlo, _mm512_set1_epi32(base));
    } else {
      sc.copy = c == 0 && !sink ? sc.live : 0;
    }
    sc.masked = base + kAttentionChunk - 1 > t->min_pos || (kWindow && t->max_lo > base);
    sc.v = addr.v[a];

    __m512 s[16];
    TileScores(p, t->qt, addr.k[a], addr.k_stride, prefetch ? addr.v[a] : nullptr,
               prefetch ? addr.k[a + 1] : nullptr, sc.valid, s);
    const __m512 m = Tree(s, MaxKeep16);
    __m512 e[16];
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) {
      e[j] = _mm512_maskz_mov_ps(sc.valid[j], Exp16(_mm512_sub_ps(s[j], m)));
      _mm512_store_ps(sc.p[j], e[j]);
    }
    const __m512 l = Tree(e, Add16);

    // The merge's scalars, lane by lane (MergePartial: m' = std::max(acc.m, m) = acc.m < m ?
    // m : acc.m; a = Exp(acc.m - m'); b = Exp(m - m'); l' = acc.l * a + l * b).
    // Copy lanes take the chunk's m and l; the other live lanes merge; the rest keep theirs.
    const __mmask16 merge = sc.live & static_cast<__mmask16>(~sc.copy);
    if (merge != 0) {
      const __m512 mn = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(st.m, m, _CMP_LT_OQ), st.m, m);
      sc.a = Exp16(_mm512_sub_ps(st.m, mn));
      sc.b = Exp16(_mm512_sub_ps(m, mn));
      const __m512 ln = _mm512_add_ps(_mm512_mul_ps(st.l, sc.a), _mm512_mul_ps(l, sc.b));
      st.l = _mm512_mask_mov_ps(st.l, merge, ln);
      st.m = _mm512_mask_mov_ps(st.m, merge, mn);
    }
    if (sc.copy != 0) {
      st.m = _mm512_mask_mov_ps(st.m, sc.copy, m);
      st.l = _mm512_mask_mov_ps(st.l, sc.copy, l);
    }
  }
}

// Pass 2 over the first cnt chunks of tile t's span: the value chains and the o updates, in
// chunk order, per block of d with that block of o in registers.
template <bool kFusedBreak, bool kWindow>
void Pass2(int32_t hd, int32_t cnt, TileRows* t) {
  int32_t d0 = 0;
  for (; d0 + 8 <= hd; d0 += 8) SpanBlock<8, kFusedBreak, kWindow>(hd, d0, t->span, cnt, &t->st);
  for (; d0 < hd; ++d0) SpanBlock<1, kFusedBreak, kWindow>(hd, d0, t->span, cnt, &t->st);
}

// out = o[d] / l per lane, transposed back to rows 16 d at a time.
void StoreTile(const AttentionParams& p, const TileRows& t) {
  const int32_t hd = p.head_dim;
  for (int32_t d0 = 0; d0 < hd; d0 += 16) {
    const __mmask16 dm = static_cast<__mmask16>(hd - d0 >= 16 ? 0xFFFF : (1u << (hd - d0)) - 1);
    __m512 r[16];
#pragma GCC unroll 16
    for (int x = 0; x < 16; ++x) {
      r[x] =
          d0 + x < hd ? _mm512_div_ps(_mm512_load_ps(t.st.o[d0 + x]), t.st.l) : _mm512_setzero_ps();
    }
    Transpose16(r);
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) {
      if (i < t.n) _mm512_mask_storeu_ps(LaneRow(p, p.out, t.lanes[i]) + d0, dm, r[i]);
    }
  }
}

// Each lane's running state (m, l, o) as an AttentionPartial: states[i] for lane i < t.n.
void ExportTile(int32_t hd, const TileRows& t, AttentionPartial* states) {
  alignas(64) float m[16], l[16];
  _mm512_store_ps(m, t.st.m);
  _mm512_store_ps(l, t.st.l);
  for (int32_t i = 0; i < t.n; ++i) {
    states[i].m = m[i];
    states[i].l = l[i];
    for (int32_t d = 0; d < hd; ++d) states[i].o[d] = t.st.o[d][i];
  }
}

// Queries lanes[0 .. n) (n <= kTileRows, one kv head) as tiles of 16 walking their chunks in
// lockstep: span by span, pass 1 of every tile, then pass 2 of every tile, so that the span's K
// and V come from memory once for all the tiles. The tiles never read each other's state. The
// chunks' K/V are read through lanes[0]'s block table: the lanes are consecutive rows of one
// sequence and one head, or, with `states`, rows whose chunks 0 .. chunk_limit - 1 are the same
// blocks. Without `states` every lane walks all its chunks and its output is stored; with it the
// walk stops before chunk_limit and each lane's running state is left in states[i].
template <bool kFusedBreak, bool kWindow>
void Tiles(const AttentionParams& p, const TileLane* lanes, int32_t n, int32_t chunk_limit,
           AttentionPartial* states) {
  constexpr int32_t kMaxTiles = kTileRows / kTileQueries;
  const int32_t kvh = lanes[0].head / (p.n_heads / p.n_kv_heads);
  const int32_t* blocks = p.block_tables[lanes[0].row];
  const int32_t n_tiles = (n + kTileQueries - 1) / kTileQueries;
  TileRows tiles[kMaxTiles];
  int32_t n_chunks = 0, first_chunk = 0;
  for (int32_t i = 0; i < n_tiles; ++i) {
    const int32_t f = i * kTileQueries;
    LoadTile(p, lanes + f, std::min(kTileQueries, n - f), &tiles[i]);
    if (states != nullptr) tiles[i].n_chunks = std::min(tiles[i].n_chunks, chunk_limit);
    n_chunks = std::max(n_chunks, tiles[i].n_chunks);
    first_chunk = i == 0 ? tiles[i].first_chunk : std::min(first_chunk, tiles[i].first_chunk);
  }
  const int32_t hd = p.head_dim;
  // Element offsets of chunk c's K and V rows for this kv head (K: [head_dim][block_size] from
  // the chunk's first key, V: [key][head_dim]).
  auto chunk_at = [&](int32_t c, int64_t* v) {
    const int32_t base = c * kAttentionChunk;
    const int32_t block = blocks[base / p.block_size];
    const int64_t head_block = (static_cast<int64_t>(block) * p.n_kv_heads + kvh) *
                               static_cast<int64_t>(hd) * p.block_size;
    const int32_t offset = base % p.block_size;
    *v = head_block + static_cast<int64_t>(offset) * hd;
    return head_block + offset;
  };
  // A bf16 pool: each span's K and V are widened (exactly) into this copy first, K as
  // [head_dim][16], V as [16][head_dim] per chunk; the tile then reads the same values as from
  // an fp32 pool holding them, so the bits are those of the fp32 path on the rounded values.
  const bool bf16 = p.kv_dtype == DType::kBF16;
  const int64_t chunk_floats = int64_t{kAttentionChunk} * hd;
  thread_local std::vector<float> widened;
  if (bf16 && static_cast<int64_t>(widened.size()) < 2 * kSpan * chunk_floats) {
    widened.resize(2 * kSpan * chunk_floats);
  }
  SpanAddr addr;
  addr.k_stride = bf16 ? kAttentionChunk : p.block_size;
  for (int32_t c0 = first_chunk; c0 < n_chunks; c0 += kSpan) {
    const int32_t span_n = std::min(kSpan, n_chunks - c0);
    for (int32_t i = 0; i < span_n; ++i) {
      int64_t v_at;
      const int64_t k_at = chunk_at(c0 + i, &v_at);
      if (!bf16) {
        addr.k[i] = static_cast<const float*>(p.k_cache) + k_at;
        addr.v[i] = static_cast<const float*>(p.v_cache) + v_at;
        continue;
      }
      float* k = widened.data() + 2 * i * chunk_floats;
      float* v = k + chunk_floats;
      const uint16_t* kb = static_cast<const uint16_t*>(p.k_cache) + k_at;
      const uint16_t* vb = static_cast<const uint16_t*>(p.v_cache) + v_at;
      for (int32_t d = 0; d < hd; ++d)
        _mm512_storeu_ps(k + d * 16, LoadBf16x16(kb + d * p.block_size));
      for (int64_t x = 0; x < chunk_floats; x += 16) _mm512_storeu_ps(v + x, LoadBf16x16(vb + x));
      addr.k[i] = k;
      addr.v[i] = v;
    }
    int64_t unused;
    addr.k[span_n] = c0 + span_n < n_chunks && !bf16
                         ? static_cast<const float*>(p.k_cache) + chunk_at(c0 + span_n, &unused)
                         : nullptr;
    // The last tile (usually the most chunks) runs first and brings the span's K and V in; the
    // others find them in cache.
    // A tile walks the span's chunks from its own first chunk to its last.
    auto tile_chunks = [&](const TileRows& t, int32_t* i0) {
      *i0 = std::max(0, t.first_chunk - c0);
      return std::min(span_n, t.n_chunks - c0) - *i0;
    };
    bool prefetch = true;
    for (int32_t i = n_tiles - 1; i >= 0; --i) {
      int32_t i0;
      const int32_t cnt = tile_chunks(tiles[i], &i0);
      if (cnt <= 0) continue;
      Pass1<kWindow>(p, addr, c0, i0, cnt, prefetch, &tiles[i]);
      prefetch = false;
    }
    for (int32_t i = 0; i < n_tiles; ++i) {
      int32_t i0;
      const int32_t cnt = tile_chunks(tiles[i], &i0);
      if (cnt > 0) Pass2<kFusedBreak, kWindow>(p.head_dim, cnt, &tiles[i]);
    }
  }
  for (int32_t i = 0; i < n_tiles; ++i) {
    if (states != nullptr) {
      ExportTile(hd, tiles[i], states + i * kTileQueries);
    } else {
      StoreTile(p, tiles[i]);
    }
  }
}

// The lanes (first, head), (first + 1, head), ..., (first + n - 1, head).
struct ConsecutiveRows {
  TileLane lanes[kTileRows];
  ConsecutiveRows(int32_t first, int32_t n, int32_t head) {
    for (int32_t i = 0; i < n; ++i) lanes[i] = {first + i, head};
  }
};

}  // namespace

void AttentionTileAvx512(const AttentionParams& p, int32_t first, int32_t n, int32_t head) {
  const ConsecutiveRows rows(first, n, head);
  if (p.window > 0) return Tiles<false, true>(p, rows.lanes, n, 0, nullptr);
  Tiles<false, false>(p, rows.lanes, n, 0, nullptr);
}

void AttentionTileAvx512FusedForTest(const AttentionParams& p, int32_t first, int32_t n,
                                     int32_t head) {
  const ConsecutiveRows rows(first, n, head);
  if (p.window > 0) return Tiles<true, true>(p, rows.lanes, n, 0, nullptr);
  Tiles<true, false>(p, rows.lanes, n, 0, nullptr);
}

void AttentionTileStatesAvx512(const AttentionParams& p, const TileLane* lanes, int32_t n,
                               int32_t chunks, AttentionPartial* states, bool fused_for_test) {
  if (fused_for_test) return Tiles<true, false>(p, lanes, n, chunks, states);
  Tiles<false, false>(p, lanes, n, chunks, states);
}

}  // namespace bitroll::kernels::internal
