// Grouped-query attention in decode: a lone decode row's query heads that read one kv head run as
// one unit (one task, or split as one), so each chunk of K/V is brought in once for all of them.
// Every ISA, kernel, thread count and cache dtype gives the reference's bits (memcmp), for 2 to 20
// query heads per kv head, batch 1 and batches mixing decode rows with prefill rows; and the
// tasks are the units they claim to be (so the bits come from the grouped path, not a fallback).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_test_util.h"

namespace bitroll::kernels {
namespace {

using namespace attention_test;  // NOLINT: the shared fixture

struct GqaCase {
  Case c;
  int32_t window = 0;
  bool sinks = false;
};

std::vector<GqaCase> GqaCases() {
  return {
      {{32, 8, 64, 16, {700}}},                   // Llama 3 / Qwen3 head ratio, batch 1
      {{16, 2, 64, 16, {300, 45}}},               // 8 query heads per kv head
      {{20, 1, 32, 16, {400}}},                   // 20 per kv head: tasks of 7, 7 and 6 heads
      {{6, 3, 16, 32, {200, 17, 90, 0}}},         // 2 per kv head; a one-chunk row
      {{12, 4, 64, 16, {3, 31, 600, 255, 256}}},  // 3 per kv head, more rows than workers
      {{32, 8, 64, 16, {900, 77}}, 100},          // a sliding window
      {{8, 2, 16, 16, {500}}, 0, true},           // sinks
  };
}

TEST(AttentionGqa, DecodeRowsGiveTheReferenceBits) {
  uint32_t seed = 301;
  for (bool bf16 : {false, true}) {
    for (const GqaCase& g : GqaCases()) {
      Fixture f(g.c, seed++);
      if (bf16) f.UseBf16Kv();
      f.p.window = g.window;
      const std::vector<float> sinks = Sinks(g.c.n_heads, seed);
      if (g.sinks) f.p.sinks = sinks.data();
      ExpectReferenceBits(f, f.Reference(), {1, 2, 3, 5},
                          "heads " + std::to_string(g.c.n_heads) + "/" +
                              std::to_string(g.c.n_kv_heads) + " window " +
                              std::to_string(g.window) + " bf16 " + std::to_string(bf16));
    }
  }
}

// Decode rows next to a prefill run of one sequence in the same call (a continuous batch): the
// prefill rows keep their per-head tasks, the decode rows their kv units.
TEST(AttentionGqa, MixedPrefillAndDecodeRowsGiveTheReferenceBits) {
  Case c{32, 8, 64, 16, {}};
  for (int32_t t = 0; t < 40; ++t) c.positions.push_back(100 + t);  // prefill rows, one sequence
  c.positions.push_back(530);                                       // two decode rows
  c.positions.push_back(61);
  Fixture f(c, 411);
  for (int32_t t = 0; t < 39; ++t) f.table_ptrs[t] = f.table_ptrs[39];  // the longest table
  ExpectReferenceBits(f, f.Reference(), {1, 2, 4}, "40 prefill rows and 2 decode rows");
}

// The plan itself: a batch-1 decode row of 32 query heads over 8 kv heads runs as 8 tasks of the
// 4 heads of one kv head (single-worker), or, split over more workers than units, as split items
// whose first head computes the chunks of all 4.
TEST(AttentionGqa, ALoneRowsHeadsOfOneKvHeadAreOneUnit) {
  Fixture f(Case{32, 8, 64, 16, {700}}, 7);
  std::vector<float> out(f.q.size());
  AttentionParams p = f.p;
  p.out = out.data();
  ThreadPool pool(2);
  AttentionScratch s;
  Attention(Isa::kScalar, p, AttentionKernel::kSingle, &pool, &s);
  ASSERT_EQ(s.tasks.size(), 8u * 4);
  for (size_t t = 0; t < 8; ++t) {
    EXPECT_EQ(s.tasks[4 * t + 2], 4) << "task " << t;            // heads
    EXPECT_EQ(s.tasks[4 * t + 3], static_cast<int32_t>(4 * t));  // first head
  }
  EXPECT_TRUE(s.split_items.empty());

  ThreadPool many(12);
  Attention(Isa::kScalar, p, AttentionKernel::kAuto, &many, &s);  // 8 units < 12 workers: split
  ASSERT_EQ(s.split_items.size(), 32u);
  for (size_t k = 0; k < 32; ++k) EXPECT_EQ(s.split_heads[k], k % 4 == 0 ? 4 : 0) << "item " << k;
  // Each unit's 44 chunks in runs of ceil(44 / 12) = 4, one task each: 11 runs per unit. The
  // first run is walked and merged in place (no partials); the other 40 chunks' partials of the
  // unit's 4 heads wait for the merge.
  ASSERT_EQ(s.split_groups.size(), 8u);
  std::vector<int32_t> chunks(32, 0), runs(32, 0);
  for (size_t t = 0; t < s.tasks.size(); t += 4) {
    if (s.tasks[t] != 3) continue;  // kSplitTask {split index, first chunk, chunks}
    const int32_t k = s.tasks[t + 1];
    EXPECT_EQ(s.tasks[t + 2] % 4, 0) << "a run starts at a multiple of 4";
    chunks[k] += s.tasks[t + 3];
    runs[k] += 1;
  }
  for (size_t k = 0; k < 32; ++k) {
    EXPECT_EQ(chunks[k], k % 4 == 0 ? 44 : 0) << "item " << k;
    EXPECT_EQ(runs[k], k % 4 == 0 ? 11 : 0) << "item " << k;
  }
  EXPECT_GE(s.partials.size(), 8u * 4 * 40);
  std::vector<float> ref_out = f.Reference();
  EXPECT_EQ(0, std::memcmp(ref_out.data(), out.data(), sizeof(float) * out.size()));

  // One query head per kv head: nothing changes (heads run alone at batch 1).
  Fixture mha(Case{12, 12, 64, 16, {700}}, 8);
  p = mha.p;
  p.out = out.data();
  Attention(Isa::kScalar, p, AttentionKernel::kSingle, &pool, &s);
  EXPECT_EQ(s.tasks.size(), 12u * 4);
  for (size_t t = 0; t < 12; ++t) EXPECT_EQ(s.tasks[4 * t + 2], 1) << "task " << t;
}

}  // namespace
}  // namespace bitroll::kernels
