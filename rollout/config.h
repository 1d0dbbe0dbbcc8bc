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
  std::string metrics_bind;              // HOST:PORT of /metrics and /health; empty: off
  bool skip_self_test = false;           // serve without the start-up invariance self-test
};

// Merges the JSON object in `text` into *config. Errors: kInvalidArgument (not JSON, a key of the
// wrong type, an unknown key).
Status ParseConfigJson(const std::string& text, ServeConfig* config);

// Reads and merges `path`. Errors: kNotFound, kIoError, and ParseConfigJson's.
Status LoadConfigFile(const std::string& path, ServeConfig* config);

class CliParser;  // rollout/cli_args.h

// Declares the flags of `bitroll serve` and `bitroll replica` on *parser, bound to *config (the
// two commands take the same flags): --config F first (the JSON file above, read before any other
// flag is applied, so that --replicas N before or after it overrides the file's "replicas"), then
// --model P, --tokenizer P, --replicas N, --bind EP, --replica-bind EP, --connect EP,
// --engine auto|null, --device cpu|cuda, --threads N, --name S, --max-queued N,
// --replica-timeout-ms N, --stream-timeout-ms N, --max-client-buffer-bytes N,
// --weights-load-timeout-ms N (UpdateWeights {path} loads of the replicas, rollout/replica.h),
// --price-replica-hour X, --log-level L, --data-dir DIR (the WAL; resume after a crash),
// --durability sync|window|none, --wal-commit-ms N, --wal-sync-window-ms N,
// --retention-max-age-s N, --retention-max-groups N, --metrics-bind HOST:PORT (rollout/metrics.h),
// the tool loop's --tool-workers N,
// --tool-max-concurrent N, --tool-uid-base UID, --tool-work-root DIR (the sandbox's work root;
// default the temp folder), --tool-disk-bytes N (total workdir bytes per process/container run;
// 0: no total cap), --price-sandbox-cpu-hour X, and the test hooks --null-delay-us N,
// --null-vocab N, --tool-append-file PATH, --tool-append-delay-ms N.
// --skip-self-test serves without the start-up self-test (rollout/self_test_gate.h), and the
// engine flags of rollout/engine_flags.h (AddEngineTuningFlags: --isa ... --kv-disk-bytes),
// applied to every replica's EngineOptions.
void AddServeFlags(CliParser* parser, ServeConfig* config);

// The checks of a whole configuration (file and flags), the engine's values included
// (CheckEngineOptionFlags). Errors: kInvalidArgument.
Status CheckServeConfig(const ServeConfig& config);

// AddServeFlags, parse argv[first..argc) (argv[first - 1] names the command), CheckServeConfig.
// Errors: kInvalidArgument (unknown flag, missing or bad value; rollout/cli_args.h), and
// LoadConfigFile's. --help applies nothing and returns Ok.
Status ApplyFlags(int argc, char** argv, int first, ServeConfig* config);

}  // namespace bitroll::rollout
