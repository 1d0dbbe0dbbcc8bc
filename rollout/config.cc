#include "rollout/config.h"

#include <charconv>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace bitroll::rollout {

namespace {

using json = nlohmann::json;

template <typename T>
Status Get(const json& j, const char* key, T* out) {
  auto it = j.find(key);
  if (it == j.end()) return Status::Ok();
  try {
    *out = it->get<T>();
  } catch (const json::exception& e) {
    return Status::InvalidArgument(std::string("config key '") + key + "': " + e.what());
  }
  return Status::Ok();
}

Status CheckKeys(const json& j, std::initializer_list<const char*> known, const char* where) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool ok = false;
    for (const char* k : known) ok = ok || it.key() == k;
    if (!ok)
      return Status::InvalidArgument(std::string("unknown config key '") + it.key() + "' in " +
                                     where);
  }
  return Status::Ok();
}

template <typename T>
Status ParseNumber(const char* flag, const char* text, T* out) {
  if constexpr (std::is_floating_point_v<T>) {
    char* end = nullptr;
    const double v = std::strtod(text, &end);
    if (end == text || *end != '\0') {
      return Status::InvalidArgument(std::string(flag) + ": not a number: " + text);
    }
    *out = static_cast<T>(v);
  } else {
    const char* end = text + std::strlen(text);
    auto [p, ec] = std::from_chars(text, end, *out);
    if (ec != std::errc() || p != end) {
      return Status::InvalidArgument(std::string(flag) + ": not an integer: " + text);
    }
  }
  return Status::Ok();
}

}  // namespace

Status ParseConfigJson(const std::string& text, ServeConfig* c) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Status::InvalidArgument("config is not a JSON object");
  }
  BR_RETURN_IF_ERROR(CheckKeys(j,
                               {"bind",
                                "replica_bind",
                                "replicas",
                                "engine",
                                "model",
                                "tokenizer",
                                "threads",
                                "device",
                                "kv_cache_bytes",
                                "max_queued",
                                "replica_timeout_ms",
                                "stream_timeout_ms",
                                "max_client_buffer_bytes",
                                "retention",
                                "replica_capacity",
                                "weights_load_timeout_ms",
                                "max_message_bytes",
                                "limits",
                                "price",
                                "null_engine",
                                "log_level",
                                "tools"},
                               "the top level"));
  auto& co = c->coordinator;
  BR_RETURN_IF_ERROR(Get(j, "bind", &co.bind));
  BR_RETURN_IF_ERROR(Get(j, "replica_bind", &co.replica_bind));
  BR_RETURN_IF_ERROR(Get(j, "replicas", &c->replicas));
  BR_RETURN_IF_ERROR(Get(j, "engine", &c->engine));
  BR_RETURN_IF_ERROR(Get(j, "model", &c->engine_options.model_path));
  BR_RETURN_IF_ERROR(Get(j, "tokenizer", &c->engine_options.tokenizer_path));
  BR_RETURN_IF_ERROR(Get(j, "threads", &c->engine_options.threads));
  BR_RETURN_IF_ERROR(Get(j, "device", &c->engine_options.device));
  BR_RETURN_IF_ERROR(Get(j, "kv_cache_bytes", &c->engine_options.kv_cache_bytes));
  BR_RETURN_IF_ERROR(Get(j, "max_queued", &co.max_queued));
  BR_RETURN_IF_ERROR(Get(j, "replica_timeout_ms", &co.replica_timeout_ms));
  BR_RETURN_IF_ERROR(Get(j, "stream_timeout_ms", &co.stream_timeout_ms));
  BR_RETURN_IF_ERROR(Get(j, "max_client_buffer_bytes", &co.max_client_buffer_bytes));
  if (auto it = j.find("retention"); it != j.end()) {
    BR_RETURN_IF_ERROR(CheckKeys(*it, {"max_age_s", "max_groups"}, "retention"));
    BR_RETURN_IF_ERROR(Get(*it, "max_age_s", &co.retention.max_age_s));
    BR_RETURN_IF_ERROR(Get(*it, "max_groups", &co.retention.max_groups));
  }
  BR_RETURN_IF_ERROR(Get(j, "replica_capacity", &co.local_replica.capacity));
  BR_RETURN_IF_ERROR(Get(j, "weights_load_timeout_ms", &co.local_replica.weights_load_timeout_ms));
  BR_RETURN_IF_ERROR(Get(j, "max_message_bytes", &co.decode.max_message_bytes));
  BR_RETURN_IF_ERROR(Get(j, "log_level", &c->log_level));
  if (auto it = j.find("limits"); it != j.end()) {
    BR_RETURN_IF_ERROR(CheckKeys(
        *it,
        {"max_prompts", "max_n", "max_samples", "max_tokens", "max_turns", "max_prompt_tokens"},
        "limits"));
    BR_RETURN_IF_ERROR(Get(*it, "max_prompts", &co.submit.max_prompts));
    BR_RETURN_IF_ERROR(Get(*it, "max_n", &co.submit.max_n));
    BR_RETURN_IF_ERROR(Get(*it, "max_samples", &co.submit.max_samples));
    BR_RETURN_IF_ERROR(Get(*it, "max_tokens", &co.submit.max_tokens));
    BR_RETURN_IF_ERROR(Get(*it, "max_turns", &co.submit.max_turns));
    BR_RETURN_IF_ERROR(Get(*it, "max_prompt_tokens", &co.submit.max_prompt_tokens));
  }
  if (auto it = j.find("tools"); it != j.end()) {
    BR_RETURN_IF_ERROR(CheckKeys(*it, {"work_root", "disk_bytes"}, "tools"));
    BR_RETURN_IF_ERROR(Get(*it, "work_root", &co.tools.sandbox.work_root));
    BR_RETURN_IF_ERROR(Get(*it, "disk_bytes", &co.tools.sandbox.work_disk_bytes));
  }
  if (auto it = j.find("price"); it != j.end()) {
    BR_RETURN_IF_ERROR(CheckKeys(*it, {"replica_hour_usd", "sandbox_cpu_hour_usd"}, "price"));
    BR_RETURN_IF_ERROR(Get(*it, "replica_hour_usd", &co.price.replica_hour_usd));
    BR_RETURN_IF_ERROR(Get(*it, "sandbox_cpu_hour_usd", &co.price.sandbox_cpu_hour_usd));
  }
  if (auto it = j.find("null_engine"); it != j.end()) {
    BR_RETURN_IF_ERROR(CheckKeys(*it, {"vocab_size", "max_seq_len", "eos_period", "step_delay_us"},
                                 "null_engine"));
    BR_RETURN_IF_ERROR(Get(*it, "vocab_size", &c->null_engine.vocab_size));
    BR_RETURN_IF_ERROR(Get(*it, "max_seq_len", &c->null_engine.max_seq_len));
    BR_RETURN_IF_ERROR(Get(*it, "eos_period", &c->null_engine.eos_period));
    BR_RETURN_IF_ERROR(Get(*it, "step_delay_us", &c->null_engine.step_delay_us));
  }
  return Status::Ok();
}

Status LoadConfigFile(const std::string& path, ServeConfig* config) {
  std::ifstream in(path);
  if (!in) return Status::NotFound("config file " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Status::IoError("reading " + path);
  return ParseConfigJson(ss.str(), config).WithContext(path);
}

Status ApplyFlags(int argc, char** argv, int first, ServeConfig* c) {
  // --config first, so that the other flags override it wherever they appear.
  for (int i = first; i < argc; ++i) {
    if (std::string(argv[i]) == "--config") {
      if (i + 1 >= argc) return Status::InvalidArgument("--config needs a value");
      BR_RETURN_IF_ERROR(LoadConfigFile(argv[i + 1], c));
    }
  }
  auto& co = c->coordinator;
  for (int i = first; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) return Status::InvalidArgument(flag + " needs a value (or is unknown)");
    const char* v = argv[++i];
    if (flag == "--config") {
      continue;
    } else if (flag == "--model") {
      c->engine_options.model_path = v;
    } else if (flag == "--replicas") {
      BR_RETURN_IF_ERROR(ParseNumber("--replicas", v, &c->replicas));
    } else if (flag == "--bind") {
      co.bind = v;
    } else if (flag == "--replica-bind") {
      co.replica_bind = v;
    } else if (flag == "--connect") {
      c->connect = v;
    } else if (flag == "--engine") {
      c->engine = v;
    } else if (flag == "--name") {
      c->name = v;
    } else if (flag == "--threads") {
      BR_RETURN_IF_ERROR(ParseNumber("--threads", v, &c->engine_options.threads));
    } else if (flag == "--device") {
      c->engine_options.device = v;  // cpu | cuda; OpenEngine says why another cannot run
    } else if (flag == "--max-queued") {
      BR_RETURN_IF_ERROR(ParseNumber("--max-queued", v, &co.max_queued));
    } else if (flag == "--replica-timeout-ms") {
      BR_RETURN_IF_ERROR(ParseNumber("--replica-timeout-ms", v, &co.replica_timeout_ms));
    } else if (flag == "--weights-load-timeout-ms") {
      BR_RETURN_IF_ERROR(
          ParseNumber("--weights-load-timeout-ms", v, &co.local_replica.weights_load_timeout_ms));
    } else if (flag == "--stream-timeout-ms") {
      BR_RETURN_IF_ERROR(ParseNumber("--stream-timeout-ms", v, &co.stream_timeout_ms));
    } else if (flag == "--max-client-buffer-bytes") {
      BR_RETURN_IF_ERROR(ParseNumber("--max-client-buffer-bytes", v, &co.max_client_buffer_bytes));
    } else if (flag == "--retention-max-age-s") {
      BR_RETURN_IF_ERROR(ParseNumber("--retention-max-age-s", v, &co.retention.max_age_s));
    } else if (flag == "--retention-max-groups") {
      BR_RETURN_IF_ERROR(ParseNumber("--retention-max-groups", v, &co.retention.max_groups));
    } else if (flag == "--price-replica-hour") {
      BR_RETURN_IF_ERROR(ParseNumber("--price-replica-hour", v, &co.price.replica_hour_usd));
    } else if (flag == "--null-delay-us") {
      BR_RETURN_IF_ERROR(ParseNumber("--null-delay-us", v, &c->null_engine.step_delay_us));
    } else if (flag == "--null-vocab") {
      BR_RETURN_IF_ERROR(ParseNumber("--null-vocab", v, &c->null_engine.vocab_size));
    } else if (flag == "--data-dir") {
      co.wal.dir = v;
    } else if (flag == "--durability") {
      const std::string d = v;
      if (d == "sync") {
        co.wal.durability = wal::Durability::kSyncEveryCommit;
      } else if (d == "window") {
        co.wal.durability = wal::Durability::kWindow;
      } else if (d == "none") {
        co.wal.durability = wal::Durability::kNone;
      } else {
        return Status::InvalidArgument("--durability must be sync, window or none");
      }
    } else if (flag == "--wal-commit-ms") {
      BR_RETURN_IF_ERROR(ParseNumber("--wal-commit-ms", v, &co.wal.commit_interval_ms));
    } else if (flag == "--wal-sync-window-ms") {
      BR_RETURN_IF_ERROR(ParseNumber("--wal-sync-window-ms", v, &co.wal.sync_window_ms));
    } else if (flag == "--tool-workers") {
      BR_RETURN_IF_ERROR(ParseNumber("--tool-workers", v, &co.tools.workers));
    } else if (flag == "--tool-append-file") {
      co.tools.functions.append_file = v;
    } else if (flag == "--tool-append-delay-ms") {
      BR_RETURN_IF_ERROR(
          ParseNumber("--tool-append-delay-ms", v, &co.tools.functions.append_delay_ms));
    } else if (flag == "--tool-uid-base") {
      BR_RETURN_IF_ERROR(ParseNumber("--tool-uid-base", v, &co.tools.sandbox.uid_base));
    } else if (flag == "--tool-work-root") {
      co.tools.sandbox.work_root = v;
    } else if (flag == "--tool-disk-bytes") {
      BR_RETURN_IF_ERROR(ParseNumber("--tool-disk-bytes", v, &co.tools.sandbox.work_disk_bytes));
    } else if (flag == "--tool-max-concurrent") {
      BR_RETURN_IF_ERROR(ParseNumber("--tool-max-concurrent", v, &co.tools.sandbox.max_concurrent));
    } else if (flag == "--price-sandbox-cpu-hour") {
      BR_RETURN_IF_ERROR(
          ParseNumber("--price-sandbox-cpu-hour", v, &co.price.sandbox_cpu_hour_usd));
    } else if (flag == "--log-level") {
      c->log_level = v;
    } else {
      return Status::InvalidArgument("unknown flag " + flag);
    }
  }
  if (c->replicas < 0 || c->replicas > 1024) {
    return Status::InvalidArgument("--replicas must be in [0, 1024]");
  }
  if (c->engine != "auto" && c->engine != "null") {
    return Status::InvalidArgument("--engine must be auto or null");
  }
  if (c->null_engine.vocab_size < 4) return Status::InvalidArgument("null vocab must be >= 4");
  if (co.tools.workers < 1 || co.tools.workers > 4096) {
    return Status::InvalidArgument("--tool-workers must be in [1, 4096]");
  }
  if (co.tools.functions.append_delay_ms < 0) {
    return Status::InvalidArgument("--tool-append-delay-ms must be >= 0");
  }
  return Status::Ok();
}

}  // namespace bitroll::rollout
