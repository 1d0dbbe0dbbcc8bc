// rollout/weights_registry.h: which weights each weight version was (docs/audit.md, "Weights by
// version").
//
// A service with a data directory appends one JSON object per line to <data-dir>/weights.jsonl:
// version 0 when it starts (the model it loaded: source "initial", its path), then one line per
// UpdateWeights once every replica installed it (source "path" with the file's path, "tensors" for
// a streamed update, "nccl" for a broadcast; streamed and NCCL lines carry no path, since no file
// holds those weights). Every line carries `weights_hash`: the engine's hash of the installed
// tensors (engine/model_weights.h, the numerics fingerprint's weights_hash), 16 hex digits, so a
// file found later is checked against it by loading it; 0 when no replica reported it.
// The line is written and fsync'd before the update is acknowledged. The file is append-only: a
// restart with another model appends another version-0 line, and a reader takes, for a version,
// the last line whose hash is the one asked for (else the last line of that version).
//
// Thread-safety: plain functions; one writer per file (the coordinator thread, or serve before the
// coordinator starts).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "schema/status.h"

namespace bitroll::rollout {

struct WeightsEntry {
  uint64_t version = 0;
  std::string source;         // "initial", "path", "tensors" or "nccl"
  std::string path;           // the file (initial, path); empty for tensors and nccl
  uint64_t weights_hash = 0;  // 0: unknown
  int64_t unix_ms = 0;        // when it went live
};

// <data_dir>/weights.jsonl
std::string WeightsRegistryPath(const std::string& data_dir);

nlohmann::json WeightsEntryToJson(const WeightsEntry& e);

// Appends `e` as one line to `file` and fsyncs it (creating the file). Errors: kIoError naming
// the file and the OS error.
Status AppendWeightsEntry(const std::string& file, const WeightsEntry& e);

// Every entry of `file`, in order. Errors: kNotFound (no such file), kCorruption naming the line
// that is not an entry (a torn last line after a crash is skipped, not an error).
Result<std::vector<WeightsEntry>> ReadWeightsRegistry(const std::string& file);

// The entry of `version`: the last one with weights_hash == prefer_hash when given, else the last
// one of that version; nullopt when the registry never saw the version.
std::optional<WeightsEntry> FindWeightsVersion(const std::vector<WeightsEntry>& entries,
                                               uint64_t version,
                                               std::optional<uint64_t> prefer_hash = {});

// The coordinator's hook: appends {version, source, path (made absolute), hash} to
// <data_dir>/weights.jsonl, creating the directory. Errors: those of AppendWeightsEntry.
Status RecordWeightsVersion(const std::string& data_dir, uint64_t version,
                            const std::string& source, const std::string& path,
                            uint64_t weights_hash);

// The weights_hash <data_dir>/weights.jsonl holds for `version` (its last entry), 0 when none.
uint64_t RegisteredWeightsHash(const std::string& data_dir, uint64_t version);

// serve's version-0 hook: appends {0, "initial", path, hash} to <data_dir>/weights.jsonl unless
// the last version-0 entry already says the same. Errors: those of AppendWeightsEntry.
Status RecordInitialWeights(const std::string& data_dir, const std::string& path,
                            uint64_t weights_hash);

}  // namespace bitroll::rollout
