#include "rollout/config.h"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "rollout/cli_args.h"
#include "rollout/engine_flags.h"

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
                                "isa",
                                "attention",
                                "max_step_tokens",
                                "max_running",
                                "max_prefill_chunk",
                                "kv_dtype",
                                "prefix_cache",
                                "kv_disk_dir",
                                "kv_disk_bytes",
                                "swa_cache",
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
                                "metrics_bind",
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
  BR_RETURN_IF_ERROR(Get(j, "isa", &c->engine_options.isa));
  BR_RETURN_IF_ERROR(Get(j, "attention", &c->engine_options.attention));
  BR_RETURN_IF_ERROR(Get(j, "max_step_tokens", &c->engine_options.max_step_tokens));
  BR_RETURN_IF_ERROR(Get(j, "max_running", &c->engine_options.max_running));
  BR_RETURN_IF_ERROR(Get(j, "max_prefill_chunk", &c->engine_options.max_prefill_chunk));
  BR_RETURN_IF_ERROR(Get(j, "kv_dtype", &c->engine_options.kv_dtype));
  BR_RETURN_IF_ERROR(Get(j, "prefix_cache", &c->engine_options.prefix_cache));
  BR_RETURN_IF_ERROR(Get(j, "kv_disk_dir", &c->engine_options.kv_disk_dir));
  BR_RETURN_IF_ERROR(Get(j, "kv_disk_bytes", &c->engine_options.kv_disk_bytes));
  BR_RETURN_IF_ERROR(Get(j, "swa_cache", &c->engine_options.swa_cache));
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
  BR_RETURN_IF_ERROR(Get(j, "metrics_bind", &c->metrics_bind));
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

namespace {

std::string Default(const std::string& help, const std::string& value) {
  return help + " (default " + value + ")";
}

template <typename T>
std::string Default(const std::string& help, T value) {
  return Default(help, std::to_string(value));
}

// The service's own flags: what it runs and where it listens (and, for a replica, connects).
void AddMainFlags(CliParser* p, ServeConfig* c) {
  // Declared first: the file is read before any other flag is applied, so flags override it.
  p->Value("--config", "JSON config file (docs/protocol.md); the other flags override it",
           "FILE.json", [c](const std::string& v) { return LoadConfigFile(v, c); });
  auto& eo = c->engine_options;
  p->String("--model", &eo.model_path, "model: llama2.c .bin, GGUF or Hugging Face folder", "PATH");
  p->String("--tokenizer", &eo.tokenizer_path,
            "tokenizer (default: tokenizer.bin or tok<vocab>.bin beside the model)", "PATH");
  p->Integer("--replicas", &c->replicas, Default("in-process replicas, 0 to 1024", c->replicas));
  p->String("--bind", &c->coordinator.bind,
            Default("client endpoint; port * picks one", c->coordinator.bind), "EP");
  p->String("--replica-bind", &c->coordinator.replica_bind,
            "endpoint for `bitroll replica` processes (none by default)", "EP");
  p->String("--connect", &c->connect, "replica: the coordinator's --replica-bind endpoint", "EP");
  p->String("--name", &c->name, "replica: its name (default host:pid)", "S");
  p->String("--engine", &c->engine,
            Default("auto (the model engine) or null (the test double)", c->engine), "auto|null");
  p->String("--device", &eo.device, Default("where the forward pass runs", eo.device), "cpu|cuda");
  p->Integer("--threads", &eo.threads, Default("kernel threads per replica", eo.threads));
  p->Integer("--weights-load-timeout-ms", &c->coordinator.local_replica.weights_load_timeout_ms,
             Default("deadline of a replica's UpdateWeights {path} load",
                     c->coordinator.local_replica.weights_load_timeout_ms));
  p->String("--log-level", &c->log_level,
            Default("trace, debug, info, warn, error or off", c->log_level), "L");
  p->String("--metrics-bind", &c->metrics_bind,
            "serve Prometheus /metrics and /health on this address (port 0: any; off by default)",
            "HOST:PORT");
  p->Flag("--skip-self-test", &c->skip_self_test,
          "serve without the start-up invariance self-test (logged as a warning)");
}

void AddCoordinatorFlags(CliParser* p, ServeConfig* c) {
  auto& co = c->coordinator;
  p->Group("Coordinator");
  p->Integer("--max-queued", &co.max_queued,
             Default("samples queued at most; beyond it a Submit gets Busy", co.max_queued));
  p->Integer("--replica-timeout-ms", &co.replica_timeout_ms,
             Default("a replica silent this long is dead", co.replica_timeout_ms));
  p->Integer("--stream-timeout-ms", &co.stream_timeout_ms,
             Default("deadline of a streamed weights update", co.stream_timeout_ms));
  p->Integer("--max-client-buffer-bytes", &co.max_client_buffer_bytes,
             Default("output kept for one client; a slower reader is dropped",
                     co.max_client_buffer_bytes));
  p->Double("--price-replica-hour", &co.price.replica_hour_usd,
            "price of one replica hour, for the cost report", "USD");
  p->Group("Write-ahead log");
  p->String("--data-dir", &co.wal.dir, "WAL folder: resume after a crash (none by default)", "DIR");
  p->Value("--durability", "when a commit is synced (default sync)", "sync|window|none",
           [&co](const std::string& d) {
             if (d == "sync") {
               co.wal.durability = wal::Durability::kSyncEveryCommit;
             } else if (d == "window") {
               co.wal.durability = wal::Durability::kWindow;
             } else if (d == "none") {
               co.wal.durability = wal::Durability::kNone;
             } else {
               return Status::InvalidArgument("--durability must be sync, window or none");
             }
             return Status::Ok();
           });
  p->Integer("--wal-commit-ms", &co.wal.commit_interval_ms,
             Default("group commit interval", co.wal.commit_interval_ms));
  p->Integer("--wal-sync-window-ms", &co.wal.sync_window_ms,
             Default("sync window of --durability window", co.wal.sync_window_ms));
  p->Integer("--retention-max-age-s", &co.retention.max_age_s,
             Default("finished groups kept this long", co.retention.max_age_s));
  p->Integer("--retention-max-groups", &co.retention.max_groups,
             Default("finished groups kept at most", co.retention.max_groups));
}

void AddToolFlags(CliParser* p, ServeConfig* c) {
  auto& t = c->coordinator.tools;
  p->Group("Tools");
  p->Integer("--tool-workers", &t.workers, Default("tool calls run at once, 1 to 4096", t.workers));
  p->Integer("--tool-max-concurrent", &t.sandbox.max_concurrent,
             Default("sandboxed processes at once", t.sandbox.max_concurrent));
  p->Integer("--tool-uid-base", &t.sandbox.uid_base,
             Default("first unprivileged uid of sandboxed tools", t.sandbox.uid_base), "UID");
  p->String("--tool-work-root", &t.sandbox.work_root,
            "folder of the tools' workdirs (default: the temp folder)", "DIR");
  p->Integer(
      "--tool-disk-bytes", &t.sandbox.work_disk_bytes,
      Default("workdir bytes of one process/container call; 0: no cap", t.sandbox.work_disk_bytes));
  p->Double("--price-sandbox-cpu-hour", &c->coordinator.price.sandbox_cpu_hour_usd,
            "price of one sandbox CPU hour, for the cost report", "USD");
  p->Group("Test hooks");
  p->Integer("--null-delay-us", &c->null_engine.step_delay_us,
             "--engine null: sleep per engine step");
  p->Integer("--null-vocab", &c->null_engine.vocab_size,
             Default("--engine null: vocabulary size, >= 4", c->null_engine.vocab_size));
  p->String("--tool-append-file", &t.functions.append_file,
            "file the `append` tool function writes to", "PATH");
  p->Integer("--tool-append-delay-ms", &t.functions.append_delay_ms,
             "makes every `append` call this slow, >= 0");
}

}  // namespace

void AddServeFlags(CliParser* p, ServeConfig* c) {
  AddMainFlags(p, c);
  p->Group("Engine of each replica (only --kv-dtype changes bits)");
  AddEngineTuningFlags(p, &c->engine_options);
  AddCoordinatorFlags(p, c);
  AddToolFlags(p, c);
}

Status CheckServeConfig(const ServeConfig& c) {
  const auto& co = c.coordinator;
  if (c.replicas < 0 || c.replicas > 1024) {
    return Status::InvalidArgument("--replicas must be in [0, 1024]");
  }
  if (c.engine != "auto" && c.engine != "null") {
    return Status::InvalidArgument("--engine must be auto or null");
  }
  if (c.null_engine.vocab_size < 4) return Status::InvalidArgument("null vocab must be >= 4");
  BR_RETURN_IF_ERROR(CheckEngineOptionFlags(c.engine_options));
  if (co.tools.workers < 1 || co.tools.workers > 4096) {
    return Status::InvalidArgument("--tool-workers must be in [1, 4096]");
  }
  if (co.tools.functions.append_delay_ms < 0) {
    return Status::InvalidArgument("--tool-append-delay-ms must be >= 0");
  }
  return Status::Ok();
}

Status ApplyFlags(int argc, char** argv, int first, ServeConfig* c) {
  CliParser p(first > 0 ? argv[first - 1] : "serve", "");
  AddServeFlags(&p, c);
  std::vector<std::string> args(argv + first, argv + argc);
  BR_RETURN_IF_ERROR(p.Parse(args));
  if (p.help()) return Status::Ok();
  return CheckServeConfig(*c);
}

}  // namespace bitroll::rollout
