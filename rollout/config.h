// rollout/config.h: configuration of `bitroll serve` and `bitroll replica`: a JSON file
// (nlohmann) and command-line flags; flags override the file. docs/protocol.md lists the keys.
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <string>
#include <vector>

#include "engine/engine.h"
#include "rollout/coordinator.h"
#include "rollout/null_engine.h"
#include "schema/status.h"

namespace bitroll::rollout {

struct ServeConfig {
  CoordinatorOptions coordinator;
  int32_t replicas = 1;                  // in-process replicas
  std::string engine = "auto";           // "auto" (the real engine when built, else error) | "null"
  engine::EngineOptions engine_options;  // model_path, threads, kv_cache_bytes, ...
  NullEngineOptions null_engine;         // for engine = "null" (tests, benchmarks)
  std::string connect;                   // `bitroll replica`: the coordinator's replica endpoint
  std::string name;                      // `bitroll replica`: replica name (default host:pid)
  std::string log_level = "info";        // spdlog level name
};

// Merges the JSON object in `text` into *config. Errors: kInvalidArgument (not JSON, a key of the
// wrong type, an unknown key).
Status ParseConfigJson(const std::string& text, ServeConfig* config);

// Reads and merges `path`. Errors: kNotFound, kIoError, and ParseConfigJson's.
Status LoadConfigFile(const std::string& path, ServeConfig* config);

// Applies flags (argv[first..argc)): --config F (loaded first), --model P, --replicas N,
// --bind EP, --replica-bind EP, --connect EP, --engine auto|null, --threads N, --name S,
// --max-queued N, --replica-timeout-ms N, --weights-load-timeout-ms N (UpdateWeights {path} loads
// of the replicas, rollout/replica.h), --price-replica-hour X, --null-delay-us N,
// --null-vocab N, --log-level L, --data-dir DIR (the WAL; resume after a crash),
// --durability sync|window|none, --wal-commit-ms N, --wal-sync-window-ms N, and the tool loop's
// --tool-workers N (8), --tool-append-file PATH, --tool-append-delay-ms N, --tool-uid-base UID
// (62000), --tool-max-concurrent N (16), --tool-work-root DIR (the sandbox's work root; default
// the temp folder), --tool-disk-bytes N (total workdir bytes per process/container run, 256 MiB;
// 0: no total cap), --price-sandbox-cpu-hour X. Errors:
// kInvalidArgument (unknown flag, missing or bad value).
Status ApplyFlags(int argc, char** argv, int first, ServeConfig* config);

}  // namespace bitroll::rollout
