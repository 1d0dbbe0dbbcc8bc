#include "engine/invariance_checks.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <utility>

namespace bitroll::engine {

namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

std::string BitsText(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  char buf[48];
  std::snprintf(buf, sizeof(buf), "0x%08x (%.9g)", bits, static_cast<double>(f));
  return buf;
}

// Compares `got` with `want` for every request of `ids`, appending one mismatch per request that
// differs, labelled (check, run).
void Compare(const std::string& check, const std::string& run,
             const std::map<uint64_t, SequenceOutput>& want_by_id,
             const std::map<uint64_t, SequenceOutput>& got_by_id, Mismatches* out) {
  for (const auto& [id, want] : want_by_id) {
    auto it = got_by_id.find(id);
    InvarianceMismatch m;
    if (it == got_by_id.end()) {
      m.note = "no output";
      m.recorded_tokens = want.tokens.size();
    } else if (!FirstDifference(want, it->second, &m)) {
      continue;
    }
    m.check = check;
    m.run = run;
    m.request = id;
    out->push_back(std::move(m));
  }
}

}  // namespace

std::string EngineVariant::Label() const {
  std::string s;
  auto add = [&s](const std::string& part) { s += (s.empty() ? "" : " ") + part; };
  if (max_step_tokens > 0) add("budget " + std::to_string(max_step_tokens));
  if (max_prefill_chunk > 0) add("chunk " + std::to_string(max_prefill_chunk));
  if (threads > 0) add("threads " + std::to_string(threads));
  if (!isa.empty()) add("isa " + isa);
  if (!attention.empty()) add("attention " + attention);
  return s.empty() ? "default" : s;
}

std::string InvarianceMismatch::ToString() const {
  std::string s = check + ": " + run + ": request " + std::to_string(request);
  if (token >= 0) {
    s += " token " + std::to_string(token) + ": recorded id " + std::to_string(recorded_id) +
         " logprob bits " + BitsText(recorded_bits) + ", recomputed id " +
         std::to_string(recomputed_id) + " logprob bits " + BitsText(recomputed_bits);
  } else if (recorded_tokens != recomputed_tokens) {
    s += ": recorded " + std::to_string(recorded_tokens) + " tokens, recomputed " +
         std::to_string(recomputed_tokens);
  }
  if (!note.empty()) s += " (" + note + ")";
  return s;
}

bool FirstDifference(const SequenceOutput& recorded, const SequenceOutput& recomputed,
                     InvarianceMismatch* out) {
  out->recorded_tokens = recorded.tokens.size();
  out->recomputed_tokens = recomputed.tokens.size();
  const size_t n = std::min({recorded.tokens.size(), recomputed.tokens.size(),
                             recorded.logprobs.size(), recomputed.logprobs.size()});
  for (size_t i = 0; i < n; ++i) {
    if (recorded.tokens[i] != recomputed.tokens[i] ||
        std::memcmp(&recorded.logprobs[i], &recomputed.logprobs[i], sizeof(float)) != 0) {
      out->token = static_cast<int32_t>(i);
      out->recorded_id = recorded.tokens[i];
      out->recomputed_id = recomputed.tokens[i];
      out->recorded_bits = Bits(recorded.logprobs[i]);
      out->recomputed_bits = Bits(recomputed.logprobs[i]);
      return true;
    }
  }
  if (recorded.tokens.size() != recomputed.tokens.size() ||
      recorded.logprobs.size() != recomputed.logprobs.size()) {
    return true;
  }
  if (recorded.finish != recomputed.finish) {
    out->note = std::string("finish ") + FinishReasonName(recorded.finish) + " vs " +
                FinishReasonName(recomputed.finish);
    return true;
  }
  return false;
}

Result<std::map<uint64_t, SequenceOutput>> RunToCompletion(
    Engine& e, const std::vector<SequenceRequest>& requests) {
  for (const SequenceRequest& r : requests) {
    BR_RETURN_IF_ERROR(e.Add(r).WithContext("request " + std::to_string(r.id)));
  }
  std::map<uint64_t, SequenceOutput> out;
  while (e.HasWork()) {
    BR_ASSIGN_OR_RETURN(StepResult step, e.Step());
    for (SequenceOutput& f : step.finished) {
      if (f.finish == FinishReason::kError) {
        return Status::Internal("request " + std::to_string(f.id) +
                                " failed: " + f.error.ToString());
      }
      out[f.id] = std::move(f);
    }
  }
  return out;
}

Result<std::map<uint64_t, SequenceOutput>> RunOneByOne(
    Engine& e, const std::vector<SequenceRequest>& requests) {
  std::map<uint64_t, SequenceOutput> out;
  for (const SequenceRequest& r : requests) {
    BR_ASSIGN_OR_RETURN(auto one, RunToCompletion(e, {r}));
    out[r.id] = std::move(one[r.id]);
  }
  return out;
}

Result<SequenceOutput> RunAlone(const EngineFactory& make, const EngineVariant& variant,
                                const SequenceRequest& r) {
  BR_ASSIGN_OR_RETURN(std::unique_ptr<Engine> e, make(variant));
  BR_ASSIGN_OR_RETURN(auto out, RunToCompletion(*e, {r}));
  return std::move(out[r.id]);
}

SequenceRequest RandomRequest(uint64_t id, uint32_t seed, int32_t vocab, int32_t max_prompt,
                              int32_t max_tokens, const SamplingParams& sp, int32_t bos) {
  std::mt19937 rng(seed);
  SequenceRequest r;
  r.id = id;
  r.prompt.push_back(bos);
  const int32_t n = std::uniform_int_distribution<int32_t>(1, max_prompt)(rng);
  for (int32_t i = 0; i < n; ++i) {
    r.prompt.push_back(std::uniform_int_distribution<int32_t>(3, vocab - 1)(rng));
  }
  r.sampling = sp;
  r.sampling.seed = sp.seed + seed;
  r.sample_index = seed % 8;
  r.stop.max_tokens = std::uniform_int_distribution<int32_t>(1, max_tokens)(rng);
  return r;
}

Result<Mismatches> CheckBatchComposition(const EngineFactory& make, const SequenceRequest& target,
                                         const std::vector<int>& sizes, const FillerShape& fillers,
                                         uint32_t seed) {
  BR_ASSIGN_OR_RETURN(const SequenceOutput alone, RunAlone(make, {}, target));
  Mismatches out;
  std::mt19937 rng(seed);
  for (int batch : sizes) {
    std::vector<SequenceRequest> reqs;
    for (int i = 0; i < batch - 1; ++i) {
      reqs.push_back(RandomRequest(1000 + i, rng(), fillers.vocab, fillers.max_prompt,
                                   fillers.max_tokens, fillers.sampling, fillers.bos));
    }
    uint64_t id = std::uniform_int_distribution<uint64_t>(0, 5000)(rng) * 2 + 1;
    if (id >= 1000 && id < 1000 + static_cast<uint64_t>(batch)) id += 100000;  // not a filler's
    const size_t at = std::uniform_int_distribution<size_t>(0, reqs.size())(rng);
    SequenceRequest t = target;
    t.id = id;
    reqs.insert(reqs.begin() + static_cast<std::ptrdiff_t>(at), t);
    BR_ASSIGN_OR_RETURN(std::unique_ptr<Engine> e, make({}));
    BR_ASSIGN_OR_RETURN(auto got, RunToCompletion(*e, reqs));
    Compare("batch", "batch of " + std::to_string(batch) + ", position " + std::to_string(at),
            {{id, alone}}, got, &out);
  }
  return out;
}

Result<Mismatches> CheckBatchEqualsSolo(const EngineFactory& make,
                                        const std::vector<SequenceRequest>& batch,
                                        const EngineVariant& variant,
                                        const std::map<uint64_t, SequenceOutput>* solo,
                                        const char* check) {
  std::map<uint64_t, SequenceOutput> want;
  for (const SequenceRequest& r : batch) {
    if (solo != nullptr && solo->count(r.id) != 0) {
      want[r.id] = solo->at(r.id);
    } else {
      BR_ASSIGN_OR_RETURN(want[r.id], RunAlone(make, {}, r));
    }
  }
  BR_ASSIGN_OR_RETURN(std::unique_ptr<Engine> e, make(variant));
  BR_ASSIGN_OR_RETURN(auto got, RunToCompletion(*e, batch));
  Mismatches out;
  Compare(check,
          "alone vs a batch of " + std::to_string(batch.size()) + " (" + variant.Label() + ")",
          want, got, &out);
  return out;
}

Result<Mismatches> CheckPrefillChunking(const EngineFactory& make, const SequenceRequest& r,
                                        const std::vector<int32_t>& chunks, int32_t whole_budget,
                                        const SequenceOutput* whole) {
  SequenceOutput ref;
  if (whole != nullptr) {
    ref = *whole;
  } else {
    EngineVariant v;
    v.max_step_tokens = whole_budget;
    v.max_prefill_chunk = whole_budget;
    BR_ASSIGN_OR_RETURN(ref, RunAlone(make, v, r));
  }
  Mismatches out;
  for (int32_t chunk : chunks) {
    EngineVariant v;
    v.max_step_tokens = chunk;
    v.max_prefill_chunk = chunk;
    BR_ASSIGN_OR_RETURN(SequenceOutput got, RunAlone(make, v, r));
    Compare("chunking", "prefill whole vs in chunks of " + std::to_string(chunk), {{r.id, ref}},
            {{r.id, std::move(got)}}, &out);
  }
  return out;
}

Result<Mismatches> CheckPrefillEqualsDecode(const EngineFactory& make, const SequenceRequest& r,
                                            const SequenceOutput& decoded,
                                            const std::vector<int32_t>& budgets) {
  return CheckPrefillEqualsDecode(make, std::vector<SequenceRequest>{r}, {{r.id, decoded}},
                                  budgets);
}

Result<Mismatches> CheckPrefillEqualsDecode(const EngineFactory& make,
                                            const std::vector<SequenceRequest>& requests,
                                            const std::map<uint64_t, SequenceOutput>& decoded,
                                            const std::vector<int32_t>& budgets) {
  std::vector<SequenceRequest> rescores;
  for (const SequenceRequest& r : requests) {
    auto it = decoded.find(r.id);
    if (it == decoded.end() || it->second.tokens.empty()) {
      return Status::Internal("prefill_vs_decode: request " + std::to_string(r.id) +
                              " decoded no token to re-score");
    }
    SequenceRequest& rescore = rescores.emplace_back(r);
    rescore.forced = it->second.tokens;
    rescore.stop.max_tokens = static_cast<int32_t>(it->second.tokens.size());
  }
  Mismatches out;
  for (int32_t budget : budgets) {
    EngineVariant v;
    v.max_step_tokens = budget;
    BR_ASSIGN_OR_RETURN(std::unique_ptr<Engine> e, make(v));
    BR_ASSIGN_OR_RETURN(auto scored, RunOneByOne(*e, rescores));
    const std::string run = "decode vs forced prefill in steps of " + std::to_string(budget);
    for (const SequenceRequest& r : requests) {
      const SequenceOutput& want = decoded.at(r.id);
      const SequenceOutput& got = scored[r.id];
      const size_t before = out.size();
      Compare("prefill_vs_decode", run, {{r.id, want}}, {{r.id, got}}, &out);
      if (out.size() == before && got.cost.decode_tokens != 0) {
        InvarianceMismatch m;
        m.check = "prefill_vs_decode";
        m.run = run;
        m.request = r.id;
        m.recorded_tokens = m.recomputed_tokens = want.tokens.size();
        m.note = "re-scoring decoded " + std::to_string(got.cost.decode_tokens) + " tokens";
        out.push_back(std::move(m));
      }
    }
  }
  return out;
}

Result<Mismatches> CheckVariants(const EngineFactory& make,
                                 const std::vector<SequenceRequest>& requests,
                                 const std::map<uint64_t, SequenceOutput>& reference,
                                 const std::vector<EngineVariant>& variants) {
  Mismatches out;
  for (const EngineVariant& v : variants) {
    BR_ASSIGN_OR_RETURN(std::unique_ptr<Engine> e, make(v));
    BR_ASSIGN_OR_RETURN(auto got, RunToCompletion(*e, requests));
    Compare("variants", "default vs " + v.Label(), reference, got, &out);
  }
  return out;
}

Result<Mismatches> CheckIdenticalRequests(const EngineFactory& make, const SequenceRequest& r,
                                          int count, int32_t budget) {
  std::vector<SequenceRequest> reqs;
  for (int i = 0; i < count; ++i) {
    reqs.push_back(r);
    reqs.back().id = static_cast<uint64_t>(i);
  }
  EngineVariant v;
  v.max_step_tokens = budget;
  BR_ASSIGN_OR_RETURN(std::unique_ptr<Engine> e, make(v));
  BR_ASSIGN_OR_RETURN(auto got, RunToCompletion(*e, reqs));
  Mismatches out;
  if (got.size() != static_cast<size_t>(count) || got.count(0) == 0) {
    InvarianceMismatch m;
    m.check = "identical";
    m.run = std::to_string(count) + " copies";
    m.note = "only " + std::to_string(got.size()) + " outputs";
    out.push_back(std::move(m));
    return out;
  }
  std::map<uint64_t, SequenceOutput> want;
  for (const auto& [id, o] : got) want[id] = got.at(0);
  Compare("identical", std::to_string(count) + " copies vs copy 0", want, got, &out);
  return out;
}

}  // namespace bitroll::engine
