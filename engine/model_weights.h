// engine/model_weights.h: a loaded model: its configuration and read-only views of its tensors.
//
// Loaders (engine/loaders/) map a file and return a ModelWeights whose Tensors point into
// `storage` (e.g. a read-only mmap). The forward pass packs what it needs from these views.
//
// Ownership: ModelWeights owns its storage through a shared_ptr; a Tensor's data stays valid while
// any copy of the ModelWeights (or of `storage`) is alive. Copies are cheap and share the bytes.
// Thread-safety: immutable after load; any number of threads may read it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/matmul.h"  // kernels::DType
#include "kernels/cpu/ops.h"     // kernels::RopeLayout
#include "schema/status.h"

namespace bitroll::engine {

struct ModelConfig {
  std::string arch = "llama";  // "llama" | "qwen2" (later)
  int32_t dim = 0;             // residual width
  int32_t hidden_dim = 0;      // FFN width
  int32_t n_layers = 0;
  int32_t n_heads = 0;     // query heads
  int32_t n_kv_heads = 0;  // key/value heads (GQA when < n_heads)
  int32_t vocab_size = 0;
  int32_t max_seq_len = 0;  // positions the model supports
  float norm_eps = 1e-5f;   // RMSNorm epsilon (llama2.c: 1e-5)
  float rope_theta = 10000.0f;
  kernels::RopeLayout rope_layout = kernels::RopeLayout::kInterleaved;
  bool shared_classifier = true;  // classifier == token embedding
  bool qkv_bias = false;          // q/k/v projections have biases (qwen2)
  int32_t bos_id = 1;
  int32_t eos_id = 2;

  int32_t head_dim() const { return dim / n_heads; }
  int32_t kv_dim() const { return head_dim() * n_kv_heads; }

  // OK when every size is positive, dim % n_heads == 0, n_heads % n_kv_heads == 0, head_dim is
  // even, norm_eps > 0 and finite, rope_theta > 0 and finite, and bos/eos lie in the vocabulary.
  // Errors: kInvalidArgument naming the first bad field and its value.
  Status Validate() const;
};

// A view of one tensor. Shapes are outermost first; matrices are in nn.Linear layout [out][in].
struct Tensor {
  const void* data = nullptr;  // not owned (points into ModelWeights::storage); nullptr = absent
  kernels::DType dtype = kernels::DType::kF32;
  std::vector<int64_t> shape;

  int64_t numel() const;       // product of shape (1 for an empty shape)
  int64_t size_bytes() const;  // numel() * element size
};

struct LayerWeights {
  Tensor attn_norm;  // [dim]
  Tensor wq;         // [dim][dim]
  Tensor wk;         // [kv_dim][dim]
  Tensor wv;         // [kv_dim][dim]
  Tensor bq;         // [dim]     optional (qwen2); data == nullptr when absent
  Tensor bk;         // [kv_dim]  optional
  Tensor bv;         // [kv_dim]  optional
  Tensor wo;         // [dim][dim]
  Tensor ffn_norm;   // [dim]
  Tensor w1;         // [hidden][dim] gate
  Tensor w2;         // [dim][hidden] down
  Tensor w3;         // [hidden][dim] up
};

struct ModelWeights {
  ModelConfig config;
  Tensor token_embedding;  // [vocab][dim]
  std::vector<LayerWeights> layers;
  Tensor final_norm;  // [dim]
  Tensor classifier;  // [vocab][dim]; aliases token_embedding when config.shared_classifier
  // XXH64 (seed 0) over: the ten int32 config fields (dim, hidden_dim, n_layers, n_heads,
  // n_kv_heads, vocab_size, max_seq_len, rope layout, shared_classifier, qkv_bias), then the
  // bytes of every present tensor in this order: token_embedding; per layer attn_norm, wq, wk,
  // wv, bq, bk, bv, wo, ffn_norm, w1, w2, w3; final_norm; classifier unless shared. Part of the
  // numerics fingerprint: equal hashes mean equal weights.
  uint64_t weights_hash = 0;
  std::shared_ptr<const void> storage;  // keeps the mapping alive; Tensors point into it
  std::string source;                   // e.g. "llama2c:stories260K.bin"
};

// Computes ModelWeights::weights_hash as documented above. REQUIRES: every present tensor's data
// holds size_bytes() readable bytes.
uint64_t HashWeights(const ModelWeights& w);

}  // namespace bitroll::engine
