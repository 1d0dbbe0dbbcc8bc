// engine/weight_update.h: new weights built from named tensors (streamed or broadcast updates).
//
// Names. A tensor is named as the model's own format names it (ModelWeights::source; the full
// table is in docs/weights.md), e.g. the layer-0 query projection is
//   llama2c (Meta, llama2.c model.py)  layers.0.attention.wq.weight
//   hf (Hugging Face)                  model.layers.0.self_attn.q_proj.weight
//   gguf                               blk.0.attn_q.weight
// and the embedding tok_embeddings.weight / model.embed_tokens.weight / token_embd.weight.
// Only the served model's family is accepted: the layouts differ (Hugging Face q/k rows are
// permuted for rotate-half RoPE), so a tensor from another family would be silently wrong. A
// tied classifier (config.shared_classifier) has no storage of its own: its name is accepted
// and its data ignored (a trainer's state_dict() includes it), as vLLM does.
//
// Values. Tensors keep the served model's dtype: a slice sent as f32, f16 or bf16 is converted
// (exact when widening, round-to-nearest-even when narrowing). A non-finite value is refused:
// rollouts from a diverged trainer are never generated.
//
// Thread-safety: a WeightStager is used by one thread; the ModelWeights it returns is immutable.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/model_weights.h"
#include "schema/status.h"

namespace bitroll::engine {

// One tensor of a model under its format's name, in the canonical order (the weights_hash order:
// embedding; per layer attn_norm, wq, wk, wv, bq, bk, bv, wo, ffn_norm, w1, w2, w3, q_norm, k_norm,
// router, each expert's w1, w2, w3, the shared expert's w1, w2, w3 and its gate; final norm;
// classifier unless tied). Absent optional tensors (biases, dense models' MoE slots) are left
// out. Experts are named as transformers names them
// (model.layers.L.mlp.experts.E.{gate,down,up}_proj.weight) in every family.
struct NamedTensor {
  std::string name;
  Tensor tensor;  // dtype and shape as served; data points into the ModelWeights
};
std::vector<NamedTensor> TensorManifest(const ModelWeights& w);

// ParseDType ("f32" / "f16" / "bf16"), DTypeName, DTypeSize: schema/vocab.h.

// A slice of one tensor as sent: bytes [offset, offset + data.size()) of the tensor in `dtype`.
struct TensorSlice {
  std::string_view name;
  kernels::DType dtype = kernels::DType::kF32;
  std::span<const int64_t> shape;
  uint64_t offset = 0;
  std::span<const uint8_t> data;
};

// Builds new weights over a base: tensors put replace the base's; the rest are shared with it.
class WeightStager {
 public:
  explicit WeightStager(std::shared_ptr<const ModelWeights> base);

  // Adds one slice. The first slice of a tensor has offset 0 and each next one starts where the
  // previous ended; a tensor completed earlier in this update may not be sent again.
  // Errors (the stager is then unusable: every later call returns the same error):
  // kNotFound (a name the model does not have: the message gives an example of its names),
  // kInvalidArgument (shape differs from the served one, slice out of order, past the end, not a
  // whole number of elements, a tensor sent twice, a non-finite value).
  Status Put(const TensorSlice& slice);

  // Put's name and shape rules alone (kNotFound, kInvalidArgument), for a manifest checked before
  // its data arrives (engine/nccl_weights.h). Changes nothing.
  Status Check(std::string_view name, std::span<const int64_t> shape) const;

  // The new weights (weights_hash recomputed, source "<base source>+update"). Errors: the sticky
  // error of Put; kInvalidArgument when a tensor was only partly sent, or (full) when some
  // tensor of the model was not sent (named in the message).
  Result<ModelWeights> Finish(bool full);

  // Bytes of the served dtype written so far (for logs and tests).
  uint64_t bytes_staged() const { return bytes_staged_; }

 private:
  struct Slot {
    Tensor* target = nullptr;  // in next_
    bool ignored = false;      // a tied classifier
    uint64_t received = 0;     // bytes (in the sent dtype) of the tensor received so far
    uint64_t total = 0;        // the tensor's bytes in the sent dtype (set by the first slice)
    kernels::DType sent = kernels::DType::kF32;
    uint8_t* buffer = nullptr;  // owned by buffers_; the tensor in the served dtype
    bool started = false;
    bool done = false;
  };

  Status PutImpl(const TensorSlice& slice);

  std::shared_ptr<const ModelWeights> base_;
  ModelWeights next_;
  std::unordered_map<std::string, Slot> slots_;
  std::vector<std::string> order_;  // slot names in the canonical order
  std::string example_names_;
  std::vector<std::unique_ptr<uint8_t[]>> buffers_;
  uint64_t bytes_staged_ = 0;
  Status error_;
};

}  // namespace bitroll::engine
