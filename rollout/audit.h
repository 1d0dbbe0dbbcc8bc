// rollout/audit.h: the reproducibility audit behind `bitroll audit` (docs/audit.md).
//
// Given audit records (rollout/trajectory_record.h) and an engine holding the weights they claim,
// AuditRecords recomputes every trajectory and compares its fp32 logprob bits (memcmp) and ids
// token by token:
//   kRescore (default): one teacher-forced prefill per trajectory: prompt = the recorded prompt,
//     forced = every recorded token (sampled and injected). Sampled tokens are compared by their
//     logprob bits; injected tokens (tool results, mask 0) are forced and never compared (their
//     recorded logprob is a placeholder 0). Re-scoring checks that these weights give these
//     logprobs to these tokens; it cannot check the seed or sample index (a logprob does not
//     depend on the noise), which re-running does.
//   kRerun: every model turn regenerated from the recorded seed, sample index and sampling
//     parameters, its context (earlier turns and injected tool results) taken from the record;
//     ids and logprob bits compared. The turn's token budget is the recorded turn's length.
// kRescore also re-derives a MoE record's routing record (TrajectoryRecord::routing): the first
// position whose expert ids or weight bits differ is kDiverged (Divergence::what names it).
// Both modes also re-derive every injected tool result (when the record has its
// tool_result_template and the model a tokenizer): the template filled with the call's recorded
// result (rollout/tool_call.h ResultText), encoded without BOS, must be the recorded injected
// tokens; else kDiverged at the first injected token that differs.
// All trajectories go through the engine together (batch invariance makes that safe).
//
// Verdicts: kIdentical; kDiverged (the first differing token: turn, index, absolute position,
// recorded vs recomputed id and logprob bits, their distance in ULPs); kFingerprintMismatch (the
// record's kernel version, attention chunk or backend is not this engine's: bits are not
// promised equal); kWeightsUnavailable (the record's weights hash is not the model's, or its tokens
// span several weight versions); kIncomplete (the record lacks a field: "cannot audit: missing
// X"); kError (the engine refused the trajectory, e.g. a token outside the vocabulary);
// kTolerance (AuditOptions::tolerance: another fingerprint, compared by value, NOT bitwise).
//
// Thread-safety: AuditRecords drives the engine from the calling thread; an Engine is not
// thread-safe, so nothing else may use it meanwhile.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "rollout/trajectory_record.h"
#include "schema/status.h"

namespace bitroll::engine {
class Engine;
}

namespace bitroll::rollout {

enum class AuditMode : uint8_t { kRescore = 0, kRerun = 1 };

enum class VerdictKind : uint8_t {
  kIdentical = 0,
  kDiverged = 1,
  kFingerprintMismatch = 2,
  kWeightsUnavailable = 3,
  kIncomplete = 4,
  kError = 5,
  kTolerance = 6,  // AuditOptions::tolerance: another fingerprint, compared by value, not bits
};
// "identical", "diverged", "fingerprint_mismatch", "weights_unavailable", "incomplete", "error",
// "tolerance_report".
const char* VerdictName(VerdictKind k);

struct Divergence {
  int32_t token = 0;     // index in the record's ids
  int32_t turn = 1;      // 1-based model turn holding the token
  int32_t position = 0;  // absolute position in the sequence: prompt length + token
  int32_t recorded_id = 0;
  int32_t recomputed_id = -1;  // -1: the re-run ended before this token
  uint32_t recorded_bits = 0;
  uint32_t recomputed_bits = 0;
  uint64_t ulps = 0;  // distance of the two floats in units in the last place
  // Set for an injected token: which tool result does not encode to the recorded tokens.
  std::string what;
  // The 5 most likely tokens there (id, logprob computed in double from the logits, for people);
  // filled by the CLI for the first divergences (rollout/audit_trace.h TopAlternatives).
  std::vector<std::pair<int32_t, double>> top5;
};

// A record of another numerics fingerprint compared by value (AuditOptions::tolerance).
struct ToleranceReport {
  int64_t compared = 0;     // sampled tokens whose logprobs were compared (ids equal)
  int64_t agreeing = 0;     // rerun: tokens whose ids agree before the first that does not
  int64_t total = 0;        // sampled tokens in the record
  double max_abs_diff = 0;  // max |recorded - recomputed logprob|
  double mean_abs_diff = 0;
};

struct AuditVerdict {
  size_t index = 0;  // the record's place in the input (0-based)
  uint64_t group_id = 0;
  uint32_t prompt_index = 0;
  uint32_t sample_index = 0;
  VerdictKind kind = VerdictKind::kIdentical;
  std::string detail;  // why, for every verdict but kIdentical
  std::optional<Divergence> divergence;
  std::optional<ToleranceReport> tolerance;
  int64_t tokens_checked = 0;  // sampled tokens compared
};

struct AuditOptions {
  AuditMode mode = AuditMode::kRescore;
  // Records whose fingerprint differs from the engine's (same weights hash): instead of
  // kFingerprintMismatch, recompute them and report by value (kTolerance): max and mean
  // |delta logprob| and, in rerun, how many ids agree. Clearly not a bitwise verdict.
  bool tolerance = false;
};

// One input line: a parsed record, or why it could not be parsed (a kIncomplete verdict).
struct AuditItem {
  TrajectoryRecord record;
  Status parse_error;
};

struct AuditStats {
  int64_t tokens_checked = 0;    // sampled tokens compared
  int64_t tokens_processed = 0;  // rows the engine ran (prefill and decode)
  double engine_seconds = 0;     // wall time of the engine steps
};

// Audits every item on `engine`. `progress(done)` (may be empty) is called as trajectories finish.
// Returns one verdict per item, in input order. Errors: only an engine failure (Step() failing);
// every problem of one record is its verdict.
Result<std::vector<AuditVerdict>> AuditRecords(engine::Engine& engine,
                                               const std::vector<AuditItem>& items,
                                               const AuditOptions& options, AuditStats* stats,
                                               const std::function<void(int64_t)>& progress = {});

// The exit status of `bitroll audit`: 0 when every verdict is kIdentical, 1 when any is kDiverged,
// else 2 (something could not be audited).
int AuditExitStatus(const std::vector<AuditVerdict>& verdicts);

// The distance between two floats in ULPs (0 for +0 vs -0).
uint64_t UlpDistance(uint32_t a_bits, uint32_t b_bits);

nlohmann::json VerdictToJson(const AuditVerdict& v);

}  // namespace bitroll::rollout
