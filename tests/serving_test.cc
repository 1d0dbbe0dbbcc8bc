// Serving behaviour of the scheduler on stories260K: GRPO prompt sharing, preemption under memory
// pressure (tiny KV budget and a forced-preemption hook), no deadlock when prefills hold every
// block, short requests beside long ones, fairness between groups, and abort. Every trajectory is
// compared bit for bit (memcmp) with a run where nothing is cached or preempted; latency bounds
// are counted in engine steps, never in seconds.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <vector>

#include "tests/engine_test_util.h"

namespace bitroll {
namespace {

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

Config Reference() {
  Config s;
  s.prefix_cache = false;
  return s;
}

std::vector<int32_t> RandomTokens(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t{1};
  for (int i = 1; i < n; ++i) t.push_back(std::uniform_int_distribution<int32_t>(3, 511)(rng));
  return t;
}

SequenceRequest Req(uint64_t id, std::vector<int32_t> prompt, int32_t max_tokens) {
  SequenceRequest r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 1.0f;
  r.sampling.top_p = 0.95f;
  r.sampling.seed = 5;
  r.sample_index = static_cast<uint32_t>(id % 8);
  r.stop.max_tokens = max_tokens;
  r.stop.stop_at_eos = r.stop.stop_at_bos = false;
  return r;
}

struct Timed {
  std::map<uint64_t, SequenceOutput> out;
  std::map<uint64_t, int64_t> first_token_step, finish_step;
  int64_t steps = 0;
};

// Adds everything, steps until idle (at most max_steps) and records when each id got its first
// token and finished. Checks the block accounting after every step.
Timed RunTimed(engine::CpuEngine& e, const std::vector<SequenceRequest>& reqs, int64_t max_steps) {
  Timed t;
  for (const auto& r : reqs) EXPECT_TRUE(e.Add(r).ok()) << r.id;
  while (e.HasWork() && t.steps < max_steps) {
    auto step = e.Step();
    if (!step.ok()) {
      ADD_FAILURE() << step.status().ToString();
      break;
    }
    ++t.steps;
    for (const auto& tok : step->tokens) t.first_token_step.emplace(tok.id, t.steps);
    for (auto& f : step->finished) {
      t.finish_step[f.id] = t.steps;
      t.out[f.id] = std::move(f);
    }
    const Status check = e.CheckBlockAccounting();
    if (!check.ok()) {
      ADD_FAILURE() << "step " << t.steps << ": " << check.ToString();
      break;
    }
  }
  EXPECT_FALSE(e.HasWork()) << "no progress after " << max_steps << " steps";
  return t;
}

void ExpectSame(const std::map<uint64_t, SequenceOutput>& ref,
                const std::map<uint64_t, SequenceOutput>& got, const char* what) {
  ASSERT_EQ(ref.size(), got.size()) << what;
  for (const auto& [id, o] : ref)
    EXPECT_TRUE(SameTrajectory(o, got.at(id))) << what << " id " << id;
}

std::vector<SequenceRequest> Group(uint64_t first_id, uint64_t group, int n,
                                   const std::vector<int32_t>& prompt, int32_t max_tokens) {
  std::vector<SequenceRequest> reqs;
  for (int i = 0; i < n; ++i) {
    SequenceRequest r = Req(first_id + i, prompt, max_tokens);
    r.group_id = group;
    r.sample_index = i;
    reqs.push_back(r);
  }
  return reqs;
}

TEST(Serving, GrpoGroupPrefillsThePromptOnce) {
  const std::vector<SequenceRequest> reqs = Group(0, 1, 8, RandomTokens(200, 1), 24);
  auto ref = Make(Reference());
  auto e = Make(Config{});
  ASSERT_NE(ref, nullptr);
  ASSERT_NE(e, nullptr);
  const auto want = RunAll(*ref, reqs);
  EXPECT_EQ(ref->stats().prefill_tokens_computed, 8 * 200) << "reference: no sharing";
  const Timed got = RunTimed(*e, reqs, 1000);
  ExpectSame(want, got.out, "grpo");
  const engine::EngineStats st = e->stats();
  // One prefill of the prompt, then each sibling recomputes only the row of the last prompt token.
  EXPECT_EQ(st.prefill_tokens_computed, 200 + 7);
  EXPECT_EQ(st.prefill_tokens_cached, 7 * 199);
  EXPECT_EQ(st.group_shared_tokens, 7 * 199);
  EXPECT_GE(st.cow_copies, 7) << "the shared partial block is copied on first write";
  int64_t per_seq_cached = 0;
  for (const auto& [id, o] : got.out) per_seq_cached += o.cost.prefill_cached;
  EXPECT_EQ(per_seq_cached, 7 * 199);
  EXPECT_EQ(got.out.at(0).cost.prefill_computed, 200);
}

std::vector<SequenceRequest> Mixed(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<SequenceRequest> reqs;
  for (int i = 0; i < n; ++i) {
    reqs.push_back(Req(i, RandomTokens(std::uniform_int_distribution<int>(2, 60)(rng), rng()),
                       std::uniform_int_distribution<int>(20, 140)(rng)));
  }
  return reqs;
}

TEST(Serving, TinyKvBudgetForcesPreemptionsAndBitsHold) {
  const std::vector<SequenceRequest> reqs = Mixed(16, 2);
  auto ref = Make(Reference());
  ASSERT_NE(ref, nullptr);
  const auto want = RunAll(*ref, reqs);
  EXPECT_EQ(ref->stats().preemptions, 0);
  for (bool cache : {false, true}) {
    Config s;
    s.prefix_cache = cache;
    s.kv_cache_bytes = 34 * kBlockBytes;  // the minimum is 32 (one 512-token sequence)
    s.max_step_tokens = 64;
    auto e = Make(s);
    ASSERT_NE(e, nullptr);
    const Timed got = RunTimed(*e, reqs, 20000);
    ExpectSame(want, got.out, cache ? "tiny kv, prefix cache" : "tiny kv, recompute");
    EXPECT_GT(e->stats().preemptions, 5) << "cache " << cache;
  }
}

TEST(Serving, ForcedPreemptionEveryKStepsKeepsBits) {
  const std::vector<SequenceRequest> reqs = Mixed(10, 3);
  auto ref = Make(Reference());
  ASSERT_NE(ref, nullptr);
  const auto want = RunAll(*ref, reqs);
  // Without the cache a victim recomputes its whole context; preempting one sequence every step
  // would then cost more rows than a step runs, so that case uses k = 4.
  for (bool cache : {false, true}) {
    for (int k : {1, 4}) {
      if (!cache && k == 1) continue;
      Config s;
      s.prefix_cache = cache;
      s.preempt_every_steps = k;
      s.max_step_tokens = 80;
      auto e = Make(s);
      ASSERT_NE(e, nullptr);
      const Timed got = RunTimed(*e, reqs, 3000);
      ExpectSame(want, got.out, "forced preemption");
      EXPECT_GE(e->stats().preemptions, got.steps / k / 2) << "k " << k << " cache " << cache;
      if (cache) {
        EXPECT_GT(e->stats().prefill_tokens_cached, 0) << "re-admission hits the cache";
      }
    }
  }
}

TEST(Serving, RunningPrefillsHoldingEveryBlockDoNotDeadlock) {
  // Six 300-token prompts, a 34-block pool (each needs 19+), and a round-one chunk of 64 rows:
  // all six start prefilling, and together they want far more blocks than exist.
  std::vector<SequenceRequest> reqs;
  for (int i = 0; i < 6; ++i) reqs.push_back(Req(i, RandomTokens(300, 10 + i), 8));
  auto ref = Make(Reference());
  ASSERT_NE(ref, nullptr);
  const auto want = RunAll(*ref, reqs);
  for (bool cache : {false, true}) {
    Config s;
    s.prefix_cache = cache;
    s.kv_cache_bytes = 34 * kBlockBytes;
    s.max_step_tokens = 512;
    s.max_prefill_chunk = 64;
    auto e = Make(s);
    ASSERT_NE(e, nullptr);
    const Timed got = RunTimed(*e, reqs, 2000);
    ExpectSame(want, got.out, "prefills holding every block");
    EXPECT_GT(e->stats().preemptions, 0);
  }
}

// Two long requests (400-token prompts, 100 tokens out) arrive first, then six short ones.
std::vector<SequenceRequest> LongTail() {
  std::vector<SequenceRequest> reqs;
  for (int i = 0; i < 2; ++i) reqs.push_back(Req(i, RandomTokens(400, 40 + i), 100));
  for (int i = 2; i < 8; ++i) reqs.push_back(Req(i, RandomTokens(8, 40 + i), 8));
  return reqs;
}

TEST(Serving, ShortRequestsAreNotStuckBehindLongOnes) {
  const std::vector<SequenceRequest> reqs = LongTail();
  auto ref = Make(Reference());
  ASSERT_NE(ref, nullptr);
  const auto want = RunAll(*ref, reqs);
  Config s;
  s.max_step_tokens = 64;
  s.max_prefill_chunk = 16;
  auto e = Make(s);
  ASSERT_NE(e, nullptr);
  const Timed got = RunTimed(*e, reqs, 5000);
  ExpectSame(want, got.out, "long tail");
  // A short request needs 1 prefill step and 8 decode steps; allow 4 steps of queueing.
  for (uint64_t id = 2; id < 8; ++id) EXPECT_LE(got.finish_step.at(id), 13) << "short " << id;
  for (uint64_t id = 0; id < 2; ++id) EXPECT_GE(got.finish_step.at(id), 100) << "long " << id;

  // Control: with no per-sequence prefill cap the long prompts take the whole budget first and
  // the same bound fails, so the check above can fail.
  Config hog = s;
  hog.max_prefill_chunk = 512;
  auto h = Make(hog);
  ASSERT_NE(h, nullptr);
  const Timed slow = RunTimed(*h, reqs, 5000);
  ExpectSame(want, slow.out, "long tail, uncapped");
  int64_t worst = 0;
  for (uint64_t id = 2; id < 8; ++id) worst = std::max(worst, slow.finish_step.at(id));
  EXPECT_GT(worst, 13);
}

TEST(Serving, SmallGroupIsNotStarvedByAHugeGroup) {
  std::vector<SequenceRequest> reqs = Group(0, 1, 48, RandomTokens(20, 50), 40);
  const std::vector<SequenceRequest> small = Group(100, 2, 2, RandomTokens(20, 51), 40);
  reqs.insert(reqs.end(), small.begin(), small.end());  // arrives after all 48
  auto ref = Make(Reference());
  ASSERT_NE(ref, nullptr);
  const auto want = RunAll(*ref, reqs);
  Config s;
  s.max_running = 8;
  auto e = Make(s);
  ASSERT_NE(e, nullptr);
  const Timed got = RunTimed(*e, reqs, 5000);
  ExpectSame(want, got.out, "groups");
  // Round-robin among groups: the small group runs in the first wave of 8, not after 6 waves.
  for (uint64_t id : {100u, 101u}) {
    EXPECT_LE(got.first_token_step.at(id), 3) << id;
    EXPECT_LE(got.finish_step.at(id), 45) << id;
  }
  EXPECT_GT(got.finish_step.at(47), 200) << "the huge group needs six waves of 8";
}

TEST(Serving, HigherPriorityRunsFirstWhenTheEngineIsFull) {
  std::vector<SequenceRequest> reqs;
  for (int i = 0; i < 4; ++i) reqs.push_back(Req(i, RandomTokens(10, 70 + i), 30));
  SequenceRequest urgent = Req(9, RandomTokens(10, 79), 30);
  urgent.priority = 5;
  reqs.push_back(urgent);  // arrives last
  auto ref = Make(Reference());
  ASSERT_NE(ref, nullptr);
  const auto want = RunAll(*ref, reqs);
  Config s;
  s.max_running = 2;
  auto e = Make(s);
  ASSERT_NE(e, nullptr);
  const Timed got = RunTimed(*e, reqs, 1000);
  ExpectSame(want, got.out, "priority");
  EXPECT_EQ(got.first_token_step.at(9), 1);
  EXPECT_EQ(got.finish_step.at(9), 30);
  EXPECT_GT(got.first_token_step.at(1), 30) << "arrival order holds within a priority";
}

TEST(Serving, AbortMidRunFreesBlocksAndLeavesOthersUnchanged) {
  std::vector<SequenceRequest> reqs = Mixed(8, 4);
  const std::vector<SequenceRequest> group = Group(50, 9, 4, RandomTokens(70, 60), 60);
  reqs.insert(reqs.end(), group.begin(), group.end());
  auto ref = Make(Reference());
  ASSERT_NE(ref, nullptr);
  const auto want = RunAll(*ref, reqs);
  Config s;
  s.max_step_tokens = 64;
  s.max_running = 8;
  auto e = Make(s);
  ASSERT_NE(e, nullptr);
  for (const auto& r : reqs) ASSERT_TRUE(e->Add(r).ok());
  std::map<uint64_t, SequenceOutput> out;
  const std::vector<uint64_t> abort_ids = {3, 51, 7};  // running, a sharing sibling, waiting
  for (int step = 0; e->HasWork(); ++step) {
    if (step == 6) {
      for (uint64_t id : abort_ids) EXPECT_TRUE(e->Abort(id).ok()) << id;
      EXPECT_EQ(e->Abort(3).code(), ErrorCode::kNotFound);
    }
    auto st = e->Step();
    ASSERT_TRUE(st.ok());
    for (auto& f : st->finished) out[f.id] = std::move(f);
    ASSERT_TRUE(e->CheckBlockAccounting().ok());
  }
  for (const auto& [id, o] : want) {
    if (std::find(abort_ids.begin(), abort_ids.end(), id) != abort_ids.end()) {
      EXPECT_EQ(out.at(id).finish, FinishReason::kAborted) << id;
    } else {
      EXPECT_TRUE(SameTrajectory(o, out.at(id))) << id;
    }
  }
  e->ClearPrefixCache();
  EXPECT_EQ(e->stats().kv_blocks_free, e->stats().kv_blocks_total);
}

}  // namespace
}  // namespace bitroll
