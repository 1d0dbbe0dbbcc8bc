// engine/forward_backend.h: the seam between the engine and the forward pass.
//
// The engine (engine/cpu_engine.h) keeps the scheduling, the prefix cache, the KV block
// accounting (engine/kv_cache.h) and the sampling on the host; a ForwardBackend only turns a flat
// batch of rows into logits and keeps the K/V bytes of the blocks the KvCache hands out:
//   - engine::Transformer (engine/transformer.h): the CPU forward pass; K/V in the KvCache's own
//     host pages (kv_store() == nullptr).
//   - engine::cuda::CudaTransformer (engine/cuda/cuda_transformer.h, CUDA builds only): weights
//     and a device KV pool indexed by the same block ids; the KvCache forwards CopyBlock /
//     ExportBlock / ImportBlock to the backend's KvBlockStore and its host pages stay untouched.
//
// Contract: Forward() writes each row's K/V into the block `row.block_table[position /
// block_size]` at slot `position % block_size` of the backend's KV storage before attention reads
// it, and writes the logits of the rows with want_logits, densely in row order, to host memory.
// Every backend keeps the invariance promise of engine/engine.h within its own numerics
// fingerprint (fingerprint_backend()); two backends are two fingerprints.
//
// Thread-safety: not thread-safe; one per engine, called by the engine's owner thread.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "engine/engine.h"
#include "engine/kv_cache.h"
#include "engine/model_weights.h"
#include "kernels/cpu/attention.h"  // kernels::AttentionKernel
#include "schema/status.h"

namespace bitroll::engine {

struct ForwardRow {
  int32_t token = 0;
  int32_t position = 0;
  const int32_t* block_table = nullptr;  // the row's sequence; covers position
  bool want_logits = false;
  // A cache with a sliding pool (KvCache::split()): the sequence's sliding block table, whose
  // entries for blocks inside any sliding layer's window of `position` are valid (-1 elsewhere).
  const int32_t* sliding_table = nullptr;
  // false: the full-attention layers' K/V of this row are already in the cache (the row rebuilds
  // sliding-window state, docs/design.md "SWA prefix-cache policies"): they read, never write.
  bool write_full_kv = true;
};

// The row checks every backend's Forward applies before any work: kOutOfRange for a token id
// outside the vocabulary or a position past max_seq_len.
inline Status CheckForwardRow(const ForwardRow& r, const ModelConfig& c) {
  if (r.token < 0 || r.token >= c.vocab_size) {
    return Status::OutOfRange("token id " + std::to_string(r.token) +
                              " outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
  }
  if (r.position < 0 || r.position >= c.max_seq_len) {
    return Status::OutOfRange("position " + std::to_string(r.position) +
                              " outside the context [0, " + std::to_string(c.max_seq_len) + ")");
  }
  return Status::Ok();
}

class ForwardBackend {
 public:
  virtual ~ForwardBackend() = default;

  // The backend string of the numerics fingerprint: "cpu", "cpu-bf16", "cuda".
  virtual std::string fingerprint_backend() const = 0;
  virtual const ModelConfig& config() const = 0;

  // Runs `rows` through the model. Writes each row's K/V (see the contract above), then the
  // logits of the rows with want_logits, in row order, to host `logits` ([count][vocab]).
  // REQUIRES: the block tables cover every position; earlier positions of each sequence are
  // cached. Errors: kOutOfRange for a token id outside the vocabulary or a position past
  // max_seq_len; backend failures (kInternal, kUnavailable) for device errors.
  virtual Status Forward(std::span<const ForwardRow> rows, KvCache* cache, float* logits) = 0;

  // Mixture-of-experts backends: the routes of the last Forward's rows, [rows][n_layers][k]
  // expert ids and fp32 weights in slot order (engine/moe.h); nullptr for dense models.
  virtual const int32_t* route_ids() const { return nullptr; }
  virtual const float* route_weights() const { return nullptr; }

  // Forces an attention kernel (tests); kAuto chooses by load. Never changes a bit.
  virtual void set_attention_kernel(kernels::AttentionKernel k) = 0;

  // Called once by the engine with its KvCache (before the first Forward): a backend that keeps
  // K/V itself allocates storage for cache.num_blocks() blocks here. Errors: kResourceExhausted,
  // device errors. The CPU Transformer needs nothing.
  virtual Status AttachKvCache(const KvCache& cache) {
    (void)cache;
    return Status::Ok();
  }
  // Where the K/V bytes live: nullptr = the KvCache's host pages; otherwise the store the
  // KvCache forwards its block copies to (KvCache::set_store). Owned by the backend.
  virtual KvBlockStore* kv_store() { return nullptr; }

  // A backend of the same kind and options over other weights of the same shape (UpdateWeights).
  virtual Result<std::unique_ptr<ForwardBackend>> WithWeights(
      std::shared_ptr<const ModelWeights> weights) const = 0;
};

// Device selection (engine/forward_backend.cc, which knows whether this build has CUDA).
// CheckDevice: Ok for "cpu"; for "cuda" Ok when a usable GPU is present, else kUnsupported "this
// build has no CUDA" or kUnavailable "no CUDA device: ..."; kInvalidArgument for any other name.
// MakeDeviceBackend: nullptr for "cpu" (the engine builds its CPU Transformer), the CUDA
// backend over `weights` for "cuda" (options.attention applies), or CheckDevice's error.
Status CheckDevice(const std::string& device);
Result<std::unique_ptr<ForwardBackend>> MakeDeviceBackend(
    const EngineOptions& options, std::shared_ptr<const ModelWeights> weights);

}  // namespace bitroll::engine
