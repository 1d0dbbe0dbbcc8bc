// Sibling decode rows (GRPO samples of one prompt: rows of different sequences whose leading
// blocks are the same block ids) run one head of the group per task, walking the shared chunks
// together (AVX-512: in the prefill tile, which leaves each row's running state for the row's own
// chunks to continue from). Every ISA, kernel and thread count gives the reference's bits; the
// grouping really ran; the tile's shared-chunk states are the walk's running states; and a tile
// with another o update is caught (negative control).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_internal.h"
#include "kernels/cpu/attention_test_util.h"

namespace bitroll::kernels {
namespace {

using namespace attention_test;  // NOLINT: the shared fixture

// Rows in groups: row t's group is group[t] (-1: alone); a group's rows take the first
// shared_blocks[g] block ids of its first row's table (as many as each row's table holds).
void MakeSiblings(Fixture* f, const std::vector<int32_t>& group,
                  const std::vector<int32_t>& shared_blocks) {
  std::vector<int32_t> leader(shared_blocks.size(), -1);
  for (size_t t = 0; t < group.size(); ++t) {
    const int32_t g = group[t];
    if (g < 0) continue;
    if (leader[g] < 0) {
      leader[g] = static_cast<int32_t>(t);
      continue;
    }
    std::vector<int32_t>& table = f->tables[t];
    const std::vector<int32_t>& lead = f->tables[leader[g]];
    const size_t n = std::min({table.size(), lead.size(), static_cast<size_t>(shared_blocks[g])});
    for (size_t b = 0; b < n; ++b) table[b] = lead[b];
  }
}

struct SiblingCase {
  Case c;
  std::vector<int32_t> group, shared_blocks;
};

// Groups larger than a tile (20 rows: two tiles in lockstep), of exactly the tile's minimum (4),
// below it (3, 2: no tile), siblings whose positions end inside the shared blocks (the shared
// run stops at the shortest row's last full chunk), a row alone, GQA, head dims that are not
// multiples of 16, blocks of 16 and 32 keys.
std::vector<SiblingCase> SiblingCases() {
  std::vector<SiblingCase> cases;
  {
    SiblingCase s{{12, 12, 64, 16, {}}, {}, {18, 2, 1}};
    for (int32_t i = 0; i < 20; ++i) {  // group 0: 288 shared tokens, rows 300 .. 357
      s.c.positions.push_back(300 + 3 * i);
      s.group.push_back(0);
    }
    for (int32_t i = 0; i < 4; ++i) {  // group 1: 2 shared blocks, one row ends inside them
      s.c.positions.push_back(i == 2 ? 20 : 40 + 7 * i);
      s.group.push_back(1);
    }
    for (int32_t i = 0; i < 3; ++i) {  // group 2: 3 rows, 1 shared block
      s.c.positions.push_back(16 + 5 * i);
      s.group.push_back(2);
    }
    s.c.positions.push_back(77);  // alone
    s.group.push_back(-1);
    cases.push_back(s);
  }
  {
    SiblingCase s{{8, 2, 80, 32, {}}, {}, {5, 3}};
    for (int32_t i = 0; i < 9; ++i) {  // group 0: 160 shared tokens
      s.c.positions.push_back(i == 4 ? 150 : 170 + 11 * i);
      s.group.push_back(0);
    }
    for (int32_t i = 0; i < 2; ++i) {  // group 1: 2 rows
      s.c.positions.push_back(100 + i);
      s.group.push_back(1);
    }
    cases.push_back(s);
  }
  {
    SiblingCase s{{2, 2, 3, 16, {}}, {}, {4}};
    for (int32_t i = 0; i < 6; ++i) {
      s.c.positions.push_back(63 + i);
      s.group.push_back(0);
    }
    cases.push_back(s);
  }
  return cases;
}

// Calls fn(f, bf16, sinks) on the case's siblings over fp32 and bf16 pools, without and with sinks
// (f.p.sinks set accordingly). Fixture seeds count up from *seed.
void ForEachPoolAndSinks(const SiblingCase& sc, uint32_t* seed,
                         const std::function<void(Fixture& f, bool bf16, bool sinks)>& fn) {
  for (bool bf16 : {false, true}) {
    Fixture f(sc.c, (*seed)++);
    MakeSiblings(&f, sc.group, sc.shared_blocks);
    if (bf16) f.UseBf16Kv();
    const std::vector<float> sk = Sinks(sc.c.n_heads, *seed);
    for (bool sinks : {false, true}) {
      f.p.sinks = sinks ? sk.data() : nullptr;
      fn(f, bf16, sinks);
    }
  }
}

TEST(AttentionSiblings, EveryKernelIsaThreadCountAndDtypeGivesTheReferenceBits) {
  uint32_t seed = 401;
  for (const SiblingCase& sc : SiblingCases()) {
    ForEachPoolAndSinks(sc, &seed, [&](Fixture& f, bool bf16, bool sinks) {
      ExpectReferenceBits(f, f.Reference(), {1, 2, 3, 5},
                          "heads " + std::to_string(sc.c.n_heads) + " bf16 " +
                              std::to_string(bf16) + " sinks " + std::to_string(sinks));
    });
  }
}

// The grouping ran: the call's sibling rows are the grouped rows, group by group (not the row
// alone), and a call where no two rows share a block has none.
TEST(AttentionSiblings, GroupsAreTheRowsThatShareTheirFirstBlock) {
  const SiblingCase sc = SiblingCases()[0];
  Fixture f(sc.c, 409);
  std::vector<float> out(f.q.size());
  AttentionParams p = f.p;
  p.out = out.data();
  AttentionScratch scratch;
  Attention(BestIsa(), p, AttentionKernel::kSingle, nullptr, &scratch);
  EXPECT_TRUE(scratch.siblings.rows.empty()) << "no shared blocks yet";
  MakeSiblings(&f, sc.group, sc.shared_blocks);
  Attention(BestIsa(), p, AttentionKernel::kSingle, nullptr, &scratch);
  std::vector<int32_t> rows = scratch.siblings.rows;
  std::sort(rows.begin(), rows.end());
  std::vector<int32_t> want;
  for (size_t t = 0; t < sc.group.size(); ++t) {
    if (sc.group[t] >= 0) want.push_back(static_cast<int32_t>(t));
  }
  EXPECT_EQ(rows, want);
}

// A system prompt common to several prompts (4 blocks, in every row's table), two GRPO groups of 8
// samples with 6 more blocks each, 3 rows that share only the system prompt and 2 rows that
// share nothing: the groups are the two GRPO groups and the 3 rows (which save 8 of 21 chunk
// reads), not one group of the 19 rows on the 4 blocks they all share. Every ISA, kernel and
// thread count gives the reference's bits.
TEST(AttentionSiblings, RowsThatShareMoreGroupOnTheirOwn) {
  Case c{4, 2, 16, 16, {}};
  for (int32_t i = 0; i < 16; ++i) c.positions.push_back(200 + i);
  for (int32_t i = 0; i < 3; ++i) c.positions.push_back(100 + i);
  c.positions.push_back(150);
  c.positions.push_back(151);
  Fixture f(c, 417);
  for (int32_t t = 1; t < 19; ++t) {
    for (int32_t b = 0; b < 10; ++b) {
      const int32_t leader = b < 4 || t >= 16 ? 0 : t / 8 * 8;
      if (b < 4 || t < 16) f.tables[t][b] = f.tables[leader][b];
    }
  }
  std::vector<float> out(f.q.size());
  AttentionParams p = f.p;
  p.out = out.data();
  AttentionScratch scratch;
  Attention(BestIsa(), p, AttentionKernel::kAuto, nullptr, &scratch);
  std::vector<std::vector<int32_t>> groups;
  const AttentionScratch::SiblingGroups& sg = scratch.siblings;
  for (size_t g = 0; g + 1 < sg.begin.size(); ++g) {
    groups.emplace_back(sg.rows.begin() + sg.begin[g], sg.rows.begin() + sg.begin[g + 1]);
    std::sort(groups.back().begin(), groups.back().end());
  }
  std::sort(groups.begin(), groups.end());
  const std::vector<std::vector<int32_t>> want = {
      {0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}, {16, 17, 18}};
  EXPECT_EQ(groups, want);
  const std::vector<float> ref = f.Reference();
  for (Isa isa : SupportedIsas()) {
    for (int threads : {1, 2, 3}) {
      ThreadPool pool(threads);
      for (AttentionKernel k : {AttentionKernel::kSingle, AttentionKernel::kAuto}) {
        EXPECT_TRUE(SameBits(ref, f.Run(isa, k, &pool)))
            << "isa " << IsaName(isa) << " threads " << threads << " kernel "
            << AttentionKernelName(k);
      }
    }
  }
}

// Random decode batches against the reference: 2-40 rows in up to 3 prompts under an optional
// system prompt (nested sharing), some rows sharing nothing, random positions past the shared
// blocks or inside them, GQA or not, fp32 or bf16, sinks or not, 1-4 threads, auto or single.
TEST(AttentionSiblings, RandomBatchesGiveTheReferenceBits) {
  std::mt19937 rng(419);
  auto uniform = [&](int32_t lo, int32_t hi) {
    return std::uniform_int_distribution<int32_t>(lo, hi)(rng);
  };
  int32_t grouped_calls = 0;
  for (int iter = 0; iter < 40; ++iter) {
    const int32_t heads = uniform(0, 1) ? 8 : 4, kv = heads / (uniform(0, 1) ? 1 : 4);
    Case c{heads, kv, uniform(0, 1) ? 16 : 40, uniform(0, 1) ? 16 : 32, {}};
    const int32_t rows = uniform(2, 40), system = uniform(0, 3), prompts = uniform(1, 3);
    std::vector<int32_t> prompt_of(rows), own(prompts);
    for (int32_t& b : own) b = uniform(0, 6);
    for (int32_t t = 0; t < rows; ++t) {
      prompt_of[t] = uniform(0, 5) == 0 ? -1 : uniform(0, prompts - 1);  // -1: shares nothing
      c.positions.push_back(uniform(0, 9) == 0 ? uniform(0, 40) : uniform(20, 300));
    }
    Fixture f(c, 500 + iter);
    // Row t takes blocks [0, system) from row 0's table (if it shares at all) and blocks
    // [system, system + own[prompt]) from its prompt's first row's table.
    std::vector<int32_t> leader(prompts, -1);
    for (int32_t t = 0; t < rows; ++t) {
      const int32_t g = prompt_of[t];
      if (g < 0) continue;
      if (leader[g] < 0) leader[g] = t;
      std::vector<int32_t>& table = f.tables[t];
      for (int32_t b = 0; b < static_cast<int32_t>(table.size()); ++b) {
        const int32_t from = b < system && prompt_of[0] >= 0      ? 0
                             : b >= system && b < system + own[g] ? leader[g]
                                                                  : -1;
        if (from >= 0 && from != t && b < static_cast<int32_t>(f.tables[from].size())) {
          table[b] = f.tables[from][b];
        }
      }
    }
    if (uniform(0, 1)) f.UseBf16Kv();
    const std::vector<float> sk = Sinks(heads, 600 + iter);
    if (uniform(0, 1)) f.p.sinks = sk.data();
    const std::vector<float> ref = f.Reference();
    ThreadPool pool(uniform(1, 4));
    const AttentionKernel kernel =
        uniform(0, 1) ? AttentionKernel::kAuto : AttentionKernel::kSingle;
    std::vector<float> out(f.q.size(), -1.0f);
    AttentionParams p = f.p;
    p.out = out.data();
    AttentionScratch scratch;
    Attention(BestIsa(), p, kernel, &pool, &scratch);
    grouped_calls += scratch.siblings.rows.empty() ? 0 : 1;
    EXPECT_TRUE(SameBits(ref, out)) << "iteration " << iter << " rows " << rows << " heads "
                                    << heads << "/" << kv << " threads " << pool.size();
  }
  EXPECT_GE(grouped_calls, 20) << "most random batches should form sibling groups";
}

// Rows that share too little of their chunks run alone (their own chunks walk faster with their
// heads together): 4 rows at positions 1,000-1,003 sharing 1 block save 3 of 252 chunk reads and
// are not grouped; sharing 40 blocks they are. The bits are the reference's either way.
TEST(AttentionSiblings, RowsGroupOnlyWhereTheSharedChunksPayOff) {
  for (int32_t shared_blocks : {1, 40}) {
    Fixture f(Case{4, 2, 16, 16, {1000, 1001, 1002, 1003}}, 415);
    MakeSiblings(&f, {0, 0, 0, 0}, {shared_blocks});
    const std::vector<float> ref = f.Reference();
    std::vector<float> out(f.q.size());
    AttentionParams p = f.p;
    p.out = out.data();
    AttentionScratch scratch;
    for (Isa isa : SupportedIsas()) {
      Attention(isa, p, AttentionKernel::kAuto, nullptr, &scratch);
      EXPECT_EQ(scratch.siblings.rows.size(), shared_blocks == 1 ? 0u : 4u)
          << "shared blocks " << shared_blocks << " isa " << IsaName(isa);
      EXPECT_TRUE(SameBits(ref, out))
          << "shared blocks " << shared_blocks << " isa " << IsaName(isa);
    }
  }
}

// The running state after `chunks` chunks of row t, head h, by the scalar reference walk.
AttentionPartial WalkState(const Fixture& f, int32_t t, int32_t h, int32_t chunks) {
  const AttentionParams& p = f.p;
  AttentionPartial acc{}, part{};
  if (p.sinks != nullptr) {
    acc.m = p.sinks[h];
    acc.l = 1.0f;
  }
  const float* q = p.q + (static_cast<int64_t>(t) * p.n_heads + h) * p.head_dim;
  const int32_t kvh = h / (p.n_heads / p.n_kv_heads);
  for (int32_t c = 0; c < chunks; ++c) {
    AttentionPartial* dst = c == 0 && p.sinks == nullptr ? &acc : &part;
    ChunkPartial(Isa::kScalar, p, q, kvh, p.block_tables[t], p.positions[t], c, dst);
    if (dst == &part) MergePartial(Isa::kScalar, p.head_dim, &acc, part);
  }
  return acc;
}

bool SameState(const AttentionPartial& a, const AttentionPartial& b, int32_t head_dim) {
  return std::memcmp(&a.m, &b.m, sizeof(float)) == 0 &&
         std::memcmp(&a.l, &b.l, sizeof(float)) == 0 &&
         std::memcmp(a.o, b.o, sizeof(float) * head_dim) == 0;
}

// The tile over the shared chunks, called directly: group 0 of the first case (20 rows, 18 chunks
// shared; lanes of one head) and of the second (9 rows, 9 chunks shared; GQA, lanes of the 4
// query heads of one kv head, row by row). Every lane's state is the walk's, for prefixes of the
// shared chunks, tiles of 1 to 4 x 16 lanes, fp32 and bf16 pools, with and without sinks; the
// tile with a fused o update is caught.
TEST(AttentionSiblings, TileStatesAreTheWalksRunningStates) {
  if (!IsaSupported(Isa::kAvx512)) {
    std::cerr
        << "*** attention_siblings_test: no avx512; the shared-chunk tile is NOT tested ***\n";
    return;
  }
  uint32_t seed = 411;
  for (int which : {0, 1}) {
    const SiblingCase sc = SiblingCases()[which];
    const int32_t rows = which == 0 ? 20 : 9, shared = which == 0 ? 18 : 9;
    // Lane sets: which == 0: one head each (0, 5, 10); which == 1: kv head 0 and 1's 4 heads.
    std::vector<std::vector<internal::TileLane>> lane_sets;
    for (int32_t k = 0; k < 3; ++k) {
      std::vector<internal::TileLane> lanes;
      for (int32_t r = 0; r < rows; ++r) {
        if (which == 0) lanes.push_back({r, 5 * k});
        for (int32_t h = 4 * k; which == 1 && k < 2 && h < 4 * k + 4; ++h) lanes.push_back({r, h});
      }
      if (!lanes.empty()) lane_sets.push_back(lanes);
    }
    ForEachPoolAndSinks(sc, &seed, [&](Fixture& f, bool bf16, bool sinks) {
      for (int32_t chunks : {1, 4, 5, shared - 1, shared}) {
        for (const std::vector<internal::TileLane>& lanes : lane_sets) {
          for (int32_t n : {1, 16, static_cast<int32_t>(lanes.size())}) {
            std::vector<AttentionPartial> states(n), fused(n);
            internal::AttentionTileStatesAvx512(f.p, lanes.data(), n, chunks, states.data());
            internal::AttentionTileStatesAvx512(f.p, lanes.data(), n, chunks, fused.data(),
                                                /*fused_for_test=*/true);
            bool any_fused_differs = false;
            for (int32_t i = 0; i < n; ++i) {
              const AttentionPartial want = WalkState(f, lanes[i].row, lanes[i].head, chunks);
              EXPECT_TRUE(SameState(want, states[i], sc.c.head_dim))
                  << "row " << lanes[i].row << " head " << lanes[i].head << " chunks " << chunks
                  << " lanes " << n << " case " << which << " bf16 " << bf16 << " sinks " << sinks;
              any_fused_differs = any_fused_differs || !SameState(want, fused[i], sc.c.head_dim);
            }
            // One chunk has no o update to fuse: it is copied, or (sinks) merged into o = 0,
            // where o * a + o_c * b and fma(o_c, b, o * a) are both exactly o_c * b. One lane
            // may round the same both ways by chance; 16 or more lanes do not.
            if (chunks > 1 && n >= 16) {
              EXPECT_TRUE(any_fused_differs)
                  << "a fused o update should not reproduce the walk's state, chunks " << chunks
                  << " lanes " << n << " case " << which;
            }
          }
        }
      }
    });
  }
}

}  // namespace
}  // namespace bitroll::kernels
