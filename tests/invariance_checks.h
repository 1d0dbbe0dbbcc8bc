// The engine invariance checks in gtest form, for every backend: each takes a factory of fresh
// engines and fails the calling test on a mismatch (with its first differing token). The checks
// themselves are engine/invariance_checks.h, shared with the start-up self-test
// (engine/self_test.h); these wrappers give them the suite's sizes. tests/invariance_test.cc runs
// them on the CPU engine, engine/cuda/cuda_engine_test.cc on the GPU backend, each with its own
// negative controls.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/invariance_checks.h"

namespace bitroll::testing_util {

// A fresh engine whose step token budget is `max_step_tokens` (0: the factory's default). nullptr
// fails the calling test.
using EngineFactory = std::function<std::unique_ptr<engine::Engine>(int32_t max_step_tokens)>;

// `r` alone in a fresh engine.
engine::SequenceOutput RunAloneOn(const EngineFactory& make, int32_t max_step_tokens,
                                  const engine::SequenceRequest& r);

// The target (Target(7, sp)) alone, then inside batches of `sizes` random other requests at a
// random position; the number of batched runs whose bits differ from the solo run (0 = invariant,
// -1 = no engine).
int BatchCompositionMismatches(const EngineFactory& make, const SamplingParams& sp,
                               const std::vector<int>& sizes);

// 24 random requests in one engine with a 64-token step budget (chunked prefill mixed with
// decode): each equals its solo run.
void CheckEveryRequestOfABatchEqualsItsSoloRun(const EngineFactory& make);

// A 155-token prompt prefilled whole and in chunks of 1, 7, 16, 48 and 100: identical bits.
void CheckPrefillChunking(const EngineFactory& make);

// p_vs_d: re-scoring a finished trajectory with its tokens forced reproduces every recorded
// logprob bit, greedy and sampled, whole or in 32- and 5-token steps, without decoding.
void CheckPrefillEqualsDecode(const EngineFactory& make);

// 1000 identical requests (greedy, then sampled) in one engine with a 700-token step budget give
// one unique output.
void CheckThousandIdenticalRequests(const EngineFactory& make);

// The suites that run these checks on other model families (MoE, sliding windows) over a
// make-model Hugging Face shape (HfShapeModel in tests/engine_test_util.h): engines of that shape
// on `base` with a step budget (HfShapeEngines), or with an EngineVariant's settings
// (HfShapeVariants).
struct EngineSetup;
EngineFactory HfShapeEngines(const std::string& shape, const EngineSetup& base);
engine::EngineFactory HfShapeVariants(const std::string& shape, const EngineSetup& base);

// Six sampled requests on the default engine vs 1, 2 and 3 threads x every attention kernel
// (auto, single, split) at a 97-token step budget and every ISA this CPU has (a missing one is
// said loudly, not tested): memcmp of every trajectory.
void CheckThreadsAttentionKernelsAndIsas(const std::string& shape);

// Eight sampled requests, each run alone on a fresh engine, vs the same requests again in one
// engine after their prompts were cached (prefix hits; some must be counted), and vs one engine
// that preempts every 3 steps with a 2 MiB KV budget and a disk tier (some preemption must
// happen): memcmp of every trajectory.
void CheckPrefixHitsPreemptionAndDiskTier(const std::string& shape);

}  // namespace bitroll::testing_util
