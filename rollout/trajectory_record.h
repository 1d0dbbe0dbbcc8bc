// rollout/trajectory_record.h: the audit record of one trajectory (docs/audit.md), version 1.
//
// A TrajectoryRecord holds what an auditor needs to check that a trajectory was produced by given
// weights with given settings: the prompt ids, every token (sampled or injected, with a mask) and
// its fp32 logprob bits, turn boundaries and tool calls, the sampling parameters, seed and sample
// index, the weight version of every token span, the numerics fingerprint and the bitroll
// version. On disk it is one JSON object per line (JSON Lines); logprobs travel as their uint32 bit
// patterns in hex ("logprob_bits") so that JSON never rounds them, and the seed as a decimal
// string, so that no reader's doubles round it.
//
// Sources: `bitroll generate --json` (rollout/cmd_generate.cc) and `bitroll audit export` (the
// WAL of a service data directory, RecordFromWal). Readers: `bitroll audit` (rollout/audit.h).
//
// This header names no engine or WAL type except in RecordFromWal, so that the record's shape does
// not move with those modules' structs.
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "schema/status.h"
#include "schema/vocab.h"

namespace bitroll::wal {
struct TrajectoryLog;
}

namespace bitroll::rollout {

inline constexpr int kTrajectoryRecordVersion = 1;

// The version of this bitroll (the CMake project version), as written in every record.
const char* BitrollVersion();

struct RecordToolCall {
  uint32_t call_index = 0;
  int32_t token_index = 0;  // index in ids just past the call (where the turn ended)
  std::string name;
  std::string input;
  bool has_result = false;  // false: the call never returned (an unfinished trajectory)
  int32_t exit_status = 0;
  std::string stdout_data;
  std::string stderr_data;
  std::string error;       // empty when the tool ran to completion (any exit status), for people
  int32_t error_code = 0;  // the typed error of the run (schema/status.h ErrorCode), 0 = none
  std::string error_message;
};

struct RecordVersionSpan {
  int32_t begin = 0;  // first index in ids of the span
  uint64_t version = 0;
};

struct TrajectoryRecord {
  int record_version = kTrajectoryRecordVersion;
  std::string bitroll_version;
  std::string source;  // "generate" or "wal"
  uint64_t group_id = 0;
  uint32_t prompt_index = 0;
  uint32_t sample_index = 0;
  // The prompt as token ids; a WAL record whose request gave the prompt as text has prompt_text
  // instead (an auditor encodes it with the model's tokenizer, BOS first, as a replica does).
  std::vector<int32_t> prompt_ids;
  std::string prompt_text;
  // Every token after the prompt in order; mask[i] = 1 sampled, 0 injected (a tool result, whose
  // logprob_bits are 0 and are never compared).
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
  std::vector<uint32_t> logprob_bits;
  // turn_begins[k]: index in ids where turn k + 1 begins (turn 1 at 0); a later turn begins with
  // its injected tokens.
  std::vector<int32_t> turn_begins;
  std::vector<RecordToolCall> tool_calls;
  // The request's tool_result_template (its default when it gave none); empty when the record
  // has no tool loop. With it an auditor re-derives every injected text from the call's result.
  std::string tool_result_template;
  SamplingParams sampling;  // schema/vocab.h, seed inside; then the stop rules
  int32_t max_tokens = 0;
  std::vector<int32_t> stop_ids;
  bool stop_at_eos = true;
  bool stop_at_bos = true;
  std::vector<RecordVersionSpan> weight_versions;
  NumericsFingerprint fingerprint;  // of the engine that produced the first token
  std::string finish;  // engine FinishReasonName, or the wire finish name of a WAL trajectory
  // Optional (MoE models, return_routing): JSON "routing": {"n_experts", "shape": [positions,
  // layers, k], "expert_ids": [...], "weight_bits": ["3f000000", ...]} (fp32 bits in hex).
  RoutingRecord routing;
};

// The record as one JSON object (the fields of docs/audit.md).
nlohmann::json RecordToJson(const TrajectoryRecord& r);

// Parses one record. Errors: kInvalidArgument "missing FIELD" for a required field that is absent,
// "bad FIELD: ..." for one of the wrong type or inconsistent (ids, mask and logprob_bits of other
// lengths), kUnsupported for a record_version newer than this reader's. Never throws.
Result<TrajectoryRecord> RecordFromJson(const nlohmann::json& j);

// The record of a trajectory logged in a service's WAL (finished or not): the prompt from the
// logged request (ids, or prompt_text), the sampled tokens with the injected ones in place
// (rollout/wal_log.h RebuildTurns), finish "unfinished" when no finish record was logged yet.
// Errors: kCorruption (the logged request does not decode or does not hold this trajectory's
// prompt).
Result<TrajectoryRecord> RecordFromWal(const wal::TrajectoryLog& log);

// Hex helpers: fp32 bits <-> "%08x", uint64 <-> "%016x".
std::string Hex32(uint32_t bits);
std::string Hex64(uint64_t v);
uint32_t FloatBits(float f);
float BitsFloat(uint32_t bits);

}  // namespace bitroll::rollout
