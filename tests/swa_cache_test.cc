// The SWA prefix-cache policies (EngineOptions::swa_cache, docs/design.md "SWA prefix-cache
// policies") and the sliding pool (engine/kv_cache.h) on make-model's hybrid shapes swa-tiny
// (sliding W=8 / full alternating, sinks) and swa-5to1-tiny (five sliding W=8 layers per full one).
// Every hit, from memory or from the disk tier, under every policy, with chunk boundaries inside
// and across windows, preemption and GRPO siblings, must give the bits of a cold run (memcmp of
// ids and logprob bits). Negative control: a rebuild that starts one token late
// (BITROLL_TEST_BREAK_INVARIANCE=late_rebuild) must be caught.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/cpu_engine.h"
#include "engine/invariance_break.h"
#include "engine/invariance_checks.h"
#include "engine/prefix_cache.h"
#include "tests/engine_test_util.h"

namespace bitroll {
namespace {

namespace fs = std::filesystem;
using engine::SequenceOutput;
using engine::SequenceRequest;
using testing_util::EngineSetup;
using testing_util::HfShapeModel;
using testing_util::MakeEngine;
using testing_util::RunAll;
using testing_util::SameTrajectory;
using testing_util::Sampled;
using testing_util::ScopedBreak;

const char* const kModels[] = {"swa-tiny", "swa-5to1-tiny"};
const char* const kPolicies[] = {"full", "checkpoint:32", "checkpoint:64", "recompute"};

std::vector<int32_t> RandomTokens(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(std::uniform_int_distribution<int32_t>(3, 511)(rng));
  return t;
}

// Requests sharing a 150-token system prefix (many windows, not a multiple of the block), each
// with its own tail, sampled.
std::vector<SequenceRequest> SharedPrefixRequests(int n, uint64_t first_id) {
  const std::vector<int32_t> system = RandomTokens(150, 5);
  std::vector<SequenceRequest> out;
  for (int i = 0; i < n; ++i) {
    SequenceRequest r;
    r.id = first_id + i;
    r.prompt = {1};
    r.prompt.insert(r.prompt.end(), system.begin(), system.end());
    const std::vector<int32_t> tail = RandomTokens(5 + 13 * i, 100 + i);
    r.prompt.insert(r.prompt.end(), tail.begin(), tail.end());
    r.sampling = Sampled();
    r.sample_index = 3;
    r.stop.max_tokens = 24 + 3 * i;
    r.stop.stop_at_eos = false;
    r.stop.stop_at_bos = false;
    out.push_back(r);
  }
  return out;
}

// Each request alone on a fresh engine without a prefix cache: the cold bits.
std::map<uint64_t, SequenceOutput> Cold(const std::string& model,
                                        const std::vector<SequenceRequest>& reqs) {
  std::map<uint64_t, SequenceOutput> out;
  for (const auto& r : reqs) {
    EngineSetup s;
    s.prefix_cache = false;
    auto e = MakeEngine(s, HfShapeModel(model));
    EXPECT_NE(e, nullptr);
    if (e == nullptr) return out;
    out[r.id] = RunAll(*e, {r})[r.id];
  }
  return out;
}

std::vector<SequenceRequest> Renumbered(std::vector<SequenceRequest> reqs, uint64_t add) {
  for (auto& r : reqs) r.id += add;
  return reqs;
}

// Bytes of one 16-token block over every layer of `model`.
int64_t BlockBytes(const std::string& model) {
  auto e = MakeEngine(EngineSetup{}, HfShapeModel(model));
  if (e == nullptr) return 0;
  const engine::EngineStats s = e->stats();
  return (s.kv_bytes_per_token_full + s.kv_bytes_per_token_sliding) * s.kv_block_tokens;
}

// Memory-tier hits: the requests run once (caching their prefixes), then again one at a time in
// the same engine at several step budgets (chunks of 7 rows end inside a window, 40-row chunks
// cross several windows): every second run equals its cold run.
TEST(SwaCache, MemoryHitsEqualColdRunsUnderEveryPolicy) {
  for (const char* model : kModels) {
    const std::vector<SequenceRequest> reqs = SharedPrefixRequests(5, 1);
    const auto cold = Cold(model, reqs);
    for (const char* policy : kPolicies) {
      for (int32_t budget : {512, 7, 40}) {
        EngineSetup s;
        s.swa_cache = policy;
        s.max_step_tokens = budget;
        auto e = MakeEngine(s, HfShapeModel(model));
        ASSERT_NE(e, nullptr);
        RunAll(*e, reqs);
        for (const auto& r : Renumbered(reqs, 100)) {
          const auto out = RunAll(*e, {r});
          EXPECT_TRUE(SameTrajectory(cold.at(r.id - 100), out.at(r.id)))
              << model << " " << policy << " budget " << budget << " request " << r.id;
          ASSERT_TRUE(e->CheckBlockAccounting().ok()) << e->CheckBlockAccounting().ToString();
        }
        const engine::EngineStats st = e->stats();
        EXPECT_GT(st.prefill_tokens_cached, 0) << model << " " << policy;
        if (std::string(policy) == "full") {
          EXPECT_EQ(st.swa_recomputed_tokens, 0) << model;
        } else {
          EXPECT_GT(st.swa_recomputed_tokens, 0) << model << " " << policy;
          EXPECT_GT(st.swa_rebuilds, 0) << model << " " << policy;
        }
        if (std::string(policy) == "recompute") {
          EXPECT_EQ(st.prefix_cached_bytes_sliding, 0) << model;
          EXPECT_GT(st.prefix_cached_bytes_full, 0) << model;
        }
      }
    }
  }
}

// The stored bytes per cached token order the policies: full > checkpoint:64 > recompute = 0.
TEST(SwaCache, StoredSlidingBytesFollowThePolicy) {
  for (const char* model : kModels) {
    std::map<std::string, double> per_token;
    for (const char* policy : {"full", "checkpoint:64", "recompute"}) {
      EngineSetup s;
      s.swa_cache = policy;
      auto e = MakeEngine(s, HfShapeModel(model));
      ASSERT_NE(e, nullptr);
      RunAll(*e, SharedPrefixRequests(3, 1));
      const engine::EngineStats st = e->stats();
      ASSERT_GT(st.kv_blocks_cached, 0);
      per_token[policy] =
          double(st.prefix_cached_bytes_sliding) / double(st.kv_blocks_cached * st.kv_block_tokens);
      EXPECT_EQ(st.prefix_cached_bytes_full,
                st.kv_blocks_cached * st.kv_block_tokens * st.kv_bytes_per_token_full);
    }
    EXPECT_GT(per_token["full"], per_token["checkpoint:64"]) << model;
    EXPECT_GT(per_token["checkpoint:64"], 0.0) << model;
    EXPECT_EQ(per_token["recompute"], 0.0) << model;
  }
}

// Disk-tier hits: a small pool spills the prefixes (full and sliding parts) to disk; a fresh
// engine on the same folder finds them there and must give the cold bits.
TEST(SwaCache, DiskTierHitsEqualColdRunsUnderEveryPolicy) {
  for (const char* model : kModels) {
    const std::vector<SequenceRequest> reqs = SharedPrefixRequests(4, 1);
    const auto cold = Cold(model, reqs);
    const int64_t block = BlockBytes(model);
    ASSERT_GT(block, 0);
    for (const char* policy : kPolicies) {
      const fs::path dir = fs::temp_directory_path() /
                           ("bitroll_swa_cache_disk_" + std::to_string(::getpid()) + "_" + model);
      fs::remove_all(dir);
      EngineSetup s;
      s.swa_cache = policy;
      s.disk_dir = dir.string();
      s.kv_cache_bytes = 40 * block;  // 40 blocks: every run evicts the previous ones
      {
        auto e = MakeEngine(s, HfShapeModel(model));
        ASSERT_NE(e, nullptr);
        for (const auto& r : reqs) RunAll(*e, {r});
        // Three other 300-token prompts cycle the whole pool: every prefix block is spilled.
        for (uint32_t k = 0; k < 3; ++k) {
          SequenceRequest other = reqs[0];
          other.id = 50 + k;
          other.prompt = RandomTokens(300, 77 + k);
          RunAll(*e, {other});
        }
        const engine::EngineStats st = e->stats();
        EXPECT_GT(st.disk_spilled_blocks, 0) << model << " " << policy;
        EXPECT_GT(st.disk_bytes_full, 0) << model << " " << policy;
        // Only the policies that keep sliding blocks spill them.
        EXPECT_EQ(st.disk_bytes_sliding > 0, std::string(policy) != "recompute")
            << model << " " << policy;
      }
      auto e = MakeEngine(s, HfShapeModel(model));
      ASSERT_NE(e, nullptr);
      for (const auto& r : Renumbered(reqs, 100)) {
        const auto out = RunAll(*e, {r});
        EXPECT_TRUE(SameTrajectory(cold.at(r.id - 100), out.at(r.id)))
            << model << " " << policy << " request " << r.id;
        ASSERT_TRUE(e->CheckBlockAccounting().ok()) << e->CheckBlockAccounting().ToString();
      }
      const engine::EngineStats st = e->stats();
      EXPECT_GT(st.disk_hit_blocks, 0) << model << " " << policy;
      if (std::string(policy) == "recompute") {
        EXPECT_EQ(st.sliding_disk_hit_blocks, 0) << model;
      } else {
        EXPECT_GT(st.sliding_disk_hit_blocks, 0) << model << " " << policy;
      }
      fs::remove_all(dir);
    }
  }
}

// Preemption every 3 steps (re-admission through the prefix cache, rebuilding the sliding state)
// and GRPO groups (siblings share the prompt's blocks, copy-on-write) under every policy.
TEST(SwaCache, PreemptionAndGroupSiblingsEqualColdRuns) {
  for (const char* model : kModels) {
    std::vector<SequenceRequest> reqs = SharedPrefixRequests(3, 1);
    // Two groups of four samples.
    for (int g = 0; g < 2; ++g) {
      for (int k = 0; k < 4; ++k) {
        SequenceRequest r = reqs[g];
        r.id = 10 + g * 4 + k;
        r.group_id = 1000 + g;
        r.sample_index = k;
        reqs.push_back(r);
      }
    }
    const auto cold = Cold(model, reqs);
    for (const char* policy : kPolicies) {
      for (int32_t preempt : {0, 3}) {
        EngineSetup s;
        s.swa_cache = policy;
        s.preempt_every_steps = preempt;
        s.max_step_tokens = 48;
        auto e = MakeEngine(s, HfShapeModel(model));
        ASSERT_NE(e, nullptr);
        for (const auto& r : reqs) ASSERT_TRUE(e->Add(r).ok());
        std::map<uint64_t, SequenceOutput> out;
        while (e->HasWork()) {
          auto step = e->Step();
          ASSERT_TRUE(step.ok()) << step.status().ToString();
          for (auto& f : step->finished) out[f.id] = std::move(f);
          ASSERT_TRUE(e->CheckBlockAccounting().ok()) << e->CheckBlockAccounting().ToString();
        }
        for (const auto& r : reqs) {
          EXPECT_TRUE(SameTrajectory(cold.at(r.id), out.at(r.id)))
              << model << " " << policy << " preempt " << preempt << " request " << r.id;
        }
        const engine::EngineStats st = e->stats();
        EXPECT_GT(st.group_shared_tokens, 0) << model << " " << policy;
        if (preempt > 0) {
          EXPECT_GT(st.preemptions, 0);
        }
      }
    }
  }
}

// Sliding blocks that leave every window go back to the pool: a long sequence holds about one
// window of sliding blocks, its full layers every block; with a prefix cache that keeps no sliding
// blocks (recompute) or none at all. A full-attention model holds every layer of every block.
TEST(SwaCache, OutOfWindowSlidingBlocksReturnToThePool) {
  for (const char* policy : {"recompute", "off"}) {
    EngineSetup s;
    if (std::string(policy) == "off") {
      s.prefix_cache = false;
    } else {
      s.swa_cache = policy;
    }
    s.max_step_tokens = 64;
    auto e = MakeEngine(s, HfShapeModel("swa-tiny"));
    ASSERT_NE(e, nullptr);
    SequenceRequest r = SharedPrefixRequests(1, 1)[0];
    r.prompt = RandomTokens(400, 8);
    r.stop.max_tokens = 60;
    ASSERT_TRUE(e->Add(r).ok());
    int64_t max_sliding = 0, max_full = 0;
    while (e->HasWork()) {
      ASSERT_TRUE(e->Step().ok());
      const engine::EngineStats st = e->stats();
      if (st.running == 0) continue;
      ASSERT_TRUE(e->CheckBlockAccounting().ok()) << e->CheckBlockAccounting().ToString();
      max_sliding = std::max(max_sliding, st.kv_sliding_blocks_total - st.kv_sliding_blocks_free);
      max_full = std::max(max_full, st.kv_blocks_total - st.kv_blocks_free);
    }
    // W = 8 and 64-row chunks: the window's blocks plus one chunk's (5 blocks at most).
    EXPECT_LE(max_sliding, 6) << policy;
    EXPECT_GE(max_full, 460 / 16) << policy;
    // Finished: nothing is held but what the cache keeps (no sliding block under recompute).
    const engine::EngineStats done = e->stats();
    EXPECT_EQ(done.kv_sliding_blocks_free, done.kv_sliding_blocks_total) << policy;
  }
  // The dense twin's bytes per token are the sum of both kinds: every block holds every layer.
  auto dense = MakeEngine(EngineSetup{}, HfShapeModel("llama3-tiny"));
  ASSERT_NE(dense, nullptr);
  EXPECT_EQ(dense->stats().kv_sliding_blocks_total, 0);
  EXPECT_EQ(dense->stats().kv_bytes_per_token_sliding, 0);
}

// Random adds, aborts, cache clears and steps with groups and shared prefixes, under every policy
// and a small pool: the block accounting of both pools holds after every operation.
TEST(SwaCache, BlockAccountingUnderRandomOperations) {
  for (const char* policy : kPolicies) {
    EngineSetup s;
    s.swa_cache = policy;
    s.kv_cache_bytes = 48 * BlockBytes("swa-5to1-tiny");
    s.max_step_tokens = 40;
    s.preempt_every_steps = 7;
    auto e = MakeEngine(s, HfShapeModel("swa-5to1-tiny"));
    ASSERT_NE(e, nullptr);
    std::mt19937 rng(11);
    const std::vector<int32_t> system = RandomTokens(120, 9);
    std::vector<uint64_t> live;
    uint64_t next = 1;
    for (int op = 0; op < 600; ++op) {
      const int kind = std::uniform_int_distribution<int>(0, 9)(rng);
      if (kind <= 2 && live.size() < 12) {
        const int group = std::uniform_int_distribution<int>(1, 3)(rng);
        std::vector<int32_t> prompt = {1};
        prompt.insert(prompt.end(), system.begin(),
                      system.begin() + std::uniform_int_distribution<int>(1, 120)(rng));
        const std::vector<int32_t> tail =
            RandomTokens(std::uniform_int_distribution<int>(0, 30)(rng), rng());
        prompt.insert(prompt.end(), tail.begin(), tail.end());
        const uint64_t gid = group > 1 ? next + 5000 : 0;
        for (int g = 0; g < group; ++g) {
          SequenceRequest r;
          r.id = next++;
          r.prompt = prompt;
          r.sampling = Sampled();
          r.group_id = gid;
          r.sample_index = g;
          r.stop.max_tokens = std::uniform_int_distribution<int>(1, 40)(rng);
          ASSERT_TRUE(e->Add(r).ok());
          live.push_back(r.id);
        }
      } else if (kind == 3 && !live.empty()) {
        const size_t i = std::uniform_int_distribution<size_t>(0, live.size() - 1)(rng);
        ASSERT_TRUE(e->Abort(live[i]).ok());
        live.erase(live.begin() + i);
      } else if (kind == 4) {
        e->ClearPrefixCache();
      } else {
        auto step = e->Step();
        ASSERT_TRUE(step.ok()) << step.status().ToString();
        for (const auto& f : step->finished) {
          live.erase(std::remove(live.begin(), live.end(), f.id), live.end());
        }
      }
      const Status check = e->CheckBlockAccounting();
      ASSERT_TRUE(check.ok()) << policy << " after op " << op << ": " << check.ToString();
    }
  }
}

// Under a budget that max_running windows would fill, a policy that caches less sliding state
// still leaves the full layers more room: capacity is the point of checkpoint and recompute.
TEST(SwaCache, LeanPoliciesGiveTheFullLayersMoreBlocksUnderASmallBudget) {
  const int64_t budget = 400 * BlockBytes("swa-5to1-tiny");
  int64_t full_blocks[3] = {};
  int i = 0;
  for (const char* policy : {"full", "checkpoint:256", "recompute"}) {
    EngineSetup s;
    s.swa_cache = policy;
    s.kv_cache_bytes = budget;
    auto e = MakeEngine(s, HfShapeModel("swa-5to1-tiny"));
    ASSERT_NE(e, nullptr) << policy;
    const engine::EngineStats st = e->stats();
    full_blocks[i++] = st.kv_blocks_total;
    EXPECT_GT(st.kv_sliding_blocks_total, 0) << policy;
  }
  EXPECT_GT(full_blocks[1], full_blocks[0]) << "checkpoint:256 vs full";
  EXPECT_GT(full_blocks[2], full_blocks[1]) << "recompute vs checkpoint:256";
  EXPECT_GT(full_blocks[2], 3 * full_blocks[0] / 2) << "recompute vs full";
}

TEST(SwaCache, BadPoliciesAreTypedErrors) {
  for (const char* bad : {"", "fulll", "checkpoint:", "checkpoint:0", "checkpoint:24",
                          "checkpoint:-16", "checkpoint:16x", "recompute "}) {
    EXPECT_EQ(engine::ParseSwaCache(bad, 16).status().code(), ErrorCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(engine::ParseSwaCache("checkpoint:48", 16)->checkpoint, 48);
  EXPECT_EQ(engine::ParseSwaCache("recompute", 16)->policy, engine::SwaCachePolicy::kRecompute);
  // The engine refuses a bad policy too (even on a model without sliding layers).
  engine::CpuEngineParts parts;
  parts.weights = HfShapeModel("swa-tiny");
  parts.options.kv_cache_bytes = 16ll << 20;
  parts.options.swa_cache = "checkpoint:10";
  EXPECT_EQ(engine::CpuEngine::Create(std::move(parts)).status().code(),
            ErrorCode::kInvalidArgument);
}

// ---- negative control ----

// A rebuild that starts one token after n - L * (W - 1) leaves a key of the last sliding layer's
// window inexact: the hits must differ from the cold runs. Without the switch, the same runs
// are exact (MemoryHitsEqualColdRunsUnderEveryPolicy).
TEST(SwaCacheNegativeControl, ARebuildThatStartsOneTokenLateIsCaught) {
  for (const char* model : kModels) {
    const std::vector<SequenceRequest> reqs = SharedPrefixRequests(4, 1);
    const auto cold = Cold(model, reqs);
    ScopedBreak broken("late_rebuild");
    EngineSetup s;
    s.swa_cache = "recompute";
    auto e = MakeEngine(s, HfShapeModel(model));
    ASSERT_NE(e, nullptr);
    RunAll(*e, reqs);
    int differ = 0;
    for (const auto& r : Renumbered(reqs, 100)) {
      const auto out = RunAll(*e, {r});
      differ += SameTrajectory(cold.at(r.id - 100), out.at(r.id)) ? 0 : 1;
    }
    EXPECT_GT(e->stats().swa_rebuilds, 0) << model;
    EXPECT_GT(differ, 0) << model << ": a rebuild one token late gave the cold bits";
  }
}

}  // namespace
}  // namespace bitroll
