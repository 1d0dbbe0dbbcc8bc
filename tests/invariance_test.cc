// The invariance suite (promise 1 and 2 of DESIGN.md), on the real stories260K model.
//
// A trajectory's ids and logprob bits must not depend on batch composition, batch size, position in
// the batch, prefill chunking, thread count, attention kernel or ISA; re-scoring a finished
// trajectory with one teacher-forced prefill must reproduce every logprob bit. Every comparison is
// memcmp. The negative controls plug deliberately batch-variant kernels in and show that the same
// checks then fail.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "tests/engine_test_util.h"

namespace bitroll {
namespace {

using engine::SamplingParams;
using engine::SequenceOutput;
using engine::SequenceRequest;
using testing_util::EngineSetup;
using testing_util::Greedy;
using testing_util::MakeEngine;
using testing_util::RandomRequest;
using testing_util::RunAll;
using testing_util::SameTrajectory;
using testing_util::Sampled;
using testing_util::Target;

SequenceOutput RunAlone(const EngineSetup& setup, const SequenceRequest& r) {
  auto e = MakeEngine(setup);
  if (e == nullptr) return {};
  return RunAll(*e, {r})[r.id];
}

// Runs the target inside batches of 2..64 random other requests at random positions and returns
// how many runs gave bits different from the target run alone (0 = invariant).
int BatchCompositionMismatches(const EngineSetup& setup, const SamplingParams& sp) {
  const SequenceOutput alone = RunAlone(setup, Target(7, sp));
  EXPECT_FALSE(alone.tokens.empty());
  int mismatches = 0;
  std::mt19937 rng(42);
  for (int batch : {2, 3, 8, 17, 32, 64}) {
    std::vector<SequenceRequest> reqs;
    for (int i = 0; i < batch - 1; ++i) {
      reqs.push_back(RandomRequest(1000 + i, rng(), 512, 40, 40, sp));
    }
    const uint64_t target_id = std::uniform_int_distribution<uint64_t>(0, 5000)(rng) * 2 + 1;
    const size_t at = std::uniform_int_distribution<size_t>(0, reqs.size())(rng);
    reqs.insert(reqs.begin() + at, Target(target_id, sp));
    auto e = MakeEngine(setup);
    if (e == nullptr) return -1;
    auto out = RunAll(*e, reqs);
    if (!SameTrajectory(alone, out[target_id])) ++mismatches;
  }
  return mismatches;
}

TEST(Invariance, BatchCompositionGreedy) {
  EXPECT_EQ(0, BatchCompositionMismatches(EngineSetup{}, Greedy()));
}

TEST(Invariance, BatchCompositionSampled) {
  EngineSetup setup;
  setup.threads = 2;
  EXPECT_EQ(0, BatchCompositionMismatches(setup, Sampled()));
}

TEST(Invariance, EveryRequestOfABatchEqualsItsSoloRun) {
  std::mt19937 rng(9);
  std::vector<SequenceRequest> reqs;
  for (int i = 0; i < 24; ++i) reqs.push_back(RandomRequest(i, rng(), 512, 60, 32, Sampled()));
  EngineSetup setup;
  setup.max_step_tokens = 64;  // forces chunked prefill mixed with decode
  auto e = MakeEngine(setup);
  ASSERT_NE(e, nullptr);
  auto batched = RunAll(*e, reqs);
  for (const auto& r : reqs) {
    EXPECT_TRUE(SameTrajectory(RunAlone(EngineSetup{}, r), batched[r.id])) << "request " << r.id;
  }
}

TEST(Invariance, PrefillChunking) {
  // A long prompt (several KV blocks and attention chunks), split into chunks of 1 token, one
  // block, several blocks, and the whole prompt.
  SequenceRequest r = Target(1, Sampled());
  std::mt19937 rng(3);
  for (int i = 0; i < 150; ++i)
    r.prompt.push_back(std::uniform_int_distribution<int32_t>(3, 511)(rng));
  EngineSetup whole;
  whole.max_step_tokens = 4096;
  const SequenceOutput ref = RunAlone(whole, r);
  ASSERT_EQ(ref.tokens.size(), 48u);
  for (int chunk : {1, 7, 16, 48, 100}) {
    EngineSetup s;
    s.max_step_tokens = chunk;
    EXPECT_TRUE(SameTrajectory(ref, RunAlone(s, r))) << "chunk " << chunk;
  }
}

// p_vs_d: re-scoring a finished trajectory with one teacher-forced prefill reproduces every
// recorded logprob bit, for greedy and sampled decoding, whole or chunked.
TEST(Invariance, PrefillEqualsDecode) {
  for (const SamplingParams& sp : {Greedy(), Sampled()}) {
    SequenceRequest r = Target(1, sp);
    r.stop.max_tokens = 120;
    const SequenceOutput decoded = RunAlone(EngineSetup{}, r);
    ASSERT_EQ(decoded.tokens.size(), 120u);
    SequenceRequest rescore = r;
    rescore.id = 2;
    rescore.forced = decoded.tokens;
    rescore.stop.max_tokens = static_cast<int32_t>(decoded.tokens.size());
    for (int budget : {4096, 32, 5}) {
      EngineSetup s;
      s.max_step_tokens = budget;
      const SequenceOutput scored = RunAlone(s, rescore);
      EXPECT_TRUE(SameTrajectory(decoded, scored)) << "budget " << budget;
      EXPECT_EQ(scored.cost.decode_tokens, 0) << "re-scoring must not decode";
    }
  }
}

TEST(Invariance, ThreadsAndAttentionKernels) {
  std::mt19937 rng(5);
  std::vector<SequenceRequest> reqs;
  for (int i = 0; i < 6; ++i) reqs.push_back(RandomRequest(i, rng(), 512, 300, 60, Sampled()));
  auto e0 = MakeEngine(EngineSetup{});
  ASSERT_NE(e0, nullptr);
  const auto ref = RunAll(*e0, reqs);
  for (int threads : {1, 2, 3, 4}) {
    for (const char* attention : {"auto", "single", "split"}) {
      EngineSetup s;
      s.threads = threads;
      s.attention = attention;
      s.max_step_tokens = 97;
      auto e = MakeEngine(s);
      ASSERT_NE(e, nullptr);
      auto out = RunAll(*e, reqs);
      for (const auto& r : reqs) {
        EXPECT_TRUE(SameTrajectory(ref.at(r.id), out[r.id]))
            << "threads " << threads << " attention " << attention << " request " << r.id;
      }
    }
  }
}

TEST(Invariance, WholeGenerationOnEveryIsa) {
  std::mt19937 rng(6);
  std::vector<SequenceRequest> reqs;
  for (int i = 0; i < 4; ++i) reqs.push_back(RandomRequest(i, rng(), 512, 100, 40, Sampled()));
  EngineSetup scalar;
  scalar.isa = "scalar";
  auto e0 = MakeEngine(scalar);
  ASSERT_NE(e0, nullptr);
  const auto ref = RunAll(*e0, reqs);
  for (const char* isa : {"avx2", "avx512"}) {
    if (!kernels::ParseIsa(isa).ok()) {
      std::cerr << "*** invariance_test: this CPU lacks " << isa
                << "; that path is NOT tested ***\n";
      continue;
    }
    EngineSetup s;
    s.isa = isa;
    s.threads = 2;
    auto e = MakeEngine(s);
    ASSERT_NE(e, nullptr);
    auto out = RunAll(*e, reqs);
    for (const auto& r : reqs)
      EXPECT_TRUE(SameTrajectory(ref.at(r.id), out[r.id])) << isa << " " << r.id;
  }
}

TEST(Invariance, ThousandIdenticalRequestsGiveOneOutput) {
  for (const SamplingParams& sp : {Greedy(), Sampled()}) {
    std::vector<SequenceRequest> reqs;
    for (int i = 0; i < 1000; ++i) {
      SequenceRequest r = Target(i, sp);
      r.stop.max_tokens = 24;
      reqs.push_back(r);
    }
    EngineSetup s;
    s.threads = 2;
    s.max_step_tokens = 700;  // batches mix prefill and decode rows of many sequences
    auto e = MakeEngine(s);
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

// ---- negative controls ----

// A batch-variant matmul: with more than one row in the batch it splits K in two halves and adds
// the halves (split-K chosen by batch size: exactly the kind of kernel the contract forbids).
void BatchVariantMatmul(kernels::Isa isa, const kernels::MatmulParams& p,
                        kernels::ThreadPool* pool) {
  if (p.m == 1) {
    kernels::Matmul(isa, p, pool);
    return;
  }
  const int64_t n = p.w->n(), k = p.w->k(), half = k / 2;
  std::vector<float> w(k);
  for (int64_t j = 0; j < n; ++j) {
    p.w->UnpackRow(j, w.data());
    for (int64_t i = 0; i < p.m; ++i) {
      const float* x = p.x + i * p.ldx;
      float a = 0.0f, b = 0.0f;
      for (int64_t kk = 0; kk < half; ++kk) a = std::fma(x[kk], w[kk], a);
      for (int64_t kk = half; kk < k; ++kk) b = std::fma(x[kk], w[kk], b);
      float acc = a + b;
      if (p.bias != nullptr) acc += p.bias[j];
      p.y[i * p.ldy + j] = acc;
    }
  }
}

TEST(InvarianceNegativeControl, BatchVariantMatmulIsCaught) {
  EngineSetup s;
  s.matmul_override = &BatchVariantMatmul;
  EXPECT_GT(BatchCompositionMismatches(s, Sampled()), 0)
      << "the batch-composition check failed to notice a split-K matmul chosen by batch size";
}

TEST(InvarianceNegativeControl, PrefillEqualsDecodeCatchesTheVariantToo) {
  EngineSetup s;
  s.matmul_override = &BatchVariantMatmul;
  SequenceRequest r = Target(1, Sampled());
  const SequenceOutput decoded = RunAlone(s, r);
  SequenceRequest rescore = r;
  rescore.forced = decoded.tokens;
  rescore.stop.max_tokens = static_cast<int32_t>(decoded.tokens.size());
  EXPECT_FALSE(SameTrajectory(decoded, RunAlone(s, rescore)));
}

}  // namespace
}  // namespace bitroll
