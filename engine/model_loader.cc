// engine/model_loader.cc: format detection and dispatch to the loaders.
#include "engine/model_loader.h"

#include <filesystem>
#include <fstream>

#include "engine/loaders/gguf.h"
#include "engine/loaders/hf.h"
#include "engine/loaders/llama2c.h"
#include "engine/tokenizers/bpe_tokenizer.h"
#include "engine/tokenizers/llama2c_tokenizer.h"

namespace bitroll::engine {

namespace fs = std::filesystem;

const char* ModelFormatName(ModelFormat f) {
  switch (f) {
    case ModelFormat::kLlama2c:
      return "llama2c";
    case ModelFormat::kGguf:
      return "gguf";
    case ModelFormat::kHuggingFace:
      return "huggingface";
  }
  return "unknown";
}

namespace {

bool IsGgufFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char magic[4] = {};
  f.read(magic, 4);
  return f.gcount() == 4 && std::string(magic, 4) == "GGUF";
}

}  // namespace

Result<ModelFormat> DetectModelFormat(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return Status::NotFound("model " + path + " does not exist");
  if (fs::is_directory(path, ec)) {
    if (fs::exists(fs::path(path) / "config.json", ec)) return ModelFormat::kHuggingFace;
    return Status::Unsupported("model directory " + path + " has no config.json");
  }
  if (IsGgufFile(path)) return ModelFormat::kGguf;
  return ModelFormat::kLlama2c;
}

Result<ModelWeights> LoadModelWeights(const std::string& path) {
  return LoadModelWeights(path, ModelLoadOptions{});
}

Result<ModelWeights> LoadModelWeights(const std::string& path, const ModelLoadOptions& options) {
  BR_ASSIGN_OR_RETURN(ModelFormat format, DetectModelFormat(path));
  switch (format) {
    case ModelFormat::kLlama2c:
      return LoadLlama2c(path);
    case ModelFormat::kGguf: {
      GgufLoadOptions o;
      o.max_seq_len = options.max_seq_len;
      return LoadGguf(path, o);
    }
    case ModelFormat::kHuggingFace: {
      HfLoadOptions o;
      o.max_seq_len = options.max_seq_len;
      return LoadHuggingFace(path, o);
    }
  }
  return Status::Internal("model " + path + ": unknown format");
}

Result<std::unique_ptr<Tokenizer>> LoadTokenizerFor(const std::string& model_path,
                                                    const std::string& tokenizer_path,
                                                    int32_t vocab_size) {
  if (!tokenizer_path.empty()) {
    if (IsGgufFile(tokenizer_path)) return LoadGgufTokenizer(tokenizer_path, vocab_size);
    if (fs::path(tokenizer_path).extension() == ".json") {
      return LoadBpeTokenizer(tokenizer_path, vocab_size);
    }
    return LoadLlama2cTokenizer(tokenizer_path, vocab_size);
  }
  std::error_code ec;
  fs::path dir = fs::path(model_path).parent_path();
  if (fs::is_directory(model_path, ec)) {
    // Hugging Face directory: tokenizer.json (byte-level BPE), else a llama2.c tokenizer.bin.
    dir = fs::path(model_path);
    const fs::path json = dir / "tokenizer.json";
    if (fs::exists(json, ec)) return LoadBpeTokenizer(json.string(), vocab_size);
    const fs::path p = dir / "tokenizer.bin";
    if (fs::exists(p, ec)) return LoadLlama2cTokenizer(p.string(), vocab_size);
    return std::unique_ptr<Tokenizer>();
  }
  if (IsGgufFile(model_path)) {
    Result<std::unique_ptr<Tokenizer>> t = LoadGgufTokenizer(model_path, vocab_size);
    if (t.ok() || t.status().code() != ErrorCode::kNotFound) return t;
    // No embedded vocabulary: look beside the file as for llama2.c.
  }
  for (const std::string& name :
       {std::string("tokenizer.bin"), "tok" + std::to_string(vocab_size) + ".bin"}) {
    const fs::path p = dir / name;
    if (fs::exists(p, ec)) return LoadLlama2cTokenizer(p.string(), vocab_size);
  }
  return std::unique_ptr<Tokenizer>();
}

}  // namespace bitroll::engine
