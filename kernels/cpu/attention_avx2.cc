// Attention chunk partials and merge, AVX2: keys 0-7 and 8-15 of a chunk in two registers.
// deterministic: same operations as ChunkPartialScalar, lane j = key j: each score is one fma chain
// over d in order, then one multiply by the scale; each value accumulator o[d] is one fma chain
// over the chunk's keys j in order. Several jobs are computed together only to interleave their
// independent chains; no operation of one job reads another job's values, so every partial has
// the bits of the one-job scalar reference.
#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/attention_internal.h"
#include "kernels/cpu/lanes.h"
#include "kernels/cpu/math_avx2.h"

namespace bitroll::kernels::internal {

static_assert(kAttentionChunk == 16, "the AVX2 attention kernel holds one chunk in two registers");

namespace {
// Lane mask: all ones for lanes < n (n may exceed 8 or be negative).
inline __m256 LaneMask(int32_t n) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx));
}

// 8 K/V elements as fp32 (bf16 widens exactly: its bits are the high half of the fp32 bits).
inline __m256 Load8(const float* p) {
  return _mm256_loadu_ps(p);
}
inline __m256 Load8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline float Load1(const float* p) {
  return *p;
}
inline float Load1(const uint16_t* p) {
  return Bf16ToF32(*p);
}

// Scores, max, exponentials and their sum for G jobs (2G interleaved score chains).
template <int G, typename T>
void ScoresG(const AttentionParams& p, const ChunkView<T>* cv, const ChunkJob* jobs,
             float (*pj)[kAttentionChunk], AttentionPartial* out) {
  const int32_t hd = p.head_dim;
  const int64_t bs = p.block_size;
  __m256 lo[G], hi[G];
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) lo[g] = hi[g] = _mm256_setzero_ps();
  for (int32_t d = 0; d < hd; ++d) {
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      const __m256 qd = _mm256_set1_ps(jobs[g].q[d]);
      const T* k = cv[g].k + d * bs;
      lo[g] = _mm256_fmadd_ps(qd, Load8(k), lo[g]);
      hi[g] = _mm256_fmadd_ps(qd, Load8(k + 8), hi[g]);
    }
  }
  const __m256 scale = _mm256_set1_ps(p.scale);
  const __m256 ninf = _mm256_set1_ps(-__builtin_inff());
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
    const __m256 valid_lo = LaneMask(cv[g].n_valid);
    const __m256 valid_hi = LaneMask(cv[g].n_valid - 8);
    const __m256 s_lo = _mm256_blendv_ps(ninf, _mm256_mul_ps(lo[g], scale), valid_lo);
    const __m256 s_hi = _mm256_blendv_ps(ninf, _mm256_mul_ps(hi[g], scale), valid_hi);
    const float m = ReduceMax16(s_lo, s_hi);
    const __m256 mv = _mm256_set1_ps(m);
    const __m256 e_lo = _mm256_and_ps(Exp8(_mm256_sub_ps(s_lo, mv)), valid_lo);
    const __m256 e_hi = _mm256_and_ps(Exp8(_mm256_sub_ps(s_hi, mv)), valid_hi);
    _mm256_storeu_ps(pj[g], e_lo);
    _mm256_storeu_ps(pj[g] + 8, e_hi);
    out[g].m = m;
    out[g].l = ReduceSum16(e_lo, e_hi);
  }
}

// o[d0, d0 + 8 * NB) of one job: NB independent chains over its keys j in order.
template <int NB, typename T>
void ValuesBlock(int32_t hd, int32_t d0, const ChunkView<T>& c, const float* pj,
                 AttentionPartial* out) {
  __m256 o[NB];
#pragma GCC unroll 8
  for (int b = 0; b < NB; ++b) o[b] = _mm256_setzero_ps();
  for (int32_t j = 0; j < c.n_valid; ++j) {
    const __m256 pb = _mm256_set1_ps(pj[j]);
    const T* v = c.v + static_cast<int64_t>(j) * hd + d0;
#pragma GCC unroll 8
    for (int b = 0; b < NB; ++b) o[b] = _mm256_fmadd_ps(pb, Load8(v + 8 * b), o[b]);
  }
#pragma GCC unroll 8
  for (int b = 0; b < NB; ++b) _mm256_storeu_ps(out->o + d0 + 8 * b, o[b]);
}

template <typename T>
void Values(int32_t hd, const ChunkView<T>& c, const float* pj, AttentionPartial* out) {
  int32_t d0 = 0;
  for (; d0 + 8 <= hd; d0 += 64) {
    switch (std::min<int32_t>(8, (hd - d0) / 8)) {
      case 8:
        ValuesBlock<8, T>(hd, d0, c, pj, out);
        break;
      case 7:
        ValuesBlock<7, T>(hd, d0, c, pj, out);
        break;
      case 6:
        ValuesBlock<6, T>(hd, d0, c, pj, out);
        break;
      case 5:
        ValuesBlock<5, T>(hd, d0, c, pj, out);
        break;
      case 4:
        ValuesBlock<4, T>(hd, d0, c, pj, out);
        break;
      case 3:
        ValuesBlock<3, T>(hd, d0, c, pj, out);
        break;
      case 2:
        ValuesBlock<2, T>(hd, d0, c, pj, out);
        break;
      default:
        ValuesBlock<1, T>(hd, d0, c, pj, out);
        break;
    }
  }
  for (d0 = hd / 8 * 8; d0 < hd; ++d0) {  // head_dim not a multiple of 8: the same chain per lane
    __m128 o = _mm_setzero_ps();
    for (int32_t j = 0; j < c.n_valid; ++j) {
      o = _mm_fmadd_ss(_mm_set_ss(pj[j]), _mm_set_ss(Load1(c.v + j * hd + d0)), o);
    }
    out->o[d0] = _mm_cvtss_f32(o);
  }
}

template <int G, typename T>
void PartialsGT(const AttentionParams& p, const ChunkJob* jobs, AttentionPartial* out) {
  ChunkView<T> cv[G];
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
    cv[g] = ViewChunk<T>(p, jobs[g].kvh, jobs[g].blocks, jobs[g].position, jobs[g].chunk);
  }
  alignas(32) float pj[G][kAttentionChunk];
  ScoresG<G, T>(p, cv, jobs, pj, out);
  for (int g = 0; g < G; ++g) Values(p.head_dim, cv[g], pj[g], out + g);
}

template <int G>
void PartialsG(const AttentionParams& p, const ChunkJob* jobs, AttentionPartial* out) {
  if (p.kv_dtype == DType::kBF16) {
    PartialsGT<G, uint16_t>(p, jobs, out);
  } else {
    PartialsGT<G, float>(p, jobs, out);
  }
}

}  // namespace

void ChunkPartialsAvx2(const AttentionParams& p, const ChunkJob* jobs, int32_t n,
                       AttentionPartial* out) {
  for (int32_t i = 0; i < n; i += 4) {
    switch (std::min<int32_t>(4, n - i)) {
      case 4:
        PartialsG<4>(p, jobs + i, out + i);
        break;
      case 3:
        PartialsG<3>(p, jobs + i, out + i);
        break;
      case 2:
        PartialsG<2>(p, jobs + i, out + i);
        break;
      default:
        PartialsG<1>(p, jobs + i, out + i);
        break;
    }
  }
}

void ChunkPartialAvx2(const AttentionParams& p, const float* q, int32_t kvh, const int32_t* blocks,
                      int32_t position, int32_t chunk, AttentionPartial* out) {
  const ChunkJob job{q, blocks, kvh, position, chunk};
  PartialsG<1>(p, &job, out);
}

// deterministic: MergePartial's operations (attention.cc) in the same order; the element-wise
// o update runs 8 lanes at a time with explicit multiplies and add (no contraction).
namespace {

// o <- o * a + co * b, element by element (explicit multiplies and add: no contraction).
void MergeValues(int32_t head_dim, float* o, const float* co, float a, float b) {
  const __m256 va = _mm256_set1_ps(a);
  const __m256 vb = _mm256_set1_ps(b);
  int32_t d = 0;
  for (; d + 8 <= head_dim; d += 8) {
    const __m256 oa = _mm256_mul_ps(_mm256_loadu_ps(o + d), va);
    const __m256 ob = _mm256_mul_ps(_mm256_loadu_ps(co + d), vb);
    _mm256_storeu_ps(o + d, _mm256_add_ps(oa, ob));
  }
  for (; d < head_dim; ++d) {
    const float oa = o[d] * a;
    const float ob = co[d] * b;
    o[d] = oa + ob;
  }
}

}  // namespace

void MergePartialAvx2(int32_t head_dim, AttentionPartial* acc, const AttentionPartial& c) {
  const float m = std::max(acc->m, c.m);
  const float a = Exp(acc->m - m);
  const float b = Exp(c.m - m);
  const float la = acc->l * a;
  const float lb = c.l * b;
  acc->l = la + lb;
  MergeValues(head_dim, acc->o, c.o, a, b);
  acc->m = m;
}

void MergePartialsAvx2(int32_t head_dim, int32_t n, AttentionPartial* const* acc,
                       const AttentionPartial* c) {
  const __m256 vam = Lanes8(n, [&](int32_t i) { return &acc[i]->m; });
  const __m256 vcm = Lanes8(n, [&](int32_t i) { return &c[i].m; });
  const __m256 val = Lanes8(n, [&](int32_t i) { return &acc[i]->l; });
  const __m256 vcl = Lanes8(n, [&](int32_t i) { return &c[i].l; });
  // std::max(a, b) is (a < b) ? b : a, lane by lane (also for +-0 and NaN).
  const __m256 m = _mm256_blendv_ps(vam, vcm, _mm256_cmp_ps(vam, vcm, _CMP_LT_OQ));
  const __m256 a = Exp8(_mm256_sub_ps(vam, m));
  const __m256 b = Exp8(_mm256_sub_ps(vcm, m));
  const __m256 la = _mm256_mul_ps(val, a);
  const __m256 lb = _mm256_mul_ps(vcl, b);
  alignas(32) float mo[8], lo[8], ao[8], bo[8];
  _mm256_store_ps(mo, m);
  _mm256_store_ps(lo, _mm256_add_ps(la, lb));
  _mm256_store_ps(ao, a);
  _mm256_store_ps(bo, b);
  for (int32_t i = 0; i < n; ++i) {
    MergeValues(head_dim, acc[i]->o, c[i].o, ao[i], bo[i]);
    acc[i]->l = lo[i];
    acc[i]->m = mo[i];
  }
}

}  // namespace bitroll::kernels::internal
