// engine/make_model_hf.h: reproducible random-weight Hugging Face checkpoints for the model
// families llama2.c's format cannot hold (Qwen3 QK-norm, Llama 3 rope scaling, mixture of experts).
//
// WriteRandomHfModel writes DIR/config.json, DIR/model.safetensors (F32, one shard) and
// DIR/tokenizer.json (byte-level BPE with the 256 byte tokens, id = byte value, no merges, then
// fillers "tok256", "tok257", ... up to vocab_size that encoding never produces), which
// engine/loaders/hf.h and the BPE tokenizer load. Weights are a pure function of (shape, seed):
// tensor element i of the stream (every matrix and bias, in the order the file lists them) is
// make_model.h's Irwin-Hall Philox value for stream index i (mean 0, sd 0.02); RMSNorm and QK-norm
// weights are 1.0f. The router's entries are scaled by 1 / (0.02 * sqrt(dim)) so that its logits
// have a standard deviation of about 1 (distinct, input-dependent routing).
//
// Thread-safety: pure functions of their arguments (and the files they write).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "schema/status.h"

namespace bitroll::engine {

struct HfModelShape {
  std::string name;
  std::string arch;  // "llama3" | "qwen3" | "qwen3_moe" | "qwen2_moe" | "llama"
  int32_t dim = 0;
  int32_t hidden_dim = 0;
  int32_t n_layers = 0;
  int32_t n_heads = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;  // 0 = dim / n_heads
  int32_t vocab_size = 0;
  int32_t max_seq_len = 0;
  int32_t n_experts = 0;
  int32_t top_k = 0;
  int32_t moe_hidden_dim = 0;
  int32_t shared_expert_hidden = 0;
  // Sliding-window layers: window W (0 = none); layer i is full when (i + 1) % full_every == 0,
  // else sliding. sinks: GPT-OSS sink logits per layer and head (config layer_types); without
  // sinks the config says sliding_window_pattern (Gemma 3).
  int32_t sliding_window = 0;
  int32_t full_every = 0;
  bool sinks = false;
};

// The named shapes (arch, dim, hidden, layers, heads, kv heads, head_dim, vocab, seq; experts,
// top-k, expert hidden, shared expert hidden):
//   "qwen3-tiny"      qwen3      64, 128, 2, 4, 2, 32, 512, 512
//   "qwen3-gqa4-tiny" qwen3      64, 128, 2, 8, 2, 32, 512, 512 (4 query heads per kv head, the
//                                ratio of Qwen3-8B and Llama 3 8B)
//   "llama3-tiny"     llama3     64, 128, 2, 4, 2,  -, 512, 512 (rope_scaling llama3: factor 8,
//                                low 1, high 4, original 64)
//   "qwen3-moe-tiny"  qwen3_moe  64, 128, 2, 4, 2, 16, 512, 512; 8, 2, 32, -
//   "qwen2-moe-tiny"  qwen2_moe  64, 128, 2, 4, 2,  -, 512, 512; 8, 2, 32, 64
//   "moe-100m"        qwen3_moe 512, 1536, 8, 8, 4, 64, 32000, 1024; 8, 2, 768, - (98M
//                                parameters, 42M active per token)
//   "moe-100m-dense"  qwen3      the same with one dense FFN of 1536 = 2 x 768 (the MoE's active
//                                parameter count, 42M)
//   "swa-tiny"        llama      64, 128, 4, 4, 2,  -, 512, 512; sliding W=8 / full alternating
//                                (GPT-OSS: layers 0, 2 sliding) with attention sinks
//   "swa-5to1-tiny"   qwen3      64, 128, 6, 4, 2, 32, 512, 512; five sliding W=8 layers, then one
//                                full (Gemma 3 sliding_window_pattern 6), no sinks
//   "hybrid-bench"    qwen3     256, 768, 12, 4, 2, 64, 8192, 8192; sliding W=128, five sliding
//                                layers per full one (layers 5 and 11 full), no sinks: 13.6M
//                                parameters, the regime benchmark's model (docs/regimes.md)
// Errors: kNotFound for any other name (the message lists the known ones).
Result<HfModelShape> NamedHfShape(std::string_view name);

// Writes the checkpoint into directory `dir` (created; files overwritten). Errors:
// kInvalidArgument (a shape ModelConfig::Validate rejects, vocab_size < 256), kIoError.
Status WriteRandomHfModel(const HfModelShape& shape, uint64_t seed, const std::string& dir);

}  // namespace bitroll::engine
