#include "engine/self_test.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <utility>

#include "engine/cpu_engine.h"
#include "engine/forward_backend.h"
#include "engine/kv_cache.h"
#include "engine/model_weights.h"
#include "kernels/cpu/isa.h"

namespace bitroll::engine {

namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Fresh engines on the served weights: `options` with the variant applied, a small private KV
// pool (room for one full-context sequence plus 64 blocks; reserved, not touched) and no disk
// tier.
EngineFactory FactoryOn(std::shared_ptr<const ModelWeights> weights, EngineOptions options) {
  const ModelConfig& c = weights->config;
  KvCacheOptions kv;
  kv.n_layers = c.n_layers;
  kv.n_kv_heads = c.n_kv_heads;
  kv.head_dim = c.head_dim();
  kv.block_size = 16;
  const int64_t blocks = (c.max_seq_len + kv.block_size - 1) / kv.block_size + 64;
  options.kv_cache_bytes = blocks * KvCache::BlockBytes(kv);
  options.kv_disk_dir.clear();
  return [weights, options](const EngineVariant& v) -> Result<std::unique_ptr<Engine>> {
    CpuEngineParts parts;
    parts.weights = weights;
    parts.options = options;
    EngineOptions& o = parts.options;
    if (v.max_step_tokens > 0) o.max_step_tokens = v.max_step_tokens;
    if (v.max_prefill_chunk > 0) o.max_prefill_chunk = v.max_prefill_chunk;
    if (v.threads > 0) o.threads = v.threads;
    if (!v.isa.empty()) o.isa = v.isa;
    if (!v.attention.empty()) o.attention = v.attention;
    BR_ASSIGN_OR_RETURN(parts.backend, MakeDeviceBackend(o, weights));
    BR_ASSIGN_OR_RETURN(std::unique_ptr<CpuEngine> e, CpuEngine::Create(std::move(parts)));
    return std::unique_ptr<Engine>(std::move(e));
  };
}

// The self-test's requests: prompts of 5, 19 and 37 tokens (fewer on a short context), greedy,
// sampled with top-p, sampled with top-k; no EOS/BOS stop, so each makes `gen` tokens.
std::vector<SequenceRequest> Requests(const ModelInfo& info, const SelfTestOptions& st) {
  const int32_t gen = std::max<int32_t>(1, st.generate_tokens);
  const int32_t room = std::max<int32_t>(1, info.max_seq_len - gen - 1);
  std::mt19937 rng(st.seed);
  const int32_t lo = std::min<int32_t>(3, info.vocab_size - 1);
  std::uniform_int_distribution<int32_t> id(lo, info.vocab_size - 1);
  std::vector<SequenceRequest> out;
  const int32_t lengths[] = {5, 19, 37};
  for (int i = 0; i < 3; ++i) {
    SequenceRequest r;
    r.id = static_cast<uint64_t>(i + 1);
    r.prompt.push_back(info.bos_id);
    for (int32_t k = 1; k < std::min(lengths[i], room); ++k) r.prompt.push_back(id(rng));
    r.sample_index = static_cast<uint32_t>(i);
    r.sampling.seed = st.seed * 1000 + static_cast<uint64_t>(i);
    if (i == 0) r.sampling.temperature = 0.0f;
    if (i == 1) r.sampling.top_p = 0.9f;
    if (i == 2) {
      r.sampling.temperature = 0.8f;
      r.sampling.top_k = 40;
    }
    r.stop.max_tokens = gen;
    r.stop.stop_at_eos = false;
    r.stop.stop_at_bos = false;
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<std::string> AvailableIsas() {
  std::vector<std::string> out;
  for (kernels::Isa isa : {kernels::Isa::kScalar, kernels::Isa::kAvx2, kernels::Isa::kAvx512}) {
    if (kernels::IsaSupported(isa)) out.emplace_back(kernels::IsaName(isa));
  }
  return out;
}

}  // namespace

std::string SelfTestReport::Summary() const {
  if (!ran) return "skipped: " + skipped;
  char secs[32];
  std::snprintf(secs, sizeof(secs), "%.3f s", seconds);
  if (!mismatches.empty()) {
    std::string s = "FAILED: " + mismatches.front().ToString();
    if (mismatches.size() > 1) s += "; " + std::to_string(mismatches.size() - 1) + " more";
    return s;
  }
  if (!passed) return std::string("FAILED: not every check ran (") + secs + ")";
  std::string s = "passed:";
  for (size_t i = 0; i < checks.size(); ++i) s += (i ? ", " : " ") + checks[i].name;
  s += " (isa";
  for (const std::string& isa : isas) s += " " + isa;
  return s + ") in " + secs;
}

std::string SelfTestReport::ToString() const {
  std::string s = Summary() + "\n";
  for (const Check& c : checks) {
    char line[160];
    std::snprintf(line, sizeof(line), "  %-18s %s  %.3f s\n", c.name.c_str(),
                  c.mismatches == 0 ? "ok      " : "MISMATCH", c.seconds);
    s += line;
  }
  for (const InvarianceMismatch& m : mismatches) s += "  " + m.ToString() + "\n";
  return s;
}

const char* SelfTestVerdict::state_name() const {
  switch (state) {
    case State::kNotRun:
      return "not run";
    case State::kPassed:
      return "passed";
    case State::kFailed:
      return "failed";
    case State::kSkipped:
      return "skipped";
  }
  return "unknown";
}

SelfTestVerdict VerdictOf(const Status& status, const SelfTestReport& report) {
  SelfTestVerdict v;
  if (!status.ok()) {
    v.state = SelfTestVerdict::State::kFailed;
    v.reason = report.mismatches.empty() ? status.ToString() : report.Summary();
  } else if (!report.ran) {
    v.state = SelfTestVerdict::State::kSkipped;
    v.reason = report.Summary();
  } else {
    v.state = report.passed ? SelfTestVerdict::State::kPassed : SelfTestVerdict::State::kFailed;
    v.reason = report.Summary();
  }
  return v;
}

Status RunInvarianceSelfTest(const Engine& served, const EngineOptions& options,
                             const SelfTestOptions& self_test, SelfTestReport* report) {
  *report = SelfTestReport{};
  const Clock::time_point t0 = Clock::now();
  std::shared_ptr<const ModelWeights> weights = served.weights();
  if (weights == nullptr) {
    report->skipped = "the engine has no weights of its own (a test double)";
    return Status::Ok();
  }
  report->ran = true;
  const EngineFactory make = FactoryOn(weights, options);
  const std::vector<SequenceRequest> reqs = Requests(served.info(), self_test);
  report->isas = AvailableIsas();

  // Runs one check, timing it and keeping its mismatches.
  auto run = [report](const char* name, auto&& body) -> Status {
    const Clock::time_point start = Clock::now();
    Result<Mismatches> found = body();
    if (!found.ok()) return found.status().WithContext(std::string("self-test ") + name);
    report->checks.push_back({name, found->size(), Since(start)});
    for (InvarianceMismatch& m : *found) report->mismatches.push_back(std::move(m));
    return Status::Ok();
  };

  // 1. batch. The solo runs (one after the other in one engine: making an engine packs the
  // weights, the main cost on a large model) are also the reference of the later checks.
  std::map<uint64_t, SequenceOutput> solo;
  BR_RETURN_IF_ERROR(run("batch", [&]() -> Result<Mismatches> {
    // A mixed batch: two random others between them, a small step budget so that prefill
    // chunks share steps with decode rows.
    std::vector<SequenceRequest> mixed = reqs;
    std::mt19937 rng(self_test.seed + 1);
    SamplingParams sp;
    sp.seed = self_test.seed;
    const ModelInfo& info = served.info();
    for (uint64_t i = 0; i < 2; ++i) {
      mixed.insert(mixed.begin() + static_cast<std::ptrdiff_t>(1 + i),
                   RandomRequest(100 + i, rng(), info.vocab_size,
                                 std::min<int32_t>(30, info.max_seq_len / 4),
                                 self_test.generate_tokens, sp, info.bos_id));
    }
    BR_ASSIGN_OR_RETURN(std::unique_ptr<Engine> e, make({}));
    BR_ASSIGN_OR_RETURN(solo, RunOneByOne(*e, mixed));
    EngineVariant small;
    small.max_step_tokens = 16;
    BR_ASSIGN_OR_RETURN(Mismatches out, CheckBatchEqualsSolo(make, mixed, small, &solo));
    // The three in reverse order under other ids: other positions in every step.
    std::vector<SequenceRequest> reversed(reqs.rbegin(), reqs.rend());
    std::map<uint64_t, SequenceOutput> solo_by_new_id;
    for (SequenceRequest& r : reversed) {
      solo_by_new_id[r.id + 1000] = solo[r.id];
      r.id += 1000;
    }
    BR_ASSIGN_OR_RETURN(Mismatches more, CheckBatchEqualsSolo(make, reversed, {}, &solo_by_new_id));
    out.insert(out.end(), more.begin(), more.end());
    return out;
  }));

  // 2. chunking, on the longest prompt. The solo run prefilled it whole when the served step
  // budget and prefill chunk hold it.
  const bool solo_was_whole = static_cast<int32_t>(reqs[2].prompt.size()) <=
                              std::min(options.max_step_tokens, options.max_prefill_chunk);
  BR_RETURN_IF_ERROR(run("chunking", [&]() {
    return CheckPrefillChunking(make, reqs[2], {1, 7}, 4096,
                                solo_was_whole ? &solo[reqs[2].id] : nullptr);
  }));

  // 3. prefill_vs_decode, greedy and sampled.
  BR_RETURN_IF_ERROR(run("prefill_vs_decode", [&]() {
    return CheckPrefillEqualsDecode(make, std::vector<SequenceRequest>{reqs[0], reqs[1]}, solo,
                                    {4096, 5});
  }));

  // 4. variants. Every ISA here on one short probe: the scalar path costs ~30x the SIMD ones
  // and dominates on a large model, so it gets the fewest rows that still reach every kernel (a
  // 5-token prefill, then decode rows up to position 16: a second attention chunk; sampled).
  // Both attention kernels (on 2 threads at least: with one worker "split" has no idle worker
  // to split over, so against a 1-thread reference they also vary the thread count), and 1
  // thread against a multi-thread reference, on the two shorter requests, 8 tokens each.
  BR_RETURN_IF_ERROR(run("variants", [&]() -> Result<Mismatches> {
    SequenceRequest probe = reqs[1];
    probe.id = 10;
    probe.prompt.resize(std::min<size_t>(probe.prompt.size(), 5));
    probe.stop.max_tokens = 17 - static_cast<int32_t>(probe.prompt.size());
    std::vector<SequenceRequest> few = {reqs[0], reqs[1]};
    for (SequenceRequest& r : few) r.stop.max_tokens = std::min<int32_t>(r.stop.max_tokens, 8);
    BR_ASSIGN_OR_RETURN(std::unique_ptr<Engine> e, make({}));
    BR_ASSIGN_OR_RETURN(const auto probe_ref, RunToCompletion(*e, {probe}));
    BR_ASSIGN_OR_RETURN(const auto few_ref, RunToCompletion(*e, few));
    BR_ASSIGN_OR_RETURN(const kernels::Isa served_isa, kernels::ParseIsa(options.isa));
    std::vector<EngineVariant> isas;  // the served one is the reference
    for (const std::string& isa : report->isas) {
      if (isa != kernels::IsaName(served_isa)) isas.emplace_back().isa = isa;
    }
    BR_ASSIGN_OR_RETURN(Mismatches out, CheckVariants(make, {probe}, probe_ref, isas));
    const int32_t split_threads = std::max<int32_t>(2, options.threads);
    std::vector<EngineVariant> variants;
    for (const char* attention : {"single", "split"}) {
      EngineVariant& v = variants.emplace_back();
      v.threads = split_threads;
      v.attention = attention;
    }
    if (options.threads != 1) variants.emplace_back().threads = 1;
    BR_ASSIGN_OR_RETURN(Mismatches more, CheckVariants(make, few, few_ref, variants));
    out.insert(out.end(), more.begin(), more.end());
    return out;
  }));

  // 5. group: six samples of one prompt (the longest: two whole KV blocks) as a GRPO group,
  // decoded together, where their attention walks the shared blocks once for the group (sibling
  // groups, kernels/cpu/attention.h), against each sample alone. Without the prefix cache the
  // samples share nothing and this is another batch check.
  BR_RETURN_IF_ERROR(run("group", [&]() -> Result<Mismatches> {
    std::vector<SequenceRequest> group;
    for (uint32_t i = 0; i < 6; ++i) {
      SequenceRequest r = reqs[2];
      r.id = 200 + i;
      r.group_id = 200;
      r.sample_index = i;
      r.sampling = SamplingParams{};
      r.sampling.top_p = 0.9f;
      r.sampling.seed = self_test.seed;
      group.push_back(std::move(r));
    }
    BR_ASSIGN_OR_RETURN(std::unique_ptr<Engine> e, make({}));
    BR_ASSIGN_OR_RETURN(const auto alone, RunOneByOne(*e, group));
    return CheckBatchEqualsSolo(make, group, {}, &alone, "group");
  }));

  report->seconds = Since(t0);
  report->passed = report->mismatches.empty();
  if (!report->passed) {
    return Status::Internal("invariance self-test failed: " +
                            report->mismatches.front().ToString());
  }
  return Status::Ok();
}

}  // namespace bitroll::engine
