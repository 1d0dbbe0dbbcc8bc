// engine/engine.cc: the free functions of engine/engine.h. OpenEngine builds a CpuEngine (the
// replica for every device: only the forward backend differs) from a model file.
#include "engine/engine.h"

#include <utility>

#include "engine/cpu_engine.h"
#include "engine/forward_backend.h"
#include "engine/model_loader.h"

namespace bitroll::engine {

Result<std::unique_ptr<Engine>> OpenEngine(const EngineOptions& options) {
  // The device first: a wrong or absent device fails fast, before the model is read.
  BR_RETURN_IF_ERROR(CheckDevice(options.device));
  BR_ASSIGN_OR_RETURN(ModelWeights w, LoadModelWeights(options.model_path));
  CpuEngineParts parts;
  BR_ASSIGN_OR_RETURN(parts.tokenizer, LoadTokenizerFor(options.model_path, options.tokenizer_path,
                                                        w.config.vocab_size));
  parts.weights = std::make_shared<const ModelWeights>(std::move(w));
  parts.options = options;
  BR_ASSIGN_OR_RETURN(parts.backend, MakeDeviceBackend(options, parts.weights));
  BR_ASSIGN_OR_RETURN(std::unique_ptr<CpuEngine> e, CpuEngine::Create(std::move(parts)));
  return std::unique_ptr<Engine>(std::move(e));
}

}  // namespace bitroll::engine
