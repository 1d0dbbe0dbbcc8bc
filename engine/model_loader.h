// engine/model_loader.h: opens a model by path, detecting its format, and finds its tokenizer.
#pragma once

#include <memory>
#include <string>

#include "engine/model_weights.h"
#include "engine/tokenizer.h"
#include "schema/status.h"

namespace bitroll::engine {

enum class ModelFormat { kLlama2c, kGguf, kHuggingFace };
const char* ModelFormatName(ModelFormat f);

// Detects the format: a directory with config.json is Hugging Face, a file starting with "GGUF" is
// GGUF, anything else is tried as a llama2.c checkpoint (whose loader validates its header).
Result<ModelFormat> DetectModelFormat(const std::string& path);

// Loads the weights of any supported format. Errors: kNotFound, kCorruption, kUnsupported,
// kInvalidArgument.
Result<ModelWeights> LoadModelWeights(const std::string& path);

// Loads the tokenizer at `tokenizer_path`, or when empty the one beside the model
// (tokenizer.bin, then tok<vocab>.bin). Returns nullptr (not an error) when none is found beside
// the model; an explicit path that fails to load is an error.
Result<std::unique_ptr<Tokenizer>> LoadTokenizerFor(const std::string& model_path,
                                                    const std::string& tokenizer_path,
                                                    int32_t vocab_size);

}  // namespace bitroll::engine
