// The audit record (rollout/trajectory_record.h, docs/audit.md): JSON in and out, and the record of
// a logged trajectory.
#include "rollout/trajectory_record.h"

#include <bit>
#include <cctype>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <limits>

#include "rollout/protocol.h"
#include "rollout/tool_call.h"
#include "rollout/wal_log.h"
#include "wal/wal.h"

#ifndef BITROLL_VERSION_STRING
#define BITROLL_VERSION_STRING "unknown"
#endif

namespace bitroll::rollout {

const char* BitrollVersion() {
  return BITROLL_VERSION_STRING;
}

std::string Hex32(uint32_t bits) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%08" PRIx32, bits);
  return buf;
}

std::string Hex64(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, v);
  return buf;
}

uint32_t FloatBits(float f) {
  return std::bit_cast<uint32_t>(f);
}

float BitsFloat(uint32_t bits) {
  return std::bit_cast<float>(bits);
}

namespace {

using nlohmann::json;

// Parses all of `s` as hex of at most `max_digits` digits.
bool ParseHex(const std::string& s, size_t max_digits, uint64_t* out) {
  if (s.empty() || s.size() > max_digits) return false;
  uint64_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      d = c - 'A' + 10;
    } else {
      return false;
    }
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  *out = v;
  return true;
}

bool ParseDecimalU64(const std::string& s, uint64_t* out) {
  if (s.empty() || s.size() > 20) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    const uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (std::numeric_limits<uint64_t>::max() - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

Status Missing(const std::string& field) {
  return Status::InvalidArgument("missing " + field);
}
Status Bad(const std::string& field, const std::string& why) {
  return Status::InvalidArgument("bad " + field + ": " + why);
}

// Reads an integer field into T (range-checked). Absent: Missing unless optional (then untouched).
template <typename T>
Status GetInt(const json& j, const char* key, const std::string& path, T* out,
              bool required = true) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return required ? Missing(path) : Status::Ok();
  if (!it->is_number_integer()) return Bad(path, "not an integer");
  if (it->is_number_unsigned()) {
    const uint64_t v = it->get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<T>::max())) return Bad(path, "out of range");
    *out = static_cast<T>(v);
  } else {
    const int64_t v = it->get<int64_t>();
    if (v < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
        (v > 0 &&
         static_cast<uint64_t>(v) > static_cast<uint64_t>(std::numeric_limits<T>::max()))) {
      return Bad(path, "out of range");
    }
    *out = static_cast<T>(v);
  }
  return Status::Ok();
}

Status GetFloat(const json& j, const char* key, const std::string& path, float* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Missing(path);
  if (!it->is_number()) return Bad(path, "not a number");
  *out = static_cast<float>(it->get<double>());
  return Status::Ok();
}

Status GetString(const json& j, const char* key, const std::string& path, std::string* out,
                 bool required = true) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return required ? Missing(path) : Status::Ok();
  if (!it->is_string()) return Bad(path, "not a string");
  *out = it->get<std::string>();
  return Status::Ok();
}

Status GetBool(const json& j, const char* key, const std::string& path, bool* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::Ok();  // every bool is optional
  if (!it->is_boolean()) return Bad(path, "not a boolean");
  *out = it->get<bool>();
  return Status::Ok();
}

template <typename T>
Status GetIntArray(const json& j, const char* key, std::vector<T>* out, bool required = true) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return required ? Missing(key) : Status::Ok();
  if (!it->is_array()) return Bad(key, "not an array");
  out->clear();
  out->reserve(it->size());
  for (size_t i = 0; i < it->size(); ++i) {
    const json& x = (*it)[i];
    if (!x.is_number_integer()) return Bad(key, "element " + std::to_string(i) + " not integer");
    const int64_t v =
        x.is_number_unsigned()
            ? static_cast<int64_t>(std::min<uint64_t>(x.get<uint64_t>(), uint64_t{1} << 40))
            : x.get<int64_t>();
    if (v < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
        v > static_cast<int64_t>(std::numeric_limits<T>::max())) {
      return Bad(key, "element " + std::to_string(i) + " out of range");
    }
    out->push_back(static_cast<T>(v));
  }
  return Status::Ok();
}

Status ParseToolCall(const json& c, size_t k, RecordToolCall* out) {
  const std::string at = "tool_calls[" + std::to_string(k) + "]";
  if (!c.is_object()) return Bad(at, "not an object");
  BR_RETURN_IF_ERROR(GetInt(c, "call_index", at + ".call_index", &out->call_index));
  BR_RETURN_IF_ERROR(GetInt(c, "token_index", at + ".token_index", &out->token_index));
  BR_RETURN_IF_ERROR(GetString(c, "name", at + ".name", &out->name));
  BR_RETURN_IF_ERROR(GetString(c, "input", at + ".input", &out->input));
  auto r = c.find("result");
  if (r == c.end() || r->is_null()) return Status::Ok();
  if (!r->is_object()) return Bad(at + ".result", "not an object");
  out->has_result = true;
  BR_RETURN_IF_ERROR(GetInt(*r, "exit_status", at + ".result.exit_status", &out->exit_status));
  BR_RETURN_IF_ERROR(GetString(*r, "stdout", at + ".result.stdout", &out->stdout_data));
  BR_RETURN_IF_ERROR(GetString(*r, "stderr", at + ".result.stderr", &out->stderr_data, false));
  BR_RETURN_IF_ERROR(GetString(*r, "error", at + ".result.error", &out->error, false));
  BR_RETURN_IF_ERROR(
      GetInt(*r, "error_code", at + ".result.error_code", &out->error_code, /*required=*/false));
  return GetString(*r, "error_message", at + ".result.error_message", &out->error_message, false);
}

// Turn k + 1 begins at the first token of each run of injected tokens.
std::vector<int32_t> TurnBeginsFromMask(const std::vector<uint8_t>& mask) {
  std::vector<int32_t> b{0};
  for (size_t i = 0; i < mask.size(); ++i) {
    if (mask[i] == 0 && i > 0 && mask[i - 1] != 0) b.push_back(static_cast<int32_t>(i));
  }
  return b;
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

nlohmann::json RecordToJson(const TrajectoryRecord& r) {
  json j;
  j["record_version"] = r.record_version;
  j["bitroll_version"] = r.bitroll_version;
  j["source"] = r.source;
  j["group_id"] = r.group_id;
  j["prompt_index"] = r.prompt_index;
  j["sample_index"] = r.sample_index;
  if (!r.prompt_text.empty() && r.prompt_ids.empty()) {
    j["prompt_text"] = r.prompt_text;
  } else {
    j["prompt_ids"] = r.prompt_ids;
  }
  j["ids"] = r.ids;
  j["mask"] = r.mask;
  std::vector<float> lps;
  std::vector<std::string> bits;
  lps.reserve(r.logprob_bits.size());
  bits.reserve(r.logprob_bits.size());
  for (uint32_t b : r.logprob_bits) {
    lps.push_back(BitsFloat(b));
    bits.push_back(Hex32(b));
  }
  j["logprobs"] = lps;
  j["logprob_bits"] = bits;
  j["turn_begins"] = r.turn_begins;
  json calls = json::array();
  for (const RecordToolCall& c : r.tool_calls) {
    json jc = {{"call_index", c.call_index},
               {"token_index", c.token_index},
               {"name", c.name},
               {"input", c.input}};
    if (c.has_result) {
      jc["result"] = {{"exit_status", c.exit_status}, {"stdout", c.stdout_data},
                      {"stderr", c.stderr_data},      {"error", c.error},
                      {"error_code", c.error_code},   {"error_message", c.error_message}};
    } else {
      jc["result"] = nullptr;
    }
    calls.push_back(std::move(jc));
  }
  j["tool_calls"] = std::move(calls);
  if (!r.routing.empty()) {
    std::vector<std::string> wbits;
    wbits.reserve(r.routing.weights.size());
    for (float w : r.routing.weights) wbits.push_back(Hex32(std::bit_cast<uint32_t>(w)));
    j["routing"] = {{"n_experts", r.routing.n_experts},
                    {"shape", {r.routing.positions(), r.routing.n_layers, r.routing.k}},
                    {"expert_ids", r.routing.expert_ids},
                    {"weight_bits", std::move(wbits)}};
  }
  if (!r.tool_result_template.empty()) j["tool_result_template"] = r.tool_result_template;
  j["sampling"] = {{"temperature", r.sampling.temperature},
                   {"top_k", r.sampling.top_k},
                   {"top_p", r.sampling.top_p},
                   {"min_p", r.sampling.min_p}};
  j["seed"] = std::to_string(r.sampling.seed);
  j["stop"] = {{"max_tokens", r.max_tokens},
               {"stop_ids", r.stop_ids},
               {"stop_at_eos", r.stop_at_eos},
               {"stop_at_bos", r.stop_at_bos}};
  json spans = json::array();
  for (const RecordVersionSpan& v : r.weight_versions) {
    spans.push_back({{"begin", v.begin}, {"version", v.version}});
  }
  j["weight_versions"] = std::move(spans);
  j["fingerprint"] = {{"weights_hash", Hex64(r.fingerprint.weights_hash)},
                      {"kernel_version", r.fingerprint.kernel_version},
                      {"attention_chunk", r.fingerprint.attention_chunk},
                      {"backend", r.fingerprint.backend}};
  j["finish"] = r.finish;
  return j;
}

// The optional "routing" object (see the header).
static Status ParseRouting(const json& rt, RoutingRecord* out) {
  if (!rt.is_object()) return Bad("routing", "not an object");
  auto shape = rt.find("shape");
  auto ids = rt.find("expert_ids");
  auto bits = rt.find("weight_bits");
  auto ne = rt.find("n_experts");
  if (shape == rt.end() || !shape->is_array() || shape->size() != 3 || ids == rt.end() ||
      !ids->is_array() || bits == rt.end() || !bits->is_array() || ne == rt.end() ||
      !ne->is_number_unsigned()) {
    return Bad("routing", "needs n_experts, shape [positions, layers, k], expert_ids, weight_bits");
  }
  for (const json& d : *shape) {
    if (!d.is_number_unsigned()) return Bad("routing", "shape holds a non-count");
  }
  const uint64_t n_experts = ne->get<uint64_t>();
  const uint64_t p = (*shape)[0].get<uint64_t>(), l = (*shape)[1].get<uint64_t>(),
                 k = (*shape)[2].get<uint64_t>();
  if (n_experts > 65535 || l > 65535 || k > 65535 || ids->size() != p * l * k ||
      bits->size() != ids->size()) {
    return Bad("routing", "expert_ids / weight_bits do not match shape");
  }
  out->n_experts = static_cast<int32_t>(n_experts);
  out->n_layers = static_cast<int32_t>(l);
  out->k = static_cast<int32_t>(k);
  for (size_t i = 0; i < ids->size(); ++i) {
    const json& e = (*ids)[i];
    if (!e.is_number_unsigned() || e.get<uint64_t>() >= n_experts) {
      return Bad("routing", "expert id " + std::to_string(i) + " is not in [0, n_experts)");
    }
    out->expert_ids.push_back(static_cast<uint16_t>(e.get<uint64_t>()));
    uint64_t v = 0;
    if (!(*bits)[i].is_string() || !ParseHex((*bits)[i].get<std::string>(), 8, &v)) {
      return Bad("routing", "weight_bits element " + std::to_string(i) + " is not 8 hex digits");
    }
    out->weights.push_back(std::bit_cast<float>(static_cast<uint32_t>(v)));
  }
  return Status::Ok();
}

Result<TrajectoryRecord> RecordFromJson(const nlohmann::json& j) {
  if (!j.is_object()) return Status::InvalidArgument("bad record: not a JSON object");
  TrajectoryRecord r;
  BR_RETURN_IF_ERROR(GetInt(j, "record_version", "record_version", &r.record_version));
  if (r.record_version < 1) return Bad("record_version", "must be >= 1");
  if (r.record_version > kTrajectoryRecordVersion) {
    return Status::Unsupported("record_version " + std::to_string(r.record_version) +
                               " is newer than this bitroll reads (" +
                               std::to_string(kTrajectoryRecordVersion) + ")");
  }
  BR_RETURN_IF_ERROR(GetString(j, "bitroll_version", "bitroll_version", &r.bitroll_version, false));
  BR_RETURN_IF_ERROR(GetString(j, "source", "source", &r.source, false));
  BR_RETURN_IF_ERROR(GetInt(j, "group_id", "group_id", &r.group_id, false));
  BR_RETURN_IF_ERROR(GetInt(j, "prompt_index", "prompt_index", &r.prompt_index, false));
  BR_RETURN_IF_ERROR(GetInt(j, "sample_index", "sample_index", &r.sample_index));
  if (j.contains("prompt_ids") || !j.contains("prompt_text")) {
    BR_RETURN_IF_ERROR(GetIntArray(j, "prompt_ids", &r.prompt_ids));
    if (r.prompt_ids.empty()) return Bad("prompt_ids", "empty");
  } else {
    BR_RETURN_IF_ERROR(GetString(j, "prompt_text", "prompt_text", &r.prompt_text));
  }
  BR_RETURN_IF_ERROR(GetIntArray(j, "ids", &r.ids));
  BR_RETURN_IF_ERROR(GetIntArray(j, "mask", &r.mask));
  for (uint8_t m : r.mask) {
    if (m > 1) return Bad("mask", "elements must be 0 or 1");
  }
  auto bits = j.find("logprob_bits");
  if (bits == j.end() || bits->is_null()) return Missing("logprob_bits");
  if (!bits->is_array()) return Bad("logprob_bits", "not an array");
  for (size_t i = 0; i < bits->size(); ++i) {
    const json& b = (*bits)[i];
    uint64_t v = 0;
    if (b.is_string()) {
      if (!ParseHex(b.get<std::string>(), 8, &v)) {
        return Bad("logprob_bits", "element " + std::to_string(i) + " is not 8 hex digits");
      }
    } else if (b.is_number_unsigned() && b.get<uint64_t>() <= 0xffffffffu) {
      v = b.get<uint64_t>();
    } else {
      return Bad("logprob_bits", "element " + std::to_string(i) + " is not a uint32");
    }
    r.logprob_bits.push_back(static_cast<uint32_t>(v));
  }
  if (r.mask.size() != r.ids.size() || r.logprob_bits.size() != r.ids.size()) {
    return Bad("ids", "ids (" + std::to_string(r.ids.size()) + "), mask (" +
                          std::to_string(r.mask.size()) + ") and logprob_bits (" +
                          std::to_string(r.logprob_bits.size()) + ") differ in length");
  }
  BR_RETURN_IF_ERROR(GetIntArray(j, "turn_begins", &r.turn_begins, false));
  if (r.turn_begins.empty()) r.turn_begins = TurnBeginsFromMask(r.mask);
  if (auto tc = j.find("tool_calls"); tc != j.end() && !tc->is_null()) {
    if (!tc->is_array()) return Bad("tool_calls", "not an array");
    for (size_t k = 0; k < tc->size(); ++k) {
      RecordToolCall c;
      BR_RETURN_IF_ERROR(ParseToolCall((*tc)[k], k, &c));
      r.tool_calls.push_back(std::move(c));
    }
  }
  if (auto rt = j.find("routing"); rt != j.end() && !rt->is_null()) {
    BR_RETURN_IF_ERROR(ParseRouting(*rt, &r.routing));
  }
  BR_RETURN_IF_ERROR(
      GetString(j, "tool_result_template", "tool_result_template", &r.tool_result_template, false));
  auto sp = j.find("sampling");
  if (sp == j.end() || sp->is_null()) return Missing("sampling");
  if (!sp->is_object()) return Bad("sampling", "not an object");
  BR_RETURN_IF_ERROR(GetFloat(*sp, "temperature", "sampling.temperature", &r.sampling.temperature));
  BR_RETURN_IF_ERROR(GetInt(*sp, "top_k", "sampling.top_k", &r.sampling.top_k));
  BR_RETURN_IF_ERROR(GetFloat(*sp, "top_p", "sampling.top_p", &r.sampling.top_p));
  BR_RETURN_IF_ERROR(GetFloat(*sp, "min_p", "sampling.min_p", &r.sampling.min_p));
  auto seed = j.find("seed");
  if (seed == j.end() || seed->is_null()) return Missing("seed");
  if (seed->is_string()) {
    if (!ParseDecimalU64(seed->get<std::string>(), &r.sampling.seed)) {
      return Bad("seed", "not a decimal uint64");
    }
  } else if (seed->is_number_unsigned()) {
    r.sampling.seed = seed->get<uint64_t>();
  } else {
    return Bad("seed", "not a decimal string or unsigned integer");
  }
  if (auto st = j.find("stop"); st != j.end() && !st->is_null()) {
    if (!st->is_object()) return Bad("stop", "not an object");
    BR_RETURN_IF_ERROR(GetInt(*st, "max_tokens", "stop.max_tokens", &r.max_tokens, false));
    BR_RETURN_IF_ERROR(GetIntArray(*st, "stop_ids", &r.stop_ids, false));
    BR_RETURN_IF_ERROR(GetBool(*st, "stop_at_eos", "stop.stop_at_eos", &r.stop_at_eos));
    BR_RETURN_IF_ERROR(GetBool(*st, "stop_at_bos", "stop.stop_at_bos", &r.stop_at_bos));
  }
  auto wv = j.find("weight_versions");
  if (wv == j.end() || wv->is_null()) return Missing("weight_versions");
  if (!wv->is_array() || wv->empty()) return Bad("weight_versions", "not a non-empty array");
  for (size_t k = 0; k < wv->size(); ++k) {
    const std::string at = "weight_versions[" + std::to_string(k) + "]";
    if (!(*wv)[k].is_object()) return Bad(at, "not an object");
    RecordVersionSpan v;
    BR_RETURN_IF_ERROR(GetInt((*wv)[k], "begin", at + ".begin", &v.begin));
    BR_RETURN_IF_ERROR(GetInt((*wv)[k], "version", at + ".version", &v.version));
    r.weight_versions.push_back(v);
  }
  auto fp = j.find("fingerprint");
  if (fp == j.end() || fp->is_null()) return Missing("fingerprint");
  if (!fp->is_object()) return Bad("fingerprint", "not an object");
  std::string hash;
  BR_RETURN_IF_ERROR(GetString(*fp, "weights_hash", "fingerprint.weights_hash", &hash));
  if (!ParseHex(hash, 16, &r.fingerprint.weights_hash)) {
    return Bad("fingerprint.weights_hash", "not 16 hex digits");
  }
  BR_RETURN_IF_ERROR(
      GetInt(*fp, "kernel_version", "fingerprint.kernel_version", &r.fingerprint.kernel_version));
  BR_RETURN_IF_ERROR(GetInt(*fp, "attention_chunk", "fingerprint.attention_chunk",
                            &r.fingerprint.attention_chunk));
  BR_RETURN_IF_ERROR(GetString(*fp, "backend", "fingerprint.backend", &r.fingerprint.backend));
  BR_RETURN_IF_ERROR(GetString(j, "finish", "finish", &r.finish, false));
  return r;
}

Result<TrajectoryRecord> RecordFromWal(const wal::TrajectoryLog& log) {
  const wal::TrajectoryHeader& h = log.header;
  const std::string where = "trajectory " + std::to_string(log.id);
  std::vector<uint64_t> storage;
  const void* data = AlignForRead(h.request.data(), h.request.size(), &storage);
  DecodeLimits limits;
  limits.max_message_bytes = std::max<uint64_t>(limits.max_message_bytes, h.request.size());
  Result<const wire::Envelope*> env = DecodeEnvelope(data, h.request.size(), limits);
  if (!env.ok()) return Status::Corruption(where + ": logged request: " + env.status().message());
  const wire::SubmitRollouts* m = (*env)->msg_as_SubmitRollouts();
  if (m == nullptr || m->prompts() == nullptr || m->n() == 0) {
    return Status::Corruption(where + ": logged request is not a SubmitRollouts with prompts");
  }
  TrajectoryRecord r;
  r.bitroll_version = BitrollVersion();
  r.source = "wal";
  r.group_id = m->group_id();  // the client's (the header's is the coordinator's serial)
  r.sample_index = h.sample_index;
  r.prompt_index = WalFlatOf(log.id) / m->n();
  if (r.prompt_index >= m->prompts()->size()) {
    return Status::Corruption(where + ": prompt " + std::to_string(r.prompt_index) +
                              " not in the logged request");
  }
  const wire::Prompt* p = m->prompts()->Get(r.prompt_index);
  if (p->ids() != nullptr && p->ids()->size() > 0) {
    r.prompt_ids.assign(p->ids()->begin(), p->ids()->end());
  } else if (p->text() != nullptr) {
    r.prompt_text = p->text()->str();
  } else {
    return Status::Corruption(where + ": logged prompt is empty");
  }
  const LoggedTurns lt = RebuildTurns(log);
  r.ids = lt.ids;
  std::vector<float> lps = lt.lps;
  r.mask = lt.mask;
  r.ids.insert(r.ids.end(), lt.turn_ids.begin(), lt.turn_ids.end());
  lps.insert(lps.end(), lt.turn_lps.begin(), lt.turn_lps.end());
  r.mask.resize(r.ids.size(), 1);
  for (float f : lps) r.logprob_bits.push_back(FloatBits(f));
  for (size_t i = 0; i < r.mask.size(); ++i) {
    if (r.mask[i] == 0) r.logprob_bits[i] = 0;
  }
  r.turn_begins = TurnBeginsFromMask(r.mask);
  for (size_t k = 0; k < lt.calls.size() && k < log.tool_calls.size(); ++k) {
    const ToolOutcome& o = lt.calls[k];
    RecordToolCall c;
    c.call_index = log.tool_calls[k].call.call_index;
    c.token_index = o.token_index;
    c.name = o.name;
    c.input = o.input;
    c.has_result = log.tool_calls[k].result.has_value();
    c.exit_status = o.exit_status;
    c.stdout_data = o.stdout_data;
    c.stderr_data = o.stderr_data;
    if (!o.error.ok()) {
      c.error = o.error.ToString();
      c.error_code = static_cast<int32_t>(o.error.code());
      c.error_message = o.error.message();
    }
    r.tool_calls.push_back(std::move(c));
  }
  if (!log.tool_calls.empty()) {
    r.tool_result_template = m->tool_result_template() && m->tool_result_template()->size() > 0
                                 ? m->tool_result_template()->str()
                                 : std::string(kDefaultResultTemplate);
  }
  r.sampling = h.sampling;
  r.max_tokens = static_cast<int32_t>(h.max_tokens);
  if (m->stop_ids()) r.stop_ids.assign(m->stop_ids()->begin(), m->stop_ids()->end());
  r.stop_at_eos = m->stop_at_eos();
  r.stop_at_bos = true;  // replicas keep the engine's default
  for (const wire::VersionSpan& v : lt.versions)
    r.weight_versions.push_back({v.begin(), v.version()});
  if (r.weight_versions.empty()) r.weight_versions.push_back({0, h.weight_version});
  r.fingerprint = h.fingerprint;
  r.finish =
      log.finish
          ? Lower(wire::EnumNameFinishReason(static_cast<wire::FinishReason>(log.finish->reason)))
          : "unfinished";
  if (log.finish) r.routing = log.finish->routing;
  return r;
}

}  // namespace bitroll::rollout
