// python/ext/moe_ext.cc: the mixture-of-experts row steps of engine/moe.cc for bitroll.torch.
//
// The experts' matmuls and SwiGLU are kernels_ext.cc's linear / swiglu (the same kernels on the
// same rows); what engine/moe.cc does per row outside those kernels is repeated here in the same
// order with the same functions, so the bits equal the engine's:
//   moe_route    softmax of the router logits (MaxValue, SumExpShifted, math.h Exp, divide),
//                top-k by repeated arg-max (ties to the lowest id), w_j = p_{id_j}, then with
//                norm_topk_prob w_j / (w_0 + ... + w_{k-1}) summed in slot order. With forced ids
//                (routing replay) the top-k is skipped and the weights are those ids' p, normalised
//                the same way.
//   moe_combine  out = 0; out = fmaf(w_j, y_j, out) in slot order; then, with a shared expert,
//                g = 1 / (1 + Exp(-gate)) and out = fmaf(g, shared, out).
// Any change to engine/moe.cc's row math must be made here too (the trainer tests catch it).
#include "python/ext/moe_ext.h"

#include <cmath>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/math.h"
#include "kernels/cpu/ops.h"

namespace py = pybind11;
namespace k = bitroll::kernels;

namespace bitroll_ext {
namespace {

using F32 = py::array_t<float, py::array::c_style>;
using I32 = py::array_t<int32_t, py::array::c_style>;

const k::Isa* g_isa = nullptr;

void Require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument(what);
}

py::tuple MoeRoute(const F32& logits, int64_t topk, bool norm_topk_prob,
                   const std::optional<I32>& forced) {
  Require(logits.ndim() == 2, "moe_route: logits must be [rows][n_experts]");
  const int64_t n = logits.shape(0), ne = logits.shape(1);
  Require(ne >= 1 && topk >= 1 && topk <= ne, "moe_route: need 1 <= k <= n_experts");
  if (forced) {
    Require(forced->ndim() == 2 && forced->shape(0) == n && forced->shape(1) == topk,
            "moe_route: forced ids must be [rows][k]");
  }
  I32 ids_a({n, topk});
  F32 ws_a({n, topk}), probs_a({n, ne});
  const k::Isa isa = *g_isa;
  for (int64_t r = 0; r < n; ++r) {
    const float* lg = logits.data() + r * ne;
    float* probs = probs_a.mutable_data() + r * ne;
    const float mx = k::MaxValue(isa, lg, ne);
    const float s = k::SumExpShifted(isa, lg, ne, mx);
    for (int64_t e = 0; e < ne; ++e) probs[e] = k::Exp(lg[e] - mx) / s;
    int32_t* ids = ids_a.mutable_data() + r * topk;
    float* ws = ws_a.mutable_data() + r * topk;
    for (int64_t j = 0; j < topk; ++j) {
      int32_t best = -1;
      if (forced) {
        best = forced->data()[r * topk + j];
        Require(best >= 0 && best < ne, "moe_route: forced expert id out of range");
      } else {
        for (int32_t e = 0; e < ne; ++e) {
          bool taken = false;
          for (int64_t i = 0; i < j; ++i) taken = taken || ids[i] == e;
          if (taken) continue;
          if (best < 0 || probs[e] > probs[best]) best = e;  // ties: lowest id
        }
      }
      ids[j] = best;
      ws[j] = probs[best];
    }
    if (norm_topk_prob) {
      float sum = 0.0f;
      for (int64_t j = 0; j < topk; ++j) sum = sum + ws[j];
      for (int64_t j = 0; j < topk; ++j) ws[j] = ws[j] / sum;
    }
  }
  return py::make_tuple(ids_a, ws_a, probs_a);
}

F32 MoeCombine(const F32& w, const F32& ys, const std::optional<F32>& gate,
               const std::optional<F32>& shared) {
  Require(w.ndim() == 2 && ys.ndim() == 3, "moe_combine: weights [rows][k], ys [rows][k][dim]");
  const int64_t n = w.shape(0), topk = w.shape(1), dim = ys.shape(2);
  Require(ys.shape(0) == n && ys.shape(1) == topk, "moe_combine: ys must be [rows][k][dim]");
  Require(gate.has_value() == shared.has_value(), "moe_combine: gate and shared go together");
  if (gate) {
    Require(gate->ndim() == 1 && gate->shape(0) == n, "moe_combine: gate must be [rows]");
    Require(shared->ndim() == 2 && shared->shape(0) == n && shared->shape(1) == dim,
            "moe_combine: shared must be [rows][dim]");
  }
  F32 out({n, dim});
  float* op = out.mutable_data();
  for (int64_t r = 0; r < n; ++r) {
    float* y = op + r * dim;
    std::memset(y, 0, dim * sizeof(float));
    for (int64_t j = 0; j < topk; ++j) {
      const float wj = w.data()[r * topk + j];
      const float* yj = ys.data() + (r * topk + j) * dim;
      for (int64_t i = 0; i < dim; ++i) y[i] = std::fma(wj, yj[i], y[i]);
    }
    if (gate) {
      const float g = 1.0f / (1.0f + k::Exp(-gate->data()[r]));
      const float* s = shared->data() + r * dim;
      for (int64_t i = 0; i < dim; ++i) y[i] = std::fma(g, s[i], y[i]);
    }
  }
  return out;
}

}  // namespace

void AddMoe(py::module_& m, const k::Isa* isa) {
  g_isa = isa;
  m.def("moe_route", &MoeRoute, py::arg("logits"), py::arg("k"), py::arg("norm_topk_prob"),
        py::arg("forced_ids") = py::none());
  m.def("moe_combine", &MoeCombine, py::arg("weights"), py::arg("ys"), py::arg("gate") = py::none(),
        py::arg("shared") = py::none());
}

}  // namespace bitroll_ext
