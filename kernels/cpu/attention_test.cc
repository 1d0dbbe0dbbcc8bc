// Attention: single-worker and split-tail kernels, every ISA and thread count, give the reference's
// bits; the result is correct; and a merge in another order is caught (negative control).
#include "kernels/cpu/attention.h"

#include <gtest/gtest.h>

#include "kernels/cpu/attention_internal.h"
#include "kernels/cpu/attention_test_util.h"
#include "kernels/cpu/math.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

namespace bitroll::kernels {
namespace {

using namespace attention_test;  // NOLINT: the shared fixture

const std::vector<Case>& Cases() {
  static const std::vector<Case> cases = {
      {8, 4, 8, 16, {0, 1, 15, 16, 17, 40, 100, 255}},  // stories260K shape
      {12, 12, 64, 16, {3, 31, 32, 33, 200, 511}},      // stories110m shape
      {4, 1, 80, 32, {0, 47, 48, 63, 64, 130}},         // head_dim not a multiple of 16
      {2, 2, 3, 16, {5, 16, 70}},                       // odd head_dim
  };
  return cases;
}

TEST(Attention, EveryKernelIsaAndThreadCountGivesTheReferenceBits) {
  uint32_t seed = 1;
  for (const Case& c : Cases()) {
    Fixture f(c, seed++);
    const std::vector<float> ref = f.Reference();
    ExpectReferenceBits(f, ref, {1, 2, 3, 4}, "head_dim " + std::to_string(c.head_dim));
    for (Isa isa : SupportedIsas()) {
      EXPECT_TRUE(SameBits(ref, f.Run(isa, AttentionKernel::kSplit, nullptr)));
    }
  }
}

// Prefill-shaped calls: consecutive rows of one sequence share a block table, so the single-worker
// kernel groups them (one chunk of several queries at a time); GQA and ragged causal edges too.
TEST(Attention, PrefillRowsOfOneSequenceGiveTheReferenceBits) {
  uint32_t seed = 21;
  for (Case c : {Case{12, 12, 64, 16, {}}, Case{8, 4, 8, 32, {}}, Case{4, 2, 80, 16, {}},
                 Case{2, 2, 3, 16, {}}}) {
    for (int32_t t = 0; t < 70; ++t) c.positions.push_back(t < 37 ? t : t + 90);  // a gap
    Fixture f(c, seed++);
    for (auto& t : f.table_ptrs) t = f.table_ptrs.back();  // one sequence: the longest table
    ExpectReferenceBits(f, f.Reference(), {1, 2, 3}, "head_dim " + std::to_string(c.head_dim));
  }
}

// Decode-shaped calls (every row its own sequence) with at least as many rows as workers: the
// single-worker tasks group a row's heads (12 heads over 4 kv heads: units of the 3 heads of one
// kv head; one query head per kv head: with at least 4 tasks per worker, runs of up to 16 heads,
// so 12 heads in one run and 20 in runs of 10 on 1 and 2 workers, else of up to 8, 12 as 6 and 6
// and 20 as 7, 7 and 6 on 5 workers), and with 5 workers the last units or heads are split-tail
// items, so the row's head run stops before them. fp32 and bf16 caches, every ISA: the
// reference's bits.
TEST(Attention, DecodeRowsWithGroupedHeadsGiveTheReferenceBits) {
  uint32_t seed = 51;
  for (bool bf16 : {false, true}) {
    for (const Case& c : {Case{12, 4, 64, 16, {3, 31, 32, 100, 255, 256, 17, 1, 600}},
                          Case{12, 12, 64, 16, {3, 31, 32, 100, 255, 256, 17, 1, 600}},
                          Case{20, 20, 8, 32, {0, 47, 48, 130, 9}}}) {
      Fixture f(c, seed++);
      if (bf16) f.UseBf16Kv();
      ExpectReferenceBits(f, f.Reference(), {1, 2, 5},
                          "heads " + std::to_string(c.n_heads) + " bf16 " + std::to_string(bf16),
                          {AttentionKernel::kSingle, AttentionKernel::kAuto});
    }
  }
}

// A bf16 KV cache: every ISA, kernel and thread count gives the scalar reference's bits, and those
// are the bits of an fp32 cache holding the same (rounded) values: widening is exact and the order
// is unchanged. Decode-shaped calls and prefill-shaped ones (rows sharing K/V loads).
TEST(Attention, Bf16KvEveryKernelIsaAndThreadCountGivesTheReferenceBits) {
  uint32_t seed = 31;
  std::vector<std::pair<Case, bool>> cases;
  for (const Case& c : Cases()) cases.push_back({c, false});
  for (Case c : {Case{12, 12, 64, 16, {}}, Case{4, 2, 80, 16, {}}, Case{2, 2, 3, 16, {}}}) {
    for (int32_t t = 0; t < 70; ++t) c.positions.push_back(t < 37 ? t : t + 90);
    cases.push_back({c, true});
  }
  for (const auto& [c, one_sequence] : cases) {
    Fixture f(c, seed++);
    if (one_sequence) {
      for (auto& t : f.table_ptrs) t = f.table_ptrs.back();
    }
    const AttentionParams widened = f.UseBf16Kv();
    const std::vector<float> ref = f.Reference();
    {
      std::vector<float> out(f.q.size(), -1.0f);
      AttentionParams pp = widened;
      pp.out = out.data();
      AttentionReference(pp);
      EXPECT_TRUE(SameBits(ref, out)) << "bf16 cache vs fp32 cache of the same values";
    }
    ExpectReferenceBits(f, ref, {1, 2, 3}, "bf16 kv, head_dim " + std::to_string(c.head_dim));
    if (one_sequence) continue;  // Naive() reads each row's own table
    const std::vector<float> got = f.Run(BestIsa(), AttentionKernel::kAuto, nullptr);
    const std::vector<double> want = f.Naive();
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 2e-5 * (1.0 + std::fabs(want[i]))) << i;
    }
  }
}

// Negative control for the bf16 cache: rounding K/V to bf16 changes the output bits (which is why
// a bf16 cache is its own numerics fingerprint), so the memcmp checks above can tell them apart.
TEST(Attention, NegativeControlBf16KvChangesBits) {
  Fixture f(Cases()[1], 41);
  const std::vector<float> fp32 = f.Run(BestIsa(), AttentionKernel::kAuto, nullptr);
  f.UseBf16Kv();
  EXPECT_FALSE(SameBits(fp32, f.Run(BestIsa(), AttentionKernel::kAuto, nullptr)));
}

// The lane-parallel merge of independent rows (AVX-512 and AVX2 prefill groups) against
// MergePartial one at a time, including equal maxima, +-0, a far smaller maximum (Exp underflows
// to 0) and -inf.
void CheckLaneParallelMerge(Isa isa) {
  const int32_t lanes = isa == Isa::kAvx512 ? 16 : 8;
  std::mt19937 rng(17);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  const float specials[] = {0.0f,    -0.0f,  1.0f,
                            -200.0f, 150.0f, -std::numeric_limits<float>::infinity()};
  for (int32_t head_dim : {3, 8, 64, 80}) {
    for (int32_t n = 1; n <= lanes; ++n) {
      std::vector<AttentionPartial> acc(n), c(n);
      for (int32_t i = 0; i < n; ++i) {
        for (AttentionPartial* x : {&acc[i], &c[i]}) {
          x->m = (rng() % 3 == 0) ? specials[rng() % 6] : nd(rng);
          x->l = std::fabs(nd(rng)) + 1.0f;
          for (int32_t d = 0; d < head_dim; ++d) x->o[d] = nd(rng);
        }
        if (rng() % 4 == 0) c[i].m = acc[i].m;  // equal maxima
      }
      std::vector<AttentionPartial> want = acc;
      for (int32_t i = 0; i < n; ++i) MergePartial(Isa::kScalar, head_dim, &want[i], c[i]);
      std::vector<AttentionPartial*> targets;
      for (auto& a : acc) targets.push_back(&a);
      if (isa == Isa::kAvx512) {
        internal::MergePartialsAvx512(head_dim, n, targets.data(), c.data());
      } else {
        internal::MergePartialsAvx2(head_dim, n, targets.data(), c.data());
      }
      for (int32_t i = 0; i < n; ++i) {
        EXPECT_EQ(0, std::memcmp(&want[i], &acc[i], 2 * sizeof(float) + head_dim * sizeof(float)))
            << IsaName(isa) << " head_dim " << head_dim << " n " << n << " row " << i;
      }
    }
  }
}

TEST(Attention, LaneParallelMergeGivesMergePartialBits) {
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    if (!IsaSupported(isa)) {
      std::cerr << "*** attention_test: no " << IsaName(isa)
                << "; its lane-parallel merge is NOT tested ***\n";
      continue;
    }
    CheckLaneParallelMerge(isa);
  }
}

// Each row alone on 3 workers runs one task per head, whose query walks its chunks alone (and
// prefetches the next batch of them): fp32 and bf16 caches.
TEST(Attention, ResultDoesNotDependOnOtherRowsInTheCall) {
  Case c = Cases()[1];
  for (bool bf16 : {false, true}) {
    Fixture all(c, 7);
    if (bf16) all.UseBf16Kv();
    const std::vector<float> together = all.Run(BestIsa(), AttentionKernel::kAuto, nullptr);
    const int64_t row = int64_t{c.n_heads} * c.head_dim;
    for (size_t t = 0; t < c.positions.size(); ++t) {
      AttentionParams p = all.p;
      p.n_tokens = 1;
      p.q = all.q.data() + t * row;
      p.positions = &c.positions[t];
      p.block_tables = &all.table_ptrs[t];
      std::vector<float> out(row);
      p.out = out.data();
      ThreadPool pool(3);
      Attention(BestIsa(), p, AttentionKernel::kAuto, &pool, nullptr);
      EXPECT_EQ(0, std::memcmp(out.data(), together.data() + t * row, row * sizeof(float)))
          << t << " bf16 " << bf16;
    }
  }
}

TEST(Attention, MatchesDoublePrecisionAttention) {
  uint32_t seed = 11;
  for (const Case& c : Cases()) {
    Fixture f(c, seed++);
    const std::vector<float> got = f.Run(BestIsa(), AttentionKernel::kAuto, nullptr);
    const std::vector<double> want = f.Naive();
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 2e-5 * (1.0 + std::fabs(want[i]))) << i;
    }
  }
}

// Negative control: the same partials merged as a balanced tree (a natural "parallel" merge)
// instead of strictly left to right. The memcmp checks above must be able to see the difference.
TEST(Attention, NegativeControlTreeMergeChangesBits) {
  Case c{12, 12, 64, 16, {511, 400, 300}};
  Fixture f(c, 5);
  const std::vector<float> ref = f.Reference();
  std::vector<float> tree(ref.size());
  for (size_t t = 0; t < c.positions.size(); ++t) {
    for (int32_t h = 0; h < c.n_heads; ++h) {
      const int32_t n = c.positions[t] / kAttentionChunk + 1;
      std::vector<AttentionPartial> parts(n);
      for (int32_t ch = 0; ch < n; ++ch) {
        ChunkPartial(Isa::kScalar, f.p, f.q.data() + (t * c.n_heads + h) * c.head_dim, h,
                     f.table_ptrs[t], c.positions[t], ch, &parts[ch]);
      }
      for (int32_t w = 1; w < n; w *= 2) {
        for (int32_t i = 0; i + w < n; i += 2 * w)
          MergePartial(Isa::kScalar, c.head_dim, &parts[i], parts[i + w]);
      }
      FinishPartial(Isa::kScalar, c.head_dim, parts[0],
                    tree.data() + (t * c.n_heads + h) * c.head_dim);
    }
  }
  EXPECT_FALSE(SameBits(ref, tree))
      << "a tree-ordered merge should not reproduce the canonical bits";
  // ... while still being a correct attention (it is only the order that differs).
  const std::vector<double> want = f.Naive();
  for (size_t i = 0; i < tree.size(); ++i)
    ASSERT_NEAR(tree[i], want[i], 2e-5 * (1 + std::fabs(want[i])));
}

// ---- sliding window and sinks ----

namespace window {

// Naive windowed attention with sinks in double precision.
std::vector<double> Naive(Fixture& f, int32_t window, const std::vector<float>& sinks) {
  const Case& c = f.c;
  std::vector<double> out(f.q.size());
  for (size_t t = 0; t < c.positions.size(); ++t) {
    const int32_t pos = c.positions[t], lo = window > 0 ? std::max(0, pos - window + 1) : 0;
    for (int32_t h = 0; h < c.n_heads; ++h) {
      const int32_t kvh = h / (c.n_heads / c.n_kv_heads);
      const float* qv = f.q.data() + (t * c.n_heads + h) * c.head_dim;
      std::vector<double> s(pos + 1, 0.0);
      double m = sinks.empty() ? -1e300 : sinks[h];
      for (int32_t j = lo; j <= pos; ++j) {
        const int64_t blk = f.tables[t][j / c.block_size], slot = j % c.block_size;
        const float* kb = f.k.data() + (blk * c.n_kv_heads + kvh) * c.head_dim * c.block_size;
        double acc = 0;
        for (int32_t d = 0; d < c.head_dim; ++d) acc += double(qv[d]) * kb[d * c.block_size + slot];
        s[j] = acc / std::sqrt(double(c.head_dim));
        m = std::max(m, s[j]);
      }
      double l = sinks.empty() ? 0.0 : std::exp(sinks[h] - m);
      for (int32_t j = lo; j <= pos; ++j) l += (s[j] = std::exp(s[j] - m));
      for (int32_t d = 0; d < c.head_dim; ++d) {
        double acc = 0;
        for (int32_t j = lo; j <= pos; ++j) {
          const int64_t blk = f.tables[t][j / c.block_size], slot = j % c.block_size;
          const float* vb = f.v.data() + (blk * c.n_kv_heads + kvh) * c.head_dim * c.block_size;
          acc += s[j] * vb[slot * c.head_dim + d];
        }
        out[(t * c.n_heads + h) * c.head_dim + d] = acc / l;
      }
    }
  }
  return out;
}

// One prefill-shaped sequence (rows 0..n-1 share the longest table) and windows that are not
// multiples of the chunk, so windows start inside chunks and span chunk boundaries.
Case PrefillCase(int32_t n_heads, int32_t n_kv, int32_t hd, int32_t bs, int32_t n) {
  Case c{n_heads, n_kv, hd, bs, {}};
  for (int32_t t = 0; t < n; ++t) c.positions.push_back(t);
  return c;
}

}  // namespace window

// ---- the AVX-512 prefill tile, called directly ----

// Rows first .. first + n - 1 of f's call through the tile (every head), written into `out`.
void RunTile(Fixture& f, int32_t first, int32_t n, bool fused_break, std::vector<float>* out) {
  AttentionParams pp = f.p;
  pp.out = out->data();
  for (int32_t h = 0; h < f.c.n_heads; ++h) {
    if (fused_break) {
      internal::AttentionTileAvx512FusedForTest(pp, first, n, h);
    } else {
      internal::AttentionTileAvx512(pp, first, n, h);
    }
  }
}

bool SameRows(const Fixture& f, const std::vector<float>& a, const std::vector<float>& b,
              int32_t first, int32_t n) {
  const int64_t row = int64_t{f.c.n_heads} * f.c.head_dim;
  return std::memcmp(a.data() + first * row, b.data() + first * row, n * row * sizeof(float)) == 0;
}

// Groups of every size class up to kTileRows (one tile, several tiles walking the chunks in
// lockstep, a last tile of 1 row), rows whose chunk counts sit around the tile's span of 8 chunks
// (7, 8, 9, 16, 17, ...), head dims that are not multiples of its 8-wide blocks of d or of its
// 16 x 16 transposes, GQA, blocks of 16 and 32 keys, sinks, positions with a gap, fp32 and bf16
// pools (a bf16 pool's spans are widened before the tile reads them): every row has the
// reference's bits.
TEST(AttentionTile, EveryGroupGivesTheReferenceBits) {
  if (!IsaSupported(Isa::kAvx512)) {
    std::cerr << "*** attention_test: no avx512; the prefill tile is NOT tested ***\n";
    return;
  }
  uint32_t seed = 201;
  for (Case c : {Case{4, 2, 64, 16, {}}, Case{2, 1, 20, 32, {}}, Case{2, 2, 3, 16, {}},
                 Case{3, 3, 40, 16, {}}}) {
    for (auto [gap, bf16] : {std::pair{false, false}, {true, false}, {false, true}, {true, true}}) {
      c.positions.clear();
      for (int32_t t = 0; t < 300; ++t) c.positions.push_back(gap && t >= 130 ? t + 77 : t);
      Fixture f(c, seed++);
      for (auto& t : f.table_ptrs) t = f.table_ptrs.back();  // one sequence
      if (bf16) f.UseBf16Kv();
      for (bool sinks : {false, true}) {
        const std::vector<float> sk = Sinks(c.n_heads, seed);
        f.p.sinks = sinks ? sk.data() : nullptr;
        const std::vector<float> ref = f.Reference();
        for (int32_t first : {0, 100, 111, 128, 236}) {
          for (int32_t n : {1, 4, 15, 16, 17, 31, 33, 48, 63, 64}) {
            if (first + n > 300) continue;
            std::vector<float> out(ref.size(), -1.0f);
            RunTile(f, first, n, false, &out);
            EXPECT_TRUE(SameRows(f, ref, out, first, n))
                << "rows " << first << ".." << first + n - 1 << " head_dim " << c.head_dim
                << " block " << c.block_size << " sinks " << sinks << " gap " << gap << " bf16 "
                << bf16;
          }
        }
      }
    }
  }
}

// Sliding windows through the tile: W from 1 key to more than a span of chunks, not multiples
// of the chunk (so windows start inside chunks and lanes of one tile start at different chunks),
// with and without sinks, windows anchored at the positions or (the test anchor) a few keys
// before them, groups of every size class from rows 0 and deep into a long sequence (the tiles
// start their walk past chunk 0), fp32 and bf16 pools: every row has the reference's bits.
TEST(AttentionTile, WindowedGroupsGiveTheReferenceBits) {
  if (!IsaSupported(Isa::kAvx512)) {
    std::cerr << "*** attention_test: no avx512; the windowed prefill tile is NOT tested ***\n";
    return;
  }
  uint32_t seed = 301;
  constexpr int32_t kRows = 600;
  for (Case c : {Case{4, 2, 64, 16, {}}, Case{2, 1, 20, 32, {}}, Case{2, 2, 3, 16, {}}}) {
    for (bool bf16 : {false, true}) {
      c.positions.clear();
      for (int32_t t = 0; t < kRows; ++t) c.positions.push_back(t);
      Fixture f(c, seed++);
      for (auto& t : f.table_ptrs) t = f.table_ptrs.back();  // one sequence
      if (bf16) f.UseBf16Kv();
      std::vector<int32_t> anchor(kRows);
      for (int32_t t = 0; t < kRows; ++t) anchor[t] = std::max(0, t - t % 5);
      const std::vector<float> sk = Sinks(c.n_heads, seed);
      for (int32_t w : {1, 8, 20, 37, 64, 200}) {
        for (bool sinks : {false, true}) {
          for (bool anchored : {false, true}) {
            f.p.window = w;
            f.p.sinks = sinks ? sk.data() : nullptr;
            f.p.test_window_anchor = anchored ? anchor.data() : nullptr;
            const std::vector<float> ref = f.Reference();
            for (int32_t first : {0, 3, 111, 236, 517, 536}) {
              for (int32_t n : {1, 4, 15, 16, 17, 33, 48, 63, 64}) {
                if (first + n > kRows) continue;
                std::vector<float> out(ref.size(), -1.0f);
                RunTile(f, first, n, false, &out);
                EXPECT_TRUE(SameRows(f, ref, out, first, n))
                    << "rows " << first << ".." << first + n - 1 << " W " << w << " head_dim "
                    << c.head_dim << " block " << c.block_size << " sinks " << sinks << " anchored "
                    << anchored << " bf16 " << bf16;
              }
            }
          }
        }
      }
      f.p.window = 0;
      f.p.sinks = nullptr;
      f.p.test_window_anchor = nullptr;
    }
  }
}

// A key just before some lanes' windows, in a chunk that the tile walks for other lanes, holds an
// infinite value: the lanes whose window excludes it must not touch it (the scalar loop skips
// it), so their rows keep the reference's (finite) bits. Plain fmas with p = 0 there would give
// 0 * inf = NaN: the tile's unmasked fast path must not run on a chunk where a window starts.
TEST(AttentionTile, KeysBeforeAWindowDoNotReachItsRows) {
  if (!IsaSupported(Isa::kAvx512)) {
    std::cerr << "*** attention_test: no avx512; the windowed prefill tile is NOT tested ***\n";
    return;
  }
  Case c{4, 2, 64, 16, {}};
  for (int32_t t = 0; t < 400; ++t) c.positions.push_back(t);
  Fixture f(c, 221);
  for (auto& t : f.table_ptrs) t = f.table_ptrs.back();
  constexpr int32_t kKey = 250, kW = 37;  // in the windows of rows 250 .. 286 only
  const int64_t blk = f.tables.back()[kKey / c.block_size], slot = kKey % c.block_size;
  for (int32_t kvh = 0; kvh < c.n_kv_heads; ++kvh) {
    float* v = f.v.data() + (blk * c.n_kv_heads + kvh) * c.head_dim * c.block_size;
    for (int32_t d = 0; d < c.head_dim; ++d) {
      v[slot * c.head_dim + d] = std::numeric_limits<float>::infinity();
    }
  }
  f.p.window = kW;
  const std::vector<float> sk = Sinks(c.n_heads, 223);
  for (bool sinks : {false, true}) {
    f.p.sinks = sinks ? sk.data() : nullptr;
    const std::vector<float> ref = f.Reference();
    std::vector<float> out(ref.size(), -1.0f);
    RunTile(f, 280, 64, false, &out);  // rows 280 .. 286 see the key, 287 .. 343 do not
    EXPECT_TRUE(SameRows(f, ref, out, kKey + kW, 344 - kKey - kW)) << "sinks " << sinks;
    const int64_t row = int64_t{c.n_heads} * c.head_dim;
    for (int64_t i = (kKey + kW) * row; i < 344 * row; ++i) {
      ASSERT_TRUE(std::isfinite(ref[i])) << i;
    }
  }
}

// Negative control for the tile: its o update o * a + o_c * b done as one fma (o_c * b not
// rounded on its own) instead of two multiplies and an add. The memcmp checks above must see it,
// while the result is still attention (only the rounding differs). Full attention (window 0)
// and a sliding window (W = 37, deep in the sequence): the tile's two instantiations.
TEST(AttentionTile, NegativeControlFusedOUpdateChangesBits) {
  if (!IsaSupported(Isa::kAvx512)) {
    std::cerr << "*** attention_test: no avx512; the tile's negative control is NOT run ***\n";
    return;
  }
  for (int32_t window : {0, 37}) {
    Case c{4, 2, 64, 16, {}};
    for (int32_t t = 0; t < 300; ++t) c.positions.push_back(t);
    Fixture f(c, window == 0 ? 211 : 213);
    for (auto& t : f.table_ptrs) t = f.table_ptrs.back();
    f.p.window = window;
    const std::vector<float> ref = f.Reference();
    std::vector<float> good(ref.size(), -1.0f), broken(ref.size(), -1.0f);
    RunTile(f, 236, 64, false, &good);
    RunTile(f, 236, 64, true, &broken);
    EXPECT_TRUE(SameRows(f, ref, good, 236, 64)) << "window " << window;
    EXPECT_FALSE(SameRows(f, ref, broken, 236, 64))
        << "a fused o update should not reproduce the canonical bits, window " << window;
    const int64_t row = int64_t{c.n_heads} * c.head_dim;
    for (int64_t i = 236 * row; i < 300 * row; ++i) {
      ASSERT_NEAR(broken[i], ref[i], 1e-5 * (1 + std::fabs(ref[i]))) << i << " window " << window;
    }
  }
}

TEST(AttentionWindow, EveryKernelIsaThreadCountAndDtypeGivesTheReferenceBits) {
  uint32_t seed = 71;
  for (bool prefill : {false, true}) {
    for (bool bf16 : {false, true}) {
      Case c = prefill ? window::PrefillCase(4, 2, 24, 32, 90)
                       : Case{8, 4, 8, 16, {0, 5, 7, 8, 9, 16, 23, 40, 77, 100, 255}};
      Fixture f(c, seed++);
      if (prefill) {
        for (auto& t : f.table_ptrs) t = f.table_ptrs.back();
      }
      if (bf16) f.UseBf16Kv();
      for (int32_t w : {0, 1, 8, 20, 37}) {  // 0: full; prefill rows: the AVX-512 tile at any W
        for (bool sinks : {false, true}) {
          const std::vector<float> sk = Sinks(c.n_heads, seed + w);
          f.p.window = w;
          f.p.sinks = sinks ? sk.data() : nullptr;
          const std::vector<float> ref = f.Reference();
          ExpectReferenceBits(f, ref, {1, 3},
                              "W " + std::to_string(w) + " sinks " + std::to_string(sinks) +
                                  " bf16 " + std::to_string(bf16) + " prefill " +
                                  std::to_string(prefill));
        }
      }
    }
  }
}

// Every row of f's call, computed in calls of other rows (cut at several starts and lengths),
// has the bits it has in the whole call.
void CheckRowsAlone(Fixture& f) {
  ThreadPool pool(2);
  const std::vector<float> whole = f.Run(BestIsa(), AttentionKernel::kAuto, &pool);
  const int64_t row = int64_t{f.c.n_heads} * f.c.head_dim;
  for (int32_t start : {0, 9, 21, 33, 47}) {
    for (int32_t len : {1, 5, 13, 16, 23}) {
      if (start + len > 70) continue;
      AttentionParams pp = f.p;
      pp.n_tokens = len;
      pp.q = f.q.data() + start * row;
      pp.positions = f.c.positions.data() + start;
      pp.block_tables = f.table_ptrs.data() + start;
      std::vector<float> out(len * row);
      pp.out = out.data();
      Attention(BestIsa(), pp, AttentionKernel::kAuto, &pool, nullptr);
      EXPECT_EQ(0, std::memcmp(out.data(), whole.data() + start * row, out.size() * 4))
          << "rows " << start << ".." << start + len - 1 << " window " << f.p.window;
    }
  }
}

// A row's bits do not depend on which rows share the call (chunked prefill cut anywhere).
TEST(AttentionWindow, RowDoesNotDependOnTheCallsOtherRows) {
  Fixture f(window::PrefillCase(4, 2, 16, 16, 70), 81);
  for (auto& t : f.table_ptrs) t = f.table_ptrs.back();
  const std::vector<float> sk = Sinks(4, 5);
  for (int32_t w : {20, 0}) {  // 0: full attention; both run in AVX-512 tiles of 16 cut anywhere
    f.p.window = w;
    f.p.sinks = sk.data();
    CheckRowsAlone(f);
  }
}

TEST(AttentionWindow, MatchesDoublePrecisionWindowedAttentionWithSinks) {
  Fixture f(window::PrefillCase(4, 2, 32, 16, 80), 91);
  for (auto& t : f.table_ptrs) t = f.table_ptrs.back();
  for (auto& t : f.tables) t = f.tables.back();
  for (int32_t w : {8, 20}) {
    for (bool sinks : {false, true}) {
      const std::vector<float> sk = sinks ? Sinks(4, 7) : std::vector<float>{};
      f.p.window = w;
      f.p.sinks = sinks ? sk.data() : nullptr;
      const std::vector<float> got = f.Reference();
      const std::vector<double> want = window::Naive(f, w, sk);
      double worst = 0;
      for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
      EXPECT_LT(worst, 1e-5) << "W " << w << " sinks " << sinks;
      // Control: the full-attention truth is far away (the window matters).
      const std::vector<double> full = window::Naive(f, 0, sk);
      double diff = 0;
      for (size_t i = 0; i < got.size(); ++i) diff = std::max(diff, std::abs(got[i] - full[i]));
      EXPECT_GT(diff, 1e-2) << "W " << w;
    }
  }
}

// Negative control: a window edge anchored at the first row of the call (the prefill chunk's
// start) instead of each query's own position changes the bits of a chunked prefill.
TEST(AttentionWindow, NegativeControlWindowAnchoredAtCallStartChangesBits) {
  Fixture f(window::PrefillCase(4, 2, 16, 16, 64), 101);
  for (auto& t : f.table_ptrs) t = f.table_ptrs.back();
  f.p.window = 20;
  const std::vector<float> ref = f.Reference();
  std::vector<int32_t> anchor(64, 0);  // one call: every row anchored at position 0
  f.p.test_window_anchor = anchor.data();
  EXPECT_FALSE(SameBits(ref, f.Run(BestIsa(), AttentionKernel::kAuto, nullptr)));
}

}  // namespace
}  // namespace bitroll::kernels
