#include "tests/invariance_checks.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <map>
#include <random>

#include "engine/invariance_checks.h"
#include "kernels/cpu/isa.h"
#include "tests/engine_test_util.h"

namespace bitroll::testing_util {

using bitroll::SamplingParams;
using engine::Mismatches;
using engine::SequenceOutput;
using engine::SequenceRequest;

namespace {

// The library's factory over a test factory that only sets the step budget. max_prefill_chunk is
// bounded by the budget anyway; other fields are not the business of these checks.
engine::EngineFactory Wrap(const EngineFactory& make) {
  return [make](const engine::EngineVariant& v) -> Result<std::unique_ptr<engine::Engine>> {
    if (v.threads > 0 || !v.isa.empty() || !v.attention.empty()) {
      return Status::Unsupported("this test factory sets only the step budget");
    }
    std::unique_ptr<engine::Engine> e = make(v.max_step_tokens);
    if (e == nullptr) return Status::Internal("the test factory made no engine");
    return e;
  };
}

// Every mismatch fails the calling test, with its first differing token.
void ExpectNone(const Result<Mismatches>& found) {
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  for (const engine::InvarianceMismatch& m : *found) ADD_FAILURE() << m.ToString();
}

}  // namespace

SequenceOutput RunAloneOn(const EngineFactory& make, int32_t max_step_tokens,
                          const SequenceRequest& r) {
  engine::EngineVariant v;
  v.max_step_tokens = max_step_tokens;
  Result<SequenceOutput> out = engine::RunAlone(Wrap(make), v, r);
  if (!out.ok()) {
    ADD_FAILURE() << out.status().ToString();
    return {};
  }
  return std::move(out).value();
}

int BatchCompositionMismatches(const EngineFactory& make, const SamplingParams& sp,
                               const std::vector<int>& sizes) {
  engine::FillerShape fillers;
  fillers.sampling = sp;
  const SequenceRequest target = Target(7, sp);
  EXPECT_EQ(RunAloneOn(make, 0, target).tokens.size(), 48u);
  Result<Mismatches> found = engine::CheckBatchComposition(Wrap(make), target, sizes, fillers);
  if (!found.ok()) {
    ADD_FAILURE() << found.status().ToString();
    return -1;
  }
  return static_cast<int>(found->size());
}

void CheckEveryRequestOfABatchEqualsItsSoloRun(const EngineFactory& make) {
  std::mt19937 rng(9);
  std::vector<SequenceRequest> reqs;
  for (int i = 0; i < 24; ++i) reqs.push_back(RandomRequest(i, rng(), 512, 60, 32, Sampled()));
  engine::EngineVariant v;
  v.max_step_tokens = 64;
  ExpectNone(engine::CheckBatchEqualsSolo(Wrap(make), reqs, v));
}

void CheckPrefillChunking(const EngineFactory& make) {
  // A long prompt (several KV blocks and attention chunks), split into chunks of 1 token, one
  // block, several blocks, and the whole prompt.
  SequenceRequest r = Target(1, Sampled());
  std::mt19937 rng(3);
  for (int i = 0; i < 150; ++i) {
    r.prompt.push_back(std::uniform_int_distribution<int32_t>(3, 511)(rng));
  }
  ASSERT_EQ(RunAloneOn(make, 4096, r).tokens.size(), 48u);
  ExpectNone(engine::CheckPrefillChunking(Wrap(make), r, {1, 7, 16, 48, 100}));
}

void CheckPrefillEqualsDecode(const EngineFactory& make) {
  for (const SamplingParams& sp : {Greedy(), Sampled()}) {
    SequenceRequest r = Target(1, sp);
    r.stop.max_tokens = 120;
    const SequenceOutput decoded = RunAloneOn(make, 0, r);
    ASSERT_EQ(decoded.tokens.size(), 120u);
    ExpectNone(engine::CheckPrefillEqualsDecode(Wrap(make), r, decoded, {4096, 32, 5}));
  }
}

void CheckThousandIdenticalRequests(const EngineFactory& make) {
  for (const SamplingParams& sp : {Greedy(), Sampled()}) {
    SequenceRequest r = Target(0, sp);
    r.stop.max_tokens = 24;
    // A 700-token step budget: batches mix prefill and decode rows of many sequences.
    ExpectNone(engine::CheckIdenticalRequests(Wrap(make), r, 1000, 700));
  }
}

EngineFactory HfShapeEngines(const std::string& shape, const EngineSetup& base) {
  return [shape, base](int32_t max_step_tokens) -> std::unique_ptr<engine::Engine> {
    EngineSetup s = base;
    if (max_step_tokens > 0) s.max_step_tokens = max_step_tokens;
    return MakeEngine(s, HfShapeModel(shape));
  };
}

engine::EngineFactory HfShapeVariants(const std::string& shape, const EngineSetup& base) {
  return [shape, base](const engine::EngineVariant& v) -> Result<std::unique_ptr<engine::Engine>> {
    EngineSetup s = base;
    if (v.max_step_tokens > 0) s.max_step_tokens = v.max_step_tokens;
    if (v.max_prefill_chunk > 0) s.max_prefill_chunk = v.max_prefill_chunk;
    if (v.threads > 0) s.threads = v.threads;
    if (!v.isa.empty()) s.isa = v.isa;
    if (!v.attention.empty()) s.attention = v.attention;
    std::unique_ptr<engine::Engine> e = MakeEngine(s, HfShapeModel(shape));
    if (e == nullptr) return Status::Internal("no engine");
    return e;
  };
}

void CheckThreadsAttentionKernelsAndIsas(const std::string& shape) {
  std::mt19937 rng(5);
  std::vector<engine::SequenceRequest> reqs;
  for (int i = 0; i < 6; ++i) reqs.push_back(RandomRequest(i, rng(), 512, 200, 40, Sampled()));
  auto e0 = MakeEngine(EngineSetup{}, HfShapeModel(shape));
  ASSERT_NE(e0, nullptr);
  const auto ref = RunAll(*e0, reqs);
  std::vector<engine::EngineVariant> variants;
  for (int threads : {1, 2, 3}) {
    for (const char* attention : {"auto", "single", "split"}) {
      engine::EngineVariant& v = variants.emplace_back();
      v.max_step_tokens = 97;
      v.threads = threads;
      v.attention = attention;
    }
  }
  for (const char* isa : {"scalar", "avx2", "avx512"}) {
    if (!kernels::ParseIsa(isa).ok()) {
      std::cerr << "*** " << shape << ": this CPU lacks " << isa << "; NOT tested ***\n";
      continue;
    }
    engine::EngineVariant& v = variants.emplace_back();
    v.threads = 2;
    v.isa = isa;
  }
  Result<engine::Mismatches> found =
      engine::CheckVariants(HfShapeVariants(shape, {}), reqs, ref, variants);
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  for (const auto& m : *found) ADD_FAILURE() << m.ToString();
}

void CheckPrefixHitsPreemptionAndDiskTier(const std::string& shape) {
  std::mt19937 rng(9);
  std::vector<engine::SequenceRequest> reqs;
  for (int i = 0; i < 8; ++i) reqs.push_back(RandomRequest(i, rng(), 512, 120, 40, Sampled()));
  std::map<uint64_t, engine::SequenceOutput> solo;
  for (const auto& r : reqs) {
    auto e = MakeEngine(EngineSetup{}, HfShapeModel(shape));
    ASSERT_NE(e, nullptr);
    solo[r.id] = RunAll(*e, {r})[r.id];
  }
  // Prefix hits: each request again in the same engine, after its first run cached the prompt.
  {
    auto e = MakeEngine(EngineSetup{}, HfShapeModel(shape));
    ASSERT_NE(e, nullptr);
    RunAll(*e, reqs);
    std::vector<engine::SequenceRequest> again = reqs;
    for (auto& r : again) r.id += 100;
    const auto out = RunAll(*e, again);
    EXPECT_GT(e->stats().prefill_tokens_cached, 0);
    for (const auto& r : reqs) EXPECT_TRUE(SameTrajectory(solo[r.id], out.at(r.id + 100))) << r.id;
  }
  // Preemption every 3 steps, with a small KV budget and the disk tier.
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      ("bitroll_suite_disk_" + shape + "_" + std::to_string(::getpid()));
  EngineSetup s;
  s.preempt_every_steps = 3;
  s.disk_dir = dir.string();
  s.kv_cache_bytes = 2ll << 20;
  auto e = MakeEngine(s, HfShapeModel(shape));
  ASSERT_NE(e, nullptr);
  const auto out = RunAll(*e, reqs);
  for (const auto& r : reqs) EXPECT_TRUE(SameTrajectory(solo[r.id], out.at(r.id))) << r.id;
  EXPECT_GT(e->stats().preemptions, 0);
  std::filesystem::remove_all(dir);
}

}  // namespace bitroll::testing_util
