// Routing records (SequenceRequest::return_routing, engine.h RoutingRecord) on make-model's
// qwen3-moe-tiny: present and well formed when asked for, and identical (memcmp of ids and
// weight bits) for a trajectory generated alone, inside a mixed batch, with prefix-cache hits,
// under preemption, re-scored by one teacher-forced prefill, and resumed from its first half
// (what the coordinator does after kill -9). Negative control: a token-count-dependent expert
// matmul changes the records of a batched run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "engine/invariance_break.h"
#include "engine/invariance_checks.h"
#include "tests/engine_test_util.h"

namespace bitroll {
namespace {

using engine::RoutingRecord;
using engine::SequenceOutput;
using engine::SequenceRequest;
using testing_util::EngineSetup;
using testing_util::MakeEngine;
using testing_util::RandomRequest;
using testing_util::RunAll;
using testing_util::SameTrajectory;
using testing_util::Sampled;
using testing_util::ScopedBreak;

const char* const kMoe = "qwen3-moe-tiny";

std::shared_ptr<const engine::ModelWeights> Moe() {
  return testing_util::HfShapeModel(kMoe);
}

bool SameRoutes(const RoutingRecord& a, const RoutingRecord& b) {
  return a.n_layers == b.n_layers && a.k == b.k && a.expert_ids == b.expert_ids &&
         a.weights.size() == b.weights.size() &&
         std::memcmp(a.weights.data(), b.weights.data(), a.weights.size() * 4) == 0;
}

SequenceRequest Target(uint64_t id) {
  SequenceRequest r = RandomRequest(id, 77, 512, 60, 40, Sampled());
  r.stop.max_tokens = 40;
  r.stop.stop_at_eos = false;
  r.stop.stop_at_bos = false;
  r.return_routing = true;
  return r;
}

SequenceOutput Alone(const SequenceRequest& r, EngineSetup s = {}) {
  auto e = MakeEngine(s, Moe());
  if (e == nullptr) return {};
  return RunAll(*e, {r})[r.id];
}

TEST(Routing, RecordIsWellFormedAndOnlyWhenAsked) {
  const SequenceRequest r = Target(1);
  const SequenceOutput out = Alone(r);
  const RoutingRecord& rr = out.routing;
  ASSERT_EQ(out.tokens.size(), 40u);
  EXPECT_EQ(rr.n_layers, 2);
  EXPECT_EQ(rr.k, 2);
  EXPECT_EQ(rr.n_experts, 8);
  // Every position that entered the model: the prompt and all generated tokens but the last.
  ASSERT_EQ(rr.positions(), int64_t(r.prompt.size() + out.tokens.size() - 1));
  std::set<int> used;
  for (int64_t p = 0; p < rr.positions(); ++p) {
    for (int l = 0; l < rr.n_layers; ++l) {
      const size_t at = size_t((p * rr.n_layers + l) * rr.k);
      EXPECT_LT(rr.expert_ids[at], 8);
      EXPECT_NE(rr.expert_ids[at], rr.expert_ids[at + 1]);
      EXPECT_GE(rr.weights[at], rr.weights[at + 1]);                  // slot order: by probability
      EXPECT_NEAR(rr.weights[at] + rr.weights[at + 1], 1.0f, 1e-6f);  // norm_topk_prob
      used.insert(rr.expert_ids[at]);
    }
  }
  EXPECT_GE(used.size(), 6u) << "the router should spread tokens over the experts";
  // Not asked: no record; and asking never changes the trajectory's bits.
  SequenceRequest plain = r;
  plain.return_routing = false;
  const SequenceOutput p = Alone(plain);
  EXPECT_TRUE(p.routing.empty());
  EXPECT_TRUE(SameTrajectory(out, p));
  // A dense model ignores the request.
  auto e = MakeEngine({}, testing_util::HfShapeModel("qwen3-tiny"));
  ASSERT_NE(e, nullptr);
  EXPECT_TRUE(RunAll(*e, {r})[1].routing.empty());
}

TEST(Routing, SameAloneInAMixedBatchWithPrefixHitsAndPreemption) {
  const SequenceRequest target = Target(1);
  const SequenceOutput ref = Alone(target);
  ASSERT_FALSE(ref.routing.empty());
  std::mt19937 rng(3);
  std::vector<SequenceRequest> batch;
  for (int i = 0; i < 16; ++i) {
    SequenceRequest o = RandomRequest(100 + i, rng(), 512, 80, 50, Sampled());
    o.return_routing = i % 2 == 0;
    batch.push_back(o);
  }
  batch.insert(batch.begin() + 7, target);
  for (int32_t step_tokens : {512, 64, 7}) {
    EngineSetup s;
    s.max_step_tokens = step_tokens;
    s.threads = 2;
    auto e = MakeEngine(s, Moe());
    ASSERT_NE(e, nullptr);
    const auto out = RunAll(*e, batch);
    EXPECT_TRUE(SameTrajectory(ref, out.at(1))) << step_tokens;
    EXPECT_TRUE(SameRoutes(ref.routing, out.at(1).routing)) << "step tokens " << step_tokens;
  }
  // Prefix hits: the same prompt first without routes (it fills the prefix cache), then with.
  {
    auto e = MakeEngine({}, Moe());
    ASSERT_NE(e, nullptr);
    SequenceRequest warm = target;
    warm.id = 50;
    warm.return_routing = false;
    RunAll(*e, {warm});
    const int64_t cached_before = e->stats().prefill_tokens_cached;
    const auto out = RunAll(*e, {target});
    EXPECT_TRUE(SameRoutes(ref.routing, out.at(1).routing)) << "after a prefix-cache fill";
    EXPECT_EQ(e->stats().prefill_tokens_cached, cached_before)
        << "a routed sequence must compute its own prompt";
    // A plain request still hits the cache.
    SequenceRequest again = warm;
    again.id = 51;
    RunAll(*e, {again});
    EXPECT_GT(e->stats().prefill_tokens_cached, cached_before);
  }
  // Preemption every 2 steps with a small KV budget.
  {
    EngineSetup s;
    s.preempt_every_steps = 2;
    s.kv_cache_bytes = 2ll << 20;
    auto e = MakeEngine(s, Moe());
    ASSERT_NE(e, nullptr);
    const auto out = RunAll(*e, batch);
    EXPECT_GT(e->stats().preemptions, 0);
    EXPECT_TRUE(SameRoutes(ref.routing, out.at(1).routing)) << "under preemption";
  }
}

// Re-scoring (p_vs_d) and resuming from a prefix of the tokens (the coordinator's resume after
// kill -9 forces the tokens it had logged) give the same record.
TEST(Routing, SameWhenRescoredAndWhenResumed) {
  const SequenceRequest target = Target(1);
  const SequenceOutput ref = Alone(target);
  for (size_t keep : {size_t{0}, size_t{17}, ref.tokens.size()}) {
    SequenceRequest r = target;
    r.forced.assign(ref.tokens.begin(), ref.tokens.begin() + keep);
    const SequenceOutput out = Alone(r);
    EXPECT_TRUE(SameTrajectory(ref, out)) << keep;
    EXPECT_TRUE(SameRoutes(ref.routing, out.routing)) << "resumed after " << keep << " tokens";
  }
}

TEST(RoutingNegativeControl, BrokenExpertMatmulChangesBatchedRecords) {
  ScopedBreak broken("expert_matmul");  // until the end of the test, early returns too
  const SequenceRequest target = Target(1);
  const SequenceOutput alone = Alone(target);
  std::mt19937 rng(3);
  std::vector<SequenceRequest> batch = {target};
  for (int i = 0; i < 16; ++i)
    batch.push_back(RandomRequest(100 + i, rng(), 512, 80, 50, Sampled()));
  auto e = MakeEngine({}, Moe());
  ASSERT_NE(e, nullptr);
  const auto out = RunAll(*e, batch);
  EXPECT_FALSE(SameRoutes(alone.routing, out.at(1).routing))
      << "records of a batched run matched the solo run under a batch-variant expert matmul";
}

}  // namespace
}  // namespace bitroll
