// engine/invariance_checks.h: the invariance checks of the engine contract (engine/engine.h,
// docs/design.md "The invariance contract"), written once for every caller: the test suites
// (tests/invariance_checks.h wraps them in gtest for the CPU and CUDA engines) and the start-up
// self-test (engine/self_test.h) run the same code on different sizes.
//
// Each check takes a factory of fresh engines, runs requests to completion and compares the
// trajectories with memcmp (token ids, fp32 logprob bits, finish reason); never a tolerance. A
// check returns the mismatches it found (empty = invariant), each naming the check, the run, the
// request and the first differing token with its recorded and recomputed bits. A Status error
// means an engine could not be made or failed a step: a broken engine, not a verdict.
//
// Thread-safety: the functions share nothing; the engines they make are used from the calling
// thread only. Library code: no exits, no output.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "schema/status.h"

namespace bitroll::engine {

// What a check changes in the engine it asks for; 0 or "" keeps the factory's default.
struct EngineVariant {
  int32_t max_step_tokens = 0;    // the step token budget (also bounds a prefill chunk)
  int32_t max_prefill_chunk = 0;  // prefill rows of one sequence per step
  int32_t threads = 0;
  std::string isa;            // "scalar" | "avx2" | "avx512"
  std::string attention;      // "single" | "split"
  std::string Label() const;  // "budget 7 isa avx2", or "default"
};

// A fresh engine with `variant` applied. A factory that cannot honour a field returns
// kUnsupported.
using EngineFactory = std::function<Result<std::unique_ptr<Engine>>(const EngineVariant&)>;

// One broken promise: what was compared and where the bits first differ.
struct InvarianceMismatch {
  std::string check;  // "batch", "chunking", "prefill_vs_decode", "variants", "identical"
  std::string run;    // the run that differed, e.g. "batch of 5, position 2" or "isa avx2"
  uint64_t request = 0;
  int32_t token = -1;  // index of the first differing token; -1: the lengths differ
  int32_t recorded_id = -1, recomputed_id = -1;
  uint32_t recorded_bits = 0, recomputed_bits = 0;  // the logprobs' fp32 bit patterns
  size_t recorded_tokens = 0, recomputed_tokens = 0;
  std::string note;  // anything else that differed (finish reason, decode tokens)
  // "batch: batch of 5, position 2: request 7 token 3: recorded id 403 logprob bits 0xbf8a...
  // (-1.08), recomputed id 403 bits 0xbf8a... (-1.08)"
  std::string ToString() const;
};

// The first difference of `recomputed` from `recorded` (ids, logprob bits by memcmp, finish);
// false when they are equal. `out`'s check/run/request are left to the caller.
bool FirstDifference(const SequenceOutput& recorded, const SequenceOutput& recomputed,
                     InvarianceMismatch* out);

// Adds every request to `e`, steps until idle, returns the outputs by id. Errors: Add's and
// Step's; kInternal when a request finished with an error.
Result<std::map<uint64_t, SequenceOutput>> RunToCompletion(
    Engine& e, const std::vector<SequenceRequest>& requests);

// Each request alone, one after the other, in `e` (one engine for many solo runs: an engine is
// costly to make on a large model). Requests with the same prompt would hit the prefix cache.
Result<std::map<uint64_t, SequenceOutput>> RunOneByOne(
    Engine& e, const std::vector<SequenceRequest>& requests);

// `r` alone in a fresh engine of `variant`.
Result<SequenceOutput> RunAlone(const EngineFactory& make, const EngineVariant& variant,
                                const SequenceRequest& r);

// A random request: BOS `bos` + 1..max_prompt ids in [3, vocab), max_tokens in [1, max_tokens],
// `sp` with seed sp.seed + seed, sample_index seed % 8.
SequenceRequest RandomRequest(uint64_t id, uint32_t seed, int32_t vocab, int32_t max_prompt,
                              int32_t max_tokens, const SamplingParams& sp, int32_t bos = 1);

using Mismatches = std::vector<InvarianceMismatch>;

// batch: `target` alone, then inside one batch per entry of `sizes`: size - 1 random others
// (RandomRequest(id, rng(), fillers.vocab, fillers.max_prompt, fillers.max_tokens,
// fillers.sampling, fillers.bos), rng = mt19937(seed)) with the target at a random position
// under a random odd id. One mismatch per batch whose target differs from the solo run.
struct FillerShape {
  int32_t vocab = 512;
  int32_t max_prompt = 40;
  int32_t max_tokens = 40;
  int32_t bos = 1;
  SamplingParams sampling;
};
Result<Mismatches> CheckBatchComposition(const EngineFactory& make, const SequenceRequest& target,
                                         const std::vector<int>& sizes, const FillerShape& fillers,
                                         uint32_t seed = 42);

// batch: every request of `batch`, run together in one engine of `variant`, equals its solo
// run (default variant); `solo` (may be null) supplies solo runs already made, by id. `check`
// names the mismatches' check.
Result<Mismatches> CheckBatchEqualsSolo(const EngineFactory& make,
                                        const std::vector<SequenceRequest>& batch,
                                        const EngineVariant& variant,
                                        const std::map<uint64_t, SequenceOutput>* solo = nullptr,
                                        const char* check = "batch");

// chunking: `r` prefilled whole (step budget and chunk = whole_budget; or `whole`, a run of r
// already made with its prompt in one step) and in chunks of each of `chunks` tokens: identical
// bits.
Result<Mismatches> CheckPrefillChunking(const EngineFactory& make, const SequenceRequest& r,
                                        const std::vector<int32_t>& chunks,
                                        int32_t whole_budget = 4096,
                                        const SequenceOutput* whole = nullptr);

// prefill_vs_decode: `decoded` is r's trajectory; re-scoring it with its tokens forced, in steps
// of each of `budgets` tokens, reproduces every id and logprob bit without decoding. kInternal
// when `decoded` is empty.
Result<Mismatches> CheckPrefillEqualsDecode(const EngineFactory& make, const SequenceRequest& r,
                                            const SequenceOutput& decoded,
                                            const std::vector<int32_t>& budgets);
// The same for several requests (`decoded` by id), re-scored one by one in one engine per budget.
Result<Mismatches> CheckPrefillEqualsDecode(const EngineFactory& make,
                                            const std::vector<SequenceRequest>& requests,
                                            const std::map<uint64_t, SequenceOutput>& decoded,
                                            const std::vector<int32_t>& budgets);

// variants: `requests` run together in one engine of each of `variants` equal `reference` (their
// outputs by id, e.g. from the default engine).
Result<Mismatches> CheckVariants(const EngineFactory& make,
                                 const std::vector<SequenceRequest>& requests,
                                 const std::map<uint64_t, SequenceOutput>& reference,
                                 const std::vector<EngineVariant>& variants);

// identical: `count` copies of `r` (ids 0..count-1) in one engine with step budget `budget` give
// one output; one mismatch per copy that differs from copy 0.
Result<Mismatches> CheckIdenticalRequests(const EngineFactory& make, const SequenceRequest& r,
                                          int count, int32_t budget);

}  // namespace bitroll::engine
