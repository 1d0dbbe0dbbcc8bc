// Prefix cache invariance (promise 1 of docs/design.md with the cache in play), on stories260K.
//
// A prefix hit replays the K/V bits a cold prefill would have written, because cached-block
// boundaries are multiples of the attention chunk. Every check runs the same requests on a warm
// engine (prefixes hit the cache, from memory or from the disk tier) and on an engine with the
// cache off, and compares ids and logprob bits with memcmp. Each test also asserts that the cache
// really hit, so a cache that silently never hits cannot pass. The negative control corrupts a
// cached block and shows the same comparison then fails.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

#include "tests/engine_test_util.h"

namespace bitroll {
namespace {

namespace fs = std::filesystem;
using bitroll::SamplingParams;
using engine::SequenceOutput;
using engine::SequenceRequest;
using testing_util::RunAll;
using testing_util::SameTrajectory;

constexpr int64_t kBlockBytes = 20480;  // stories260K: 2 * 5 layers * 4 kv heads * 8 * 16 * 4

// Engine settings of these tests: the shared test setup (tests/engine_test_util.h).
using Config = testing_util::EngineSetup;

std::unique_ptr<engine::CpuEngine> Make(const Config& s) {
  return testing_util::MakeEngine(s);
}

Config Cold() {
  Config s;
  s.prefix_cache = false;
  return s;
}

SamplingParams Sampled() {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.9f;
  p.seed = 77;
  return p;
}

std::vector<int32_t> RandomTokens(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(std::uniform_int_distribution<int32_t>(3, 511)(rng));
  return t;
}

SequenceRequest Req(uint64_t id, std::vector<int32_t> prompt, int32_t max_tokens) {
  SequenceRequest r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.sampling = Sampled();
  r.sample_index = 3;  // ids never change bits; keep the noise key fixed across them
  r.stop.max_tokens = max_tokens;
  r.stop.stop_at_eos = r.stop.stop_at_bos = false;
  return r;
}

// BOS + a shared 100-token "system prompt" + a per-request suffix.
std::vector<SequenceRequest> SharedPrefixRequests(uint64_t first_id, int n) {
  std::vector<int32_t> system = RandomTokens(100, 1);
  system.insert(system.begin(), 1);
  std::vector<SequenceRequest> reqs;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> p = system;
    const std::vector<int32_t> tail = RandomTokens(1 + i * 3, 100 + i);
    p.insert(p.end(), tail.begin(), tail.end());
    reqs.push_back(Req(first_id + i, p, 24));
  }
  return reqs;
}

// Same requests under new ids (ids never change bits; the cache sees the same tokens again).
std::vector<SequenceRequest> Renumber(std::vector<SequenceRequest> reqs, uint64_t first_id) {
  for (size_t i = 0; i < reqs.size(); ++i) reqs[i].id = first_id + i;
  return reqs;
}

TEST(PrefixCacheInvariance, WarmEqualsColdInMixedBatches) {
  const std::vector<SequenceRequest> reqs = SharedPrefixRequests(0, 12);
  auto cold = Make(Cold());
  ASSERT_NE(cold, nullptr);
  const auto ref = RunAll(*cold, reqs);
  EXPECT_EQ(cold->stats().prefill_tokens_cached, 0);

  Config s;
  s.max_step_tokens = 64;  // chunked prefill mixed with decodes
  auto warm = Make(s);
  ASSERT_NE(warm, nullptr);
  const auto first = RunAll(*warm, reqs);  // later requests hit blocks of earlier ones
  const int64_t cached_first = warm->stats().prefill_tokens_cached;
  const auto second = RunAll(*warm, Renumber(reqs, 100));  // every request hits the prefix
  const int64_t cached_second = warm->stats().prefill_tokens_cached - cached_first;
  EXPECT_GE(cached_second, 12 * 96) << "the shared 101-token prefix holds 6 full blocks";
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_TRUE(SameTrajectory(ref.at(i), first.at(i))) << "first pass, request " << i;
    EXPECT_TRUE(SameTrajectory(ref.at(i), second.at(100 + i))) << "warm pass, request " << i;
    EXPECT_GT(second.at(100 + i).cost.prefill_cached, 0) << i;
  }
  EXPECT_TRUE(warm->CheckBlockAccounting().ok());
}

TEST(PrefixCacheInvariance, ChunkingWithWarmPrefix) {
  std::vector<int32_t> prompt = RandomTokens(150, 3);
  prompt.insert(prompt.begin(), 1);
  const SequenceRequest r = Req(1, prompt, 32);
  Config whole = Cold();
  whole.max_step_tokens = 4096;
  auto cold = Make(whole);
  ASSERT_NE(cold, nullptr);
  const SequenceOutput ref = RunAll(*cold, {r})[1];
  ASSERT_EQ(ref.tokens.size(), 32u);
  for (int chunk : {1, 7, 16, 48, 100}) {
    Config s;
    s.max_step_tokens = chunk;
    auto e = Make(s);
    ASSERT_NE(e, nullptr);
    // Warm with a request that shares the first 100 prompt tokens, then diverges.
    std::vector<int32_t> other(prompt.begin(), prompt.begin() + 100);
    other.push_back(4);
    RunAll(*e, {Req(50, other, 3)});
    const SequenceOutput out = RunAll(*e, {r})[1];
    EXPECT_TRUE(SameTrajectory(ref, out)) << "chunk " << chunk;
    EXPECT_EQ(out.cost.prefill_cached, 96) << "chunk " << chunk;
  }
}

TEST(PrefixCacheInvariance, PrefillEqualsDecodeWithWarmPrompt) {
  std::vector<int32_t> prompt = RandomTokens(70, 4);
  prompt.insert(prompt.begin(), 1);
  SequenceRequest r = Req(1, prompt, 90);
  auto e = Make(Config{});
  ASSERT_NE(e, nullptr);
  const SequenceOutput decoded = RunAll(*e, {r})[1];
  ASSERT_EQ(decoded.tokens.size(), 90u);
  SequenceRequest rescore = r;
  rescore.id = 2;
  rescore.forced = decoded.tokens;
  rescore.stop.max_tokens = 90;
  const SequenceOutput scored = RunAll(*e, {rescore})[2];
  EXPECT_TRUE(SameTrajectory(decoded, scored));
  EXPECT_EQ(scored.cost.decode_tokens, 0);
  // Rows [0, 70) hit (the 5th block, partly, copy-on-write); row 70 scores the first token.
  EXPECT_EQ(scored.cost.prefill_cached, 70);
}

TEST(PrefixCacheInvariance, WholePromptHitRecomputesTheLastTokenCopyOnWrite) {
  // 64 tokens = 4 full blocks: a repeat hits all of them, but row 63 must still run to produce
  // logits; its K/V write goes to a copy of the shared last block.
  std::vector<int32_t> prompt = RandomTokens(63, 5);
  prompt.insert(prompt.begin(), 1);
  auto cold = Make(Cold());
  ASSERT_NE(cold, nullptr);
  const SequenceOutput ref = RunAll(*cold, {Req(1, prompt, 40)})[1];
  auto e = Make(Config{});
  ASSERT_NE(e, nullptr);
  const SequenceOutput a = RunAll(*e, {Req(1, prompt, 40)})[1];
  const int64_t cow_before = e->stats().cow_copies;
  const SequenceOutput b = RunAll(*e, {Req(2, prompt, 40)})[2];
  EXPECT_TRUE(SameTrajectory(ref, a));
  EXPECT_TRUE(SameTrajectory(ref, b));
  EXPECT_EQ(b.cost.prefill_cached, 63);
  EXPECT_EQ(b.cost.prefill_computed, 1);
  EXPECT_GT(e->stats().cow_copies, cow_before);
  // The cached block was not clobbered: a third run still matches.
  EXPECT_TRUE(SameTrajectory(ref, RunAll(*e, {Req(3, prompt, 40)})[3]));
  EXPECT_TRUE(e->CheckBlockAccounting().ok());
}

TEST(PrefixCacheInvariance, ThreadsAndAttentionKernelsWarm) {
  const std::vector<SequenceRequest> reqs = SharedPrefixRequests(0, 4);
  auto cold = Make(Cold());
  ASSERT_NE(cold, nullptr);
  const auto ref = RunAll(*cold, reqs);
  for (int threads : {1, 2}) {
    for (const char* attention : {"single", "split"}) {
      Config s;
      s.threads = threads;
      s.attention = attention;
      s.max_step_tokens = 97;
      auto e = Make(s);
      ASSERT_NE(e, nullptr);
      RunAll(*e, {reqs[0]});
      const auto out = RunAll(*e, Renumber(reqs, 10));
      for (size_t i = 0; i < reqs.size(); ++i) {
        EXPECT_TRUE(SameTrajectory(ref.at(i), out.at(10 + i)))
            << "threads " << threads << " attention " << attention << " request " << i;
        EXPECT_GE(out.at(10 + i).cost.prefill_cached, 96);
      }
    }
  }
}

TEST(PrefixCacheInvariance, MultiTurnFollowUpHitsEveryFullBlock) {
  std::vector<int32_t> p1 = RandomTokens(39, 6);
  p1.insert(p1.begin(), 1);
  auto e = Make(Config{});
  auto cold = Make(Cold());
  ASSERT_NE(e, nullptr);
  ASSERT_NE(cold, nullptr);
  const SequenceOutput t1 = RunAll(*e, {Req(1, p1, 60)})[1];
  ASSERT_EQ(t1.tokens.size(), 60u);
  // Turn 2: previous prompt + completion + a new user turn.
  std::vector<int32_t> p2 = p1;
  p2.insert(p2.end(), t1.tokens.begin(), t1.tokens.end());
  const std::vector<int32_t> turn = RandomTokens(10, 7);
  p2.insert(p2.end(), turn.begin(), turn.end());
  const SequenceOutput t2 = RunAll(*e, {Req(2, p2, 30)})[2];
  // Turn 1 computed K/V for positions [0, 99): its last sampled token was never fed back.
  EXPECT_EQ(t2.cost.prefill_cached, (40 + 60 - 1) / 16 * 16);
  EXPECT_TRUE(SameTrajectory(RunAll(*cold, {Req(2, p2, 30)})[2], t2));
}

// Prints the .kvb files of `dir`.
std::vector<fs::path> KvbFiles(const std::string& dir) {
  std::vector<fs::path> out;
  for (const auto& f : fs::directory_iterator(dir)) {
    if (f.path().extension() == ".kvb") out.push_back(f.path());
  }
  return out;
}

TEST(PrefixCacheInvariance, DiskTierHitsAndCorruptedBlocksAreMisses) {
  const std::string dir = (fs::path(::testing::TempDir()) / "bitroll_prefix_disk_tier").string();
  fs::remove_all(dir);
  std::vector<int32_t> prompt = RandomTokens(300, 8);
  prompt.insert(prompt.begin(), 1);
  auto cold = Make(Cold());
  ASSERT_NE(cold, nullptr);
  const SequenceOutput ref = RunAll(*cold, {Req(1, prompt, 20)})[1];

  Config s;
  s.disk_dir = dir;
  s.kv_cache_bytes = 40 * kBlockBytes;  // 40 blocks: one 512-token sequence needs 32
  auto e = Make(s);
  ASSERT_NE(e, nullptr);
  EXPECT_TRUE(SameTrajectory(ref, RunAll(*e, {Req(1, prompt, 20)})[1]));
  // Other long requests push the prompt's blocks out of memory, onto disk.
  for (uint64_t i = 0; i < 3; ++i) {
    std::vector<int32_t> other = RandomTokens(300, 20 + i);
    other.insert(other.begin(), 1);
    RunAll(*e, {Req(10 + i, other, 4)});
  }
  ASSERT_GT(e->stats().disk_spilled_blocks, 0);
  const SequenceOutput from_disk = RunAll(*e, {Req(2, prompt, 20)})[2];
  EXPECT_TRUE(SameTrajectory(ref, from_disk));
  EXPECT_GT(e->stats().disk_hit_blocks, 0);
  EXPECT_EQ(from_disk.cost.prefill_cached, 288) << "18 full blocks of the 301-token prompt";

  // Corrupt one byte of every file and evict memory again: nothing wrong may come back.
  for (uint64_t i = 0; i < 3; ++i) {
    std::vector<int32_t> other = RandomTokens(300, 20 + i);
    other.insert(other.begin(), 1);
    RunAll(*e, {Req(30 + i, other, 4)});
  }
  e->ClearPrefixCache();
  const std::vector<fs::path> files = KvbFiles(dir);
  ASSERT_FALSE(files.empty());
  for (const fs::path& f : files) {
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(1000);
    char c;
    io.read(&c, 1);
    c ^= 0x01;
    io.seekp(1000);
    io.write(&c, 1);
  }
  const SequenceOutput after = RunAll(*e, {Req(3, prompt, 20)})[3];
  EXPECT_TRUE(SameTrajectory(ref, after));
  EXPECT_GT(e->stats().disk_corrupt_blocks, 0);
  EXPECT_EQ(after.cost.prefill_cached, 0) << "every disk block was corrupt: all misses";
  EXPECT_TRUE(e->CheckBlockAccounting().ok());
}

TEST(PrefixCacheAccounting, RandomOperationsNeverLeakBlocks) {
  Config s;
  s.kv_cache_bytes = 48 * kBlockBytes;
  s.max_step_tokens = 48;
  s.preempt_every_steps = 11;
  auto e = Make(s);
  ASSERT_NE(e, nullptr);
  std::mt19937 rng(2024);
  std::vector<int32_t> system = RandomTokens(40, 9);
  system.insert(system.begin(), 1);
  std::vector<uint64_t> live;
  uint64_t next_id = 0;
  int aborted = 0, finished = 0;
  for (int op = 0; op < 3000; ++op) {
    const int kind = std::uniform_int_distribution<int>(0, 9)(rng);
    if (kind <= 2 && live.size() < 24) {  // add: a group, a shared-prefix or a random request
      const int group = std::uniform_int_distribution<int>(1, 3)(rng);
      std::vector<int32_t> prompt = system;
      prompt.resize(std::uniform_int_distribution<size_t>(1, system.size())(rng));
      const std::vector<int32_t> tail =
          RandomTokens(std::uniform_int_distribution<int>(0, 30)(rng), rng());
      prompt.insert(prompt.end(), tail.begin(), tail.end());
      const uint64_t gid = group > 1 ? next_id + 1 : 0;
      for (int g = 0; g < group; ++g) {
        SequenceRequest r = Req(next_id, prompt, std::uniform_int_distribution<int>(1, 40)(rng));
        r.group_id = gid;
        r.sample_index = g;
        ASSERT_TRUE(e->Add(r).ok());
        live.push_back(next_id++);
      }
    } else if (kind == 3 && !live.empty()) {
      const size_t i = std::uniform_int_distribution<size_t>(0, live.size() - 1)(rng);
      ASSERT_TRUE(e->Abort(live[i]).ok());
      live.erase(live.begin() + i);
      ++aborted;
    } else if (kind == 4) {
      e->ClearPrefixCache();
    } else {
      auto step = e->Step();
      ASSERT_TRUE(step.ok()) << step.status().ToString();
      for (const auto& f : step->finished) {
        auto it = std::find(live.begin(), live.end(), f.id);
        if (it != live.end()) {
          live.erase(it);
          ++finished;
        }
      }
    }
    const Status check = e->CheckBlockAccounting();
    ASSERT_TRUE(check.ok()) << "after op " << op << ": " << check.ToString();
  }
  while (e->HasWork()) ASSERT_TRUE(e->Step().ok());
  ASSERT_TRUE(e->CheckBlockAccounting().ok());
  const engine::EngineStats st = e->stats();
  EXPECT_GT(st.prefill_tokens_cached, 0);
  EXPECT_GT(st.preemptions, 0);
  EXPECT_GT(st.cow_copies, 0);
  EXPECT_GT(aborted, 50);
  EXPECT_GT(finished, 50);
  EXPECT_EQ(st.kv_blocks_free + e->prefix_cache().size(), st.kv_blocks_total)
      << "at idle every block is free or only cached";
  e->ClearPrefixCache();
  EXPECT_EQ(e->stats().kv_blocks_free, e->stats().kv_blocks_total);
}

// ---- negative control ----

TEST(PrefixCacheNegativeControl, CorruptedCachedBlockIsCaught) {
  const std::vector<SequenceRequest> reqs = SharedPrefixRequests(0, 3);
  auto cold = Make(Cold());
  ASSERT_NE(cold, nullptr);
  const auto ref = RunAll(*cold, reqs);
  auto e = Make(Config{});
  ASSERT_NE(e, nullptr);
  RunAll(*e, {reqs[0]});
  ASSERT_GT(e->prefix_cache().size(), 0);
  // Nudge one value of every cached block (layer 2, slot 5), as a wrong replay would.
  engine::KvCache* kv = e->kv_cache_for_test();
  std::vector<float> k(32, 0.25f), v(32, -0.25f);
  for (int32_t b = 0; b < kv->num_blocks(); ++b) {
    if (e->prefix_cache().Holds(b)) kv->Write(2, b, 5, k.data(), v.data());
  }
  const auto out = RunAll(*e, Renumber(reqs, 10));
  int mismatches = 0;
  for (size_t i = 0; i < reqs.size(); ++i)
    mismatches += SameTrajectory(ref.at(i), out.at(10 + i)) ? 0 : 1;
  EXPECT_EQ(mismatches, 3) << "the memcmp check failed to notice replayed K/V that differ";
}

}  // namespace
}  // namespace bitroll
