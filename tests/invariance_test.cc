// The invariance suite (promises 1 and 2, docs/design.md "Promises"), on stories260K.
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

#include "engine/invariance_break.h"
#include "engine/invariance_checks.h"
#include "kernels/cpu/matmul.h"
#include "tests/engine_test_util.h"
#include "tests/invariance_checks.h"

namespace bitroll {
namespace {

using bitroll::SamplingParams;
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

// The CPU engine factory of the shared checks (tests/invariance_checks.h): `base` with the step
// budget the check asks for.
testing_util::EngineFactory Cpu(const EngineSetup& base) {
  return [base](int32_t max_step_tokens) -> std::unique_ptr<engine::Engine> {
    EngineSetup s = base;
    if (max_step_tokens > 0) s.max_step_tokens = max_step_tokens;
    return MakeEngine(s);
  };
}

// The same with every field of engine::EngineVariant (threads, ISA, attention kernel).
engine::EngineFactory CpuVariants(const EngineSetup& base) {
  return [base](const engine::EngineVariant& v) -> Result<std::unique_ptr<engine::Engine>> {
    EngineSetup s = base;
    if (v.max_step_tokens > 0) s.max_step_tokens = v.max_step_tokens;
    if (v.max_prefill_chunk > 0) s.max_prefill_chunk = v.max_prefill_chunk;
    if (v.threads > 0) s.threads = v.threads;
    if (!v.isa.empty()) s.isa = v.isa;
    if (!v.attention.empty()) s.attention = v.attention;
    std::unique_ptr<engine::Engine> e = MakeEngine(s);
    if (e == nullptr) return Status::Internal("no engine");
    return e;
  };
}

const std::vector<int> kBatchSizes = {2, 3, 8, 17, 32, 64};

int BatchCompositionMismatches(const EngineSetup& setup, const SamplingParams& sp) {
  return testing_util::BatchCompositionMismatches(Cpu(setup), sp, kBatchSizes);
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
  testing_util::CheckEveryRequestOfABatchEqualsItsSoloRun(Cpu(EngineSetup{}));
}

TEST(Invariance, PrefillChunking) {
  testing_util::CheckPrefillChunking(Cpu(EngineSetup{}));
}

// p_vs_d: re-scoring a finished trajectory with one teacher-forced prefill reproduces every
// recorded logprob bit, for greedy and sampled decoding, whole or chunked.
TEST(Invariance, PrefillEqualsDecode) {
  testing_util::CheckPrefillEqualsDecode(Cpu(EngineSetup{}));
}

// Every request of `reqs`, run together on each variant, equals the `base` engine's run.
void ExpectSameOnEveryVariant(const std::vector<SequenceRequest>& reqs,
                              const std::vector<engine::EngineVariant>& variants,
                              const EngineSetup& base = EngineSetup{}) {
  auto e0 = MakeEngine(base);
  ASSERT_NE(e0, nullptr);
  const auto ref = RunAll(*e0, reqs);
  Result<engine::Mismatches> found = engine::CheckVariants(CpuVariants(base), reqs, ref, variants);
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  for (const auto& m : *found) ADD_FAILURE() << m.ToString();
}

void ExpectSameOnEveryThreadCountAndKernel(const EngineSetup& base) {
  std::mt19937 rng(5);
  std::vector<SequenceRequest> reqs;
  for (int i = 0; i < 6; ++i) reqs.push_back(RandomRequest(i, rng(), 512, 300, 60, Sampled()));
  std::vector<engine::EngineVariant> variants;
  for (int threads : {1, 2, 3, 4}) {
    for (const char* attention : {"auto", "single", "split"}) {
      engine::EngineVariant& v = variants.emplace_back();
      v.max_step_tokens = 97;
      v.threads = threads;
      v.attention = attention;
    }
  }
  ExpectSameOnEveryVariant(reqs, variants, base);
}

TEST(Invariance, ThreadsAndAttentionKernels) {
  ExpectSameOnEveryThreadCountAndKernel(EngineSetup{});
}

void ExpectSameOnEveryIsa(const EngineSetup& base) {
  std::mt19937 rng(6);
  std::vector<SequenceRequest> reqs;
  for (int i = 0; i < 4; ++i) reqs.push_back(RandomRequest(i, rng(), 512, 100, 40, Sampled()));
  std::vector<engine::EngineVariant> variants(1);
  variants[0].isa = "scalar";
  for (const char* isa : {"avx2", "avx512"}) {
    if (!kernels::ParseIsa(isa).ok()) {
      std::cerr << "*** invariance_test: this CPU lacks " << isa
                << "; that path is NOT tested ***\n";
      continue;
    }
    engine::EngineVariant& v = variants.emplace_back();
    v.threads = 2;
    v.isa = isa;
  }
  ExpectSameOnEveryVariant(reqs, variants, base);
}

TEST(Invariance, WholeGenerationOnEveryIsa) {
  ExpectSameOnEveryIsa(EngineSetup{});
}

// ---- the bf16 KV cache (--kv-dtype bf16): its own fingerprint, the same promises within it ----

EngineSetup Bf16Kv() {
  EngineSetup s;
  s.kv_dtype = "bf16";
  return s;
}

TEST(InvarianceBf16Kv, BatchComposition) {
  EXPECT_EQ(0, BatchCompositionMismatches(Bf16Kv(), Greedy()));
  EngineSetup s = Bf16Kv();
  s.threads = 2;
  EXPECT_EQ(0, BatchCompositionMismatches(s, Sampled()));
}

TEST(InvarianceBf16Kv, EveryRequestOfABatchEqualsItsSoloRun) {
  testing_util::CheckEveryRequestOfABatchEqualsItsSoloRun(Cpu(Bf16Kv()));
}

TEST(InvarianceBf16Kv, PrefillChunking) {
  testing_util::CheckPrefillChunking(Cpu(Bf16Kv()));
}

TEST(InvarianceBf16Kv, PrefillEqualsDecode) {
  testing_util::CheckPrefillEqualsDecode(Cpu(Bf16Kv()));
}

TEST(InvarianceBf16Kv, ThreadsAndAttentionKernels) {
  ExpectSameOnEveryThreadCountAndKernel(Bf16Kv());
}

TEST(InvarianceBf16Kv, WholeGenerationOnEveryIsa) {
  ExpectSameOnEveryIsa(Bf16Kv());
}

TEST(Invariance, ThousandIdenticalRequestsGiveOneOutput) {
  EngineSetup s;
  s.threads = 2;
  testing_util::CheckThousandIdenticalRequests(Cpu(s));
}

// ---- negative controls ----

// The batch-variant matmul of engine/invariance_break.h (split-K chosen by batch size: exactly
// the kind of kernel the contract forbids; BITROLL_TEST_BREAK_INVARIANCE=matmul plugs the same one
// into every engine of a process).
using engine::BatchVariantMatmul;

TEST(InvarianceNegativeControl, BatchVariantMatmulIsCaught) {
  EngineSetup s;
  s.matmul_override = &BatchVariantMatmul;
  EXPECT_GT(BatchCompositionMismatches(s, Sampled()), 0)
      << "the batch-composition check failed to notice a split-K matmul chosen by batch size";
}

TEST(InvarianceNegativeControl, BatchVariantMatmulIsCaughtWithABf16KvCache) {
  EngineSetup s = Bf16Kv();
  s.matmul_override = &BatchVariantMatmul;
  EXPECT_GT(BatchCompositionMismatches(s, Sampled()), 0)
      << "the batch-composition check failed to notice a split-K matmul (bf16 KV cache)";
}

// The two caches are two fingerprints: the same request gives different bits (so a check that
// compared across them would fail, and the fingerprint must tell them apart).
TEST(InvarianceNegativeControl, Bf16KvCacheIsADifferentFingerprint) {
  auto a = MakeEngine(EngineSetup{});
  auto b = MakeEngine(Bf16Kv());
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(a->info().fingerprint.backend, "cpu");
  EXPECT_EQ(b->info().fingerprint.backend, "cpu-kvbf16");
  const SequenceRequest r = Target(1, Sampled());
  EXPECT_FALSE(SameTrajectory(RunAll(*a, {r})[1], RunAll(*b, {r})[1]));
}

TEST(InvarianceNegativeControl, PrefillEqualsDecodeCatchesTheVariantToo) {
  EngineSetup s;
  s.matmul_override = &BatchVariantMatmul;
  SequenceRequest r = Target(1, Sampled());
  const SequenceOutput decoded = RunAlone(s, r);
  Result<engine::Mismatches> found =
      engine::CheckPrefillEqualsDecode(CpuVariants(s), r, decoded, {4096});
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  ASSERT_FALSE(found->empty()) << "re-scoring with a batch-variant matmul gave the decoded bits";
  EXPECT_EQ(found->front().check, "prefill_vs_decode");
  EXPECT_GE(found->front().token, 0);
  EXPECT_NE(found->front().recorded_bits, found->front().recomputed_bits);
}

}  // namespace
}  // namespace bitroll
