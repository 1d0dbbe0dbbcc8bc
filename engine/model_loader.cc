#include "engine/model_loader.h"

#include <filesystem>
#include <fstream>

#include "engine/cpu_engine.h"
#include "engine/loaders/llama2c.h"
#include "engine/tokenizers/llama2c_tokenizer.h"

namespace bitroll::engine {

namespace fs = std::filesystem;

const char* ModelFormatName(ModelFormat f) {
  switch (f) {
    case ModelFormat::kLlama2c: return "llama2c";
    case ModelFormat::kGguf: return "gguf";
    case ModelFormat::kHuggingFace: return "huggingface";
  }
  return "unknown";
}

Result<ModelFormat> DetectModelFormat(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return Status::NotFound("model " + path + " does not exist");
  if (fs::is_directory(path, ec)) {
    if (fs::exists(fs::path(path) / "config.json", ec)) return ModelFormat::kHuggingFace;
    return Status::Unsupported("model directory " + path + " has no config.json");
  }
  std::ifstream f(path, std::ios::binary);
  char magic[4] = {};
  f.read(magic, 4);
  if (f.gcount() == 4 && std::string(magic, 4) == "GGUF") return ModelFormat::kGguf;
  return ModelFormat::kLlama2c;
}

Result<ModelWeights> LoadModelWeights(const std::string& path) {
  BR_ASSIGN_OR_RETURN(ModelFormat format, DetectModelFormat(path));
  switch (format) {
    case ModelFormat::kLlama2c: return LoadLlama2c(path);
    case ModelFormat::kGguf:
    case ModelFormat::kHuggingFace: break;
  }
  return Status::Unsupported(std::string("model ") + path + ": the " + ModelFormatName(format) +
                             " format is not supported by this build yet");
}

Result<std::unique_ptr<Tokenizer>> LoadTokenizerFor(const std::string& model_path,
                                                    const std::string& tokenizer_path,
                                                    int32_t vocab_size) {
  if (!tokenizer_path.empty()) return LoadLlama2cTokenizer(tokenizer_path, vocab_size);
  const fs::path dir = fs::path(model_path).parent_path();
  for (const std::string name : {std::string("tokenizer.bin"), "tok" + std::to_string(vocab_size) + ".bin"}) {
    std::error_code ec;
    const fs::path p = dir / name;
    if (fs::exists(p, ec)) return LoadLlama2cTokenizer(p.string(), vocab_size);
  }
  return std::unique_ptr<Tokenizer>();
}

Result<std::unique_ptr<Engine>> OpenEngine(const EngineOptions& options) {
  BR_ASSIGN_OR_RETURN(ModelWeights w, LoadModelWeights(options.model_path));
  CpuEngineParts parts;
  BR_ASSIGN_OR_RETURN(parts.tokenizer,
                      LoadTokenizerFor(options.model_path, options.tokenizer_path, w.config.vocab_size));
  parts.weights = std::make_shared<const ModelWeights>(std::move(w));
  parts.options = options;
  BR_ASSIGN_OR_RETURN(std::unique_ptr<CpuEngine> e, CpuEngine::Create(std::move(parts)));
  return std::unique_ptr<Engine>(std::move(e));
}

}  // namespace bitroll::engine
