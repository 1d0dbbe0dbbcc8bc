// engine/loaders/gguf.h: GGUF files (ggml's model format, versions 2 and 3).
//
// File layout (little-endian; spec: ggml docs/gguf.md):
//   uint32 magic "GGUF", uint32 version (2 or 3), uint64 tensor_count, uint64 metadata_kv_count
//   metadata_kv_count x { string key; uint32 value_type; value }
//   tensor_count x { string name; uint32 n_dims; uint64 ne[n_dims] (fastest-varying first);
//                    uint32 ggml_type; uint64 offset (relative to the data section) }
//   padding to general.alignment (default 32), then the data section.
// A string is uint64 length + bytes (no terminator). A value is one of the GgufType scalars, a
// string, or an array: uint32 element type, uint64 count, count values (arrays may nest).
//
// ParseGguf checks everything it reads against the buffer before reading it, so it is safe on
// arbitrary bytes (it is fuzzed): absurd counts/lengths, offsets past the end, overlapping or
// misaligned tensors, unknown types and sizes that overflow all give typed errors.
//
// LoadGguf maps a Llama-architecture GGUF file (llama.cpp's `llama.*` keys and tensor names) and
// returns views into the mapping (F32, F16 and BF16 tensors; quantized types are kUnsupported).
// llama.cpp's LLAMA RoPE is the adjacent-pair (interleaved) layout; HF->GGUF conversion permutes
// q/k rows so that holds, and a llama2.c->GGUF file carries llama2.c's weights as they are. The
// `qwen2` architecture (NeoX half-split RoPE, q/k/v biases) is accepted too, and so are `qwen3`
// (half-split RoPE, QK-norm: blk.N.attn_{q,k}_norm.weight; attention.key_length sets head_dim)
// and `qwen3moe` (expert_count, expert_used_count, expert_feed_forward_length; router
// blk.N.ffn_gate_inp.weight; experts stacked in ffn_{gate,up,down}_exps.weight, served as
// per-expert views; top-k weights renormalised as llama.cpp does).
//
// Thread-safety: a GgufFile is an immutable value after parsing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/model_weights.h"
#include "engine/tokenizer.h"
#include "schema/status.h"

namespace bitroll::engine {

enum class GgufType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};
const char* GgufTypeName(GgufType t);  // "uint32", ...; "unknown" outside the enum

// One metadata value. Scalars fill exactly one of u64 (unsigned integers, bool), i64 (signed
// integers) or f64 (floats); strings fill str; arrays fill elem_type and array.
struct GgufValue {
  GgufType type = GgufType::kUint8;
  uint64_t u64 = 0;
  int64_t i64 = 0;
  double f64 = 0.0;
  std::string str;
  GgufType elem_type = GgufType::kUint8;
  std::vector<GgufValue> array;

  bool is_integer() const;  // any of the eight integer types
  bool is_float() const;    // float32 or float64
};

// ggml tensor element types. Only kF32, kF16 and kBF16 can be loaded; the others are listed so
// that sizes can be checked and errors can name the type.
const char* GgmlTypeName(uint32_t ggml_type);  // "F32", "Q4_0", ...; "unknown" for others

struct GgufTensorInfo {
  std::string name;
  std::vector<uint64_t> ne;  // ggml dims, fastest-varying first (ne[0] is the row length)
  uint32_t ggml_type = 0;
  uint64_t offset = 0;      // relative to GgufFile::data_offset; a multiple of alignment
  uint64_t size_bytes = 0;  // bytes the tensor occupies
};

struct GgufParseOptions {
  // Limits on what a header may declare; exceeding one is kCorruption. They bound the memory a
  // hostile header can make the parser allocate (the buffer size bounds it too).
  uint64_t max_string_bytes = 1ull << 24;    // one key or string value
  uint64_t max_array_elements = 1ull << 24;  // one array (a 256K-token vocabulary fits)
  uint64_t max_metadata = 1ull << 16;        // metadata key/value pairs
  uint64_t max_tensors = 1ull << 16;
  int32_t max_array_depth = 8;  // nested arrays
  // When true, every tensor must lie inside the buffer (pass the whole file). When false (header
  // only, e.g. a prefix of a file), tensor ranges are checked only against each other.
  bool check_data_bounds = true;
};

struct GgufFile {
  uint32_t version = 0;
  std::vector<std::pair<std::string, GgufValue>> metadata;  // file order
  std::map<std::string, size_t> metadata_index;             // key -> index into metadata
  std::vector<GgufTensorInfo> tensors;                      // file order
  std::map<std::string, size_t> tensor_index;               // name -> index into tensors
  uint64_t alignment = 32;                                  // general.alignment
  uint64_t data_offset = 0;  // absolute offset of the data section (aligned)

  // nullptr when absent.
  const GgufValue* Find(const std::string& key) const;
  const GgufTensorInfo* FindTensor(const std::string& name) const;
  // Typed getters. Errors: kNotFound (absent key, naming it), kCorruption (wrong type, or an
  // integer that does not fit).
  Result<int64_t> GetInt(const std::string& key) const;
  Result<double> GetFloat(const std::string& key) const;  // float or integer values
  Result<std::string> GetString(const std::string& key) const;
};

// Parses the header in data[0, size). Errors: kCorruption (bad magic, truncation, bad counts,
// duplicate keys or tensor names, bad alignment, tensors out of bounds / overlapping / misaligned,
// unknown value or tensor types), kUnsupported (GGUF version 1 or > 3, big-endian files).
Result<GgufFile> ParseGguf(const uint8_t* data, size_t size, const GgufParseOptions& options = {});

struct GgufLoadOptions {
  // Caps ModelConfig::max_seq_len (llama.context_length can be 128K, which makes RoPE tables and
  // per-sequence limits large). 0 = use the file's context_length.
  int32_t max_seq_len = 0;
};

// Maps `path` and returns the model. Errors: those of MapFile and ParseGguf, plus kUnsupported
// (an architecture other than llama/qwen2, a quantized tensor type naming the type and tensor,
// partial RoPE), kNotFound (a required tensor or metadata key, named), kInvalidArgument (a tensor
// whose shape disagrees with the config, naming both; a bad config value).
Result<ModelWeights> LoadGguf(const std::string& path, const GgufLoadOptions& options = {});

// Builds the SentencePiece tokenizer embedded in a GGUF file's `tokenizer.ggml.*` metadata
// (tokenizer.ggml.model == "llama": tokens, scores, token_type, bos/eos ids). Pieces get their
// U+2581 "▁" replaced by " " (llama2.c's convention) and are encoded with llama2.c's merge-by-score
// algorithm; only NORMAL and USER_DEFINED pieces (token_type 1 and 4) are merge results.
// `expected_vocab_size` 0 accepts any size. Errors: kNotFound (no tokenizer metadata),
// kUnsupported (another tokenizer model, e.g. "gpt2"), kCorruption (arrays of mismatched length or
// type), kInvalidArgument (vocabulary size differs from expected_vocab_size).
Result<std::unique_ptr<Tokenizer>> GgufTokenizer(const GgufFile& file, int32_t expected_vocab_size);
Result<std::unique_ptr<Tokenizer>> LoadGgufTokenizer(const std::string& path,
                                                     int32_t expected_vocab_size);

}  // namespace bitroll::engine
