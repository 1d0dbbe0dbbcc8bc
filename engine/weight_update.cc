// engine/weight_update.cc: tensor names per format family, and the WeightStager.
#include "engine/weight_update.h"

#include <cmath>
#include <cstring>

#include "kernels/cpu/math.h"

namespace bitroll::engine {
namespace {

enum class Family { kLlama2c, kHf, kGguf };

Family FamilyOf(const ModelWeights& w) {
  if (w.source.rfind("hf:", 0) == 0) return Family::kHf;
  if (w.source.rfind("gguf:", 0) == 0) return Family::kGguf;
  return Family::kLlama2c;  // llama2.c files and models built in memory
}

// The per-layer names of one family, in LayerWeights order.
struct LayerNames {
  const char* prefix;  // followed by the layer index
  const char* attn_norm;
  const char* wq;
  const char* wk;
  const char* wv;
  const char* bq;
  const char* bk;
  const char* bv;
  const char* wo;
  const char* ffn_norm;
  const char* w1;
  const char* w2;
  const char* w3;
};

struct FamilyNames {
  const char* embedding;
  LayerNames layer;
  const char* final_norm;
  const char* classifier;
};

const FamilyNames& NamesOf(Family f) {
  static const FamilyNames kLlama2c{
      "tok_embeddings.weight",
      {"layers.", ".attention_norm.weight", ".attention.wq.weight", ".attention.wk.weight",
       ".attention.wv.weight", ".attention.wq.bias", ".attention.wk.bias", ".attention.wv.bias",
       ".attention.wo.weight", ".ffn_norm.weight", ".feed_forward.w1.weight",
       ".feed_forward.w2.weight", ".feed_forward.w3.weight"},
      "norm.weight",
      "output.weight"};
  static const FamilyNames kHf{
      "model.embed_tokens.weight",
      {"model.layers.", ".input_layernorm.weight", ".self_attn.q_proj.weight",
       ".self_attn.k_proj.weight", ".self_attn.v_proj.weight", ".self_attn.q_proj.bias",
       ".self_attn.k_proj.bias", ".self_attn.v_proj.bias", ".self_attn.o_proj.weight",
       ".post_attention_layernorm.weight", ".mlp.gate_proj.weight", ".mlp.down_proj.weight",
       ".mlp.up_proj.weight"},
      "model.norm.weight",
      "lm_head.weight"};
  static const FamilyNames kGguf{
      "token_embd.weight",
      {"blk.", ".attn_norm.weight", ".attn_q.weight", ".attn_k.weight", ".attn_v.weight",
       ".attn_q.bias", ".attn_k.bias", ".attn_v.bias", ".attn_output.weight", ".ffn_norm.weight",
       ".ffn_gate.weight", ".ffn_down.weight", ".ffn_up.weight"},
      "output_norm.weight",
      "output.weight"};
  switch (f) {
    case Family::kHf:
      return kHf;
    case Family::kGguf:
      return kGguf;
    case Family::kLlama2c:
      break;
  }
  return kLlama2c;
}

// Calls fn(name, tensor*) for every tensor slot of `w` in the canonical order, absent optional
// ones included (tensor->data == nullptr), the classifier last.
template <typename W, typename Fn>
void ForEachSlot(W& w, Fn&& fn) {
  const FamilyNames& n = NamesOf(FamilyOf(w));
  fn(std::string(n.embedding), &w.token_embedding);
  for (size_t l = 0; l < w.layers.size(); ++l) {
    auto& L = w.layers[l];
    const std::string p = n.layer.prefix + std::to_string(l);
    fn(p + n.layer.attn_norm, &L.attn_norm);
    fn(p + n.layer.wq, &L.wq);
    fn(p + n.layer.wk, &L.wk);
    fn(p + n.layer.wv, &L.wv);
    fn(p + n.layer.bq, &L.bq);
    fn(p + n.layer.bk, &L.bk);
    fn(p + n.layer.bv, &L.bv);
    fn(p + n.layer.wo, &L.wo);
    fn(p + n.layer.ffn_norm, &L.ffn_norm);
    fn(p + n.layer.w1, &L.w1);
    fn(p + n.layer.w2, &L.w2);
    fn(p + n.layer.w3, &L.w3);
    // Qwen3 QK-norm and mixture-of-experts slots (absent in dense Llama-family models). Experts
    // take transformers' per-expert names in every family.
    const bool gguf = &n == &NamesOf(Family::kGguf);
    fn(p + (gguf ? ".attn_q_norm.weight" : ".self_attn.q_norm.weight"), &L.q_norm);
    fn(p + (gguf ? ".attn_k_norm.weight" : ".self_attn.k_norm.weight"), &L.k_norm);
    fn(p + (gguf ? ".ffn_gate_inp.weight" : ".mlp.gate.weight"), &L.router);
    for (size_t e = 0; e < L.experts.size(); ++e) {
      const std::string x = p + ".mlp.experts." + std::to_string(e);
      fn(x + ".gate_proj.weight", &L.experts[e].w1);
      fn(x + ".down_proj.weight", &L.experts[e].w2);
      fn(x + ".up_proj.weight", &L.experts[e].w3);
    }
    fn(p + ".mlp.shared_expert.gate_proj.weight", &L.shared_expert.w1);
    fn(p + ".mlp.shared_expert.down_proj.weight", &L.shared_expert.w2);
    fn(p + ".mlp.shared_expert.up_proj.weight", &L.shared_expert.w3);
    fn(p + ".mlp.shared_expert_gate.weight", &L.shared_expert_gate);
  }
  fn(std::string(n.final_norm), &w.final_norm);
  fn(std::string(n.classifier), &w.classifier);
}

std::string ShapeString(std::span<const int64_t> s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

float LoadAsF32(kernels::DType d, const uint8_t* p) {
  switch (d) {
    case kernels::DType::kF32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case kernels::DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return kernels::Bf16ToF32(h);
    }
    case kernels::DType::kF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return kernels::F16ToF32(h);
    }
  }
  return 0.0f;
}

void StoreFromF32(kernels::DType d, float f, uint8_t* p) {
  uint16_t h = 0;
  switch (d) {
    case kernels::DType::kF32:
      std::memcpy(p, &f, 4);
      return;
    case kernels::DType::kBF16:
      h = kernels::F32ToBf16(f);
      break;
    case kernels::DType::kF16:
      h = kernels::F32ToF16(f);
      break;
  }
  std::memcpy(p, &h, 2);
}

// Keeps the base's storage alive beside the buffers of the replaced tensors.
struct StagedStorage {
  std::shared_ptr<const void> base;
  std::vector<std::unique_ptr<uint8_t[]>> buffers;
};

}  // namespace

std::vector<NamedTensor> TensorManifest(const ModelWeights& w) {
  std::vector<NamedTensor> out;
  ForEachSlot(w, [&](std::string name, const Tensor* t) {
    if (t->data == nullptr) return;
    if (t == &w.classifier && w.config.shared_classifier) return;
    out.push_back({std::move(name), *t});
  });
  return out;
}

WeightStager::WeightStager(std::shared_ptr<const ModelWeights> base)
    : base_(std::move(base)), next_(*base_) {
  ForEachSlot(next_, [&](std::string name, Tensor* t) {
    const bool tied = t == &next_.classifier && next_.config.shared_classifier;
    if (t->data == nullptr && !tied) return;
    if (example_names_.size() < 120) example_names_ += (example_names_.empty() ? "" : ", ") + name;
    Slot s;
    s.target = t;
    s.ignored = tied;
    order_.push_back(name);
    slots_.emplace(std::move(name), s);
  });
}

Status WeightStager::Put(const TensorSlice& slice) {
  if (!error_.ok()) return error_;
  Status s = PutImpl(slice);
  if (!s.ok()) error_ = s;
  return s;
}

Status WeightStager::Check(std::string_view name, std::span<const int64_t> shape) const {
  auto it = slots_.find(std::string(name));
  if (it == slots_.end()) {
    return Status::NotFound("weight update: the model (" + base_->source + ") has no tensor '" +
                            std::string(name) + "'; its names are like " + example_names_);
  }
  const Slot& s = it->second;
  const Tensor& served = s.ignored ? base_->token_embedding : *s.target;
  if (!std::equal(shape.begin(), shape.end(), served.shape.begin(), served.shape.end())) {
    return Status::InvalidArgument("weight update: " + std::string(name) + " has shape " +
                                   ShapeString(shape) + ", the model's is " +
                                   ShapeString(served.shape));
  }
  return Status::Ok();
}

Status WeightStager::PutImpl(const TensorSlice& slice) {
  BR_RETURN_IF_ERROR(Check(slice.name, slice.shape));
  const std::string name(slice.name);
  Slot& s = slots_.at(name);
  const Tensor& served = s.ignored ? base_->token_embedding : *s.target;
  const size_t es = DTypeSize(slice.dtype);
  if (s.done) return Status::InvalidArgument("weight update: " + name + " was sent twice");
  if (!s.started) {
    if (slice.offset != 0) {
      return Status::InvalidArgument("weight update: the first slice of " + name +
                                     " starts at byte " + std::to_string(slice.offset) + ", not 0");
    }
    s.started = true;
    s.sent = slice.dtype;
    s.total = static_cast<uint64_t>(served.numel()) * es;
    if (!s.ignored) {
      buffers_.push_back(std::make_unique_for_overwrite<uint8_t[]>(served.size_bytes()));
      s.buffer = buffers_.back().get();
    }
  }
  if (slice.dtype != s.sent) {
    return Status::InvalidArgument("weight update: slices of " + name + " change dtype from " +
                                   std::string(DTypeName(s.sent)) + " to " +
                                   std::string(DTypeName(slice.dtype)));
  }
  if (slice.offset != s.received) {
    return Status::InvalidArgument("weight update: slice of " + name + " at byte " +
                                   std::to_string(slice.offset) + ", expected byte " +
                                   std::to_string(s.received) + " (slices go in order)");
  }
  if (slice.data.size() % es != 0 || slice.data.size() > s.total - s.received) {
    return Status::InvalidArgument(
        "weight update: slice of " + name + " has " + std::to_string(slice.data.size()) +
        " bytes at byte " + std::to_string(slice.offset) + "; the tensor has " +
        std::to_string(s.total) + " bytes of " + std::string(DTypeName(s.sent)) + " elements");
  }
  const int64_t first = static_cast<int64_t>(slice.offset / es);
  const int64_t n = static_cast<int64_t>(slice.data.size() / es);
  const kernels::DType out = served.dtype;
  const size_t os = DTypeSize(out);
  if (s.sent == out) {  // the bits as sent: one copy, then a branch-free finiteness scan
    if (!s.ignored) std::memcpy(s.buffer + first * os, slice.data.data(), slice.data.size());
    int64_t bad = -1;
    if (out == kernels::DType::kF32) {
      const uint8_t* p = slice.data.data();
      uint32_t any = 0;
      for (int64_t i = 0; i < n; ++i) {
        uint32_t bits;
        std::memcpy(&bits, p + 4 * i, 4);
        any |= static_cast<uint32_t>((bits & 0x7F800000u) == 0x7F800000u);
      }
      if (any != 0) {
        for (int64_t i = 0; i < n && bad < 0; ++i) {
          if (!std::isfinite(LoadAsF32(out, p + 4 * i))) bad = i;
        }
      }
    } else {
      for (int64_t i = 0; i < n && bad < 0; ++i) {
        if (!std::isfinite(LoadAsF32(out, slice.data.data() + 2 * i))) bad = i;
      }
    }
    if (bad >= 0) {
      return Status::InvalidArgument("weight update: " + name + " element " +
                                     std::to_string(first + bad) + " is not finite");
    }
  }
  for (int64_t i = 0; i < n && s.sent != out; ++i) {
    const uint8_t* src = slice.data.data() + i * es;
    const float f = LoadAsF32(s.sent, src);
    if (!std::isfinite(f)) {
      return Status::InvalidArgument("weight update: " + name + " element " +
                                     std::to_string(first + i) + " is not finite");
    }
    if (!s.ignored) StoreFromF32(out, f, s.buffer + (first + i) * os);
  }
  s.received += slice.data.size();
  if (!s.ignored) bytes_staged_ += static_cast<uint64_t>(n) * os;
  if (s.received == s.total) {
    s.done = true;
    if (!s.ignored) s.target->data = s.buffer;
  }
  return Status::Ok();
}

Result<ModelWeights> WeightStager::Finish(bool full) {
  if (!error_.ok()) return error_;
  std::string missing;
  int n_missing = 0;
  for (const std::string& name : order_) {  // canonical order: messages name the first ones
    const Slot& s = slots_.at(name);
    if (s.started && !s.done) {
      error_ = Status::InvalidArgument("weight update: " + name + " was only partly sent (" +
                                       std::to_string(s.received) + " of " +
                                       std::to_string(s.total) + " bytes)");
      return error_;
    }
    if (full && !s.done && !s.ignored) {
      if (++n_missing <= 3) missing += (missing.empty() ? "" : ", ") + name;
    }
  }
  if (n_missing > 0) {
    error_ =
        Status::InvalidArgument("weight update: full update misses " + std::to_string(n_missing) +
                                " tensors: " + missing + (n_missing > 3 ? ", ..." : ""));
    return error_;
  }
  if (next_.config.shared_classifier) next_.classifier = next_.token_embedding;
  auto storage = std::make_shared<StagedStorage>();
  storage->base = base_->storage;
  storage->buffers = std::move(buffers_);
  next_.storage = std::move(storage);
  next_.weights_hash = HashWeights(next_);
  if (next_.source.size() < 7 || next_.source.compare(next_.source.size() - 7, 7, "+update") != 0) {
    next_.source += "+update";
  }
  error_ = Status::FailedPrecondition("weight update: Finish() was called already");
  return std::move(next_);
}

}  // namespace bitroll::engine
