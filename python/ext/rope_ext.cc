// python/ext/rope_ext.cc: RoPE with a model's own cos/sin tables (Llama 3 rope scaling).
//
//   rope_tables  engine::ModelRopeTables (engine/rope_scaling.cc, compiled into this module) for a
//                head_dim, theta and Llama 3 scaling (factor 0 = none): the engine's tables, bit
//                for bit, as float32 [max_pos][head_dim / 2] cos and sin
//   rope_tabled  kernels::Rope per row with the table rows of its position, as the engine's
//                forward applies them
#include "python/ext/rope_ext.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "engine/model_weights.h"
#include "engine/rope_scaling.h"
#include "kernels/cpu/ops.h"
#include "python/ext/ext_common.h"

namespace py = pybind11;
namespace k = bitroll::kernels;

namespace bitroll_ext {
namespace {

const k::Isa* g_isa = nullptr;

py::tuple RopeTables(float theta, int32_t head_dim, int32_t max_pos, float factor, float low,
                     float high, int32_t original_max_pos) {
  Require(head_dim >= 2 && head_dim % 2 == 0 && max_pos >= 1, "rope_tables: bad shape");
  Require(factor == 0.0f || (factor >= 1.0f && 0.0f < low && low < high && original_max_pos > 0),
          "rope_tables: llama3 scaling needs factor >= 1, 0 < low < high, original > 0");
  bitroll::engine::ModelConfig c;
  c.dim = head_dim;
  c.n_heads = 1;
  c.head_size = head_dim;
  c.max_seq_len = max_pos;
  c.rope_theta = theta;
  c.rope_factor = factor;
  c.rope_low_freq_factor = low;
  c.rope_high_freq_factor = high;
  c.rope_original_max_pos = original_max_pos;
  F32 cs({int64_t{max_pos}, int64_t{head_dim / 2}}), sn({int64_t{max_pos}, int64_t{head_dim / 2}});
  bitroll::engine::ModelRopeTables(c, cs.mutable_data(), sn.mutable_data());
  return py::make_tuple(cs, sn);
}

F32 RopeTabled(const F32& x, const I32& positions, const F32& cs, const F32& sn, bool interleaved) {
  Require(x.ndim() == 3 && positions.ndim() == 1 && positions.shape(0) == x.shape(0),
          "rope_tabled: x [rows][heads][head_dim], positions [rows]");
  const int64_t m = x.shape(0), h = x.shape(1), hd = x.shape(2), half = hd / 2;
  Require(hd >= 2 && hd % 2 == 0, "rope_tabled: head_dim must be even");
  Require(cs.ndim() == 2 && cs.shape(1) == half && sn.ndim() == 2 && sn.shape(0) == cs.shape(0) &&
              sn.shape(1) == half,
          "rope_tabled: cos and sin must be [max_pos][head_dim / 2]");
  for (int64_t r = 0; r < m; ++r) {
    Require(positions.data()[r] >= 0 && positions.data()[r] < cs.shape(0),
            "rope_tabled: a position outside the tables");
  }
  F32 y({m, h, hd});
  std::memcpy(y.mutable_data(), x.data(), sizeof(float) * m * h * hd);
  const auto layout = interleaved ? k::RopeLayout::kInterleaved : k::RopeLayout::kHalfSplit;
  for (int64_t r = 0; r < m; ++r) {
    const int64_t p = positions.data()[r];
    k::Rope(*g_isa, y.mutable_data() + r * h * hd, h, hd, cs.data() + p * half,
            sn.data() + p * half, layout);
  }
  return y;
}

}  // namespace

void AddRope(py::module_& m, const k::Isa* isa) {
  g_isa = isa;
  m.def("rope_tables", &RopeTables, py::arg("theta"), py::arg("head_dim"), py::arg("max_pos"),
        py::arg("factor"), py::arg("low_freq_factor"), py::arg("high_freq_factor"),
        py::arg("original_max_pos"));
  m.def("rope_tabled", &RopeTabled, py::arg("x"), py::arg("positions"), py::arg("cos"),
        py::arg("sin"), py::arg("interleaved"));
}

}  // namespace bitroll_ext
