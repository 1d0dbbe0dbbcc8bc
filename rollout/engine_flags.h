// rollout/engine_flags.h: the engine flags of the commands that run a model on this machine
// (`bitroll generate`, `bitroll audit`): one registration, one check, one way to open the engine.
//
//   EngineFlags f;                      // model path defaults to $BITROLL_MODEL
//   AddEngineFlags(&parser, &f);        // --device --threads --weights, and
//                                       // AddEngineTuningFlags' flags
//   BR_RETURN_IF_ERROR(CheckEngineFlags(&f));  // values and ranges
//   auto e = OpenCpuEngine(f, /*tokenizer_required=*/true, nullptr);
//
// --model and --tokenizer stay with each command (their help differs). Thread-safety: none needed.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/cpu_engine.h"
#include "engine/engine.h"
#include "rollout/cli_args.h"
#include "schema/status.h"

namespace bitroll::rollout {

struct EngineFlags {
  EngineFlags();  // eo.model_path from $BITROLL_MODEL when it is set
  engine::EngineOptions eo;
  std::string weights = "f32";  // CPU matmul weight storage: f32 | bf16
};

// The engine settings every command that runs a model takes (generate, audit, serve, replica),
// bound to *eo: --isa, --attention, --max-step-tokens, --max-running, --max-prefill-chunk,
// --kv-cache-mb (sets eo->kv_cache_bytes; [0, 2^40]), --kv-dtype, --prefix-cache on|off,
// --kv-disk-dir, --kv-disk-bytes, --swa-cache full|checkpoint:P|recompute. Only --kv-dtype
// changes bits (its own fingerprint).
void AddEngineTuningFlags(CliParser* p, engine::EngineOptions* eo);

// The checks of those values: --kv-dtype f32|bf16 (bf16 with --device cpu only), the scheduler
// limits >= 1, --kv-disk-bytes >= 0, --swa-cache (engine::ParseSwaCache). Errors:
// kInvalidArgument.
Status CheckEngineOptionFlags(const engine::EngineOptions& eo);

// Registers the group "Engine (none of these changes a bit, except --device, --weights and
// --kv-dtype)".
void AddEngineFlags(CliParser* p, EngineFlags* f);

// --weights f32|bf16, then CheckEngineOptionFlags(f->eo). Errors: kInvalidArgument.
Status CheckEngineFlags(EngineFlags* f);

// Loads the model (and its tokenizer: an error when `tokenizer_required`, else the engine has
// none) and makes a CpuEngine with f.weights' matmul storage and f.eo.device's forward backend.
// *t_setup (if not null): when the engine setup began, the files loaded.
Result<std::unique_ptr<engine::CpuEngine>> OpenCpuEngine(
    const EngineFlags& f, bool tokenizer_required,
    std::chrono::steady_clock::time_point* t_setup = nullptr);

}  // namespace bitroll::rollout
