// rollout/engine_flags.cc: the engine flags of generate and audit (rollout/engine_flags.h).
#include "rollout/engine_flags.h"

#include <cstdlib>

#include "engine/forward_backend.h"
#include "engine/model_loader.h"
#include "engine/tokenizer.h"

namespace bitroll::rollout {

EngineFlags::EngineFlags() {
  if (const char* env_model = std::getenv("BITROLL_MODEL"); env_model != nullptr) {
    eo.model_path = env_model;
  }
}

void AddEngineTuningFlags(CliParser* p, engine::EngineOptions* eo) {
  p->String("--isa", &eo->isa, "auto|scalar|avx2|avx512 (default auto)", "NAME");
  p->String("--attention", &eo->attention, "auto|single|split (default auto)", "NAME");
  p->Integer("--max-step-tokens", &eo->max_step_tokens,
             "token budget of one engine step (default 512)");
  p->Integer("--max-running", &eo->max_running, "sequences decoding at once (default 256)");
  p->Integer("--max-prefill-chunk", &eo->max_prefill_chunk,
             "prefill rows per sequence before others get a turn (default 256)");
  p->Value("--kv-cache-mb",
           "KV cache budget in MiB (default 0: sized from the model and the machine)", "N",
           [eo](const std::string& v) {
             int64_t mb = 0;
             BR_RETURN_IF_ERROR(ParseIntegerFlag("--kv-cache-mb", v, &mb));
             if (mb < 0 || mb > (int64_t{1} << 40)) {
               return Status::InvalidArgument("--kv-cache-mb must be in [0, 2^40]");
             }
             eo->kv_cache_bytes = mb * (int64_t{1} << 20);
             return Status::Ok();
           });
  p->String("--kv-dtype", &eo->kv_dtype,
            "CPU KV cache element type (bf16 halves the K/V bytes attention reads at long "
            "contexts; K/V rounded when written: different numerics, fingerprint suffix -kvbf16)",
            "f32|bf16");
  p->Value("--prefix-cache", "reuse KV blocks of shared prefixes (default on)", "on|off",
           [eo](const std::string& v) {
             if (v != "on" && v != "off") {
               return Status::InvalidArgument("--prefix-cache must be on or off, got '" + v + "'");
             }
             eo->prefix_cache = v == "on";
             return Status::Ok();
           });
  p->String("--kv-disk-dir", &eo->kv_disk_dir,
            "spill evicted prefix blocks to files in this folder (none by default)", "DIR");
  p->Integer("--kv-disk-bytes", &eo->kv_disk_bytes,
             "size cap of the --kv-disk-dir tier (default 1 GiB)");
  p->String("--swa-cache", &eo->swa_cache,
            "prefix-cache policy of sliding-window layers (default full): keep every sliding "
            "block, only the windows at every P tokens (P a multiple of 16), or none (a hit "
            "rebuilds them); never changes a bit",
            "full|checkpoint:P|recompute");
}

void AddEngineFlags(CliParser* p, EngineFlags* f) {
  p->Group("Engine (none of these changes a bit, except --device, --weights and --kv-dtype)");
  p->String("--device", &f->eo.device,
            "cpu|cuda (default cpu): cuda runs the forward pass on the GPU (weights and KV cache "
            "on the device; a different numerics fingerprint)",
            "NAME");
  p->Integer("--threads", &f->eo.threads, "kernel threads (default 1)");
  p->String("--weights", &f->weights,
            "CPU matmul weight storage (bf16 halves memory traffic; different numerics, "
            "fingerprint cpu-bf16); --device cuda always keeps bf16 weights on the GPU",
            "f32|bf16");
  AddEngineTuningFlags(p, &f->eo);
}

Status CheckEngineOptionFlags(const engine::EngineOptions& eo) {
  if (eo.kv_dtype != "f32" && eo.kv_dtype != "bf16") {
    return Status::InvalidArgument("--kv-dtype must be f32 or bf16, got '" + eo.kv_dtype + "'");
  }
  if (eo.kv_dtype != "f32" && eo.device != "cpu") {
    return Status::InvalidArgument("--kv-dtype bf16 applies to --device cpu only");
  }
  if (eo.max_step_tokens < 1 || eo.max_running < 1 || eo.max_prefill_chunk < 1) {
    return Status::InvalidArgument(
        "--max-step-tokens, --max-running and --max-prefill-chunk must be >= 1");
  }
  if (eo.kv_disk_bytes < 0) return Status::InvalidArgument("--kv-disk-bytes must be >= 0");
  if (Result<engine::SwaCache> swa = engine::ParseSwaCache(eo.swa_cache, 16); !swa.ok()) {
    return Status::InvalidArgument("--swa-cache: " + swa.status().message());
  }
  return Status::Ok();
}

Status CheckEngineFlags(EngineFlags* f) {
  if (f->weights != "f32" && f->weights != "bf16") {
    return Status::InvalidArgument("--weights must be f32 or bf16, got '" + f->weights + "'");
  }
  return CheckEngineOptionFlags(f->eo);
}

Result<std::unique_ptr<engine::CpuEngine>> OpenCpuEngine(
    const EngineFlags& f, bool tokenizer_required, std::chrono::steady_clock::time_point* t_setup) {
  const engine::EngineOptions& eo = f.eo;
  BR_ASSIGN_OR_RETURN(engine::ModelWeights w, engine::LoadModelWeights(eo.model_path));
  engine::CpuEngineParts parts;
  Result<std::unique_ptr<engine::Tokenizer>> tok =
      engine::LoadTokenizerFor(eo.model_path, eo.tokenizer_path, w.config.vocab_size);
  if (tok.ok()) {
    parts.tokenizer = std::move(tok).value();
  } else if (tokenizer_required) {
    return tok.status();
  }
  parts.weights = std::make_shared<const engine::ModelWeights>(std::move(w));
  parts.options = eo;
  parts.weight_storage = f.weights == "bf16" ? kernels::DType::kBF16 : kernels::DType::kF32;
  if (t_setup != nullptr) *t_setup = std::chrono::steady_clock::now();
  BR_ASSIGN_OR_RETURN(parts.backend, engine::MakeDeviceBackend(eo, parts.weights));
  return engine::CpuEngine::Create(std::move(parts));
}

}  // namespace bitroll::rollout
