// engine/moe_row.h: the per-row steps of the mixture-of-experts FFN outside its matmuls, shared
// by the engine (engine/moe.cc) and the trainer kit (python/ext/moe_ext.cc), so that the two
// compute the same bits by running the same code. Depends on kernels/cpu only.
//
//   RouteRow    p = softmax(logits) (m = MaxValue, s = SumExpShifted, p_e = Exp(logits_e - m) / s);
//               slot j takes the largest p not yet taken, ties to the lowest expert id (or, for
//               routing replay, the forced id); w_j = p_{id_j}; with norm_topk_prob
//               w_j = w_j / (w_0 + ... + w_{k-1}), the sum in slot order.
//   CombineRow  out = 0; out = fmaf(w_j, y_j, out) for j in slot order; then, with a shared
//               expert, g = 1 / (1 + Exp(-gate_logit)) and out = fmaf(g, shared_y, out).
#pragma once

#include <cstdint>

#include "kernels/cpu/isa.h"

namespace bitroll::engine {

// REQUIRES: 1 <= k <= n_experts; probs has n_experts floats (written: the softmax); ids and
// weights have k. forced: null, or k expert ids in [0, n_experts) used instead of the top-k.
void RouteRow(kernels::Isa isa, const float* logits, int32_t n_experts, int32_t k,
              bool norm_topk_prob, const int32_t* forced, float* probs, int32_t* ids,
              float* weights);

// ys: [k][dim], slot j's expert output. shared_y: null, or [dim] with its gate logit.
void CombineRow(const float* weights, const float* ys, int32_t k, int64_t dim,
                const float* shared_y, float shared_gate_logit, float* out);

}  // namespace bitroll::engine
