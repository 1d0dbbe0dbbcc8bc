// Tests of the NullEngine test double: its output is a pure function of (prompt, seed,
// sample_index, position, weights) and nothing else, as the Engine contract requires.
#include "rollout/null_engine.h"

#include <gtest/gtest.h>

#include <cstring>

namespace bitroll::rollout {
namespace {

engine::SequenceRequest Req(uint64_t id, std::vector<int32_t> prompt, uint32_t sample,
                            uint64_t seed = 1, int32_t max_tokens = 32) {
  engine::SequenceRequest r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.sample_index = sample;
  r.sampling.seed = seed;
  r.stop.max_tokens = max_tokens;
  r.group_id = 1;
  return r;
}

std::map<uint64_t, engine::SequenceOutput> RunAll(engine::Engine& e) {
  std::map<uint64_t, engine::SequenceOutput> out;
  while (e.HasWork()) {
    auto r = e.Step();
    EXPECT_TRUE(r.ok());
    for (auto& f : r->finished) out[f.id] = std::move(f);
  }
  return out;
}

bool SameBits(const engine::SequenceOutput& a, const engine::SequenceOutput& b) {
  return a.tokens.size() == b.tokens.size() && a.logprobs.size() == b.logprobs.size() &&
         std::memcmp(a.tokens.data(), b.tokens.data(), a.tokens.size() * 4) == 0 &&
         std::memcmp(a.logprobs.data(), b.logprobs.data(), a.logprobs.size() * 4) == 0;
}

TEST(NullEngineTest, IndependentOfBatchAndOrder) {
  NullEngine alone({});
  ASSERT_TRUE(alone.Add(Req(1, {4, 5, 6}, 3)).ok());
  auto ref = RunAll(alone);

  NullEngine crowded({});
  for (uint64_t i = 10; i < 20; ++i) ASSERT_TRUE(crowded.Add(Req(i, {7, 8}, i)).ok());
  ASSERT_TRUE(crowded.Step().ok());  // the sequence joins mid-flight, under another id
  ASSERT_TRUE(crowded.Add(Req(99, {4, 5, 6}, 3)).ok());
  auto got = RunAll(crowded);
  ASSERT_TRUE(SameBits(ref[1], got[99]));
  EXPECT_FALSE(ref[1].tokens.empty());
  // Negative control: another sample index gives other bits.
  NullEngine other({});
  ASSERT_TRUE(other.Add(Req(1, {4, 5, 6}, 4)).ok());
  EXPECT_FALSE(SameBits(ref[1], RunAll(other)[1]));
}

TEST(NullEngineTest, MatchesDocumentedFormula) {
  NullEngineOptions o;
  o.eos_period = 0;
  NullEngine e(o);
  ASSERT_TRUE(e.Add(Req(1, {4, 5, 6}, 2, 9, 5)).ok());
  auto out = RunAll(e)[1];
  ASSERT_EQ(out.tokens.size(), 5u);
  EXPECT_EQ(out.finish, FinishReason::kLength);
  const uint64_t ph = NullPromptHash({4, 5, 6});
  for (int k = 0; k < 5; ++k) {
    const uint64_t h = NullTokenHash(ph, 9, 2, false, 3 + k, 0);
    EXPECT_EQ(out.tokens[k], static_cast<int32_t>(3 + h % 509));
    const float lp = -static_cast<float>(h >> 40) / 1048576.0f;
    EXPECT_EQ(std::memcmp(&out.logprobs[k], &lp, 4), 0);
  }
}

TEST(NullEngineTest, GreedyIgnoresSampleIndex) {
  NullEngine e({});
  auto a = Req(1, {9, 9}, 0);
  auto b = Req(2, {9, 9}, 5);
  a.sampling.temperature = b.sampling.temperature = 0.0f;
  ASSERT_TRUE(e.Add(a).ok());
  ASSERT_TRUE(e.Add(b).ok());
  auto out = RunAll(e);
  EXPECT_TRUE(SameBits(out[1], out[2]));
}

TEST(NullEngineTest, ErrorsAndAbort) {
  NullEngine e({});
  EXPECT_EQ(e.Add(Req(1, {}, 0)).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(e.Add(Req(1, {600}, 0)).code(), ErrorCode::kOutOfRange);
  ASSERT_TRUE(e.Add(Req(1, {5}, 0, 1, 1000)).ok());
  EXPECT_EQ(e.Add(Req(1, {5}, 0)).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(e.Abort(2).code(), ErrorCode::kNotFound);
  ASSERT_TRUE(e.Abort(1).ok());
  auto out = RunAll(e);
  EXPECT_EQ(out[1].finish, FinishReason::kAborted);
}

TEST(NullEngineTest, WeightUpdateSplitsVersionSpans) {
  NullEngineOptions o;
  o.eos_period = 0;
  NullEngine e(o);
  ASSERT_TRUE(e.Add(Req(1, {4}, 0, 1, 6)).ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(e.Step().ok());
  ASSERT_TRUE(e.UpdateWeights("w2", 7).ok());
  auto out = RunAll(e)[1];
  ASSERT_EQ(out.versions.size(), 2u);
  EXPECT_EQ(out.versions[0].begin, 0);
  EXPECT_EQ(out.versions[0].version, 0u);
  EXPECT_EQ(out.versions[1].begin, 3);
  EXPECT_EQ(out.versions[1].version, 7u);
  NullEngine fresh(o);
  ASSERT_TRUE(fresh.Add(Req(1, {4}, 0, 1, 6)).ok());
  auto ref = RunAll(fresh)[1];
  EXPECT_EQ(std::memcmp(ref.tokens.data(), out.tokens.data(), 3 * 4), 0);
  EXPECT_NE(std::memcmp(ref.tokens.data() + 3, out.tokens.data() + 3, 3 * 4), 0);
}

}  // namespace
}  // namespace bitroll::rollout
