// engine/cpu_engine.h: the CPU implementation of engine::Engine.
//
// One CpuEngine is one replica: a Transformer (packed weights), a KV cache, a scheduler, a sampler
// and a thread pool. See engine.h for the API contract and the invariance promise.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/kv_cache.h"
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
  void (*matmul_override)(kernels::Isa, const kernels::MatmulParams&, kernels::ThreadPool*) = nullptr;
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

  // Forces an attention kernel (tests); kAuto chooses by load.
  void set_attention_kernel(kernels::AttentionKernel k) { transformer_->set_attention_kernel(k); }
  const Transformer& transformer() const { return *transformer_; }

 private:
  CpuEngine() = default;
  void Finish(Sequence* s, FinishReason reason);
  // Applies a sampled or scored token to `s` after its row at `position` produced `logits`.
  void Consume(Sequence* s, int32_t position, const float* logits, StepResult* out);

  EngineOptions opt_;
  ModelInfo info_;
  std::unique_ptr<kernels::ThreadPool> pool_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<Transformer> transformer_;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<Sampler> sampler_;
  kernels::DType weight_storage_ = kernels::DType::kF32;

  std::map<uint64_t, std::unique_ptr<Sequence>> live_;  // id order: deterministic iteration
  std::vector<std::unique_ptr<Sequence>> done_;         // finished, reported by the next Step()
  uint64_t arrivals_ = 0;
  uint64_t weight_version_ = 0;
  EngineStats totals_;
  std::vector<float> logits_;
  std::vector<ForwardRow> rows_;
};

}  // namespace bitroll::engine
