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

void AddEngineFlags(CliParser* p, EngineFlags* f) {
  p->Group("Engine (none of these changes a bit, except --device, --weights and --kv-dtype)");
  p->String("--device", &f->eo.device,
            "cpu|cuda (default cpu): cuda runs the forward pass on the GPU (weights and KV cache "
            "on the device; a different numerics fingerprint)",
            "NAME");
  p->Integer("--threads", &f->eo.threads, "kernel threads (default 1)");
  p->String("--isa", &f->eo.isa, "auto|scalar|avx2|avx512 (default auto)", "NAME");
  p->String("--attention", &f->eo.attention, "auto|single|split (default auto)", "NAME");
  p->Integer("--max-step-tokens", &f->eo.max_step_tokens,
             "token budget of one engine step (default 512)");
  p->Integer("--kv-cache-mb", &f->kv_cache_mb,
             "KV cache budget in MiB (default 0: sized from the model and the machine)");
  p->String("--weights", &f->weights,
            "CPU matmul weight storage (bf16 halves memory traffic; different numerics, "
            "fingerprint cpu-bf16); --device cuda always keeps bf16 weights on the GPU",
            "f32|bf16");
  p->String("--kv-dtype", &f->eo.kv_dtype,
            "CPU KV cache element type (bf16 halves the K/V bytes attention reads at long "
            "contexts; K/V rounded when written: different numerics, fingerprint suffix -kvbf16)",
            "f32|bf16");
}

Status CheckEngineFlags(EngineFlags* f) {
  if (f->kv_cache_mb < 0 || f->kv_cache_mb > (int64_t{1} << 40)) {
    return Status::InvalidArgument("--kv-cache-mb must be in [0, 2^40]");
  }
  if (f->weights != "f32" && f->weights != "bf16") {
    return Status::InvalidArgument("--weights must be f32 or bf16, got '" + f->weights + "'");
  }
  if (f->eo.kv_dtype != "f32" && f->eo.kv_dtype != "bf16") {
    return Status::InvalidArgument("--kv-dtype must be f32 or bf16, got '" + f->eo.kv_dtype + "'");
  }
  if (f->eo.kv_dtype != "f32" && f->eo.device != "cpu") {
    return Status::InvalidArgument("--kv-dtype bf16 applies to --device cpu only");
  }
  f->eo.kv_cache_bytes = f->kv_cache_mb * (int64_t{1} << 20);
  return Status::Ok();
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
