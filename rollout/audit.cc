// The reproducibility audit (rollout/audit.h): records in, one batched engine run, verdicts out.
#include "rollout/audit.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <set>

#include "engine/engine.h"
#include "engine/tokenizer.h"
#include "rollout/tool_call.h"

namespace bitroll::rollout {

const char* VerdictName(VerdictKind k) {
  switch (k) {
    case VerdictKind::kIdentical:
      return "identical";
    case VerdictKind::kDiverged:
      return "diverged";
    case VerdictKind::kFingerprintMismatch:
      return "fingerprint_mismatch";
    case VerdictKind::kWeightsUnavailable:
      return "weights_unavailable";
    case VerdictKind::kIncomplete:
      return "incomplete";
    case VerdictKind::kError:
      return "error";
    case VerdictKind::kTolerance:
      return "tolerance_report";
  }
  return "error";
}

uint64_t UlpDistance(uint32_t a, uint32_t b) {
  // Map the sign-magnitude bit patterns onto one ordered integer line.
  auto key = [](uint32_t u) -> int64_t {
    return (u >> 31) ? -static_cast<int64_t>(u & 0x7fffffffu) : static_cast<int64_t>(u);
  };
  const int64_t d = key(a) - key(b);
  return static_cast<uint64_t>(d < 0 ? -d : d);
}

int AuditExitStatus(const std::vector<AuditVerdict>& verdicts) {
  bool diverged = false, other = false;
  for (const AuditVerdict& v : verdicts) {
    diverged |= v.kind == VerdictKind::kDiverged;
    other |= v.kind != VerdictKind::kDiverged && v.kind != VerdictKind::kIdentical;
  }
  return diverged ? 1 : other ? 2 : 0;
}

nlohmann::json VerdictToJson(const AuditVerdict& v) {
  nlohmann::json j = {{"index", v.index},
                      {"group_id", v.group_id},
                      {"prompt_index", v.prompt_index},
                      {"sample_index", v.sample_index},
                      {"verdict", VerdictName(v.kind)},
                      {"tokens_checked", v.tokens_checked}};
  if (!v.detail.empty()) j["detail"] = v.detail;
  if (v.tolerance) {
    j["tolerance"] = {{"bitwise", false},
                      {"tokens", v.tolerance->total},
                      {"ids_agree", v.tolerance->agreeing},
                      {"compared", v.tolerance->compared},
                      {"max_abs_logprob_diff", v.tolerance->max_abs_diff},
                      {"mean_abs_logprob_diff", v.tolerance->mean_abs_diff}};
  }
  if (v.divergence) {
    const Divergence& d = *v.divergence;
    j["divergence"] = {{"token", d.token},
                       {"turn", d.turn},
                       {"position", d.position},
                       {"recorded_id", d.recorded_id},
                       {"recomputed_id", d.recomputed_id},
                       {"recorded_logprob", BitsFloat(d.recorded_bits)},
                       {"recomputed_logprob", BitsFloat(d.recomputed_bits)},
                       {"recorded_bits", Hex32(d.recorded_bits)},
                       {"recomputed_bits", Hex32(d.recomputed_bits)},
                       {"ulps", d.ulps}};
    if (!d.what.empty()) j["divergence"]["what"] = d.what;
    if (!d.top5.empty()) {
      nlohmann::json alt = nlohmann::json::array();
      for (const auto& [id, lp] : d.top5) alt.push_back({{"id", id}, {"logprob", lp}});
      j["divergence"]["top5"] = std::move(alt);
    }
  }
  return j;
}

namespace {

// One engine sequence of the audit: a whole trajectory (re-score) or one model turn (re-run).
struct Job {
  size_t item = 0;
  int32_t begin = 0;  // first token of the record's ids this sequence covers
  int32_t count = 0;  // tokens it covers
};

// Why the record cannot be audited on this engine, or OK.
AuditVerdict Precheck(const AuditItem& it, size_t index, const engine::ModelInfo& info) {
  AuditVerdict v;
  v.index = index;
  const TrajectoryRecord& r = it.record;
  v.group_id = r.group_id;
  v.prompt_index = r.prompt_index;
  v.sample_index = r.sample_index;
  if (!it.parse_error.ok()) {
    v.kind = it.parse_error.code() == ErrorCode::kInvalidArgument ||
                     it.parse_error.code() == ErrorCode::kUnsupported
                 ? VerdictKind::kIncomplete
                 : VerdictKind::kError;
    v.detail = "cannot audit: " + it.parse_error.message();
    return v;
  }
  const NumericsFingerprint& fp = info.fingerprint;
  if (r.fingerprint.weights_hash != fp.weights_hash) {
    v.kind = VerdictKind::kWeightsUnavailable;
    v.detail = "weights unavailable: the record was made with weights " +
               Hex64(r.fingerprint.weights_hash) + ", the model given has " +
               Hex64(fp.weights_hash);
    return v;
  }
  std::set<uint64_t> versions;
  for (const RecordVersionSpan& s : r.weight_versions) versions.insert(s.version);
  if (versions.size() > 1) {
    v.kind = VerdictKind::kWeightsUnavailable;
    v.detail = "weights unavailable: the tokens span " + std::to_string(versions.size()) +
               " weight versions; an audit takes one model file (one version)";
    return v;
  }
  if (r.fingerprint.kernel_version != fp.kernel_version ||
      r.fingerprint.attention_chunk != fp.attention_chunk || r.fingerprint.backend != fp.backend) {
    v.kind = VerdictKind::kFingerprintMismatch;
    v.detail = "fingerprint mismatch: record (kernel " +
               std::to_string(r.fingerprint.kernel_version) + ", chunk " +
               std::to_string(r.fingerprint.attention_chunk) + ", backend " +
               r.fingerprint.backend + ") vs this engine (kernel " +
               std::to_string(fp.kernel_version) + ", chunk " + std::to_string(fp.attention_chunk) +
               ", backend " + fp.backend + "): bits are promised equal only within one fingerprint";
    return v;
  }
  return v;
}

// The record's prompt as ids (prompt_text encoded with BOS, as a replica does).
Result<std::vector<int32_t>> PromptIds(const TrajectoryRecord& r, const engine::Engine& e) {
  if (!r.prompt_ids.empty()) return r.prompt_ids;
  if (e.tokenizer() == nullptr) {
    return Status::Unavailable("the prompt is text and the model has no tokenizer");
  }
  return e.tokenizer()->Encode(r.prompt_text, /*add_bos=*/true);
}

int32_t TurnOf(const TrajectoryRecord& r, int32_t token) {
  int32_t turn = 0;
  for (int32_t b : r.turn_begins) turn += b <= token ? 1 : 0;
  return std::max(turn, 1);
}

engine::SequenceRequest BaseRequest(const TrajectoryRecord& r, uint64_t id, uint64_t group) {
  engine::SequenceRequest q;
  q.id = id;
  q.group_id = group;
  q.sample_index = r.sample_index;
  q.sampling = r.sampling;
  return q;
}

// The first position where a recomputed routing record differs from the recorded one (expert id
// or weight bits; a record of another shape differs at position 0), as a Divergence of the token
// that position's row produced; nullopt when they are equal.
std::optional<Divergence> RoutingDivergence(const TrajectoryRecord& r, const RoutingRecord& got,
                                            int32_t prompt_len) {
  const RoutingRecord& want = r.routing;
  const int64_t per = int64_t(want.n_layers) * want.k;
  const bool same_shape = got.n_layers == want.n_layers && got.k == want.k &&
                          got.expert_ids.size() == want.expert_ids.size() && per > 0;
  int64_t at = -1;
  if (!same_shape) {
    at = 0;
  } else {
    for (size_t i = 0; i < want.expert_ids.size() && at < 0; ++i) {
      if (want.expert_ids[i] != got.expert_ids[i] ||
          std::memcmp(&want.weights[i], &got.weights[i], sizeof(float)) != 0) {
        at = static_cast<int64_t>(i);
      }
    }
  }
  if (at < 0) return std::nullopt;
  const int64_t position = per > 0 ? at / per : 0;
  Divergence d;
  d.token = static_cast<int32_t>(std::clamp<int64_t>(
      position + 1 - prompt_len, 0, std::max<int64_t>(0, int64_t(r.ids.size()) - 1)));
  d.turn = TurnOf(r, d.token);
  d.position = static_cast<int32_t>(position);
  if (!r.ids.empty()) d.recorded_id = d.recomputed_id = r.ids[size_t(d.token)];
  if (!r.logprob_bits.empty())
    d.recorded_bits = d.recomputed_bits = r.logprob_bits[size_t(d.token)];
  char buf[200];
  if (!same_shape) {
    std::snprintf(buf, sizeof(buf),
                  "routing record shape differs (recorded %zu routes, recomputed %zu)",
                  want.expert_ids.size(), got.expert_ids.size());
  } else {
    const size_t i = static_cast<size_t>(at);
    std::snprintf(buf, sizeof(buf),
                  "routing differs at position %lld layer %lld slot %lld: recorded expert %u "
                  "weight %08x, recomputed expert %u weight %08x",
                  static_cast<long long>(position), static_cast<long long>((at % per) / want.k),
                  static_cast<long long>(at % want.k), want.expert_ids[i],
                  std::bit_cast<uint32_t>(want.weights[i]), got.expert_ids[i],
                  std::bit_cast<uint32_t>(got.weights[i]));
  }
  d.what = buf;
  return d;
}

// The sampled runs of a record: [begin, end) of consecutive mask-1 tokens.
std::vector<std::pair<int32_t, int32_t>> SampledRuns(const TrajectoryRecord& r) {
  std::vector<std::pair<int32_t, int32_t>> runs;
  const auto n = static_cast<int32_t>(r.ids.size());
  for (int32_t i = 0; i < n;) {
    if (r.mask[i] == 0) {
      ++i;
      continue;
    }
    int32_t j = i;
    while (j < n && r.mask[j] != 0) ++j;
    runs.emplace_back(i, j);
    i = j;
  }
  return runs;
}

// Which injected token first differs from what the record's tool results encode to, if any.
std::optional<Divergence> CheckToolResults(const TrajectoryRecord& r, const engine::Tokenizer& tk,
                                           int32_t prompt_len) {
  if (r.tool_result_template.empty()) return std::nullopt;
  for (size_t k = 0; k < r.tool_calls.size(); ++k) {
    const RecordToolCall& c = r.tool_calls[k];
    // Call k ended turn k + 1; its result opens turn k + 2.
    if (!c.has_result || k + 1 >= r.turn_begins.size()) continue;
    const int32_t begin = r.turn_begins[k + 1];
    int32_t end = begin;
    while (end < static_cast<int32_t>(r.ids.size()) && r.mask[end] == 0) ++end;
    ToolOutcome o;
    o.exit_status = c.exit_status;
    o.stdout_data = c.stdout_data;
    o.stderr_data = c.stderr_data;
    if (c.error_code != 0) o.error = Status(static_cast<ErrorCode>(c.error_code), c.error_message);
    std::string text = r.tool_result_template;
    const std::string out = ResultText(o);
    for (size_t at = text.find("{output}"); at != std::string::npos;
         at = text.find("{output}", at + out.size())) {
      text.replace(at, 8, out);
    }
    Result<std::vector<int32_t>> want = tk.Encode(text, /*add_bos=*/false);
    if (!want.ok()) continue;
    const auto n = static_cast<int32_t>(want->size());
    for (int32_t t = begin; t <= end; ++t) {
      const int32_t i = t - begin;
      const bool rec_has = t < end, want_has = i < n;
      if (!rec_has && !want_has) break;
      if (rec_has && want_has && r.ids[t] == (*want)[i]) continue;
      Divergence d;
      d.token = rec_has ? t : end - 1;
      d.turn = TurnOf(r, d.token);
      d.position = prompt_len + d.token;
      d.recorded_id = rec_has ? r.ids[t] : -1;
      d.recomputed_id = want_has ? (*want)[i] : -1;
      d.what = "tool result " + std::to_string(c.call_index) + " (" + c.name.substr(0, 32) +
               ") does not encode to the injected tokens";
      return d;
    }
  }
  return std::nullopt;
}

}  // namespace

Result<std::vector<AuditVerdict>> AuditRecords(engine::Engine& e,
                                               const std::vector<AuditItem>& items,
                                               const AuditOptions& options, AuditStats* stats,
                                               const std::function<void(int64_t)>& progress) {
  const engine::ModelInfo& info = e.info();
  const AuditMode mode = options.mode;
  std::vector<AuditVerdict> verdicts(items.size());
  std::map<size_t, ToleranceReport> by_value;  // records audited by value, not bits
  std::vector<std::vector<int32_t>> prompts(items.size());
  std::vector<Job> jobs;
  std::vector<int> pending(items.size(), 0);
  std::map<size_t, Divergence> first_tool;  // injected tokens that do not match their result
  for (size_t i = 0; i < items.size(); ++i) {
    verdicts[i] = Precheck(items[i], i, info);
    if (options.tolerance && verdicts[i].kind == VerdictKind::kFingerprintMismatch) {
      verdicts[i].kind = VerdictKind::kIdentical;  // audited, then reported by value
      by_value[i] = ToleranceReport{};
    }
    if (verdicts[i].kind != VerdictKind::kIdentical) continue;
    const TrajectoryRecord& r = items[i].record;
    Result<std::vector<int32_t>> p = PromptIds(r, e);
    if (!p.ok()) {
      verdicts[i].kind = VerdictKind::kError;
      verdicts[i].detail = "cannot audit: " + p.status().ToString();
      continue;
    }
    prompts[i] = std::move(p).value();
    if (e.tokenizer() != nullptr) {
      if (std::optional<Divergence> d =
              CheckToolResults(r, *e.tokenizer(), static_cast<int32_t>(prompts[i].size()))) {
        first_tool[i] = *d;
      }
    }
    for (uint8_t m : r.mask) verdicts[i].tokens_checked += m;
    if (mode == AuditMode::kRescore) {
      if (!r.ids.empty()) jobs.push_back({i, 0, static_cast<int32_t>(r.ids.size())});
    } else {
      for (const auto& [b, end] : SampledRuns(r)) jobs.push_back({i, b, end - b});
    }
  }
  // Queue every job; a refused one makes its record's verdict kError.
  for (size_t k = 0; k < jobs.size(); ++k) {
    const Job& j = jobs[k];
    AuditVerdict& v = verdicts[j.item];
    if (v.kind != VerdictKind::kIdentical) continue;
    const TrajectoryRecord& r = items[j.item].record;
    engine::SequenceRequest q = BaseRequest(r, k, j.item);
    q.prompt = prompts[j.item];
    if (mode == AuditMode::kRescore) {
      q.forced = r.ids;
      q.return_routing = !r.routing.empty();  // re-derive the routing record too
      q.stop.max_tokens = j.count;
      q.stop.stop_at_eos = false;
      q.stop.stop_at_bos = false;
    } else {
      q.prompt.insert(q.prompt.end(), r.ids.begin(), r.ids.begin() + j.begin);
      q.stop.max_tokens = j.count;
      q.stop.stop_ids = r.stop_ids;
      q.stop.stop_at_eos = r.stop_at_eos;
      q.stop.stop_at_bos = r.stop_at_bos;
    }
    if (Status s = e.Add(std::move(q)); !s.ok()) {
      v.kind = VerdictKind::kError;
      v.detail = "cannot audit: the engine refused the trajectory: " + s.ToString();
      continue;
    }
    ++pending[j.item];
  }
  int64_t done = 0;
  for (size_t i = 0; i < items.size(); ++i) done += pending[i] == 0 ? 1 : 0;
  if (progress) progress(done);
  // Earliest divergence per record (re-run turns finish in any order).
  std::map<size_t, Divergence> first = first_tool;
  const auto t0 = std::chrono::steady_clock::now();
  while (e.HasWork()) {
    Result<engine::StepResult> step = e.Step();
    if (!step.ok()) return step.status();
    if (stats) stats->tokens_processed += step->tokens_processed;
    for (const engine::SequenceOutput& o : step->finished) {
      const Job& j = jobs[o.id];
      const TrajectoryRecord& r = items[j.item].record;
      AuditVerdict& v = verdicts[j.item];
      if (o.finish == FinishReason::kError || o.finish == FinishReason::kAborted) {
        v.kind = VerdictKind::kError;
        v.detail = "cannot audit: the engine failed the trajectory: " + o.error.ToString();
      } else {
        auto tol = by_value.find(j.item);
        for (int32_t k = 0; k < j.count && tol != by_value.end(); ++k) {
          const int32_t t = j.begin + k;
          if (r.mask[t] == 0) continue;
          ToleranceReport& tr = tol->second;
          const bool have = k < static_cast<int32_t>(o.logprobs.size()) &&
                            k < static_cast<int32_t>(o.tokens.size());
          if (!have || o.tokens[k] != r.ids[t]) break;  // rerun: the ids part here
          const double d = std::fabs(static_cast<double>(o.logprobs[k]) -
                                     static_cast<double>(BitsFloat(r.logprob_bits[t])));
          tr.max_abs_diff = std::max(tr.max_abs_diff, d);
          tr.mean_abs_diff += d;  // a sum until the end
          ++tr.compared;
          ++tr.agreeing;
        }
        for (int32_t k = 0; k < j.count && tol == by_value.end(); ++k) {
          const int32_t t = j.begin + k;
          if (r.mask[t] == 0) continue;  // injected: forced, not compared
          const bool have = k < static_cast<int32_t>(o.logprobs.size());
          const uint32_t got = have ? FloatBits(o.logprobs[k]) : 0;
          const int32_t got_id =
              have && k < static_cast<int32_t>(o.tokens.size()) ? o.tokens[k] : -1;
          const bool same = have && got_id == r.ids[t] &&
                            std::memcmp(&got, &r.logprob_bits[t], sizeof(uint32_t)) == 0;
          if (same) continue;
          auto it = first.find(j.item);
          if (it == first.end() || it->second.token > t) {
            Divergence d;
            d.token = t;
            d.turn = TurnOf(r, t);
            d.position = static_cast<int32_t>(prompts[j.item].size()) + t;
            d.recorded_id = r.ids[t];
            d.recomputed_id = got_id;
            d.recorded_bits = r.logprob_bits[t];
            d.recomputed_bits = got;
            d.ulps = have ? UlpDistance(r.logprob_bits[t], got) : 0;
            first[j.item] = d;
          }
          break;
        }
        // Re-scoring a MoE trajectory re-derives its routing record: the first position whose
        // expert ids or weight bits differ is a divergence (when every token agreed).
        if (mode == AuditMode::kRescore && !r.routing.empty() && first.count(j.item) == 0) {
          if (std::optional<Divergence> d =
                  RoutingDivergence(r, o.routing, static_cast<int32_t>(prompts[j.item].size()))) {
            first[j.item] = *d;
          }
        }
      }
      if (--pending[j.item] == 0) ++done;
    }
    if (progress) progress(done);
  }
  if (stats) {
    stats->engine_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  for (auto& [item, tr] : by_value) {
    AuditVerdict& v = verdicts[item];
    // An edited tool result does not depend on the fingerprint: it stays a divergence.
    if (v.kind != VerdictKind::kIdentical || first_tool.count(item) != 0) continue;
    tr.total = v.tokens_checked;
    if (tr.compared > 0) tr.mean_abs_diff /= static_cast<double>(tr.compared);
    v.kind = VerdictKind::kTolerance;
    v.tolerance = tr;
    char buf[320];
    std::snprintf(buf, sizeof(buf),
                  "NOT BITWISE: record fingerprint (kernel %u, chunk %u, backend %s) vs this "
                  "engine's (backend %s): %s %lld of %lld sampled tokens; over those, "
                  "max |dlogprob| %.3g, mean %.3g",
                  items[item].record.fingerprint.kernel_version,
                  items[item].record.fingerprint.attention_chunk,
                  items[item].record.fingerprint.backend.c_str(), info.fingerprint.backend.c_str(),
                  mode == AuditMode::kRerun ? "re-run ids agree on" : "re-scored",
                  static_cast<long long>(tr.agreeing), static_cast<long long>(tr.total),
                  tr.max_abs_diff, tr.mean_abs_diff);
    v.detail = buf;
    first.erase(item);
  }
  for (auto& [item, d] : first) {
    AuditVerdict& v = verdicts[item];
    if (v.kind != VerdictKind::kIdentical) continue;
    v.kind = VerdictKind::kDiverged;
    v.divergence = d;
    char buf[256];
    std::snprintf(buf, sizeof(buf),
                  "diverged at token %d (turn %d, position %d): recorded id %d logprob %.9g "
                  "(%08x), recomputed id %d logprob %.9g (%08x), %llu ULPs",
                  d.token, d.turn, d.position, d.recorded_id, BitsFloat(d.recorded_bits),
                  d.recorded_bits, d.recomputed_id, BitsFloat(d.recomputed_bits), d.recomputed_bits,
                  static_cast<unsigned long long>(d.ulps));
    v.detail = buf;
    if (!d.what.empty()) v.detail += ": " + d.what;
  }
  for (const AuditVerdict& v : verdicts) {
    if (stats && (v.kind == VerdictKind::kIdentical || v.kind == VerdictKind::kDiverged)) {
      stats->tokens_checked += v.tokens_checked;
    }
  }
  return verdicts;
}

}  // namespace bitroll::rollout
