// The invariance suite (docs/design.md "Promises") on mixture-of-experts models: make-model's
// qwen3-moe-tiny (8 experts, top-2, norm_topk_prob) and qwen2-moe-tiny (with the gated shared
// expert), plus the dense Qwen3 (QK-norm, head_dim != dim / n_heads) and Llama 3 (rope scaling)
// shapes for batch composition. Every comparison is memcmp. The negative control breaks only
// the routed experts' matmul (its reduction then depends on how many tokens an expert gets:
// BITROLL_TEST_BREAK_INVARIANCE=expert_matmul) and shows the same checks fail.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/invariance_break.h"
#include "engine/invariance_checks.h"
#include "engine/loaders/hf.h"
#include "engine/make_model_hf.h"
#include "kernels/cpu/isa.h"
#include "tests/engine_test_util.h"
#include "tests/invariance_checks.h"

namespace bitroll {
namespace {

namespace fs = std::filesystem;
using engine::SequenceOutput;
using engine::SequenceRequest;
using testing_util::EngineSetup;
using testing_util::Greedy;
using testing_util::MakeEngine;
using testing_util::RandomRequest;
using testing_util::RunAll;
using testing_util::SameTrajectory;
using testing_util::Sampled;
using testing_util::ScopedBreak;

std::shared_ptr<const engine::ModelWeights> Model(const std::string& name) {
  return testing_util::HfShapeModel(name);
}

testing_util::EngineFactory Cpu(const std::string& model, const EngineSetup& base) {
  return testing_util::HfShapeEngines(model, base);
}

engine::EngineFactory CpuVariants(const std::string& model, const EngineSetup& base) {
  return testing_util::HfShapeVariants(model, base);
}

const std::vector<int> kBatchSizes = {2, 3, 8, 17, 32};
const char* const kMoe = "qwen3-moe-tiny";

// The model loads as a MoE and routes: a guard that the suite below runs on experts.
TEST(MoeInvariance, TheModelIsAMixtureOfExperts) {
  auto w = Model(kMoe);
  ASSERT_TRUE(w);
  EXPECT_EQ(w->config.n_experts, 8);
  EXPECT_EQ(w->config.n_experts_per_tok, 2);
  EXPECT_TRUE(w->config.norm_topk_prob);
  EXPECT_TRUE(w->config.qk_norm);
  EXPECT_EQ(w->layers[0].experts.size(), 8u);
}

TEST(MoeInvariance, BatchCompositionGreedy) {
  EXPECT_EQ(0, testing_util::BatchCompositionMismatches(Cpu(kMoe, {}), Greedy(), kBatchSizes));
}

TEST(MoeInvariance, BatchCompositionSampledTwoThreads) {
  EngineSetup s;
  s.threads = 2;
  EXPECT_EQ(0, testing_util::BatchCompositionMismatches(Cpu(kMoe, s), Sampled(), kBatchSizes));
}

TEST(MoeInvariance, SharedExpertAndDenseShapesBatchComposition) {
  for (const char* m : {"qwen2-moe-tiny", "qwen3-tiny", "llama3-tiny"}) {
    EXPECT_EQ(0, testing_util::BatchCompositionMismatches(Cpu(m, {}), Sampled(), {3, 17})) << m;
  }
}

TEST(MoeInvariance, EveryRequestOfABatchEqualsItsSoloRun) {
  testing_util::CheckEveryRequestOfABatchEqualsItsSoloRun(Cpu(kMoe, {}));
}

TEST(MoeInvariance, PrefillChunking) {
  testing_util::CheckPrefillChunking(Cpu(kMoe, {}));
}

TEST(MoeInvariance, PrefillEqualsDecode) {
  testing_util::CheckPrefillEqualsDecode(Cpu(kMoe, {}));
}

TEST(MoeInvariance, ThreadsAttentionKernelsAndIsas) {
  testing_util::CheckThreadsAttentionKernelsAndIsas(kMoe);
}

TEST(MoeInvariance, ThousandIdenticalRequestsGiveOneOutput) {
  EngineSetup s;
  s.threads = 2;
  testing_util::CheckThousandIdenticalRequests(Cpu(kMoe, s));
}

// Prefix-cache hits, preemption and the disk tier give the bits of a fresh engine's run.
TEST(MoeInvariance, PrefixHitsPreemptionAndDiskTier) {
  testing_util::CheckPrefixHitsPreemptionAndDiskTier(kMoe);
}

// ---- negative control ----

TEST(MoeInvarianceNegativeControl, TokenCountDependentExpertMatmulIsCaught) {
  EngineSetup s;
  s.threads = 2;
  ScopedBreak broken("expert_matmul");
  EXPECT_GT(testing_util::BatchCompositionMismatches(Cpu(kMoe, s), Sampled(), kBatchSizes), 0)
      << "the batch-composition check failed to notice an expert matmul split by token count";
  // A dense model has no routed experts: the same switch leaves it invariant, so the failure
  // above comes from the experts.
  EXPECT_EQ(0, testing_util::BatchCompositionMismatches(Cpu("qwen3-tiny", s), Sampled(), {3, 17}));
}

TEST(MoeInvarianceNegativeControl, PrefillEqualsDecodeCatchesTheBrokenExpertToo) {
  ScopedBreak broken("expert_matmul");
  SequenceRequest r = testing_util::Target(1, Sampled());
  const SequenceOutput decoded = testing_util::RunAloneOn(Cpu(kMoe, {}), 0, r);
  Result<engine::Mismatches> found =
      engine::CheckPrefillEqualsDecode(CpuVariants(kMoe, {}), r, decoded, {4096});
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_FALSE(found->empty()) << "re-scoring with a token-count-dependent expert matmul gave the "
                                  "decoded bits";
}

}  // namespace
}  // namespace bitroll
