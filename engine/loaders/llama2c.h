// engine/loaders/llama2c.h: loads llama2.c checkpoints (run.c's "legacy" version-0 format).
//
// File format (little-endian):
//   int32 dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
//     (a negative vocab_size means the classifier is stored separately; its magnitude is the size)
//   float32 token_embedding [vocab][dim]
//           rms_att   [L][dim]
//           wq        [L][dim][dim]          (nn.Linear layout [out][in])
//           wk        [L][kv_dim][dim]
//           wv        [L][kv_dim][dim]
//           wo        [L][dim][dim]
//           rms_ffn   [L][dim]
//           w1        [L][hidden][dim]
//           w2        [L][dim][hidden]
//           w3        [L][hidden][dim]
//           rms_final [dim]
//           freq_cis_real [seq_len][head_dim/2], freq_cis_imag [seq_len][head_dim/2]  (skipped:
//                     RoPE tables are recomputed from rope_theta = 10000)
//           wcls      [vocab][dim]           (only when vocab_size was negative)
// and nothing after. The config gets arch "llama", norm_eps 1e-5, rope_theta 10000, the
// interleaved RoPE layout, BOS 1 and EOS 2.
#pragma once

#include <string>

#include "engine/model_weights.h"
#include "schema/status.h"

namespace bitroll::engine {

// Maps `path` read-only and returns views into the mapping. Every header value, product and
// the exact file length are checked before any weight byte is read (the weights are read once,
// for weights_hash). Errors:
//   kNotFound         the file does not exist
//   kIoError          it cannot be opened, stat'ed or mapped
//   kInvalidArgument  a bad header value (non-positive size, dim % n_heads != 0, ...), or a
//                     directory
//   kCorruption       the length differs from the header's: "expected N bytes, file has M"
//   kUnsupported      a newer llama2.c export (magic "ak42", versions 1/2) or a GGUF file
Result<ModelWeights> LoadLlama2c(const std::string& path);

}  // namespace bitroll::engine
