// rollout/cost_report.h: cost tables for `bitroll cost`.
//
// Input: JSON Lines, one trajectory per line, as written by `bitroll generate --json` or by the
// Python client's Trajectory.to_json(). Keys read: group_id (default 0), prompt_index,
// sample_index, ids (or cost.decode_tokens), prompt_ids (optional), turns (default 1), and cost:
// prefill_computed | prefill_tokens_computed, prefill_cached | prefill_tokens_cached,
// decode_tokens, engine_seconds, queue_seconds, sandbox_seconds, sandbox_cpu_seconds, wal_bytes.
// Price = engine_seconds x replica_hour_usd / 3600 + sandbox_cpu_seconds x sandbox_cpu_hour_usd /
// 3600 (the coordinator's formula), recomputed from the given price table.
//
// Regimes: "agentic" (turns > 1), "long_context" (prompt + generated >= long_context_tokens),
// else "short_chat".
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "rollout/coordinator.h"
#include "rollout/protocol.h"
#include "schema/status.h"

namespace bitroll::rollout {

struct CostRow {
  uint64_t group_id = 0;
  uint32_t prompt_index = 0;
  uint32_t sample_index = 0;
  int64_t prompt_tokens = 0;
  int32_t turns = 1;
  std::string regime;
  Cost cost;
};

struct CostReportOptions {
  PriceTable price;
  int64_t long_context_tokens = 2048;  // prompt + generated at or above this: long_context
};

// Parses JSON Lines. Errors: kInvalidArgument naming the line ("line 3: ...").
Result<std::vector<CostRow>> ParseCostRows(const std::string& jsonl,
                                           const CostReportOptions& options);

// format: "table" (per trajectory, per group, per regime), "csv" (per trajectory) or "json"
// (groups and regimes). Errors: kInvalidArgument (unknown format).
Result<std::string> RenderCostReport(const std::vector<CostRow>& rows, const std::string& format);

}  // namespace bitroll::rollout
