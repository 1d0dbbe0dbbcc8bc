// engine/model_weights.cc: ModelConfig validation and the weights hash.
#include "engine/model_weights.h"

#include <xxhash.h>

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
  if (dim % n_heads != 0) {
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
  auto add = [&](const Tensor& t) {
    if (t.data != nullptr) XXH64_update(state, t.data, size_t(t.size_bytes()));
  };
  add(w.token_embedding);
  for (const LayerWeights& l : w.layers) {
    for (const Tensor* t : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.bq, &l.bk, &l.bv, &l.wo,
                            &l.ffn_norm, &l.w1, &l.w2, &l.w3}) {
      add(*t);
    }
  }
  add(w.final_norm);
  if (!c.shared_classifier) add(w.classifier);
  const uint64_t h = XXH64_digest(state);
  XXH64_freeState(state);
  return h;
}

}  // namespace bitroll::engine
