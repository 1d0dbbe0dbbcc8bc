#include "tests/invariance_checks.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <set>

#include "tests/engine_test_util.h"

namespace bitroll::testing_util {

using engine::SamplingParams;
using engine::SequenceOutput;
using engine::SequenceRequest;

SequenceOutput RunAloneOn(const EngineFactory& make, int32_t max_step_tokens,
                          const SequenceRequest& r) {
  auto e = make(max_step_tokens);
  if (e == nullptr) return {};
  return RunAll(*e, {r})[r.id];
}

int BatchCompositionMismatches(const EngineFactory& make, const SamplingParams& sp,
                               const std::vector<int>& sizes) {
  const SequenceOutput alone = RunAloneOn(make, 0, Target(7, sp));
  EXPECT_EQ(alone.tokens.size(), 48u);
  int mismatches = 0;
  std::mt19937 rng(42);
  for (int batch : sizes) {
    std::vector<SequenceRequest> reqs;
    for (int i = 0; i < batch - 1; ++i) {
      reqs.push_back(RandomRequest(1000 + i, rng(), 512, 40, 40, sp));
    }
    const uint64_t target_id = std::uniform_int_distribution<uint64_t>(0, 5000)(rng) * 2 + 1;
    const size_t at = std::uniform_int_distribution<size_t>(0, reqs.size())(rng);
    reqs.insert(reqs.begin() + at, Target(target_id, sp));
    auto e = make(0);
    if (e == nullptr) return -1;
    auto out = RunAll(*e, reqs);
    if (!SameTrajectory(alone, out[target_id])) ++mismatches;
  }
  return mismatches;
}

void CheckEveryRequestOfABatchEqualsItsSoloRun(const EngineFactory& make) {
  std::mt19937 rng(9);
  std::vector<SequenceRequest> reqs;
  for (int i = 0; i < 24; ++i) reqs.push_back(RandomRequest(i, rng(), 512, 60, 32, Sampled()));
  auto e = make(64);
  ASSERT_NE(e, nullptr);
  auto batched = RunAll(*e, reqs);
  for (const auto& r : reqs) {
    EXPECT_TRUE(SameTrajectory(RunAloneOn(make, 0, r), batched[r.id])) << "request " << r.id;
  }
}

void CheckPrefillChunking(const EngineFactory& make) {
  // A long prompt (several KV blocks and attention chunks), split into chunks of 1 token, one
  // block, several blocks, and the whole prompt.
  SequenceRequest r = Target(1, Sampled());
  std::mt19937 rng(3);
  for (int i = 0; i < 150; ++i) {
    r.prompt.push_back(std::uniform_int_distribution<int32_t>(3, 511)(rng));
  }
  const SequenceOutput ref = RunAloneOn(make, 4096, r);
  ASSERT_EQ(ref.tokens.size(), 48u);
  for (int chunk : {1, 7, 16, 48, 100}) {
    EXPECT_TRUE(SameTrajectory(ref, RunAloneOn(make, chunk, r))) << "chunk " << chunk;
  }
}

void CheckPrefillEqualsDecode(const EngineFactory& make) {
  for (const SamplingParams& sp : {Greedy(), Sampled()}) {
    SequenceRequest r = Target(1, sp);
    r.stop.max_tokens = 120;
    const SequenceOutput decoded = RunAloneOn(make, 0, r);
    ASSERT_EQ(decoded.tokens.size(), 120u);
    SequenceRequest rescore = r;
    rescore.id = 2;
    rescore.forced = decoded.tokens;
    rescore.stop.max_tokens = static_cast<int32_t>(decoded.tokens.size());
    for (int budget : {4096, 32, 5}) {
      const SequenceOutput scored = RunAloneOn(make, budget, rescore);
      EXPECT_TRUE(SameTrajectory(decoded, scored)) << "budget " << budget;
      EXPECT_EQ(scored.cost.decode_tokens, 0) << "re-scoring must not decode";
    }
  }
}

void CheckThousandIdenticalRequests(const EngineFactory& make) {
  for (const SamplingParams& sp : {Greedy(), Sampled()}) {
    std::vector<SequenceRequest> reqs;
    for (int i = 0; i < 1000; ++i) {
      SequenceRequest r = Target(i, sp);
      r.stop.max_tokens = 24;
      reqs.push_back(r);
    }
    auto e = make(700);  // batches mix prefill and decode rows of many sequences
    ASSERT_NE(e, nullptr);
    auto out = RunAll(*e, reqs);
    ASSERT_EQ(out.size(), 1000u);
    std::set<std::vector<uint8_t>> unique;
    for (const auto& [id, o] : out) {
      std::vector<uint8_t> bytes(o.tokens.size() * 4 + o.logprobs.size() * 4);
      std::memcpy(bytes.data(), o.tokens.data(), o.tokens.size() * 4);
      std::memcpy(bytes.data() + o.tokens.size() * 4, o.logprobs.data(), o.logprobs.size() * 4);
      unique.insert(bytes);
    }
    EXPECT_EQ(unique.size(), 1u) << "temperature " << sp.temperature;
  }
}

}  // namespace bitroll::testing_util
