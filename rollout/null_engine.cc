#include "rollout/null_engine.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "engine/model_weights.h"

namespace bitroll::rollout {

namespace {

// splitmix64's finaliser.
uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t Fnv1a(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t h = 0xCBF29CE484222325ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001B3ull;
  }
  return h;
}

}  // namespace

uint64_t NullPromptHash(const std::vector<int32_t>& prompt) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (int32_t id : prompt) {
    const auto u = static_cast<uint32_t>(id);
    for (int b = 0; b < 4; ++b) {
      h ^= (u >> (8 * b)) & 0xFFu;
      h *= 0x100000001B3ull;
    }
  }
  return Mix(h);
}

uint64_t NullTokenHash(uint64_t prompt_hash, uint64_t seed, uint32_t sample_index, bool greedy,
                       int32_t position, uint64_t salt) {
  uint64_t h = prompt_hash ^ Mix(seed + 0x1234567ull) ^ Mix(static_cast<uint64_t>(position) << 1);
  if (!greedy) h ^= Mix(uint64_t{sample_index} * 2 + 1);
  return Mix(h ^ salt);
}

NullEngine::NullEngine(const NullEngineOptions& options) : options_(options) {
  info_.name = options.name;
  info_.vocab_size = options.vocab_size;
  info_.max_seq_len = options.max_seq_len;
  info_.bos_id = 1;
  info_.eos_id = options.eos_id;
  info_.fingerprint.weights_hash = options.weights_hash;
  info_.fingerprint.kernel_version = 0;
  info_.fingerprint.attention_chunk = 0;
  info_.fingerprint.backend = "null";
  version_ = options.weight_version;
}

Status NullEngine::Add(engine::SequenceRequest request) {
  if (request.prompt.empty()) return Status::InvalidArgument("empty prompt");
  if (live_.count(request.id)) {
    return Status::InvalidArgument("duplicate sequence id " + std::to_string(request.id));
  }
  if (request.stop.max_tokens < 1) return Status::InvalidArgument("max_tokens must be >= 1");
  for (int32_t id : request.prompt) {
    if (id < 0 || id >= info_.vocab_size) {
      return Status::OutOfRange("token id " + std::to_string(id) + " outside the vocabulary");
    }
  }
  if (static_cast<int64_t>(request.prompt.size()) >= info_.max_seq_len) {
    return Status::OutOfRange("prompt longer than the context");
  }
  auto seq = std::make_unique<Seq>();
  seq->prompt_hash = NullPromptHash(request.prompt);
  seq->out.id = request.id;
  seq->req = std::move(request);
  live_.emplace(seq->req.id, std::move(seq));
  ++stats_.waiting;
  return Status::Ok();
}

Status NullEngine::Abort(uint64_t id) {
  auto it = live_.find(id);
  if (it == live_.end()) return Status::NotFound("sequence " + std::to_string(id));
  it->second->aborted = true;
  return Status::Ok();
}

Status NullEngine::UpdateWeights(const std::string& path, uint64_t version) {
  salt_ = path.empty() ? 0 : Mix(Fnv1a(path.data(), path.size()));
  version_ = version;
  return Status::Ok();
}

Status NullEngine::InstallWeights(std::shared_ptr<const engine::ModelWeights> weights,
                                  uint64_t version) {
  if (weights == nullptr) return Status::InvalidArgument("update weights: no weights");
  salt_ = Mix(weights->weights_hash);
  version_ = version;
  return Status::Ok();
}

Result<engine::StepResult> NullEngine::Step() {
  const auto t0 = std::chrono::steady_clock::now();
  engine::StepResult r;
  std::vector<std::pair<Seq*, int64_t>> worked;  // sequence, tokens processed this step
  worked.reserve(live_.size());
  for (auto& [id, s] : live_) {
    if (s->aborted) {
      s->out.finish = FinishReason::kAborted;
      continue;
    }
    int64_t processed = 1;
    if (!s->prefilled) {
      s->prefilled = true;
      --stats_.waiting;
      ++stats_.running;
      const auto n = static_cast<int64_t>(s->req.prompt.size());
      if (seen_groups_.count(s->req.group_id) && s->req.group_id != 0) {
        s->out.cost.prefill_cached += n;
        stats_.prefill_tokens_cached += n;
      } else {
        seen_groups_.insert(s->req.group_id);
        s->out.cost.prefill_computed += n;
        stats_.prefill_tokens_computed += n;
        processed += n - 1;
      }
      // Teacher forcing (resume): the forced tokens are appended as given, each scored by the
      // same pure function of its position, all in the prefill step.
      const bool greedy_f = s->req.sampling.temperature == 0.0f;
      for (const int32_t f : s->req.forced) {
        const int32_t fk = static_cast<int32_t>(s->out.tokens.size());
        const int32_t fpos = static_cast<int32_t>(s->req.prompt.size()) + fk;
        const uint64_t fh = NullTokenHash(s->prompt_hash, s->req.sampling.seed, s->req.sample_index,
                                          greedy_f, fpos, salt_);
        const float flp = -static_cast<float>(fh >> 40) * (1.0f / 1048576.0f);
        if (s->out.versions.empty() || s->out.versions.back().version != version_) {
          s->out.versions.push_back({fk, version_});
        }
        s->out.tokens.push_back(f);
        s->out.logprobs.push_back(flp);
        r.tokens.push_back({id, fpos, f, flp, version_});
        ++processed;
      }
      if (!s->req.forced.empty() &&
          static_cast<int32_t>(s->out.tokens.size()) >= s->req.stop.max_tokens) {
        s->out.finish = FinishReason::kLength;
        worked.emplace_back(s.get(), processed);
        r.tokens_processed += processed;
        continue;
      }
    }
    const auto k = static_cast<int32_t>(s->out.tokens.size());
    const int32_t pos = static_cast<int32_t>(s->req.prompt.size()) + k;
    const bool greedy = s->req.sampling.temperature == 0.0f;
    const uint64_t h = NullTokenHash(s->prompt_hash, s->req.sampling.seed, s->req.sample_index,
                                     greedy, pos, salt_);
    const uint32_t period = options_.eos_period;
    const bool eos = period != 0 && k >= 1 && ((h >> 32) % period) == 0;
    const int32_t token =
        eos ? options_.eos_id
            : 3 + static_cast<int32_t>(h % static_cast<uint64_t>(info_.vocab_size - 3));
    const float logprob = -static_cast<float>(h >> 40) * (1.0f / 1048576.0f);
    if (s->out.versions.empty() || s->out.versions.back().version != version_) {
      s->out.versions.push_back({k, version_});
    }
    s->out.tokens.push_back(token);
    s->out.logprobs.push_back(logprob);
    s->out.cost.decode_tokens += 1;
    stats_.decode_tokens += 1;
    r.tokens.push_back({id, pos, token, logprob, version_});
    worked.emplace_back(s.get(), processed);
    r.tokens_processed += processed;
    const auto& stop = s->req.stop;
    if (eos && s->req.stop.stop_at_eos) {
      s->out.finish = FinishReason::kEos;
    } else if (std::find(stop.stop_ids.begin(), stop.stop_ids.end(), token) !=
               stop.stop_ids.end()) {
      s->out.finish = FinishReason::kStop;
    } else if (static_cast<int32_t>(s->out.tokens.size()) >= stop.max_tokens ||
               pos + 1 >= info_.max_seq_len) {
      s->out.finish = FinishReason::kLength;
    }
  }
  if (options_.step_delay_us > 0 && !worked.empty()) {
    std::this_thread::sleep_for(std::chrono::microseconds(options_.step_delay_us));
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (r.tokens_processed > 0) {
    for (auto& [s, n] : worked) {
      s->out.cost.engine_seconds +=
          r.seconds * static_cast<double>(n) / static_cast<double>(r.tokens_processed);
    }
  }
  for (auto it = live_.begin(); it != live_.end();) {
    if (it->second->out.finish != FinishReason::kNone) {
      if (it->second->prefilled) {
        --stats_.running;
      } else {
        --stats_.waiting;
      }
      r.finished.push_back(std::move(it->second->out));
      it = live_.erase(it);
    } else {
      ++it;
    }
  }
  ++stats_.steps;
  return r;
}

}  // namespace bitroll::rollout
