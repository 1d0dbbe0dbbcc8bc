// Shared helpers for the engine-level suites: the real test model, running requests to completion,
// and bitwise comparison of trajectories.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/cpu_engine.h"
#include "engine/invariance_break.h"
#include "engine/invariance_checks.h"
#include "engine/model_weights.h"
#include "engine/tokenizer.h"

namespace bitroll::testing_util {

// BITROLL_MODELS_DIR from the environment, else the configure-time default (../shared/models).
std::string ModelsDir();
// stories260K.bin, loaded once per process. Fails the calling test if missing.
std::shared_ptr<const engine::ModelWeights> Stories260K();
std::unique_ptr<engine::Tokenizer> Tok512();

struct EngineSetup {
  int32_t threads = 1;
  std::string isa = "auto";
  std::string attention = "auto";
  int32_t max_step_tokens = 512;
  int32_t max_running = 256;
  int64_t kv_cache_bytes = 64ll << 20;
  bool prefix_cache = true;
  int32_t max_prefill_chunk = 256;
  std::string disk_dir;  // the KV disk tier's folder; empty = none
  int32_t preempt_every_steps = 0;
  std::string kv_dtype = "f32";    // EngineOptions::kv_dtype
  std::string swa_cache = "full";  // EngineOptions::swa_cache
  void (*matmul_override)(kernels::Isa, const kernels::MatmulParams&,
                          kernels::ThreadPool*) = nullptr;
};

// make-model's Hugging Face shape `name` (engine/make_model_hf.h, seed 7), written once per
// process and loaded; nullptr (and a test failure) on error.
std::shared_ptr<const engine::ModelWeights> HfShapeModel(const std::string& name);

// The float64 logprobs of tests/hf_reference.py (the independent numpy forward), one per token
// after the first, for `tokens` of the Hugging Face folder `dir`; `extra` adds flags (e.g.
// " --break no_sinks"). Empty when the script fails.
std::vector<double> HfReferenceLogprobs(const std::string& dir, const std::vector<int32_t>& tokens,
                                        const std::string& extra = "");

std::unique_ptr<engine::CpuEngine> MakeEngine(
    const EngineSetup& setup, std::shared_ptr<const engine::ModelWeights> w = nullptr);

// Adds every request, steps until idle, and returns the outputs by id. Fails the test on errors.
std::map<uint64_t, engine::SequenceOutput> RunAll(engine::Engine& e,
                                                  const std::vector<engine::SequenceRequest>& reqs);

// ids and logprob bits equal (memcmp), plus the finish reason.
bool SameTrajectory(const engine::SequenceOutput& a, const engine::SequenceOutput& b);

// Sampling presets of the invariance suites: greedy, and T = 1 with top-p 0.9 (seed 1234).
SamplingParams Greedy();
SamplingParams Sampled();
// The request under test: "Once upon a time" on stories260K, sample index 3, 48 tokens, no EOS/BOS
// stop.
engine::SequenceRequest Target(uint64_t id, const SamplingParams& sp);

// Parses a golden transcript's "PROMPT_TOKENS(5): 1 403 ..." and "SEQ: 403 ..." lines
// (once_upon_n256.ids.txt). False when either is missing.
bool ReadGoldenIds(const std::string& path, std::vector<int32_t>* prompt,
                   std::vector<int32_t>* seq);

// run.c's greedy run of `steps` positions from `prompt` (stops only on BOS), as request `id`.
engine::SequenceRequest RunCRequest(uint64_t id, const std::vector<int32_t>& prompt, int32_t steps);
// A golden transcript's SEQ line from a prompt and its generated ids: the prompt without its BOS,
// then the generated ids.
std::vector<int32_t> RunCSequence(const std::vector<int32_t>& prompt,
                                  const std::vector<int32_t>& generated);

// A random request: BOS + 1..max_prompt random ids, random max_tokens, the given sampling params
// (engine/invariance_checks.h, shared with the start-up self-test).
using engine::RandomRequest;

// Sets BITROLL_TEST_BREAK_INVARIANCE (engine/invariance_break.h) to `value` for the scope: engines
// made meanwhile run the named deliberately broken kernel (the negative controls).
class ScopedBreak {
 public:
  explicit ScopedBreak(const char* value) { ::setenv(engine::kTestBreakInvarianceEnv, value, 1); }
  ~ScopedBreak() { ::unsetenv(engine::kTestBreakInvarianceEnv); }
  ScopedBreak(const ScopedBreak&) = delete;
  ScopedBreak& operator=(const ScopedBreak&) = delete;
};

}  // namespace bitroll::testing_util
