// The invariance suite (docs/design.md "Promises") on grouped-query attention at the ratio of
// Qwen3-8B and Llama 3 8B: make-model's qwen3-gqa4-tiny, 8 query heads over 2 kv heads of 32,
// whose decode rows run as kv units (kernels/cpu/attention.h: a row's 4 query heads of one kv
// head walk its chunks together, or split as one unit). Every comparison is memcmp. The negative
// control breaks the matmul (BITROLL_TEST_BREAK_INVARIANCE=matmul) and shows the same checks
// fail on this model.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "engine/invariance_break.h"
#include "tests/engine_test_util.h"
#include "tests/invariance_checks.h"

namespace bitroll {
namespace {

using testing_util::EngineSetup;
using testing_util::Greedy;
using testing_util::Sampled;
using testing_util::ScopedBreak;

const char* const kGqa = "qwen3-gqa4-tiny";
const std::vector<int> kBatchSizes = {2, 3, 8, 17, 32};

testing_util::EngineFactory Cpu(const EngineSetup& base) {
  return testing_util::HfShapeEngines(kGqa, base);
}

TEST(GqaInvariance, TheModelHasFourQueryHeadsPerKvHead) {
  auto w = testing_util::HfShapeModel(kGqa);
  ASSERT_TRUE(w);
  EXPECT_EQ(w->config.n_heads, 8);
  EXPECT_EQ(w->config.n_kv_heads, 2);
}

TEST(GqaInvariance, BatchCompositionGreedy) {
  EXPECT_EQ(0, testing_util::BatchCompositionMismatches(Cpu({}), Greedy(), kBatchSizes));
}

TEST(GqaInvariance, BatchCompositionSampledTwoThreads) {
  EngineSetup s;
  s.threads = 2;
  EXPECT_EQ(0, testing_util::BatchCompositionMismatches(Cpu(s), Sampled(), kBatchSizes));
}

TEST(GqaInvariance, EveryRequestOfABatchEqualsItsSoloRun) {
  testing_util::CheckEveryRequestOfABatchEqualsItsSoloRun(Cpu({}));
}

TEST(GqaInvariance, PrefillChunking) {
  testing_util::CheckPrefillChunking(Cpu({}));
}

TEST(GqaInvariance, PrefillEqualsDecode) {
  testing_util::CheckPrefillEqualsDecode(Cpu({}));
}

// 1, 2 and 3 threads x auto, single and split x every ISA: with 2 kv units per decode row, one
// thread runs both, two run one each, three split them.
TEST(GqaInvariance, ThreadsAttentionKernelsAndIsas) {
  testing_util::CheckThreadsAttentionKernelsAndIsas(kGqa);
}

TEST(GqaInvarianceNegativeControl, BatchSizeDependentMatmulIsCaught) {
  EngineSetup s;
  s.threads = 2;
  ScopedBreak broken("matmul");
  EXPECT_GT(testing_util::BatchCompositionMismatches(Cpu(s), Sampled(), kBatchSizes), 0)
      << "the batch-composition check failed to notice a batch-size dependent matmul";
}

}  // namespace
}  // namespace bitroll
