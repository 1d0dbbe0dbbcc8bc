// engine/model_loader.h: opens a model by path, detecting its format, and finds its tokenizer.
//
// Formats: llama2.c checkpoints (engine/loaders/llama2c.h), GGUF files (engine/loaders/gguf.h)
// and Hugging Face directories (engine/loaders/hf.h). Weights are memory-mapped in every format.
// Thread-safety: the functions share no state; call them from any thread.
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
// Errors: kNotFound (no such path), kUnsupported (a directory without config.json).
Result<ModelFormat> DetectModelFormat(const std::string& path);

struct ModelLoadOptions {
  // Caps the context length of GGUF / Hugging Face models (their RoPE tables and per-sequence
  // limit). 0 = the model's own (llama.context_length / max_position_embeddings). llama2.c files
  // always use their header's seq_len.
  int32_t max_seq_len = 0;
};

// Loads the weights of any supported format. Errors: kNotFound, kCorruption, kUnsupported,
// kInvalidArgument, kIoError (see the loaders).
Result<ModelWeights> LoadModelWeights(const std::string& path);
Result<ModelWeights> LoadModelWeights(const std::string& path, const ModelLoadOptions& options);

// Loads the tokenizer at `tokenizer_path` (a llama2.c tokenizer file, a GGUF file whose
// embedded vocabulary is used, or a *.json Hugging Face tokenizer.json), or when empty the
// model's own:
//   llama2.c  tokenizer.bin, then tok<vocab>.bin beside the model
//   GGUF      the embedded tokenizer.ggml.* vocabulary (a GGUF without one: as llama2.c)
//   HF dir    tokenizer.json inside the directory (engine/tokenizers/bpe_tokenizer.h), else
//             tokenizer.bin
// Returns nullptr (not an error) when none is found; an explicit path that fails to load, or a
// tokenizer whose vocabulary size differs from `vocab_size`, is an error (kInvalidArgument:
// "tokenizer has N tokens, model expects M").
Result<std::unique_ptr<Tokenizer>> LoadTokenizerFor(const std::string& model_path,
                                                    const std::string& tokenizer_path,
                                                    int32_t vocab_size);

}  // namespace bitroll::engine
