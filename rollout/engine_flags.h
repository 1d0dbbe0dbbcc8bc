// rollout/engine_flags.h: the engine flags of the commands that run a model on this machine
// (`bitroll generate`, `bitroll audit`): one registration, one check, one way to open the engine.
//
//   EngineFlags f;                      // model path defaults to $BITROLL_MODEL
//   AddEngineFlags(&parser, &f);        // --device --threads --isa --attention
//                                       // --max-step-tokens --kv-cache-mb --weights
//                                       // --kv-dtype
//   BR_RETURN_IF_ERROR(CheckEngineFlags(&f));  // ranges; sets f.eo.kv_cache_bytes
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
  int64_t kv_cache_mb = 0;      // 0: sized from the model and the machine
  std::string weights = "f32";  // CPU matmul weight storage: f32 | bf16
};

// Registers the group "Engine (none of these changes a bit, except --device, --weights and
// --kv-dtype)".
void AddEngineFlags(CliParser* p, EngineFlags* f);

// --kv-cache-mb in [0, 2^40] (then f->eo.kv_cache_bytes is set), --weights f32|bf16 and
// --kv-dtype f32|bf16 (bf16 with --device cpu only).
// Errors: kInvalidArgument.
Status CheckEngineFlags(EngineFlags* f);

// Loads the model (and its tokenizer: an error when `tokenizer_required`, else the engine has
// none) and makes a CpuEngine with f.weights' matmul storage and f.eo.device's forward backend.
// *t_setup (if not null): when the engine setup began, the files loaded.
Result<std::unique_ptr<engine::CpuEngine>> OpenCpuEngine(
    const EngineFlags& f, bool tokenizer_required,
    std::chrono::steady_clock::time_point* t_setup = nullptr);

}  // namespace bitroll::rollout
