// engine/moe.cc: the batch-invariant mixture-of-experts FFN (see the header).
#include "engine/moe.h"

#include <cmath>
#include <cstring>
#include <string>

#include "engine/moe_row.h"
#include "kernels/cpu/math.h"
#include "kernels/cpu/ops.h"

namespace bitroll::engine {
namespace {

using kernels::MatrixPart;
using kernels::PackedMatrix;

Result<MatrixPart> Part(const Tensor& t, int64_t rows, int64_t cols, const std::string& what) {
  if (t.data == nullptr) return Status::InvalidArgument("missing weight " + what);
  if (t.numel() != rows * cols) {
    return Status::InvalidArgument("weight " + what + " has " + std::to_string(t.numel()) +
                                   " elements, expected " + std::to_string(rows) + " x " +
                                   std::to_string(cols));
  }
  return MatrixPart{t.data, t.dtype, rows};
}

Result<PackedMatrix> PackFfn13(const FfnWeights& f, int64_t hidden, int64_t dim,
                               const std::string& what, kernels::DType storage) {
  BR_ASSIGN_OR_RETURN(MatrixPart w1, Part(f.w1, hidden, dim, what + ".w1"));
  BR_ASSIGN_OR_RETURN(MatrixPart w3, Part(f.w3, hidden, dim, what + ".w3"));
  const MatrixPart parts[] = {w1, w3};
  return PackedMatrix::Pack(parts, dim, storage);
}

Result<PackedMatrix> PackFfn2(const FfnWeights& f, int64_t hidden, int64_t dim,
                              const std::string& what, kernels::DType storage) {
  BR_ASSIGN_OR_RETURN(MatrixPart w2, Part(f.w2, dim, hidden, what + ".w2"));
  return PackedMatrix::Pack({&w2, 1}, hidden, storage);
}

void Run(MoeMatmulFn fn, const MoeRunOptions& o, const float* x, int64_t m, int64_t ldx,
         const PackedMatrix& w, float* y, int64_t ldy) {
  kernels::MatmulParams p;
  p.x = x;
  p.m = m;
  p.ldx = ldx;
  p.w = &w;
  p.y = y;
  p.ldy = ldy;
  if (fn != nullptr) {
    fn(o.isa, p, o.pool);
  } else {
    kernels::Matmul(o.isa, p, o.pool);
  }
}

}  // namespace

Result<std::unique_ptr<MoeFfn>> MoeFfn::Create(const ModelWeights& w, kernels::DType storage) {
  const ModelConfig& c = w.config;
  if (!c.is_moe()) return Status::InvalidArgument("moe: the model has no experts");
  std::unique_ptr<MoeFfn> m(new MoeFfn());
  m->c_ = c;
  const int64_t dim = c.dim, hidden = c.moe_hidden_dim, sh = c.shared_expert_hidden;
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const LayerWeights& lw = w.layers[l];
    const std::string at = "layer " + std::to_string(l) + " ";
    Layer layer;
    BR_ASSIGN_OR_RETURN(MatrixPart r, Part(lw.router, c.n_experts, dim, at + "router"));
    BR_ASSIGN_OR_RETURN(layer.router, PackedMatrix::Pack({&r, 1}, dim, storage));
    if (lw.experts.size() != size_t(c.n_experts)) {
      return Status::InvalidArgument("moe: " + at + "has " + std::to_string(lw.experts.size()) +
                                     " experts, config says " + std::to_string(c.n_experts));
    }
    for (int32_t e = 0; e < c.n_experts; ++e) {
      const std::string what = at + "expert " + std::to_string(e);
      Expert ex;
      BR_ASSIGN_OR_RETURN(ex.w13, PackFfn13(lw.experts[size_t(e)], hidden, dim, what, storage));
      BR_ASSIGN_OR_RETURN(ex.w2, PackFfn2(lw.experts[size_t(e)], hidden, dim, what, storage));
      layer.experts.push_back(std::move(ex));
    }
    if (sh > 0) {
      const std::string what = at + "shared expert";
      BR_ASSIGN_OR_RETURN(layer.shared.w13, PackFfn13(lw.shared_expert, sh, dim, what, storage));
      BR_ASSIGN_OR_RETURN(layer.shared.w2, PackFfn2(lw.shared_expert, sh, dim, what, storage));
      BR_ASSIGN_OR_RETURN(MatrixPart g, Part(lw.shared_expert_gate, 1, dim, what + " gate"));
      BR_ASSIGN_OR_RETURN(layer.shared_gate, PackedMatrix::Pack({&g, 1}, dim, storage));
    }
    m->layers_.push_back(std::move(layer));
  }
  return m;
}

void MoeFfn::Ensure(int64_t n) {
  if (n <= capacity_) return;
  capacity_ = n;
  const int64_t dim = c_.dim, k = c_.n_experts_per_tok, e = c_.n_experts;
  const int64_t hidden = std::max(c_.moe_hidden_dim, c_.shared_expert_hidden);
  logits_.resize(n * e);
  probs_.resize(e);
  xg_.resize(n * dim);
  hg_.resize(n * 2 * hidden);
  ag_.resize(n * hidden);
  yg_.resize(n * dim);
  yslot_.resize(n * k * dim);
  shared_y_.resize(c_.shared_expert_hidden > 0 ? n * dim : 0);
  gate_.resize(n);
  ids_.resize(n * k);
  weights_.resize(n * k);
  rows_.resize(n);
}

void MoeFfn::Forward(const MoeRunOptions& o, int32_t layer, const float* x, int64_t n, float* out,
                     int32_t* route_ids, float* route_weights, int64_t route_stride) {
  if (n == 0) return;
  Ensure(n);
  const Layer& L = layers_[size_t(layer)];
  const int64_t dim = c_.dim, k = c_.n_experts_per_tok, ne = c_.n_experts;
  const int64_t hidden = c_.moe_hidden_dim;
  // Router, softmax and top-k, per row.
  Run(o.matmul, o, x, n, dim, *L.router, logits_.data(), ne);
  for (int64_t r = 0; r < n; ++r) {
    RouteRow(o.isa, logits_.data() + r * ne, int32_t(ne), int32_t(k), c_.norm_topk_prob, nullptr,
             probs_.data(), ids_.data() + r * k, weights_.data() + r * k);
  }
  // Each expert on the rows routed to it, gathered in row order.
  for (int32_t e = 0; e < ne; ++e) {
    int64_t cnt = 0;
    for (int64_t s = 0; s < n * k; ++s) {
      if (ids_[size_t(s)] != e) continue;
      rows_[size_t(cnt)] = int32_t(s);  // row * k + slot
      std::memcpy(xg_.data() + cnt * dim, x + (s / k) * dim, dim * sizeof(float));
      ++cnt;
    }
    if (cnt == 0) continue;
    const Expert& ex = L.experts[size_t(e)];
    Run(o.expert_matmul, o, xg_.data(), cnt, dim, *ex.w13, hg_.data(), 2 * hidden);
    for (int64_t i = 0; i < cnt; ++i) {
      const float* g = hg_.data() + i * 2 * hidden;
      kernels::SwiGlu(o.isa, g, g + hidden, hidden, ag_.data() + i * hidden);
    }
    Run(o.expert_matmul, o, ag_.data(), cnt, hidden, *ex.w2, yg_.data(), dim);
    for (int64_t i = 0; i < cnt; ++i) {
      std::memcpy(yslot_.data() + int64_t(rows_[size_t(i)]) * dim, yg_.data() + i * dim,
                  dim * sizeof(float));
    }
  }
  // The shared expert on every row, and its sigmoid gate.
  const int64_t sh = c_.shared_expert_hidden;
  if (sh > 0) {
    Run(o.matmul, o, x, n, dim, *L.shared.w13, hg_.data(), 2 * sh);
    for (int64_t r = 0; r < n; ++r) {
      const float* g = hg_.data() + r * 2 * sh;
      kernels::SwiGlu(o.isa, g, g + sh, sh, ag_.data() + r * sh);
    }
    Run(o.matmul, o, ag_.data(), n, sh, *L.shared.w2, shared_y_.data(), dim);
    Run(o.matmul, o, x, n, dim, *L.shared_gate, gate_.data(), 1);
  }
  // Combine in slot order.
  for (int64_t r = 0; r < n; ++r) {
    CombineRow(weights_.data() + r * k, yslot_.data() + r * k * dim, int32_t(k), dim,
               sh > 0 ? shared_y_.data() + r * dim : nullptr, sh > 0 ? gate_[size_t(r)] : 0.0f,
               out + r * dim);
  }
  const int64_t stride = route_stride > 0 ? route_stride : k;
  for (int64_t r = 0; r < n; ++r) {
    if (route_ids != nullptr) {
      std::memcpy(route_ids + r * stride, ids_.data() + r * k, k * sizeof(int32_t));
    }
    if (route_weights != nullptr) {
      std::memcpy(route_weights + r * stride, weights_.data() + r * k, k * sizeof(float));
    }
  }
}

}  // namespace bitroll::engine
