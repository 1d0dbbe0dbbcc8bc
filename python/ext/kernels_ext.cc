// python/ext/kernels_ext.cc: bitroll's CPU kernels for Python (module bitroll_kernels_ext).
//
// The forward ops of bitroll.torch (python/bitroll/torch/ops.py) call these functions on
// contiguous float32 numpy arrays (a CPU torch tensor's .numpy() view, no copy). Each function
// calls the SAME kernel the engine's forward pass calls (engine/transformer.cc), with the same
// arguments per row, so the bits equal the engine's by construction:
//   linear       kernels::Matmul on a PackedMatrix of W (one fma chain per output, k order)
//   rms_norm     kernels::RmsNorm per row
//   rope         kernels::RopeTable + kernels::Rope per row at its position
//   swiglu       kernels::SwiGlu per row
//   attention    kernels::Attention over a paged K/V pool filled here, positions 0..len-1 of each
//                sequence: the engine's prefill order (chunks anchored at position 0, same merge)
//   log_softmax  the sampler's scoring: logits / T (fp32 divide), kernels::LogSoftmax
//   moe_route, moe_combine  engine/moe.cc's per-row router softmax / top-k and combine (moe_ext.cc)
//   rope_tables, rope_tabled  RoPE on engine::ModelRopeTables' tables (Llama 3; rope_ext.cc)
// Thread count never changes a bit (the kernels are invariant); set_num_threads picks it.
// Thread-safety: any Python thread may call any function; one mutex serialises the computations
// (the shared ThreadPool serves one Run at a time) and set_num_threads.
// Bad shapes raise ValueError (pybind11 maps std::invalid_argument); nothing here aborts.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/thread_pool.h"
#include "python/ext/ext_common.h"
#include "python/ext/moe_ext.h"
#include "python/ext/rope_ext.h"

namespace py = pybind11;
namespace k = bitroll::kernels;

namespace {

using bitroll_ext::F32;
using bitroll_ext::I32;
using bitroll_ext::Require;

k::Isa g_isa = k::BestIsa();
std::unique_ptr<k::ThreadPool> g_pool;  // nullptr: one thread

std::mutex g_mu;  // guards g_isa, g_pool and every use of the pool

k::ThreadPool* Pool() {
  return g_pool.get();
}

void RequireDims(const py::array& a, int nd, const char* name) {
  Require(a.ndim() == nd, std::string(name) + " must have " + std::to_string(nd) +
                              " dimensions, got " + std::to_string(a.ndim()));
}

// Row ops split rows over the pool; they never reduce across rows.
template <typename Fn>
void ForRows(int64_t rows, Fn fn) {
  constexpr int64_t kPer = 8;
  if (Pool() == nullptr || rows < 2 * kPer) {
    for (int64_t r = 0; r < rows; ++r) fn(r);
    return;
  }
  Pool()->Run((rows + kPer - 1) / kPer, [&](int, int64_t t) {
    const int64_t end = std::min(rows, (t + 1) * kPer);
    for (int64_t r = t * kPer; r < end; ++r) fn(r);
  });
}

F32 Linear(const F32& x, const F32& w, const std::optional<F32>& bias) {
  RequireDims(x, 2, "x");
  RequireDims(w, 2, "weight");
  const int64_t m = x.shape(0), kk = x.shape(1), n = w.shape(0);
  Require(w.shape(1) == kk,
          "weight has " + std::to_string(w.shape(1)) + " columns, x has " + std::to_string(kk));
  Require(kk > 0 && n > 0, "linear: empty weight");
  if (bias) {
    RequireDims(*bias, 1, "bias");
    Require(bias->shape(0) == n, "bias must have weight.shape[0] elements");
  }
  F32 y({m, n});
  const k::MatrixPart part{w.data(), k::DType::kF32, n};
  auto packed = k::PackedMatrix::Pack({&part, 1}, kk, k::DType::kF32);
  if (!packed.ok()) throw std::runtime_error(packed.status().ToString());
  k::MatmulParams p;
  p.x = x.data();
  p.m = m;
  p.ldx = kk;
  p.w = &*packed;
  p.bias = bias ? bias->data() : nullptr;
  p.y = y.mutable_data();
  p.ldy = n;
  py::gil_scoped_release release;
  std::lock_guard<std::mutex> lock(g_mu);
  k::Matmul(g_isa, p, Pool());
  return y;
}

F32 RmsNorm(const F32& x, const F32& w, float eps) {
  RequireDims(x, 2, "x");
  RequireDims(w, 1, "weight");
  const int64_t m = x.shape(0), d = x.shape(1);
  Require(d >= 1 && w.shape(0) == d, "rms_norm: weight must have x.shape[1] >= 1 elements");
  F32 y({m, d});
  const float* xp = x.data();
  const float* wp = w.data();
  float* yp = y.mutable_data();
  py::gil_scoped_release release;
  std::lock_guard<std::mutex> lock(g_mu);
  ForRows(m, [&](int64_t r) { k::RmsNorm(g_isa, xp + r * d, wp, d, eps, yp + r * d); });
  return y;
}

F32 Rope(const F32& x, const I32& positions, float theta, bool interleaved) {
  RequireDims(x, 3, "x");  // [rows][heads][head_dim]
  RequireDims(positions, 1, "positions");
  const int64_t m = x.shape(0), h = x.shape(1), hd = x.shape(2);
  Require(positions.shape(0) == m, "positions must have x.shape[0] elements");
  Require(hd >= 2 && hd % 2 == 0, "rope: head_dim must be even and >= 2");
  Require(std::isfinite(theta) && theta > 0, "rope: theta must be finite and > 0");
  const int32_t* pos = positions.data();
  int64_t max_pos = 0;
  for (int64_t r = 0; r < m; ++r) {
    Require(pos[r] >= 0, "rope: negative position");
    max_pos = std::max<int64_t>(max_pos, pos[r] + 1);
  }
  const int64_t half = hd / 2;
  std::vector<float> cs(static_cast<size_t>(max_pos * half)), sn(cs.size());
  k::RopeTable(theta, hd, max_pos, cs.data(), sn.data());
  F32 y({m, h, hd});
  std::memcpy(y.mutable_data(), x.data(), sizeof(float) * m * h * hd);
  float* yp = y.mutable_data();
  const auto layout = interleaved ? k::RopeLayout::kInterleaved : k::RopeLayout::kHalfSplit;
  py::gil_scoped_release release;
  std::lock_guard<std::mutex> lock(g_mu);
  ForRows(m, [&](int64_t r) {
    k::Rope(g_isa, yp + r * h * hd, h, hd, cs.data() + pos[r] * half, sn.data() + pos[r] * half,
            layout);
  });
  return y;
}

F32 SwiGlu(const F32& gate, const F32& up) {
  RequireDims(gate, 2, "gate");
  RequireDims(up, 2, "up");
  Require(gate.shape(0) == up.shape(0) && gate.shape(1) == up.shape(1),
          "swiglu: gate and up must have the same shape");
  const int64_t m = gate.shape(0), n = gate.shape(1);
  F32 y({m, n});
  const float* g = gate.data();
  const float* u = up.data();
  float* yp = y.mutable_data();
  py::gil_scoped_release release;
  std::lock_guard<std::mutex> lock(g_mu);
  ForRows(m, [&](int64_t r) { k::SwiGlu(g_isa, g + r * n, u + r * n, n, yp + r * n); });
  return y;
}

// q [T][H][hd], k/v [T][KVH][hd]; cu_seqlens [B+1] (0 = c0 < c1 < ... = T): sequence b is rows
// c_b..c_{b+1}-1 at positions 0..len-1. Each sequence gets its own blocks of a paged pool.
F32 Attention(const F32& q, const F32& kx, const F32& vx, const I32& cu_seqlens, float scale) {
  RequireDims(q, 3, "q");
  RequireDims(kx, 3, "k");
  RequireDims(vx, 3, "v");
  RequireDims(cu_seqlens, 1, "cu_seqlens");
  const int64_t t = q.shape(0), h = q.shape(1), hd = q.shape(2), kvh = kx.shape(1);
  Require(kx.shape(0) == t && vx.shape(0) == t, "attention: q, k, v need the same rows");
  Require(vx.shape(1) == kvh && kx.shape(2) == hd && vx.shape(2) == hd,
          "attention: k and v must be [rows][kv_heads][head_dim] like q's head_dim");
  Require(hd >= 1 && hd <= 256, "attention: head_dim must be in [1, 256]");
  Require(kvh >= 1 && h % kvh == 0, "attention: heads must be a multiple of kv_heads");
  const int64_t nb = cu_seqlens.shape(0) - 1;
  const int32_t* cu = cu_seqlens.data();
  Require(nb >= 1 && cu[0] == 0 && cu[nb] == t, "attention: cu_seqlens must run from 0 to rows");
  const int32_t bs = k::kAttentionChunk;
  std::vector<int32_t> first_block(static_cast<size_t>(nb + 1), 0);
  for (int64_t b = 0; b < nb; ++b) {
    Require(cu[b + 1] > cu[b], "attention: cu_seqlens must increase");
    first_block[b + 1] = first_block[b] + (cu[b + 1] - cu[b] + bs - 1) / bs;
  }
  const int64_t blocks = first_block[nb];
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  for (int64_t i = 0; i < blocks; ++i) table[i] = static_cast<int32_t>(i);
  std::vector<float> kpool(static_cast<size_t>(blocks * kvh * hd * bs), 0.0f);
  std::vector<float> vpool(kpool.size(), 0.0f);
  std::vector<int32_t> positions(static_cast<size_t>(t));
  std::vector<const int32_t*> tables(static_cast<size_t>(t));
  const float* kp = kx.data();
  const float* vp = vx.data();
  for (int64_t b = 0; b < nb; ++b) {
    for (int32_t r = cu[b]; r < cu[b + 1]; ++r) {
      const int32_t pos = r - cu[b];
      positions[r] = pos;
      tables[r] = table.data() + first_block[b];
      const int64_t blk = first_block[b] + pos / bs, slot = pos % bs;
      for (int64_t g = 0; g < kvh; ++g) {
        const float* krow = kp + (r * kvh + g) * hd;
        const float* vrow = vp + (r * kvh + g) * hd;
        for (int64_t d = 0; d < hd; ++d) {  // K [blk][kvh][hd][bs], V [blk][kvh][bs][hd]
          kpool[((blk * kvh + g) * hd + d) * bs + slot] = krow[d];
          vpool[((blk * kvh + g) * bs + slot) * hd + d] = vrow[d];
        }
      }
    }
  }
  F32 out({t, h, hd});
  k::AttentionParams p;
  p.n_tokens = static_cast<int32_t>(t);
  p.n_heads = static_cast<int32_t>(h);
  p.n_kv_heads = static_cast<int32_t>(kvh);
  p.head_dim = static_cast<int32_t>(hd);
  p.block_size = bs;
  p.q = q.data();
  p.out = out.mutable_data();
  p.k_cache = kpool.data();
  p.v_cache = vpool.data();
  p.positions = positions.data();
  p.block_tables = tables.data();
  p.scale = scale;
  py::gil_scoped_release release;
  std::lock_guard<std::mutex> lock(g_mu);
  k::AttentionScratch scratch;
  k::Attention(g_isa, p, k::AttentionKernel::kAuto, Pool(), &scratch);
  return out;
}

// The gradients of Attention (not bitwise anything: ordinary float math, std::exp), for the
// training backward: per (sequence, kv head), for each query head of the group and query i,
// p = softmax(scale * q_i . k_j, j <= i), D = dO_i . O_i, ds_j = p_j (dO_i . v_j - D), then
// dq_i += scale ds_j k_j, dk_j += scale ds_j q_i, dv_j += p_j dO_i. Tasks own disjoint rows of
// dk/dv (one kv head of one sequence), so threads never write the same float.
py::tuple AttentionBackward(const F32& q, const F32& kx, const F32& vx, const F32& out,
                            const F32& grad, const I32& cu_seqlens, float scale) {
  RequireDims(q, 3, "q");
  RequireDims(kx, 3, "k");
  RequireDims(vx, 3, "v");
  RequireDims(out, 3, "out");
  RequireDims(grad, 3, "grad");
  RequireDims(cu_seqlens, 1, "cu_seqlens");
  const int64_t t = q.shape(0), h = q.shape(1), hd = q.shape(2), kvh = kx.shape(1);
  Require(kx.shape(0) == t && vx.shape(0) == t && vx.shape(1) == kvh && kx.shape(2) == hd &&
              vx.shape(2) == hd && kvh >= 1 && h % kvh == 0,
          "attention_backward: q [rows][H][hd], k and v [rows][KVH][hd], H % KVH == 0");
  for (const F32* a : {&out, &grad}) {
    Require(a->shape(0) == t && a->shape(1) == h && a->shape(2) == hd,
            "attention_backward: out and grad must have q's shape");
  }
  const int64_t nb = cu_seqlens.shape(0) - 1;
  const int32_t* cu = cu_seqlens.data();
  Require(nb >= 1 && cu[0] == 0 && cu[nb] == t, "attention: cu_seqlens must run from 0 to rows");
  for (int64_t b = 0; b < nb; ++b)
    Require(cu[b + 1] > cu[b], "attention: cu_seqlens must increase");
  F32 gq({t, h, hd}), gk({t, kvh, hd}), gv({t, kvh, hd});
  float* gqp = gq.mutable_data();
  float* gkp = gk.mutable_data();
  float* gvp = gv.mutable_data();
  std::fill(gqp, gqp + t * h * hd, 0.0f);
  std::fill(gkp, gkp + t * kvh * hd, 0.0f);
  std::fill(gvp, gvp + t * kvh * hd, 0.0f);
  const float *qp = q.data(), *kp = kx.data(), *vp = vx.data(), *op = out.data(), *dp = grad.data();
  const int64_t rep = h / kvh;
  auto task = [&](int64_t item) {
    const int64_t b = item / kvh, g = item % kvh;
    const int64_t a = cu[b], n = cu[b + 1] - cu[b];
    const int64_t kstride = kvh * hd;  // floats between rows j and j + 1 of one kv head
    const float* __restrict kg = kp + (a * kvh + g) * hd;
    const float* __restrict vg = vp + (a * kvh + g) * hd;
    float* __restrict gkg = gkp + (a * kvh + g) * hd;
    float* __restrict gvg = gvp + (a * kvh + g) * hd;
    std::vector<float> p(static_cast<size_t>(n));
    float qi[256], di[256], gqi[256];
    for (int64_t hh = g * rep; hh < (g + 1) * rep; ++hh) {
      for (int64_t i = 0; i < n; ++i) {
        const int64_t row = ((a + i) * h + hh) * hd;
        std::memcpy(qi, qp + row, hd * sizeof(float));
        std::memcpy(di, dp + row, hd * sizeof(float));
        float dsum = 0.0f;
        for (int64_t d = 0; d < hd; ++d) dsum += di[d] * op[row + d];
        float m = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          const float* kj = kg + j * kstride;
          float s = 0.0f;
          for (int64_t d = 0; d < hd; ++d) s += qi[d] * kj[d];
          p[j] = s * scale;
          m = std::max(m, p[j]);
        }
        float z = 0.0f;
        for (int64_t j = 0; j <= i; ++j) z += (p[j] = std::exp(p[j] - m));
        const float inv_z = 1.0f / z;
        std::fill(gqi, gqi + hd, 0.0f);
        for (int64_t j = 0; j <= i; ++j) {
          const float* kj = kg + j * kstride;
          const float* vj = vg + j * kstride;
          float* gkj = gkg + j * kstride;
          float* gvj = gvg + j * kstride;
          const float pj = p[j] * inv_z;
          float dpj = 0.0f;
          for (int64_t d = 0; d < hd; ++d) dpj += di[d] * vj[d];
          const float ds = pj * (dpj - dsum) * scale;
          for (int64_t d = 0; d < hd; ++d) {
            gqi[d] += ds * kj[d];
            gkj[d] += ds * qi[d];
            gvj[d] += pj * di[d];
          }
        }
        std::memcpy(gqp + row, gqi, hd * sizeof(float));
      }
    }
  };
  {
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(g_mu);
    const int64_t items = nb * kvh;
    if (Pool() == nullptr) {
      for (int64_t i = 0; i < items; ++i) task(i);
    } else {
      Pool()->Run(items, [&](int, int64_t i) { task(i); });
    }
  }
  return py::make_tuple(gq, gk, gv);
}

// The sampler's scoring distribution (engine/sampler.h): log-softmax of logits / T over the full
// vocabulary; T == 0 (greedy) scores at T == 1, and so does a scale that overflows.
F32 LogSoftmax(const F32& x, float temperature) {
  RequireDims(x, 2, "logits");
  Require(std::isfinite(temperature) && temperature >= 0, "temperature must be finite and >= 0");
  const int64_t m = x.shape(0), v = x.shape(1);
  Require(v >= 1, "log_softmax: empty vocabulary");
  F32 y({m, v});
  const float* xp = x.data();
  float* yp = y.mutable_data();
  py::gil_scoped_release release;
  std::lock_guard<std::mutex> lock(g_mu);
  ForRows(m, [&](int64_t r) {
    const float* row = xp + r * v;
    float* out = yp + r * v;
    if (temperature > 0.0f) {
      for (int64_t i = 0; i < v; ++i) out[i] = row[i] / temperature;
      if (std::isfinite(k::MaxValue(g_isa, out, v))) {
        k::LogSoftmax(g_isa, out, v, out);
        return;
      }
    }
    k::LogSoftmax(g_isa, row, v, out);
  });
  return y;
}

void SetNumThreads(int n) {
  Require(n >= 1, "threads must be >= 1");
  g_pool = n == 1 ? nullptr : std::make_unique<k::ThreadPool>(n);
}

int NumThreads() {
  return g_pool == nullptr ? 1 : g_pool->size();
}

void SetIsa(const std::string& name) {
  auto isa = k::ParseIsa(name);
  if (!isa.ok()) throw std::invalid_argument(isa.status().ToString());
  g_isa = *isa;
}

}  // namespace

PYBIND11_MODULE(bitroll_kernels_ext, m) {
  m.doc() = "bitroll's CPU kernels on float32 numpy arrays (bitwise equal to the engine)";
  m.def("linear", &Linear, py::arg("x"), py::arg("weight"), py::arg("bias") = py::none());
  m.def("rms_norm", &RmsNorm, py::arg("x"), py::arg("weight"), py::arg("eps"));
  m.def("rope", &Rope, py::arg("x"), py::arg("positions"), py::arg("theta"),
        py::arg("interleaved"));
  m.def("swiglu", &SwiGlu, py::arg("gate"), py::arg("up"));
  m.def("attention", &Attention, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("cu_seqlens"),
        py::arg("scale"));
  m.def("attention_backward", &AttentionBackward, py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("out"), py::arg("grad"), py::arg("cu_seqlens"), py::arg("scale"));
  m.def("log_softmax", &LogSoftmax, py::arg("logits"), py::arg("temperature"));
  m.def("set_num_threads", &SetNumThreads, py::arg("n"));
  m.def("num_threads", &NumThreads);
  m.def("set_isa", &SetIsa, py::arg("name"));
  m.def("isa", [] { return std::string(k::IsaName(g_isa)); });
  bitroll_ext::AddMoe(m, &g_isa);
  bitroll_ext::AddRope(m, &g_isa);
}
