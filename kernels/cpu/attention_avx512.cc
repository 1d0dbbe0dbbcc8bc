// Attention chunk partials and merge, AVX-512: the 16 keys of a chunk are the 16 lanes of one
// register.
// deterministic: same operations as ChunkPartialScalar, lane j = key j: each score is one fma chain
// over d in order, then one multiply by the scale; each value accumulator o[d] is one fma chain
// over the chunk's keys j in order. Several jobs (chunks of one query, or one chunk of several
// queries) are computed together only to interleave their independent chains (the scalar kernel
// runs one 4-cycle fma after another); no operation of one job ever reads another job's values,
// so every partial has the bits of the one-job scalar reference. When every job of a batch reads
// the same chunk (prefill rows of one sequence), each K and V row is loaded once and used by all
// of them: the same operands, so the same bits.
#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/attention_internal.h"
#include "kernels/cpu/lanes.h"
#include "kernels/cpu/math_avx512.h"

namespace bitroll::kernels::internal {

static_assert(kAttentionChunk == 16, "the AVX-512 attention kernel holds one chunk per register");

namespace {

// Lanes < n set (n may exceed 16 or be <= 0).
inline __mmask16 Prefix16(int32_t n) {
  if (n >= 16) return static_cast<__mmask16>(0xFFFF);
  if (n <= 0) return 0;
  return static_cast<__mmask16>((1u << n) - 1u);
}

// 16 K/V elements as fp32 (bf16 widens exactly: its bits are the high half of the fp32 bits).
inline __m512 Load16(const float* p) {
  return _mm512_loadu_ps(p);
}
inline __m512 Load16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
// Lanes outside `m` are 0 and are not read.
inline __m512 MaskLoad16(__mmask16 m, const float* p) {
  return _mm512_maskz_loadu_ps(m, p);
}
inline __m512 MaskLoad16(__mmask16 m, const uint16_t* p) {
  const __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// The scores' tail for G jobs whose score chains are done (acc[g]: job g's 16 dot products):
// scale, mask beyond the causal edge, max, exponentials and their sum. pj[g][j] receives p_j of
// job g (0 beyond its causal edge).
template <int G, typename T>
inline void SoftmaxG(const AttentionParams& p, const ChunkView<T>* cv, const __m512* acc,
                     float (*pj)[kAttentionChunk], AttentionPartial* out) {
  const __m512 scale = _mm512_set1_ps(p.scale);
  const __m512 ninf = _mm512_set1_ps(-__builtin_inff());
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g) {
    const __mmask16 valid = Prefix16(cv[g].n_valid);
    __m512 s = _mm512_mul_ps(acc[g], scale);
    s = _mm512_mask_mov_ps(ninf, valid, s);
    const float m = ReduceMax16(s);
    const __m512 e = _mm512_maskz_mov_ps(valid, Exp16(_mm512_sub_ps(s, _mm512_set1_ps(m))));
    _mm512_storeu_ps(pj[g], e);
    out[g].m = m;
    out[g].l = ReduceSum16(e);
  }
}

// Scores, max, exponentials and their sum for G jobs in runs of R > 1 that read the same chunk
// (R = G: prefill rows of one sequence; R = heads per kv head: the query heads of one decode row);
// the G score chains run interleaved and each K row is loaded once per run. pf_k (or nullptr):
// per run, the K of a later chunk to prefetch (its V is prefetched during the run's values).
template <int G, int R, typename T>
void ScoresRuns(const AttentionParams& p, const ChunkView<T>* cv, const ChunkJob* jobs,
                const T* const* pf_k, float (*pj)[kAttentionChunk], AttentionPartial* out) {
  static_assert(R > 1 && G % R == 0, "runs of R > 1 jobs");
  const int32_t hd = p.head_dim;
  const int64_t bs = p.block_size;
  const float* q[G];
  const T* k[G];
  __m512 acc[G];
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g) {
    q[g] = jobs[g].q;
    k[g] = cv[g].k;
    acc[g] = _mm512_setzero_ps();
  }
  for (int32_t d = 0; d < hd; ++d) {
#pragma GCC unroll 8
    for (int r = 0; r < G; r += R) {
      if (pf_k != nullptr && pf_k[r / R] != nullptr) {
        _mm_prefetch(reinterpret_cast<const char*>(pf_k[r / R] + d * bs), _MM_HINT_T0);
      }
      const __m512 kd = Load16(k[r] + d * bs);
#pragma GCC unroll 8
      for (int g = r; g < r + R; ++g) acc[g] = _mm512_fmadd_ps(_mm512_set1_ps(q[g][d]), kd, acc[g]);
    }
  }
  SoftmaxG<G>(p, cv, acc, pj, out);
}

// The same for G jobs that share nothing (R = 1: any queries, any chunks), with few live
// pointers: the G queries are copied side by side, so each score's q[d] is one broadcast at a
// fixed offset from one base, and the loop keeps only the G K pointers in registers (with a
// pointer per query, per K chunk and per prefetch target, the loop spilled them and ran ~90
// instructions for its 8 fmas). Jobs of one query (a query walking its chunks alone) share one
// broadcast of q[d] per step instead, and copy nothing: the same operand, so the same bits, and
// one load per step instead of G beside the G K rows. pf_k / pf_v (or nullptr): per job, the K
// and V of a later chunk to prefetch (a job without one names its own). They are prefetched in
// address order, one target after the other, a few rows per d, so the lines stream in as pages
// instead of as G interleaved rows (docs/benchmarks.md, "Issue 19, round 15").
template <int G, typename T>
void ScoresLone(const AttentionParams& p, const ChunkView<T>* cv, const ChunkJob* jobs,
                const T* const* pf_k, const T* const* pf_v, float (*pj)[kAttentionChunk],
                AttentionPartial* out) {
  const int32_t hd = p.head_dim;
  const int64_t bs = p.block_size;
  constexpr int kQs = 256;  // the widest head
  alignas(64) float qs[G * kQs];
  bool one_query = true;
#pragma GCC unroll 8
  for (int g = 1; g < G; ++g) one_query = one_query && jobs[g].q == jobs[0].q;
  const float* q0 = jobs[0].q;
  const T* k[G];
  const T* pk[G];
  const T* pv[G];
  __m512 acc[G];
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g) {
    k[g] = cv[g].k;
    acc[g] = _mm512_setzero_ps();
    if (pf_k != nullptr) {
      pk[g] = pf_k[g] != nullptr ? pf_k[g] : cv[g].k;
      pv[g] = pf_v[g] != nullptr ? pf_v[g] : cv[g].v;
    }
  }
  // The whole loop, with the G jobs' queries side by side (kOneQuery: one query for all).
  auto walk = [&]<bool kOneQuery>() __attribute__((always_inline)) {
    if constexpr (!kOneQuery) {
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) std::copy(jobs[g].q, jobs[g].q + hd, qs + g * kQs);
    }
    // Step d of every job's chain.
    auto fmas = [&](int32_t d) __attribute__((always_inline)) {
      if constexpr (kOneQuery) {
        __m512 qd = _mm512_set1_ps(q0[d]);
        // In a register: folded into each fma as an embedded broadcast, it would be G loads.
        __asm__("" : "+v"(qd));
#pragma GCC unroll 8
        for (int g = 0; g < G; ++g) acc[g] = _mm512_fmadd_ps(qd, Load16(k[g] + d * bs), acc[g]);
      } else {
#pragma GCC unroll 8
        for (int g = 0; g < G; ++g) {
          acc[g] = _mm512_fmadd_ps(_mm512_set1_ps(qs[g * kQs + d]), Load16(k[g] + d * bs), acc[g]);
        }
      }
    };
    if (pf_k == nullptr) {
      for (int32_t d = 0; d < hd; ++d) fmas(d);
    } else if (hd % G == 0) {
      // Target t's rows during steps t * hd / G ..: G rows of its K and G of its V per step (a V
      // "row" is kAttentionChunk values; hd of them make the chunk). bf16 rows of 16 are half a
      // line: V's rows, and K's when a block is one chunk (its rows then follow each other), come
      // two to a line, so every other one is prefetched.
      constexpr int kRowsPerLine = sizeof(T) == 2 && G % 2 == 0 ? 2 : 1;
      const int k_step = bs == kAttentionChunk ? kRowsPerLine : 1;
      const int32_t steps = hd / G;
      int32_t d = 0;
      for (int t = 0; t < G; ++t) {
        const T* kr = pk[t];
        const T* vr = pv[t];
        for (int32_t e = 0; e < steps; ++e, ++d, kr += G * bs, vr += G * kAttentionChunk) {
#pragma GCC unroll 8
          for (int i = 0; i < G; i += k_step) {
            _mm_prefetch(reinterpret_cast<const char*>(kr + i * bs), _MM_HINT_T0);
          }
#pragma GCC unroll 8
          for (int i = 0; i < G; i += kRowsPerLine) {
            _mm_prefetch(reinterpret_cast<const char*>(vr + i * kAttentionChunk), _MM_HINT_T0);
          }
          fmas(d);
        }
      }
    } else {  // row d of every target during step d
      for (int32_t d = 0; d < hd; ++d) {
#pragma GCC unroll 8
        for (int g = 0; g < G; ++g) {
          _mm_prefetch(reinterpret_cast<const char*>(pk[g] + d * bs), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(pv[g] + d * kAttentionChunk), _MM_HINT_T0);
        }
        fmas(d);
      }
    }
  };
  if (G > 1 && one_query) {
    walk.template operator()<true>();
  } else {
    walk.template operator()<false>();
  }
  SoftmaxG<G>(p, cv, acc, pj, out);
}

// o[d0, d0 + 16 * NB) of H jobs: H * NB independent chains over the keys j in order. A job's
// chain stops at its own n_valid (the masked fma keeps the accumulator unchanged after it).
// kSharedKv: the H jobs read the same V rows, loaded once for all of them.
template <int NB, int H, bool kSharedKv, typename T>
void ValuesBlock(int32_t hd, int32_t d0, __mmask16 last, const ChunkView<T>* cv, const T* pf_v,
                 const float (*pj)[kAttentionChunk], AttentionPartial* out) {
  __m512 o[H][NB];
  int32_t jmax = 0, jall = kAttentionChunk;  // jall: keys that every job's chain takes
#pragma GCC unroll 4
  for (int h = 0; h < H; ++h) {
    jmax = std::max(jmax, cv[h].n_valid);
    jall = std::min(jall, cv[h].n_valid);
#pragma GCC unroll 4
    for (int b = 0; b < NB; ++b) o[h][b] = _mm512_setzero_ps();
  }
  // Key j for every job; kAll: j < every job's n_valid, so no chain needs the mask (an fma under a
  // full mask is the plain fma: the same bits).
  auto key = [&]<bool kAll>(int32_t j) __attribute__((always_inline)) {
    auto fma = [&](int h, const __m512 pb, const __m512 x, __m512& acc)
        __attribute__((always_inline)) {
      if constexpr (kAll) {
        acc = _mm512_fmadd_ps(pb, x, acc);
      } else {
        const __mmask16 live = j < cv[h].n_valid ? static_cast<__mmask16>(0xFFFF) : 0;
        acc = _mm512_mask3_fmadd_ps(pb, x, acc, live);
      }
    };
    if constexpr (kSharedKv) {
      const T* v = cv[0].v + static_cast<int64_t>(j) * hd + d0;
      if (pf_v != nullptr) {
#pragma GCC unroll 4
        for (int b = 0; b < NB; ++b) {
          _mm_prefetch(reinterpret_cast<const char*>(pf_v + (v - cv[0].v) + 16 * b), _MM_HINT_T0);
        }
      }
      __m512 x[NB];
#pragma GCC unroll 4
      for (int b = 0; b < NB; ++b) {
        const __mmask16 dm = b == NB - 1 ? last : static_cast<__mmask16>(0xFFFF);
        x[b] = MaskLoad16(dm, v + 16 * b);
      }
#pragma GCC unroll 4
      for (int h = 0; h < H; ++h) {
        const __m512 pb = _mm512_set1_ps(pj[h][j]);
#pragma GCC unroll 4
        for (int b = 0; b < NB; ++b) fma(h, pb, x[b], o[h][b]);
      }
    } else {
#pragma GCC unroll 2
      for (int h = 0; h < H; ++h) {
        const __m512 pb = _mm512_set1_ps(pj[h][j]);
        const T* v = cv[h].v + static_cast<int64_t>(j) * hd + d0;
#pragma GCC unroll 4
        for (int b = 0; b < NB; ++b) {
          const __mmask16 dm = b == NB - 1 ? last : static_cast<__mmask16>(0xFFFF);
          fma(h, pb, MaskLoad16(dm, v + 16 * b), o[h][b]);
        }
      }
    }
  };
  int32_t j = 0;
  for (; j < jall; ++j) key.template operator()<true>(j);
  for (; j < jmax; ++j) key.template operator()<false>(j);
#pragma GCC unroll 4
  for (int h = 0; h < H; ++h) {
#pragma GCC unroll 4
    for (int b = 0; b < NB; ++b) {
      const __mmask16 dm = b == NB - 1 ? last : static_cast<__mmask16>(0xFFFF);
      _mm512_mask_storeu_ps(out[h].o + d0 + 16 * b, dm, o[h][b]);
    }
  }
}

template <int H, bool kSharedKv, typename T>
void Values(int32_t hd, const ChunkView<T>* cv, const float (*pj)[kAttentionChunk],
            AttentionPartial* out, const T* pf_v = nullptr) {
  for (int32_t d0 = 0; d0 < hd; d0 += 64) {
    const int32_t left = hd - d0;
    const int32_t nb = std::min<int32_t>(4, (left + 15) / 16);
    const __mmask16 last = Prefix16(left - 16 * (nb - 1));
    switch (nb) {
      case 4:
        ValuesBlock<4, H, kSharedKv, T>(hd, d0, last, cv, pf_v, pj, out);
        break;
      case 3:
        ValuesBlock<3, H, kSharedKv, T>(hd, d0, last, cv, pf_v, pj, out);
        break;
      case 2:
        ValuesBlock<2, H, kSharedKv, T>(hd, d0, last, cv, pf_v, pj, out);
        break;
      default:
        ValuesBlock<1, H, kSharedKv, T>(hd, d0, last, cv, pf_v, pj, out);
        break;
    }
  }
}

// o of the R jobs of one run, which read the same V rows (loaded once for up to 4 of them);
// pf_v: V of a later chunk to prefetch meanwhile (nullptr: none).
template <int R, typename T>
void ValuesRun(int32_t hd, const ChunkView<T>* cv, const float (*pj)[kAttentionChunk],
               AttentionPartial* out, const T* pf_v) {
  static_assert(R > 1, "a run shares its V rows");
  int g = 0;
  for (; g + 4 <= R; g += 4, pf_v = nullptr) {
    Values<4, true, T>(hd, cv + g, pj + g, out + g, pf_v);
  }
  for (; g + 2 <= R; g += 2, pf_v = nullptr) {
    Values<2, true, T>(hd, cv + g, pj + g, out + g, pf_v);
  }
  if (g < R) Values<1, true, T>(hd, cv + g, pj + g, out + g, pf_v);
}

// The G jobs in runs of R that read the same chunk (R = 1: none shared). A run whose first job
// names a prefetch chunk has that chunk's K lines prefetched during its scores and its V lines
// during its values (R > 1) or its scores too (R = 1: the values of a lone query's chunk are too
// short to cover them).
template <int G, int R, typename T>
void PartialsRuns(const AttentionParams& p, const ChunkView<T>* cv, const ChunkJob* jobs,
                  AttentionPartial* out) {
  alignas(64) float pj[G][kAttentionChunk];
  const T* pf_k[G / R];
  const T* pf_v[G / R];
  bool prefetch = false;
#pragma GCC unroll 8
  for (int r = 0; r < G; r += R) {
    pf_k[r / R] = pf_v[r / R] = nullptr;
    if (jobs[r].prefetch_chunk >= 0) {
      const ChunkView<T> next =
          ViewChunk<T>(p, jobs[r].kvh, jobs[r].blocks, jobs[r].position, jobs[r].prefetch_chunk);
      pf_k[r / R] = next.k;
      pf_v[r / R] = next.v;
      prefetch = true;
    }
  }
  if constexpr (R == 1) {  // nothing shared: two jobs' value chains interleaved
    ScoresLone<G, T>(p, cv, jobs, prefetch ? pf_k : nullptr, pf_v, pj, out);
    int g = 0;
    for (; g + 2 <= G; g += 2) Values<2, false, T>(p.head_dim, cv + g, pj + g, out + g);
    if (g < G) Values<1, false, T>(p.head_dim, cv + g, pj + g, out + g);
  } else {
    ScoresRuns<G, R, T>(p, cv, jobs, prefetch ? pf_k : nullptr, pj, out);
#pragma GCC unroll 8
    for (int r = 0; r < G; r += R) {
      ValuesRun<R, T>(p.head_dim, cv + r, pj + r, out + r, pf_v[r / R]);
    }
  }
}

// Whether the jobs in each run of R (jobs r .. r + R - 1, r a multiple of R) read the same chunk
// of the same kv head.
template <int G, typename T>
bool RunsShare(const ChunkView<T>* cv, int r_len) {
  for (int g = 0; g < G; ++g) {
    const int r = g - g % r_len;
    if (cv[g].k != cv[r].k || cv[g].v != cv[r].v) return false;
  }
  return true;
}

template <int G, typename T>
void PartialsGT(const AttentionParams& p, const ChunkJob* jobs, AttentionPartial* out) {
  ChunkView<T> cv[G];
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g) {
    cv[g] = ViewChunk<T>(p, jobs[g].kvh, jobs[g].blocks, jobs[g].position, jobs[g].chunk);
  }
  if constexpr (G > 1) {
    if (RunsShare<G>(cv, G)) return PartialsRuns<G, G, T>(p, cv, jobs, out);
  }
  if constexpr (G > 4 && G % 4 == 0) {
    if (RunsShare<G>(cv, 4)) return PartialsRuns<G, 4, T>(p, cv, jobs, out);
  }
  if constexpr (G > 3 && G % 3 == 0) {
    if (RunsShare<G>(cv, 3)) return PartialsRuns<G, 3, T>(p, cv, jobs, out);
  }
  if constexpr (G > 2 && G % 2 == 0) {
    if (RunsShare<G>(cv, 2)) return PartialsRuns<G, 2, T>(p, cv, jobs, out);
  }
  PartialsRuns<G, 1, T>(p, cv, jobs, out);
}

template <int G>
void PartialsG(const AttentionParams& p, const ChunkJob* jobs, AttentionPartial* out) {
  if (p.kv_dtype == DType::kBF16) {
    PartialsGT<G, uint16_t>(p, jobs, out);
  } else {
    PartialsGT<G, float>(p, jobs, out);
  }
}

// Lanes 0..15 of lanes.h's vector: lane i holds *get(i) for i < n, 0 beyond.
template <typename Get>
inline __m512 Lanes16(int32_t n, Get get) {
  return _mm512_insertf32x8(_mm512_castps256_ps512(Lanes8(n, get)), Lanes8(n, get, 1), 1);
}

}  // namespace

void ChunkPartialsAvx512(const AttentionParams& p, const ChunkJob* jobs, int32_t n,
                         AttentionPartial* out) {
  static_assert(kMaxChunkJobs == 8);
  switch (n) {
    case 8:
      return PartialsG<8>(p, jobs, out);
    case 7:
      return PartialsG<7>(p, jobs, out);
    case 6:
      return PartialsG<6>(p, jobs, out);
    case 5:
      return PartialsG<5>(p, jobs, out);
    case 4:
      return PartialsG<4>(p, jobs, out);
    case 3:
      return PartialsG<3>(p, jobs, out);
    case 2:
      return PartialsG<2>(p, jobs, out);
    case 1:
      return PartialsG<1>(p, jobs, out);
    default:
      return;
  }
}

void ChunkPartialAvx512(const AttentionParams& p, const float* q, int32_t kvh,
                        const int32_t* blocks, int32_t position, int32_t chunk,
                        AttentionPartial* out) {
  const ChunkJob job{q, blocks, kvh, position, chunk};
  PartialsG<1>(p, &job, out);
}

// deterministic: MergePartial's operations (attention.cc) in the same order; the element-wise
// o update runs 16 lanes at a time with explicit multiplies and add (no contraction).
void MergePartialAvx512(int32_t head_dim, AttentionPartial* acc, const AttentionPartial& c) {
  const float m = std::max(acc->m, c.m);
  const float a = Exp(acc->m - m);
  const float b = Exp(c.m - m);
  const float la = acc->l * a;
  const float lb = c.l * b;
  acc->l = la + lb;
  const __m512 va = _mm512_set1_ps(a);
  const __m512 vb = _mm512_set1_ps(b);
  for (int32_t d0 = 0; d0 < head_dim; d0 += 16) {
    const __mmask16 dm = Prefix16(head_dim - d0);
    const __m512 oa = _mm512_mul_ps(_mm512_maskz_loadu_ps(dm, acc->o + d0), va);
    const __m512 ob = _mm512_mul_ps(_mm512_maskz_loadu_ps(dm, c.o + d0), vb);
    _mm512_mask_storeu_ps(acc->o + d0, dm, _mm512_add_ps(oa, ob));
  }
  acc->m = m;
}

void MergePartialsAvx512(int32_t head_dim, int32_t n, AttentionPartial* const* acc,
                         const AttentionPartial* c) {
  const __m512 vam = Lanes16(n, [&](int32_t i) { return &acc[i]->m; });
  const __m512 vcm = Lanes16(n, [&](int32_t i) { return &c[i].m; });
  const __m512 val = Lanes16(n, [&](int32_t i) { return &acc[i]->l; });
  const __m512 vcl = Lanes16(n, [&](int32_t i) { return &c[i].l; });
  // std::max(a, b) is (a < b) ? b : a, lane by lane (also for +-0 and NaN).
  const __m512 m = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(vam, vcm, _CMP_LT_OQ), vam, vcm);
  const __m512 a = Exp16(_mm512_sub_ps(vam, m));
  const __m512 b = Exp16(_mm512_sub_ps(vcm, m));
  const __m512 la = _mm512_mul_ps(val, a);
  const __m512 lb = _mm512_mul_ps(vcl, b);
  alignas(64) float mo[16], lo[16], ao[16], bo[16];
  _mm512_store_ps(mo, m);
  _mm512_store_ps(lo, _mm512_add_ps(la, lb));
  _mm512_store_ps(ao, a);
  _mm512_store_ps(bo, b);
  for (int32_t i = 0; i < n; ++i) {
    AttentionPartial* t = acc[i];
    const __m512 va = _mm512_set1_ps(ao[i]);
    const __m512 vb = _mm512_set1_ps(bo[i]);
    for (int32_t d0 = 0; d0 < head_dim; d0 += 16) {
      const __mmask16 dm = Prefix16(head_dim - d0);
      const __m512 oa = _mm512_mul_ps(_mm512_maskz_loadu_ps(dm, t->o + d0), va);
      const __m512 ob = _mm512_mul_ps(_mm512_maskz_loadu_ps(dm, c[i].o + d0), vb);
      _mm512_mask_storeu_ps(t->o + d0, dm, _mm512_add_ps(oa, ob));
    }
    t->l = lo[i];
    t->m = mo[i];
  }
}

}  // namespace bitroll::kernels::internal
