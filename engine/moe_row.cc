// The MoE FFN's per-row router and combine (see moe_row.h).
#include "engine/moe_row.h"

#include <cmath>
#include <cstring>

#include "kernels/cpu/math.h"
#include "kernels/cpu/ops.h"

namespace bitroll::engine {

void RouteRow(kernels::Isa isa, const float* logits, int32_t n_experts, int32_t k,
              bool norm_topk_prob, const int32_t* forced, float* probs, int32_t* ids,
              float* weights) {
  const float mx = kernels::MaxValue(isa, logits, n_experts);
  const float s = kernels::SumExpShifted(isa, logits, n_experts, mx);
  for (int32_t e = 0; e < n_experts; ++e) probs[e] = kernels::Exp(logits[e] - mx) / s;
  for (int32_t j = 0; j < k; ++j) {
    int32_t best = -1;
    if (forced != nullptr) {
      best = forced[j];
    } else {
      for (int32_t e = 0; e < n_experts; ++e) {
        bool taken = false;
        for (int32_t i = 0; i < j; ++i) taken = taken || ids[i] == e;
        if (taken) continue;
        if (best < 0 || probs[e] > probs[best]) best = e;  // ties: lowest id
      }
    }
    ids[j] = best;
    weights[j] = probs[best];
  }
  if (norm_topk_prob) {
    float sum = 0.0f;
    for (int32_t j = 0; j < k; ++j) sum = sum + weights[j];
    for (int32_t j = 0; j < k; ++j) weights[j] = weights[j] / sum;
  }
}

void CombineRow(const float* weights, const float* ys, int32_t k, int64_t dim,
                const float* shared_y, float shared_gate_logit, float* out) {
  std::memset(out, 0, dim * sizeof(float));
  for (int32_t j = 0; j < k; ++j) {
    const float w = weights[j];
    const float* y = ys + j * dim;
    for (int64_t i = 0; i < dim; ++i) out[i] = std::fma(w, y[i], out[i]);
  }
  if (shared_y != nullptr) {
    const float g = 1.0f / (1.0f + kernels::Exp(-shared_gate_logit));
    for (int64_t i = 0; i < dim; ++i) out[i] = std::fma(g, shared_y[i], out[i]);
  }
}

}  // namespace bitroll::engine
