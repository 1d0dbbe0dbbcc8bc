// engine/self_test.h: the start-up invariance self-test. A batch-invariant engine refuses to serve
// when its invariance is broken on this machine (a kernel regression, a miscompiled build, a CPU
// fault); `bitroll serve` and `bitroll replica` run this before accepting work, and
// `bitroll self-test` runs it alone.
//
// On the weights the served engine loaded, with its options (device, threads, step budget,
// prefix cache), it runs a few short requests (3 prompts of 5 to 37 tokens, greedy and sampled,
// `generate_tokens` tokens each) through fresh engines and compares with memcmp, by the shared
// checks of engine/invariance_checks.h, in this order:
//   1. batch: each request alone vs inside two mixed batches (other lengths, other positions
//      and ids, prefill chunks mixed with decode rows);
//   2. chunking: the longest prompt prefilled whole vs in chunks of 1 and 7 tokens;
//   3. prefill_vs_decode: two generated trajectories re-scored with their tokens forced, whole
//      and in 5-token steps: the recorded logprob bits, no decode step;
//   4. variants: a short sampled probe (a 5-token prompt, decoding to position 16) on every
//      ISA this CPU has (scalar, avx2, avx512), and the two shorter requests (8 tokens) on the
//      "single" and "split" attention kernels (2 threads at least) and, when more than one
//      thread serves, on 1 thread;
//   5. group: six samples of the longest prompt as one GRPO group (they share its KV blocks, and
//      their decode attention walks the shared blocks once for the group) vs each sample alone.
// Every check runs; the report lists each with its time, and every mismatch with the run, the
// request, the first differing token and its recorded vs recomputed id and logprob bits.
// On stories260K it takes well under a second (docs/benchmarks.md "Start-up self-test").
//
// Thread-safety: RunInvarianceSelfTest builds its own engines and only reads `served`'s weights
// (shared, immutable); it may run while no other thread changes `served`'s weights.
// Library code: no exits; it prints nothing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/invariance_checks.h"
#include "schema/status.h"

namespace bitroll::engine {

struct SelfTestOptions {
  int32_t generate_tokens = 16;  // per request
  uint32_t seed = 20;            // of the prompts' random ids and the sampling seeds
};

struct SelfTestReport {
  bool ran = false;     // false: skipped (an engine without weights of its own)
  bool passed = false;  // every check ran and found no mismatch
  std::string skipped;  // why it did not run
  struct Check {
    std::string name;  // "batch", "chunking", "prefill_vs_decode", "variants", "group"
    size_t mismatches = 0;
    double seconds = 0.0;
  };
  std::vector<Check> checks;                   // in the order run
  std::vector<InvarianceMismatch> mismatches;  // every one found, in check order
  std::vector<std::string> isas;               // the ISAs compared
  double seconds = 0.0;                        // the whole self-test
  // One line: "passed: batch, chunking, prefill_vs_decode, variants (isa scalar avx2 avx512)
  // in 0.21 s" or "FAILED: " + the first mismatch (+ "; N more").
  std::string Summary() const;
  // Summary, then one line per check and per mismatch.
  std::string ToString() const;
};

// Runs the self-test on `served`'s weights with `options` (the engine options it was opened
// with; the KV budget and the disk tier are replaced by small private ones). Ok: passed, or
// skipped (report->ran false) when `served` has no weights (a test double). kInternal
// "invariance self-test failed: <first mismatch>" when a check found a mismatch; the errors of
// making or stepping an engine otherwise (kUnsupported for an ISA name this CPU lacks, ...).
Status RunInvarianceSelfTest(const Engine& served, const EngineOptions& options,
                             const SelfTestOptions& self_test, SelfTestReport* report);

// What a service keeps of its self-test, for logs and a /health reason.
struct SelfTestVerdict {
  enum class State : uint8_t { kNotRun = 0, kPassed, kFailed, kSkipped };
  State state = State::kNotRun;
  std::string reason;  // the report's summary, the error, or why it was skipped
  // Passed, or skipped on purpose (--skip-self-test, an engine without weights).
  bool ok_to_serve() const { return state == State::kPassed || state == State::kSkipped; }
  const char* state_name() const;  // "not run" | "passed" | "failed" | "skipped"
};

// The verdict of one run: passed, skipped (report.ran false), or failed with the status.
SelfTestVerdict VerdictOf(const Status& status, const SelfTestReport& report);

}  // namespace bitroll::engine
