// rollout/audit_weights.h: which model file audits which record (docs/audit.md, "Weights by
// version").
//
// Without a weights registry every record is audited with the --model file (AuditRecords then
// refuses a record whose weights hash is not that file's). With one (rollout/weights_registry.h:
// <data-dir>/weights.jsonl, or --weights-registry FILE) each record's weight versions are
// resolved to files:
//   - a version whose entry has a path: the file is used when it still holds those weights (its
//     weights hash, computed by loading it, is the entry's); else the record is
//     kWeightsUnavailable "weights unavailable: version V was FILE (hash H), file now hashes H'"
//     (or "... cannot be read: why");
//   - a version that came as streamed or NCCL tensors (no file), or that the registry never saw:
//     the --model file when it hashes to the entry's hash (or, never seen, to the record's), else
//     kWeightsUnavailable naming the version and why;
//   - a record whose tokens span several versions: kWeightsUnavailable "multi-version record
//     needs ..." naming each version's file and whether it is available. The engine's
//     UpdateWeights takes effect between whole steps, and a re-score is one prefill under one set
//     of weights; the service's sequence kept the KV entries of the older weights across the swap
//     (and a resumed one re-prefilled under the newer), which this audit does not reproduce.
// The first span's version prefers the registry entry whose hash is the record's fingerprint hash
// (a restart with another model appends a second version-0 entry).
//
// Thread-safety: plain functions; `hash_of` is called from the calling thread.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "rollout/audit.h"
#include "rollout/weights_registry.h"
#include "schema/status.h"

namespace bitroll::rollout {

struct WeightsPlan {
  std::vector<std::string> files;  // distinct model files, in first-use order
  // Per item: index into files, or -1 when verdicts[i] is already decided (weights unavailable)
  // or the item did not parse (AuditRecords gives it its verdict: file_of_item is then 0 when
  // some file exists).
  std::vector<int> file_of_item;
  std::vector<std::optional<AuditVerdict>> verdicts;
};

// The weights hash of a model file (engine/model_loader.h LoadModelWeights), or why it cannot be
// read.
using WeightsHasher = std::function<Result<uint64_t>(const std::string& path)>;

// Resolves every item's weights. `registry` null: every item uses `model` (which must then be
// non-empty). `model` may be empty with a registry. `hash_of` is called at most once per file.
WeightsPlan PlanAuditWeights(const std::vector<AuditItem>& items,
                             const std::vector<WeightsEntry>* registry, const std::string& model,
                             const WeightsHasher& hash_of);

}  // namespace bitroll::rollout
