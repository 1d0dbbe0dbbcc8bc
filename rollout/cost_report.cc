#include "rollout/cost_report.h"

#include <cinttypes>
#include <cstdio>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

namespace bitroll::rollout {

namespace {

using json = nlohmann::json;

template <typename T>
T Num(const json& j, std::initializer_list<const char*> keys, T fallback) {
  for (const char* k : keys) {
    auto it = j.find(k);
    if (it != j.end() && it->is_number()) return it->get<T>();
  }
  return fallback;
}

std::string Fmt(const char* f, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof(buf), f, args...);
  return buf;
}

json CostJson(const Cost& c) {
  return {{"prefill_computed", c.prefill_computed},
          {"prefill_cached", c.prefill_cached},
          {"decode_tokens", c.decode_tokens},
          {"engine_seconds", c.engine_seconds},
          {"queue_seconds", c.queue_seconds},
          {"sandbox_seconds", c.sandbox_seconds},
          {"wal_bytes", c.wal_bytes},
          {"price_usd", c.price_usd}};
}

}  // namespace

Result<std::vector<CostRow>> ParseCostRows(const std::string& jsonl,
                                           const CostReportOptions& options) {
  std::vector<CostRow> rows;
  std::istringstream in(jsonl);
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return Status::InvalidArgument("line " + std::to_string(lineno) + ": not a JSON object");
    }
    const json cost = j.value("cost", json::object());
    if (!cost.is_object()) {
      return Status::InvalidArgument("line " + std::to_string(lineno) + ": cost is not an object");
    }
    CostRow r;
    r.group_id = Num<uint64_t>(j, {"group_id"}, 0);
    r.prompt_index = Num<uint32_t>(j, {"prompt_index"}, 0);
    r.sample_index = Num<uint32_t>(j, {"sample_index"}, 0);
    r.turns = Num<int32_t>(j, {"turns"}, 1);
    if (auto it = j.find("prompt_ids"); it != j.end() && it->is_array()) {
      r.prompt_tokens = static_cast<int64_t>(it->size());
    }
    Cost& c = r.cost;
    c.prefill_computed = Num<int64_t>(cost, {"prefill_computed", "prefill_tokens_computed"}, 0);
    c.prefill_cached = Num<int64_t>(cost, {"prefill_cached", "prefill_tokens_cached"}, 0);
    int64_t generated = 0;
    if (auto it = j.find("ids"); it != j.end() && it->is_array()) {
      generated = static_cast<int64_t>(it->size());
    }
    c.decode_tokens = Num<int64_t>(cost, {"decode_tokens"}, generated);
    c.engine_seconds = Num<double>(cost, {"engine_seconds"}, 0.0);
    c.queue_seconds = Num<double>(cost, {"queue_seconds"}, 0.0);
    c.sandbox_seconds = Num<double>(cost, {"sandbox_seconds"}, 0.0);
    c.sandbox_cpu_seconds = Num<double>(cost, {"sandbox_cpu_seconds"}, 0.0);
    c.wal_bytes = Num<int64_t>(cost, {"wal_bytes"}, 0);
    c.price_usd = c.engine_seconds * options.price.replica_hour_usd / 3600.0 +
                  c.sandbox_cpu_seconds * options.price.sandbox_cpu_hour_usd / 3600.0;
    if (r.prompt_tokens == 0) r.prompt_tokens = c.prefill_computed + c.prefill_cached;
    if (r.turns > 1) {
      r.regime = "agentic";
    } else if (r.prompt_tokens + std::max(generated, c.decode_tokens) >=
               options.long_context_tokens) {
      r.regime = "long_context";
    } else {
      r.regime = "short_chat";
    }
    rows.push_back(std::move(r));
  }
  return rows;
}

Result<std::string> RenderCostReport(const std::vector<CostRow>& rows, const std::string& format) {
  std::map<uint64_t, Cost> groups;
  std::map<uint64_t, int> group_n;
  std::map<std::string, Cost> regimes;
  std::map<std::string, int> regime_n;
  for (const CostRow& r : rows) {
    groups[r.group_id].Add(r.cost);
    ++group_n[r.group_id];
    regimes[r.regime].Add(r.cost);
    ++regime_n[r.regime];
  }
  std::string out;
  if (format == "csv") {
    out =
        "group_id,prompt_index,sample_index,regime,turns,prompt_tokens,prefill_computed,"
        "prefill_cached,decode_tokens,engine_seconds,queue_seconds,sandbox_seconds,"
        "wal_bytes,price_usd\n";
    for (const CostRow& r : rows) {
      const Cost& c = r.cost;
      out += Fmt("%" PRIu64 ",%u,%u,%s,%d,%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64
                 ",%.9f,%.9f,%.9f,%" PRId64 ",%.9f\n",
                 r.group_id, r.prompt_index, r.sample_index, r.regime.c_str(), r.turns,
                 r.prompt_tokens, c.prefill_computed, c.prefill_cached, c.decode_tokens,
                 c.engine_seconds, c.queue_seconds, c.sandbox_seconds, c.wal_bytes, c.price_usd);
    }
    return out;
  }
  if (format == "json") {
    json j = {
        {"trajectories", rows.size()}, {"groups", json::array()}, {"regimes", json::object()}};
    for (const auto& [g, c] : groups) {
      json e = CostJson(c);
      e["group_id"] = g;
      e["trajectories"] = group_n[g];
      j["groups"].push_back(e);
    }
    for (const auto& [name, c] : regimes) {
      json e = CostJson(c);
      e["trajectories"] = regime_n[name];
      j["regimes"][name] = e;
    }
    return j.dump(2) + "\n";
  }
  if (format != "table") {
    return Status::InvalidArgument("unknown format '" + format + "' (table, csv or json)");
  }
  const char* head = "%8s %6s %6s %12s %8s %8s %8s %10s %10s %10s\n";
  const char* row =
      "%8" PRIu64 " %6u %6u %12s %8" PRId64 " %8" PRId64 " %8" PRId64 " %10.6f %10.6f %10.6f\n";
  out += "per trajectory\n";
  out += Fmt(head, "group", "prompt", "sample", "regime", "computed", "cached", "decode",
             "engine s", "queue s", "price $");
  for (const CostRow& r : rows) {
    const Cost& c = r.cost;
    out +=
        Fmt(row, r.group_id, r.prompt_index, r.sample_index, r.regime.c_str(), c.prefill_computed,
            c.prefill_cached, c.decode_tokens, c.engine_seconds, c.queue_seconds, c.price_usd);
  }
  const char* ghead = "%14s %6s %10s %8s %8s %10s %10s %12s\n";
  const char* grow = "%14s %6d %10" PRId64 " %8" PRId64 " %8" PRId64 " %10.6f %10.6f %12.4f\n";
  out += "\nper group\n";
  out += Fmt(ghead, "group", "trajs", "computed", "cached", "decode", "engine s", "price $",
             "decode tok/s");
  for (const auto& [g, c] : groups) {
    out += Fmt(grow, std::to_string(g).c_str(), group_n[g], c.prefill_computed, c.prefill_cached,
               c.decode_tokens, c.engine_seconds, c.price_usd,
               c.engine_seconds > 0 ? c.decode_tokens / c.engine_seconds : 0.0);
  }
  out += "\nper regime\n";
  out += Fmt(ghead, "regime", "trajs", "computed", "cached", "decode", "engine s", "price $",
             "decode tok/s");
  for (const auto& [name, c] : regimes) {
    out += Fmt(grow, name.c_str(), regime_n[name], c.prefill_computed, c.prefill_cached,
               c.decode_tokens, c.engine_seconds, c.price_usd,
               c.engine_seconds > 0 ? c.decode_tokens / c.engine_seconds : 0.0);
  }
  return out;
}

}  // namespace bitroll::rollout
