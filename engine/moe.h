// engine/moe.h: the batch-invariant mixture-of-experts FFN (Qwen3-MoE, Qwen2-MoE).
//
// Per row x (the post-attention RMSNorm output, [dim]):
//   logits = router x                     one canonical fp32 matmul (kernels/cpu/matmul.h)
//   p = softmax(logits)                   m = MaxValue, s = SumExpShifted (lane order, math.h Exp),
//                                         p_e = Exp(logits_e - m) / s
//   top-k: slot j takes the largest p not yet taken; ties go to the lowest expert id
//   w_j = p_{id_j}; with norm_topk_prob, w_j = w_j / (w_0 + w_1 + ... + w_{k-1}) (sum in slot
//   order)
//   y_j = expert_{id_j}(x)                SwiGLU FFN: w2 (SwiGlu(w1 x, w3 x))
//   out = 0; for j in slot order: out = fmaf(w_j, y_j, out)
//   shared expert (Qwen2-MoE): g = 1 / (1 + Exp(-(gate x))); out = fmaf(g, shared(x), out)
//
// Invariance: each expert runs kernels::Matmul on the rows routed to it, gathered densely in row
// order. A matmul output is one fma chain over k whatever the number of rows (no split by token
// count), so a row's expert output, and so its whole result, does not depend on which other rows
// share its batch or its experts. The router, softmax, top-k and combine are per-row and fixed
// order.
//
// Routing records: Forward can write, per row and slot, the expert id and the fp32 weight w_j.
//
// Thread-safety: not thread-safe (scratch); one per Transformer.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "engine/model_weights.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"
#include "schema/status.h"

namespace bitroll::engine {

using MoeMatmulFn = void (*)(kernels::Isa, const kernels::MatmulParams&, kernels::ThreadPool*);

struct MoeRunOptions {
  kernels::Isa isa = kernels::Isa::kScalar;
  kernels::ThreadPool* pool = nullptr;
  MoeMatmulFn matmul = nullptr;         // router and shared expert; nullptr = kernels::Matmul
  MoeMatmulFn expert_matmul = nullptr;  // routed experts; nullptr = kernels::Matmul (test seam)
};

class MoeFfn {
 public:
  // Packs every MoE layer of `w` (config.n_experts > 0). Errors: kInvalidArgument for a missing
  // or mis-sized tensor (named).
  static Result<std::unique_ptr<MoeFfn>> Create(const ModelWeights& w, kernels::DType storage);

  // out[r] = MoE(x[r]) for layer `layer`, rows r < n (x and out are [n][dim], distinct). When
  // route_ids / route_weights are non-null, writes row r's k expert ids and weights, in slot
  // order, at [r * route_stride, r * route_stride + k) (route_stride 0 = k).
  void Forward(const MoeRunOptions& o, int32_t layer, const float* x, int64_t n, float* out,
               int32_t* route_ids, float* route_weights, int64_t route_stride = 0);

 private:
  struct Expert {
    std::optional<kernels::PackedMatrix> w13;  // [2 * hidden][dim]
    std::optional<kernels::PackedMatrix> w2;   // [dim][hidden]
  };
  struct Layer {
    std::optional<kernels::PackedMatrix> router;  // [n_experts][dim]
    std::vector<Expert> experts;
    Expert shared;                                     // w13 absent without a shared expert
    std::optional<kernels::PackedMatrix> shared_gate;  // [1][dim]
  };
  MoeFfn() = default;
  void Ensure(int64_t n);

  ModelConfig c_;
  std::vector<Layer> layers_;
  int64_t capacity_ = 0;
  std::vector<float> logits_, probs_, xg_, hg_, ag_, yg_, yslot_, shared_y_, gate_;
  std::vector<int32_t> ids_, rows_;
  std::vector<float> weights_;
};

}  // namespace bitroll::engine
