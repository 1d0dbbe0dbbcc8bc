// rollout/null_engine.h: NullEngine, a test double of bitroll::engine::Engine.
//
// It runs no model. Token k of a sequence (k = 0, 1, ... among the generated tokens, absolute
// position p = prompt length + k) is a pure function of (prompt ids, seed, sample_index, p,
// weights salt), so the coordinator's bit-identity across replicas, load and arrival order can be
// tested without a model:
//
//   ph   = Mix(FNV-1a-64 over the prompt ids' little-endian bytes)
//   h    = Mix(ph ^ Mix(seed + 0x9E37..) ^ Mix(sample_index*2+1) ^ Mix(p) ^ salt)   (see .cc)
//   token   = 3 + h % (vocab_size - 3)
//   logprob = -(float)(h >> 40) * 2^-20                 (exact in fp32)
//   finish  = kEos (token EOS emitted) when k >= 1 and (h >> 32) % eos_period == 0
//
// Under temperature 0 (greedy) the sample_index is not part of the key. examples/python and the
// tests re-derive these values independently. UpdateWeights sets salt = FNV-1a-64 of the path
// (0 for ""), so tokens after a swap differ and carry the new version.
//
// SequenceRequest::forced tokens (resume from the WAL) are appended in the prefill step, each
// scored by the same function of its position, so a resumed sequence is bit-identical.
// Each Step() advances every running sequence by one token (prefill counts as the first step),
// sleeps `step_delay_us` and shares its wall time among sequences as engine_seconds. A group's
// second and later sequences report their prompt as cached (a toy prefix cache).
//
// Thread-safety: like any Engine, one owner thread calls every method.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace bitroll::rollout {

struct NullEngineOptions {
  int32_t vocab_size = 512;
  int32_t max_seq_len = 4096;
  int32_t eos_id = 2;
  uint32_t eos_period = 48;            // mean generated length ~ eos_period tokens; 0 = never EOS
  int64_t step_delay_us = 0;           // sleep per Step(), simulating a forward pass
  uint64_t weights_hash = 0x6e756c6c;  // reported in the fingerprint ("null")
  uint64_t weight_version = 0;
  std::string name = "null";
};

// Pure functions behind NullEngine (exposed for tests).
uint64_t NullPromptHash(const std::vector<int32_t>& prompt);
uint64_t NullTokenHash(uint64_t prompt_hash, uint64_t seed, uint32_t sample_index, bool greedy,
                       int32_t position, uint64_t salt);

class NullEngine final : public engine::Engine {
 public:
  explicit NullEngine(const NullEngineOptions& options);
  ~NullEngine() override = default;

  const engine::ModelInfo& info() const override { return info_; }
  Status Add(engine::SequenceRequest request) override;
  Status Abort(uint64_t id) override;
  Result<engine::StepResult> Step() override;
  bool HasWork() const override { return !live_.empty(); }
  engine::EngineStats stats() const override { return stats_; }
  const engine::Tokenizer* tokenizer() const override { return nullptr; }
  Status UpdateWeights(const std::string& path, uint64_t version) override;
  // Takes the weights' hash as its salt (the NullEngine has no weights of its own).
  Status InstallWeights(std::shared_ptr<const engine::ModelWeights> weights,
                        uint64_t version) override;
  std::shared_ptr<const engine::ModelWeights> weights() const override { return nullptr; }

 private:
  struct Seq {
    engine::SequenceRequest req;
    engine::SequenceOutput out;
    uint64_t prompt_hash = 0;
    bool prefilled = false;
    bool aborted = false;
  };

  NullEngineOptions options_;
  engine::ModelInfo info_;
  engine::EngineStats stats_;
  std::map<uint64_t, std::unique_ptr<Seq>> live_;  // by id: Step() visits in id order
  std::set<uint64_t> seen_groups_;                 // toy prefix cache
  uint64_t salt_ = 0;
  uint64_t version_ = 0;
};

}  // namespace bitroll::rollout
