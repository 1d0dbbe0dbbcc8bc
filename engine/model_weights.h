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
  std::string arch = "llama";  // "llama" | "qwen2" | "qwen3" | "qwen3_moe" | "qwen2_moe"
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
  // Qwen3: explicit head size (0 = dim / n_heads), and RMSNorm over each head's q and k (weights
  // LayerWeights::q_norm / k_norm, eps norm_eps) after the projection, before RoPE.
  int32_t head_size = 0;
  bool qk_norm = false;
  // Llama 3 RoPE scaling (rope_scaling.rope_type "llama3"); rope_factor 0 = none. See
  // engine/rope_scaling.h.
  float rope_factor = 0.0f;
  float rope_low_freq_factor = 1.0f;
  float rope_high_freq_factor = 4.0f;
  int32_t rope_original_max_pos = 8192;
  // Mixture of experts (engine/moe.h); n_experts 0 = a dense SwiGLU FFN of hidden_dim. Every layer
  // is sparse when n_experts > 0. shared_expert_hidden > 0 adds Qwen2-MoE's gated shared expert.
  int32_t n_experts = 0;
  int32_t n_experts_per_tok = 0;
  int32_t moe_hidden_dim = 0;
  bool norm_topk_prob = false;
  int32_t shared_expert_hidden = 0;
  // Sliding-window attention (Gemma 3 5:1, GPT-OSS alternating): per layer, 0 = full attention,
  // W > 0 = a sliding window of W keys (query t sees keys t-W+1..t). Empty = every layer full.
  // attn_sinks: every layer has a per-head learned sink logit (LayerWeights::sinks, GPT-OSS).
  std::vector<int32_t> layer_window;
  bool attn_sinks = false;

  int32_t window(int32_t layer) const {
    return layer_window.empty() ? 0 : layer_window[static_cast<size_t>(layer)];
  }
  bool has_sliding() const {
    for (int32_t w : layer_window) {
      if (w > 0) return true;
    }
    return false;
  }

  int32_t head_dim() const { return head_size > 0 ? head_size : dim / n_heads; }
  int32_t q_dim() const { return head_dim() * n_heads; }
  int32_t kv_dim() const { return head_dim() * n_kv_heads; }
  bool is_moe() const { return n_experts > 0; }

  // OK when every size is positive, layer_window is empty or has n_layers entries >= 0, dim %
  // n_heads == 0, n_heads % n_kv_heads == 0, head_dim is even, norm_eps > 0 and finite, rope_theta
  // > 0 and finite, and bos/eos lie in the vocabulary. Errors: kInvalidArgument naming the first
  // bad field and its value.
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

// One SwiGLU FFN: w1 gate [hidden][dim], w2 down [dim][hidden], w3 up [hidden][dim].
struct FfnWeights {
  Tensor w1;
  Tensor w2;
  Tensor w3;
};

struct LayerWeights {
  Tensor attn_norm;  // [dim]
  Tensor wq;         // [q_dim][dim]
  Tensor wk;         // [kv_dim][dim]
  Tensor wv;         // [kv_dim][dim]
  Tensor bq;         // [dim]     optional (qwen2); data == nullptr when absent
  Tensor bk;         // [kv_dim]  optional
  Tensor bv;         // [kv_dim]  optional
  Tensor wo;         // [dim][q_dim]
  Tensor q_norm;     // [head_dim]  optional (qk_norm)
  Tensor k_norm;     // [head_dim]  optional (qk_norm)
  Tensor ffn_norm;   // [dim]
  Tensor w1;         // [hidden][dim] gate   (dense layers)
  Tensor w2;         // [dim][hidden] down
  Tensor w3;         // [hidden][dim] up
  // Mixture-of-experts layers (config.n_experts > 0) instead of w1/w2/w3:
  Tensor router;                    // [n_experts][dim]
  std::vector<FfnWeights> experts;  // n_experts, each of moe_hidden_dim
  FfnWeights shared_expert;         // of shared_expert_hidden; absent unless configured
  Tensor shared_expert_gate;        // [1][dim]; with shared_expert
  Tensor sinks;                     // [n_heads] attention sink logits; with config.attn_sinks
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
  // numerics fingerprint: equal hashes mean equal weights. Models that use head_size, qk_norm,
  // rope scaling or experts add, after the ten fields, the int32s head_size, qk_norm, n_experts,
  // n_experts_per_tok, moe_hidden_dim, norm_topk_prob, shared_expert_hidden and the float bits of
  // rope_factor, rope_low_freq_factor, rope_high_freq_factor, rope_original_max_pos (as int32),
  // and per layer after w3: q_norm, k_norm, router, each expert's w1, w2, w3, the shared expert's
  // w1, w2, w3 and its gate. Models with sliding windows or sinks then add the int32s attn_sinks
  // and layer_window[0..n_layers-1], and per layer the sinks tensor (after the shared expert's
  // gate). Dense Llama/Qwen2 hashes are unchanged.
  uint64_t weights_hash = 0;
  std::shared_ptr<const void> storage;  // keeps the mapping alive; Tensors point into it
  std::string source;                   // e.g. "llama2c:stories260K.bin"
};

// Computes ModelWeights::weights_hash as documented above. REQUIRES: every present tensor's data
// holds size_bytes() readable bytes.
uint64_t HashWeights(const ModelWeights& w);

}  // namespace bitroll::engine
