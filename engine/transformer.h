// engine/transformer.h: the Llama-family forward pass over a flat batch of tokens.
//
// A batch is a list of rows; each row is one token of some sequence at an absolute position, with
// that sequence's block table. Rows from many sequences, prefill chunks and decode tokens mix
// freely. Each row's K/V is written to the KV cache before attention reads it, so a prefill chunk
// sees its own earlier tokens.
//
// Invariance: every row's hidden state, K/V and logits are a pure function of the row's own token,
// position and the K/V of its sequence's earlier positions. Matmuls reduce each output in one fixed
// order; attention uses the canonical chunk order; row ops reduce in lane order. Batch size,
// batch composition, row order, thread count, ISA and attention kernel never change a bit.
//
// Shapes (llama2.c / HF conventions, per row):
//   x    [dim]                      residual stream
//   qkv  [q_dim + 2 * kv_dim]       q | k | v from one fused matmul (q_dim = n_heads * head_dim;
//                                   Qwen3: RMSNorm over each q and k head before RoPE)
//   att  [q_dim]
//   h13  [2 * hidden]               w1 (gate) | w3 (up) from one fused matmul
//   hb   [hidden]                   SwiGLU(gate, up)
//   logits [vocab]                  only for rows that ask for them
// Mixture-of-experts models replace the SwiGLU FFN by engine/moe.h's batch-invariant MoeFfn.
// RoPE tables: engine/rope_scaling.h (Llama 3 scaling).
//
// This is the CPU ForwardBackend (engine/forward_backend.h): K/V live in the KvCache's host pages.
// Fingerprint backend: "cpu" (fp32 weight storage) or "cpu-bf16", plus "-kvbf16" with a bf16 KV
// cache (TransformerOptions::kv_storage).
//
// Thread-safety: not thread-safe (scratch buffers); one per engine.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/forward_backend.h"
#include "engine/kv_cache.h"
#include "engine/model_weights.h"
#include "engine/moe.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"
#include "schema/status.h"

namespace bitroll::engine {

struct TransformerOptions {
  kernels::Isa isa = kernels::Isa::kScalar;
  kernels::AttentionKernel attention = kernels::AttentionKernel::kAuto;
  kernels::ThreadPool* pool = nullptr;  // not owned; nullptr runs on the calling thread
  // Weight storage for the matmuls. kBF16 halves the bytes per token; from fp32 weights it rounds
  // them, which changes the model (and its fingerprint).
  kernels::DType weight_storage = kernels::DType::kF32;
  // KV cache element type: kF32, or kBF16 (K/V rounded to bf16 when written: half the attention
  // traffic at long contexts, a different fingerprint). The KvCache must have this dtype.
  kernels::DType kv_storage = kernels::DType::kF32;
  // Test seam: replaces kernels::Matmul. The invariance suite's negative control plugs a
  // deliberately batch-variant matmul in here to show the suite catches it. nullptr in production.
  void (*matmul_override)(kernels::Isa, const kernels::MatmulParams&,
                          kernels::ThreadPool*) = nullptr;
  // Test seam: replaces kernels::Matmul for the routed experts of a MoE model only
  // (engine/moe.h); the negative control plugs in a matmul whose reduction depends on how many
  // tokens an expert gets. nullptr in production.
  void (*expert_matmul_override)(kernels::Isa, const kernels::MatmulParams&,
                                 kernels::ThreadPool*) = nullptr;
  // Audit seam (`bitroll audit --trace-layers`, rollout/audit_trace.h): when set, called after
  // each stage of the forward pass for every row at position trace_position, with that row's
  // fp32 output of the stage: layer -1 "embed"; per layer "attn_norm", "qkv" (after RoPE), "attn"
  // (before wo), "attn_out", "resid_attn", "ffn_norm", "mlp_act", "mlp_out", "resid_mlp"; layer
  // n_layers "final_norm" and "logits" (rows that want logits). A reader changes no bit; a test may
  // change the values (a deliberately perturbed kernel; a change to "qkv" reaches only the trace:
  // q and K/V are taken before it). Unset in production.
  // Test seam (BITROLL_TEST_BREAK_INVARIANCE=window_chunk): the sliding window's lower edge is
  // anchored at the first row of each sequence's run in the call (the prefill chunk's start)
  // instead of each query's own position, a mask that depends on chunking. false in production.
  bool test_break_window_chunk = false;
  // Test seam (BITROLL_TEST_BREAK_INVARIANCE=sibling_tile): AttentionParams::
  // test_fused_sibling_tile on every layer. false in production.
  bool test_break_sibling_tile = false;
  int32_t trace_position = -1;
  std::function<void(int32_t layer, const char* op, float* data, int64_t n)> trace;
};

class Transformer final : public ForwardBackend {
 public:
  // Packs the weights for the kernels. `weights` must outlive the Transformer (norm vectors and the
  // embedding table are read in place).
  static Result<std::unique_ptr<Transformer>> Create(std::shared_ptr<const ModelWeights> weights,
                                                     const TransformerOptions& options);

  std::string fingerprint_backend() const override {
    std::string b = opt_.weight_storage == kernels::DType::kBF16 ? "cpu-bf16" : "cpu";
    if (opt_.kv_storage == kernels::DType::kBF16) b += "-kvbf16";
    return b;
  }
  // kInvalidArgument when the cache's element type is not options().kv_storage.
  Status AttachKvCache(const KvCache& cache) override;
  const ModelConfig& config() const override { return w_->config; }
  const ModelWeights& weights() const { return *w_; }
  const TransformerOptions& options() const { return opt_; }
  void set_attention_kernel(kernels::AttentionKernel k) override { opt_.attention = k; }
  const int32_t* route_ids() const override { return moe_ ? route_ids_.data() : nullptr; }
  const float* route_weights() const override { return moe_ ? route_weights_.data() : nullptr; }
  // Transformer::Create(weights, options()).
  Result<std::unique_ptr<ForwardBackend>> WithWeights(
      std::shared_ptr<const ModelWeights> weights) const override;

  // Runs `rows` through the model. Writes each row's K/V into `cache`, then the logits of the rows
  // with want_logits, in row order, to `logits` ([count][vocab]).
  // REQUIRES: the block tables cover every position; earlier positions of each sequence are cached.
  // Errors: kOutOfRange for a token id outside the vocabulary or a position past max_seq_len.
  Status Forward(std::span<const ForwardRow> rows, KvCache* cache, float* logits) override;

 private:
  struct Layer {  // matrices are set once by Create()
    std::optional<kernels::PackedMatrix> wqkv;
    std::optional<kernels::PackedMatrix> wo;
    std::optional<kernels::PackedMatrix> w13;
    std::optional<kernels::PackedMatrix> w2;
    std::vector<float> bqkv;            // empty unless the model has q/k/v biases
    std::vector<float> q_norm, k_norm;  // [head_dim]; empty unless the model has QK-norm
    std::vector<float> attn_norm;
    std::vector<float> ffn_norm;
    int32_t window = 0;        // sliding window (0 = full attention)
    std::vector<float> sinks;  // [n_heads]; empty unless the model has attention sinks
  };

  Transformer() = default;
  void EnsureScratch(int64_t rows);
  void RowOp(int64_t rows, const std::function<void(int64_t)>& fn);
  // Stores layer l's K/V of rows [0, n) (from qkv_, after RoPE) into `cache`, split over the pool
  // by kv head (see KvCache::Write).
  void WriteKv(int32_t l, std::span<const ForwardRow> rows, KvCache* cache);
  void RunMatmul(const kernels::MatmulParams& p);

  std::shared_ptr<const ModelWeights> w_;
  TransformerOptions opt_;
  std::vector<Layer> layers_;
  std::optional<kernels::PackedMatrix> classifier_;
  std::vector<float> final_norm_;
  std::unique_ptr<MoeFfn> moe_;  // set for mixture-of-experts models
  std::vector<float> rope_cos_;  // [max_seq_len][head_dim / 2]
  std::vector<float> rope_sin_;
  kernels::AttentionScratch attn_scratch_;

  // Scratch, grown to the largest batch seen.
  int64_t capacity_ = 0;
  std::vector<float> x_, xb_, qkv_, q_, att_, tmp_, h13_, hb_;
  std::vector<int32_t> positions_;
  std::vector<int32_t> window_anchor_;  // test_break_window_chunk only
  std::vector<int32_t> route_ids_;      // MoE: [rows][n_layers][k] of the last Forward
  std::vector<float> route_weights_;
  std::vector<const int32_t*> tables_;
  std::vector<const int32_t*> sliding_tables_;
};

// Converts a weight tensor of any supported dtype to fp32 (norm vectors, embedding rows).
void TensorRowToF32(const Tensor& t, int64_t row, int64_t row_len, float* out);

}  // namespace bitroll::engine
