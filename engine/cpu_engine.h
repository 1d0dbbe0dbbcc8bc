// engine/cpu_engine.h: the CPU implementation of engine::Engine.
//
// One CpuEngine is one replica: a forward backend (engine/forward_backend.h: the CPU Transformer by
// default, or a device backend such as engine/cuda/cuda_transformer.h), a KV cache (its block
// accounting; the K/V bytes live where the backend keeps them), a scheduler, a prefix cache, a
// sampler and a thread pool. Scheduling, prefix caching, block accounting and sampling run on the
// host for every backend; only the forward pass is the backend's. See engine.h for the API
// contract and the invariance promise.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/forward_backend.h"
#include "engine/kv_cache.h"
#include "engine/kv_disk_tier.h"
#include "engine/prefix_cache.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/sequence.h"
#include "engine/tokenizer.h"
#include "engine/transformer.h"
#include "kernels/cpu/thread_pool.h"

namespace bitroll::engine {

// Everything needed to build an engine from weights already in memory (tests, benchmarks).
struct CpuEngineParts {
  std::shared_ptr<const ModelWeights> weights;
  std::unique_ptr<Tokenizer> tokenizer;  // may be null
  EngineOptions options;
  // Matmul weight storage; kBF16 is a different numerics fingerprint ("cpu-bf16").
  kernels::DType weight_storage = kernels::DType::kF32;
  // Test seam (see TransformerOptions::matmul_override); nullptr in production.
  void (*matmul_override)(kernels::Isa, const kernels::MatmulParams&,
                          kernels::ThreadPool*) = nullptr;
  // A ready forward backend over `weights` (e.g. the CUDA one); null builds the CPU Transformer
  // from weight_storage / matmul_override. With a backend that stores K/V itself
  // (kv_store() != nullptr) the disk tier is refused (kUnsupported).
  std::unique_ptr<ForwardBackend> backend;
  // Audit seam for the CPU Transformer (see TransformerOptions::trace); unset in production.
  int32_t trace_position = -1;
  std::function<void(int32_t layer, const char* op, float* data, int64_t n)> trace;
};

class CpuEngine final : public Engine {
 public:
  static Result<std::unique_ptr<CpuEngine>> Create(CpuEngineParts parts);

  const ModelInfo& info() const override { return info_; }
  Status Add(SequenceRequest request) override;
  Status Abort(uint64_t id) override;
  Result<StepResult> Step() override;
  bool HasWork() const override { return !live_.empty() || !done_.empty(); }
  EngineStats stats() const override;
  const Tokenizer* tokenizer() const override { return tokenizer_.get(); }
  Status UpdateWeights(const std::string& path, uint64_t version) override;
  Status InstallWeights(std::shared_ptr<const ModelWeights> weights, uint64_t version) override;
  std::shared_ptr<const ModelWeights> weights() const override { return weights_; }

  // Forces an attention kernel (tests); kAuto chooses by load.
  void set_attention_kernel(kernels::AttentionKernel k) { backend_->set_attention_kernel(k); }
  const ForwardBackend& backend() const { return *backend_; }

  // Checks the KV block accounting: every block's reference count equals the number of block
  // tables that hold it plus one if the prefix cache names it, and exactly the blocks with count 0
  // are free. kInternal with the first discrepancy. O(blocks + table entries); for tests.
  Status CheckBlockAccounting() const;
  // Drops every prefix-cache entry (the disk tier keeps its files).
  void ClearPrefixCache() { prefix_->Clear(); }
  // Internals for tests (the negative controls corrupt cached K/V on purpose).
  KvCache* kv_cache_for_test() { return cache_.get(); }
  const PrefixCache& prefix_cache() const { return *prefix_; }
  const KvDiskTier* disk_tier() const { return disk_.get(); }

 private:
  CpuEngine() = default;
  void Finish(Sequence* s, FinishReason reason);
  // One row's logits turned into a token: a forced token scored, or a new token sampled.
  struct Pick {
    Sequence* seq;
    int32_t position;  // of the row; the token is for position + 1
    const float* logits;
    bool forced;
    SampleResult result;
  };
  // Applies a pick to its sequence: appends the token, records it, checks the stop conditions.
  void Consume(const Pick& pick, StepResult* out);

  EngineOptions opt_;
  ModelInfo info_;
  std::unique_ptr<kernels::ThreadPool> pool_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::shared_ptr<const ModelWeights> weights_;  // the weights backend_ serves
  // Fills EngineStats' KV memory per layer kind.
  void KvMemoryByLayerKind(EngineStats* s) const;
  std::unique_ptr<ForwardBackend> backend_;  // declared before cache_: outlives its store pointer
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<KvDiskTier> disk_;          // may be null
  std::unique_ptr<KvDiskTier> sliding_disk_;  // the sliding pool's blocks; null without disk_
  std::unique_ptr<PrefixCache> prefix_;       // declared after cache_: destroyed first
  std::unique_ptr<Scheduler> scheduler_;
  std::vector<std::unique_ptr<Sampler>> samplers_;  // one per pool worker
  kernels::DType weight_storage_ = kernels::DType::kF32;

  std::map<uint64_t, std::unique_ptr<Sequence>> live_;  // id order: deterministic iteration
  std::vector<std::unique_ptr<Sequence>> done_;         // finished, reported by the next Step()
  uint64_t arrivals_ = 0;
  uint64_t weight_version_ = 0;
  EngineStats totals_;
  std::vector<float> logits_;
  std::vector<ForwardRow> rows_;
  std::vector<Pick> picks_;
};

}  // namespace bitroll::engine
