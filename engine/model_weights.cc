// engine/model_weights.cc: ModelConfig validation and the weights hash.
#include "engine/model_weights.h"

#include <xxhash.h>

#include <bit>
#include <cmath>
#include <string>

namespace bitroll::engine {

Status ModelConfig::Validate() const {
  auto bad = [](const std::string& what) {
    return Status::InvalidArgument("model config: " + what);
  };
  const struct {
    const char* name;
    int32_t value;
  } sizes[] = {{"dim", dim},
               {"hidden_dim", hidden_dim},
               {"n_layers", n_layers},
               {"n_heads", n_heads},
               {"n_kv_heads", n_kv_heads},
               {"vocab_size", vocab_size},
               {"max_seq_len", max_seq_len}};
  for (const auto& s : sizes) {
    if (s.value <= 0)
      return bad(std::string(s.name) + " must be > 0, got " + std::to_string(s.value));
  }
  if (head_size < 0) return bad("head_size must be >= 0, got " + std::to_string(head_size));
  if (head_size == 0 && dim % n_heads != 0) {
    return bad("dim " + std::to_string(dim) + " is not a multiple of n_heads " +
               std::to_string(n_heads));
  }
  if (n_heads % n_kv_heads != 0) {
    return bad("n_heads " + std::to_string(n_heads) + " is not a multiple of n_kv_heads " +
               std::to_string(n_kv_heads));
  }
  if (head_dim() % 2 != 0) return bad("head_dim " + std::to_string(head_dim()) + " must be even");
  if (!(norm_eps > 0.0f) || !std::isfinite(norm_eps)) {
    return bad("norm_eps must be positive and finite, got " + std::to_string(norm_eps));
  }
  if (!(rope_theta > 0.0f) || !std::isfinite(rope_theta)) {
    return bad("rope_theta must be positive and finite, got " + std::to_string(rope_theta));
  }
  if (rope_factor != 0.0f) {
    if (!(rope_factor >= 1.0f) || !std::isfinite(rope_factor) || !(rope_low_freq_factor > 0.0f) ||
        !(rope_high_freq_factor > rope_low_freq_factor) || rope_original_max_pos <= 0) {
      return bad(
          "llama3 rope scaling needs factor >= 1, 0 < low_freq_factor < high_freq_factor "
          "and original_max_position_embeddings > 0");
    }
  }
  if (n_experts < 0) return bad("n_experts must be >= 0, got " + std::to_string(n_experts));
  if (n_experts > 0) {
    if (n_experts > 65535) return bad("n_experts over 65535");
    if (n_experts_per_tok <= 0 || n_experts_per_tok > n_experts) {
      return bad("n_experts_per_tok " + std::to_string(n_experts_per_tok) + " outside [1, " +
                 std::to_string(n_experts) + "]");
    }
    if (moe_hidden_dim <= 0) {
      return bad("moe_hidden_dim must be > 0, got " + std::to_string(moe_hidden_dim));
    }
  }
  if (!layer_window.empty() && static_cast<int32_t>(layer_window.size()) != n_layers) {
    return bad("layer_window has " + std::to_string(layer_window.size()) + " entries for " +
               std::to_string(n_layers) + " layers");
  }
  for (size_t l = 0; l < layer_window.size(); ++l) {
    if (layer_window[l] < 0) {
      return bad("layer " + std::to_string(l) + " window must be > 0 (or 0 = full), got " +
                 std::to_string(layer_window[l]));
    }
  }
  if (shared_expert_hidden < 0 || (shared_expert_hidden > 0 && n_experts == 0)) {
    return bad("shared_expert_hidden needs experts and must be >= 0");
  }
  if (bos_id < 0 || bos_id >= vocab_size) {
    return bad("bos_id " + std::to_string(bos_id) + " outside the vocabulary of " +
               std::to_string(vocab_size));
  }
  if (eos_id < 0 || eos_id >= vocab_size) {
    return bad("eos_id " + std::to_string(eos_id) + " outside the vocabulary of " +
               std::to_string(vocab_size));
  }
  return Status::Ok();
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t Tensor::size_bytes() const {
  return numel() * (dtype == kernels::DType::kF32 ? 4 : 2);
}

uint64_t HashWeights(const ModelWeights& w) {
  XXH64_state_t* state = XXH64_createState();
  XXH64_reset(state, 0);
  const ModelConfig& c = w.config;
  const int32_t header[10] = {c.dim,
                              c.hidden_dim,
                              c.n_layers,
                              c.n_heads,
                              c.n_kv_heads,
                              c.vocab_size,
                              c.max_seq_len,
                              int32_t(c.rope_layout),
                              int32_t(c.shared_classifier),
                              int32_t(c.qkv_bias)};
  XXH64_update(state, header, sizeof(header));
  const bool extended = c.head_size != 0 || c.qk_norm || c.rope_factor != 0.0f || c.n_experts != 0;
  if (extended) {
    const int32_t ext[11] = {c.head_size,
                             int32_t(c.qk_norm),
                             c.n_experts,
                             c.n_experts_per_tok,
                             c.moe_hidden_dim,
                             int32_t(c.norm_topk_prob),
                             c.shared_expert_hidden,
                             std::bit_cast<int32_t>(c.rope_factor),
                             std::bit_cast<int32_t>(c.rope_low_freq_factor),
                             std::bit_cast<int32_t>(c.rope_high_freq_factor),
                             c.rope_original_max_pos};
    XXH64_update(state, ext, sizeof(ext));
  }
  const bool windowed = c.has_sliding() || c.attn_sinks;
  if (windowed) {
    const int32_t sinks = int32_t(c.attn_sinks);
    XXH64_update(state, &sinks, sizeof(sinks));
    for (int32_t l = 0; l < c.n_layers; ++l) {
      const int32_t win = c.window(l);
      XXH64_update(state, &win, sizeof(win));
    }
  }
  auto add = [&](const Tensor& t) {
    if (t.data != nullptr) XXH64_update(state, t.data, size_t(t.size_bytes()));
  };
  add(w.token_embedding);
  for (const LayerWeights& l : w.layers) {
    for (const Tensor* t : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.bq, &l.bk, &l.bv, &l.wo,
                            &l.ffn_norm, &l.w1, &l.w2, &l.w3, &l.q_norm, &l.k_norm, &l.router}) {
      add(*t);
    }
    for (const FfnWeights& e : l.experts) {
      for (const Tensor* t : {&e.w1, &e.w2, &e.w3}) add(*t);
    }
    for (const Tensor* t :
         {&l.shared_expert.w1, &l.shared_expert.w2, &l.shared_expert.w3, &l.shared_expert_gate}) {
      add(*t);
    }
    if (windowed) add(l.sinks);
  }
  add(w.final_norm);
  if (!c.shared_classifier) add(w.classifier);
  const uint64_t h = XXH64_digest(state);
  XXH64_freeState(state);
  return h;
}

}  // namespace bitroll::engine
