// python/ext/moe_ext.cc: the mixture-of-experts row steps for bitroll.torch.
//
// The experts' matmuls and SwiGLU are kernels_ext.cc's linear / swiglu (the same kernels on the
// same rows); the router's softmax and top-k (moe_route; with forced ids for routing replay) and
// the slot-order combine (moe_combine) run the engine's own code, engine/moe_row.h, so the bits
// are the engine's by construction.
#include "python/ext/moe_ext.h"

#include <cmath>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/moe_row.h"
#include "python/ext/ext_common.h"

namespace py = pybind11;
namespace k = bitroll::kernels;

namespace bitroll_ext {
namespace {

const k::Isa* g_isa = nullptr;

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
  for (int64_t r = 0; r < n; ++r) {
    const int32_t* f = nullptr;
    if (forced) {
      f = forced->data() + r * topk;
      for (int64_t j = 0; j < topk; ++j) {
        Require(f[j] >= 0 && f[j] < ne, "moe_route: forced expert id out of range");
      }
    }
    bitroll::engine::RouteRow(*g_isa, logits.data() + r * ne, int32_t(ne), int32_t(topk),
                              norm_topk_prob, f, probs_a.mutable_data() + r * ne,
                              ids_a.mutable_data() + r * topk, ws_a.mutable_data() + r * topk);
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
  for (int64_t r = 0; r < n; ++r) {
    bitroll::engine::CombineRow(w.data() + r * topk, ys.data() + r * topk * dim, int32_t(topk), dim,
                                gate ? shared->data() + r * dim : nullptr,
                                gate ? gate->data()[r] : 0.0f, out.mutable_data() + r * dim);
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
