#include "engine/transformer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "engine/rope_scaling.h"
#include "kernels/cpu/math.h"
#include "kernels/cpu/ops.h"

namespace bitroll::engine {

namespace {

using kernels::MatrixPart;
using kernels::PackedMatrix;

constexpr int64_t kRowsPerTask = 8;  // row ops: rows per thread-pool task

Result<MatrixPart> PartOf(const Tensor& t, int64_t rows, int64_t cols, const char* what) {
  if (t.data == nullptr) return Status::InvalidArgument(std::string("missing weight ") + what);
  int64_t n = 1;
  for (int64_t s : t.shape) n *= s;
  if (n != rows * cols) {
    return Status::InvalidArgument(std::string("weight ") + what + " has " + std::to_string(n) +
                                   " elements, expected " + std::to_string(rows) + " x " +
                                   std::to_string(cols));
  }
  return MatrixPart{t.data, t.dtype, rows};
}

std::vector<float> VectorOf(const Tensor& t, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  TensorRowToF32(t, 0, n, v.data());
  return v;
}

}  // namespace

void TensorRowToF32(const Tensor& t, int64_t row, int64_t row_len, float* out) {
  const int64_t off = row * row_len;
  switch (t.dtype) {
    case kernels::DType::kF32:
      std::memcpy(out, static_cast<const float*>(t.data) + off, row_len * sizeof(float));
      return;
    case kernels::DType::kBF16: {
      const uint16_t* s = static_cast<const uint16_t*>(t.data) + off;
      for (int64_t i = 0; i < row_len; ++i) out[i] = kernels::Bf16ToF32(s[i]);
      return;
    }
    case kernels::DType::kF16: {
      const uint16_t* s = static_cast<const uint16_t*>(t.data) + off;
      for (int64_t i = 0; i < row_len; ++i) out[i] = kernels::F16ToF32(s[i]);
      return;
    }
  }
}

Result<std::unique_ptr<Transformer>> Transformer::Create(
    std::shared_ptr<const ModelWeights> weights, const TransformerOptions& options) {
  if (weights == nullptr) return Status::InvalidArgument("transformer: no weights");
  const ModelConfig& c = weights->config;
  BR_RETURN_IF_ERROR(c.Validate());
  if (c.head_dim() > 256) return Status::Unsupported("transformer: head_dim over 256");
  std::unique_ptr<Transformer> t(new Transformer());
  t->w_ = std::move(weights);
  t->opt_ = options;
  const ModelWeights& w = *t->w_;
  const int64_t dim = c.dim, kv = c.kv_dim(), hidden = c.hidden_dim, qd = c.q_dim();
  if (c.is_moe()) {
    BR_ASSIGN_OR_RETURN(t->moe_, MoeFfn::Create(w, options.weight_storage));
  }
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const LayerWeights& lw = w.layers[l];
    Layer layer;
    BR_ASSIGN_OR_RETURN(MatrixPart q, PartOf(lw.wq, qd, dim, "wq"));
    BR_ASSIGN_OR_RETURN(MatrixPart k, PartOf(lw.wk, kv, dim, "wk"));
    BR_ASSIGN_OR_RETURN(MatrixPart v, PartOf(lw.wv, kv, dim, "wv"));
    const MatrixPart qkv[] = {q, k, v};
    BR_ASSIGN_OR_RETURN(layer.wqkv, PackedMatrix::Pack(qkv, dim, options.weight_storage));
    BR_ASSIGN_OR_RETURN(MatrixPart o, PartOf(lw.wo, dim, qd, "wo"));
    BR_ASSIGN_OR_RETURN(layer.wo, PackedMatrix::Pack({&o, 1}, qd, options.weight_storage));
    if (!c.is_moe()) {
      BR_ASSIGN_OR_RETURN(MatrixPart w1, PartOf(lw.w1, hidden, dim, "w1"));
      BR_ASSIGN_OR_RETURN(MatrixPart w3, PartOf(lw.w3, hidden, dim, "w3"));
      const MatrixPart w13[] = {w1, w3};
      BR_ASSIGN_OR_RETURN(layer.w13, PackedMatrix::Pack(w13, dim, options.weight_storage));
      BR_ASSIGN_OR_RETURN(MatrixPart w2, PartOf(lw.w2, dim, hidden, "w2"));
      BR_ASSIGN_OR_RETURN(layer.w2, PackedMatrix::Pack({&w2, 1}, hidden, options.weight_storage));
    }
    if (lw.bq.data != nullptr) {
      layer.bqkv.resize(static_cast<size_t>(qd + 2 * kv));
      TensorRowToF32(lw.bq, 0, qd, layer.bqkv.data());
      TensorRowToF32(lw.bk, 0, kv, layer.bqkv.data() + qd);
      TensorRowToF32(lw.bv, 0, kv, layer.bqkv.data() + qd + kv);
    }
    if (c.qk_norm) {
      if (lw.q_norm.data == nullptr || lw.k_norm.data == nullptr) {
        return Status::InvalidArgument("missing weight q_norm / k_norm");
      }
      layer.q_norm = VectorOf(lw.q_norm, c.head_dim());
      layer.k_norm = VectorOf(lw.k_norm, c.head_dim());
    }
    layer.window = c.window(static_cast<int32_t>(l));
    if (c.attn_sinks) {
      if (lw.sinks.data == nullptr || lw.sinks.numel() != c.n_heads) {
        return Status::InvalidArgument("attention sinks of layer " + std::to_string(l) +
                                       " must have n_heads = " + std::to_string(c.n_heads) +
                                       " entries");
      }
      layer.sinks = VectorOf(lw.sinks, c.n_heads);
      for (float s : layer.sinks) {
        if (!std::isfinite(s)) return Status::InvalidArgument("attention sink not finite");
      }
    }
    layer.attn_norm = VectorOf(lw.attn_norm, dim);
    layer.ffn_norm = VectorOf(lw.ffn_norm, dim);
    t->layers_.push_back(std::move(layer));
  }
  BR_ASSIGN_OR_RETURN(MatrixPart cls, PartOf(w.classifier, c.vocab_size, dim, "classifier"));
  BR_ASSIGN_OR_RETURN(t->classifier_, PackedMatrix::Pack({&cls, 1}, dim, options.weight_storage));
  t->final_norm_ = VectorOf(w.final_norm, dim);
  const int64_t half = c.head_dim() / 2;
  t->rope_cos_.resize(static_cast<size_t>(c.max_seq_len * half));
  t->rope_sin_.resize(static_cast<size_t>(c.max_seq_len * half));
  ModelRopeTables(c, t->rope_cos_.data(), t->rope_sin_.data());
  return t;
}

Result<std::unique_ptr<ForwardBackend>> Transformer::WithWeights(
    std::shared_ptr<const ModelWeights> weights) const {
  BR_ASSIGN_OR_RETURN(std::unique_ptr<Transformer> t, Create(std::move(weights), opt_));
  return std::unique_ptr<ForwardBackend>(std::move(t));
}

Status Transformer::AttachKvCache(const KvCache& cache) {
  if (cache.options().dtype != opt_.kv_storage) {
    return Status::InvalidArgument(
        "transformer: the KV cache's element type differs from kv_storage");
  }
  return Status::Ok();
}

void Transformer::EnsureScratch(int64_t rows) {
  if (rows <= capacity_) return;
  const ModelConfig& c = w_->config;
  const int64_t dim = c.dim, kv = c.kv_dim(), hidden = c.hidden_dim, qd = c.q_dim();
  capacity_ = rows;
  x_.resize(rows * dim);
  xb_.resize(rows * dim);
  qkv_.resize(rows * (qd + 2 * kv));
  q_.resize(rows * qd);
  att_.resize(rows * qd);
  tmp_.resize(rows * dim);
  h13_.resize(rows * 2 * hidden);
  hb_.resize(rows * hidden);
  positions_.resize(rows);
  window_anchor_.resize(rows);
  route_ids_.resize(rows * c.n_layers * c.n_experts_per_tok);
  route_weights_.resize(rows * c.n_layers * c.n_experts_per_tok);
  tables_.resize(rows);
  sliding_tables_.resize(rows);
}

void Transformer::RunMatmul(const kernels::MatmulParams& p) {
  if (opt_.matmul_override != nullptr) {
    opt_.matmul_override(opt_.isa, p, opt_.pool);
  } else {
    kernels::Matmul(opt_.isa, p, opt_.pool);
  }
}

// Row ops never reduce across rows, so splitting rows over threads cannot change a bit.
void Transformer::RowOp(int64_t rows, const std::function<void(int64_t)>& fn) {
  if (opt_.pool == nullptr || opt_.pool->size() == 1 || rows < 2 * kRowsPerTask) {
    for (int64_t r = 0; r < rows; ++r) fn(r);
    return;
  }
  const int64_t tasks = (rows + kRowsPerTask - 1) / kRowsPerTask;
  opt_.pool->Run(tasks, [&](int, int64_t task) {
    const int64_t end = std::min(rows, (task + 1) * kRowsPerTask);
    for (int64_t r = task * kRowsPerTask; r < end; ++r) fn(r);
  });
}

void Transformer::WriteKv(int32_t l, std::span<const ForwardRow> rows, KvCache* cache) {
  const ModelConfig& c = w_->config;
  const int64_t n = static_cast<int64_t>(rows.size());
  const int64_t qd = c.q_dim(), kv = c.kv_dim(), qkv_dim = qd + 2 * kv;
  const int32_t bs = cache->block_size();
  const bool sliding_pool = cache->pool_of(l) == KvPool::kSliding;
  auto write = [&](int64_t r, int32_t head0, int32_t heads) {
    const float* row = qkv_.data() + r * qkv_dim;
    const int64_t pos = rows[r].position;
    const int32_t slot = static_cast<int32_t>(pos % bs);
    if (sliding_pool) {
      cache->Write(l, rows[r].sliding_table[pos / bs], slot, row + qd, row + qd + kv, head0, heads);
    } else if (rows[r].write_full_kv) {
      cache->Write(l, rows[r].block_table[pos / bs], slot, row + qd, row + qd + kv, head0, heads);
    }
  };
  // A row writes one float into each of a head's head_dim K lines of its block, and the rows of
  // one block share those lines: rows split over threads (as RowOp splits them) would pass every
  // line back and forth between the cores. Tasks by kv head write disjoint lines, and a task's
  // rows revisit the same lines of each block while they are still in L1.
  if (opt_.pool == nullptr || opt_.pool->size() == 1 || n < 2 * kRowsPerTask) {
    for (int64_t r = 0; r < n; ++r) write(r, 0, c.n_kv_heads);
    return;
  }
  opt_.pool->Run(c.n_kv_heads, [&](int, int64_t h) {
    for (int64_t r = 0; r < n; ++r) write(r, static_cast<int32_t>(h), 1);
  });
}

Status Transformer::Forward(std::span<const ForwardRow> rows, KvCache* cache, float* logits) {
  const ModelConfig& c = w_->config;
  const int64_t n = static_cast<int64_t>(rows.size());
  if (n == 0) return Status::Ok();
  for (const ForwardRow& r : rows) {
    BR_RETURN_IF_ERROR(CheckForwardRow(r, c));
  }
  EnsureScratch(n);
  const kernels::Isa isa = opt_.isa;
  const int64_t dim = c.dim, kv = c.kv_dim(), hidden = c.hidden_dim, hd = c.head_dim();
  const int64_t qd = c.q_dim(), qkv_dim = qd + 2 * kv, half = hd / 2;
  const int32_t bs = cache->block_size();
  for (int64_t r = 0; r < n; ++r) {
    TensorRowToF32(w_->token_embedding, rows[r].token, dim, x_.data() + r * dim);
    positions_[r] = rows[r].position;
    tables_[r] = rows[r].block_table;
    sliding_tables_[r] = rows[r].sliding_table;
    const bool run =
        r > 0 && tables_[r - 1] == tables_[r] && positions_[r - 1] + 1 == positions_[r];
    window_anchor_[r] = run ? window_anchor_[r - 1] : positions_[r];
  }
  // The audit seam (TransformerOptions::trace): `stride` floats per row, the first `width` traced.
  auto trace = [&](int32_t layer, const char* op, float* buf, int64_t stride, int64_t width) {
    if (!opt_.trace) return;
    for (int64_t r = 0; r < n; ++r) {
      if (rows[r].position == opt_.trace_position) opt_.trace(layer, op, buf + r * stride, width);
    }
  };
  trace(-1, "embed", x_.data(), dim, dim);
  auto matmul = [&](const float* x, int64_t ldx, const PackedMatrix& w, const float* bias, float* y,
                    int64_t ldy) {
    kernels::MatmulParams p;
    p.x = x;
    p.m = n;
    p.ldx = ldx;
    p.w = &w;
    p.bias = bias;
    p.y = y;
    p.ldy = ldy;
    RunMatmul(p);
  };

  for (int32_t l = 0; l < c.n_layers; ++l) {
    Layer& L = layers_[l];
    // A split cache keeps sliding layers in their own pool, read through the sliding tables.
    const bool sliding_pool = cache->pool_of(l) == KvPool::kSliding;
    // attention block
    RowOp(n, [&](int64_t r) {
      kernels::RmsNorm(isa, x_.data() + r * dim, L.attn_norm.data(), dim, c.norm_eps,
                       xb_.data() + r * dim);
    });
    trace(l, "attn_norm", xb_.data(), dim, dim);
    matmul(xb_.data(), dim, *L.wqkv, L.bqkv.empty() ? nullptr : L.bqkv.data(), qkv_.data(),
           qkv_dim);
    RowOp(n, [&](int64_t r) {
      float* row = qkv_.data() + r * qkv_dim;
      const int64_t pos = rows[r].position;
      const float* cs = rope_cos_.data() + pos * half;
      const float* sn = rope_sin_.data() + pos * half;
      if (!L.q_norm.empty()) {  // Qwen3 QK-norm: per head, before RoPE
        for (int64_t h = 0; h < c.n_heads; ++h) {
          kernels::RmsNorm(isa, row + h * hd, L.q_norm.data(), hd, c.norm_eps, row + h * hd);
        }
        for (int64_t h = 0; h < c.n_kv_heads; ++h) {
          float* k = row + qd + h * hd;
          kernels::RmsNorm(isa, k, L.k_norm.data(), hd, c.norm_eps, k);
        }
      }
      kernels::Rope(isa, row, c.n_heads, hd, cs, sn, c.rope_layout);          // q
      kernels::Rope(isa, row + qd, c.n_kv_heads, hd, cs, sn, c.rope_layout);  // k
      std::memcpy(q_.data() + r * qd, row, qd * sizeof(float));
    });
    WriteKv(l, rows, cache);
    kernels::AttentionParams ap;
    ap.n_tokens = static_cast<int32_t>(n);
    ap.n_heads = c.n_heads;
    ap.n_kv_heads = c.n_kv_heads;
    ap.head_dim = static_cast<int32_t>(hd);
    ap.block_size = bs;
    ap.q = q_.data();
    ap.out = att_.data();
    ap.k_cache = cache->k_layer(l);
    ap.v_cache = cache->v_layer(l);
    ap.kv_dtype = cache->options().dtype;
    ap.positions = positions_.data();
    ap.block_tables = sliding_pool ? sliding_tables_.data() : tables_.data();
    ap.scale = 1.0f / std::sqrt(static_cast<float>(hd));
    ap.window = L.window;
    ap.sinks = L.sinks.empty() ? nullptr : L.sinks.data();
    if (opt_.test_break_window_chunk) ap.test_window_anchor = window_anchor_.data();
    ap.test_fused_sibling_tile = opt_.test_break_sibling_tile;
    trace(l, "qkv", qkv_.data(), qkv_dim, qkv_dim);
    kernels::Attention(isa, ap, opt_.attention, opt_.pool, &attn_scratch_);
    trace(l, "attn", att_.data(), qd, qd);
    matmul(att_.data(), qd, *L.wo, nullptr, tmp_.data(), dim);
    trace(l, "attn_out", tmp_.data(), dim, dim);
    RowOp(n,
          [&](int64_t r) { kernels::Add(isa, x_.data() + r * dim, tmp_.data() + r * dim, dim); });
    trace(l, "resid_attn", x_.data(), dim, dim);
    // feed-forward block
    RowOp(n, [&](int64_t r) {
      kernels::RmsNorm(isa, x_.data() + r * dim, L.ffn_norm.data(), dim, c.norm_eps,
                       xb_.data() + r * dim);
    });
    trace(l, "ffn_norm", xb_.data(), dim, dim);
    if (moe_ != nullptr) {
      MoeRunOptions mo{isa, opt_.pool, opt_.matmul_override, opt_.expert_matmul_override};
      if (mo.expert_matmul == nullptr) mo.expert_matmul = opt_.matmul_override;
      const int64_t k = c.n_experts_per_tok;
      moe_->Forward(mo, l, xb_.data(), n, tmp_.data(), route_ids_.data() + l * k,
                    route_weights_.data() + l * k, c.n_layers * k);
    } else {
      matmul(xb_.data(), dim, *L.w13, nullptr, h13_.data(), 2 * hidden);
      RowOp(n, [&](int64_t r) {
        const float* g = h13_.data() + r * 2 * hidden;
        kernels::SwiGlu(isa, g, g + hidden, hidden, hb_.data() + r * hidden);
      });
      trace(l, "mlp_act", hb_.data(), hidden, hidden);
      matmul(hb_.data(), hidden, *L.w2, nullptr, tmp_.data(), dim);
    }
    trace(l, "mlp_out", tmp_.data(), dim, dim);
    RowOp(n,
          [&](int64_t r) { kernels::Add(isa, x_.data() + r * dim, tmp_.data() + r * dim, dim); });
    trace(l, "resid_mlp", x_.data(), dim, dim);
  }

  // Logits for the rows that want them, gathered densely.
  int64_t m = 0;
  for (int64_t r = 0; r < n; ++r) {
    if (!rows[r].want_logits) continue;
    kernels::RmsNorm(isa, x_.data() + r * dim, final_norm_.data(), dim, c.norm_eps,
                     xb_.data() + m * dim);
    ++m;
  }
  if (m > 0) {
    kernels::MatmulParams p;
    p.x = xb_.data();
    p.m = m;
    p.ldx = dim;
    p.w = &*classifier_;
    p.y = logits;
    p.ldy = c.vocab_size;
    RunMatmul(p);
  }
  if (opt_.trace) {
    for (int64_t r = 0, k = 0; r < n; ++r) {
      if (!rows[r].want_logits) continue;
      if (rows[r].position == opt_.trace_position) {
        opt_.trace(c.n_layers, "final_norm", xb_.data() + k * dim, dim);
        opt_.trace(c.n_layers, "logits", logits + k * c.vocab_size, c.vocab_size);
      }
      ++k;
    }
  }
  return Status::Ok();
}

}  // namespace bitroll::engine
