// rollout/cmd_serve.cc: `bitroll serve` and `bitroll replica`.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <thread>

#include <spdlog/spdlog.h>

#include "rollout/cli_args.h"
#include "rollout/commands.h"
#include "rollout/config.h"
#include "rollout/coordinator.h"
#include "rollout/metrics.h"
#include "rollout/null_engine.h"
#include "rollout/replica.h"
#include "rollout/self_test_gate.h"
#include "rollout/weights_registry.h"

namespace bitroll::rollout {

namespace {

std::atomic<bool> g_stop{false};

void OnSignal(int) {
  g_stop.store(true);
}

void InstallSignals() {
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
}

// Opens the engine the config asks for: the NullEngine test double, or the real engine when this
// build has one (BITROLL_HAVE_ENGINE).
Result<std::unique_ptr<engine::Engine>> MakeEngine(const ServeConfig& c) {
  if (c.engine == "null") {
    return std::unique_ptr<engine::Engine>(std::make_unique<NullEngine>(c.null_engine));
  }
#ifdef BITROLL_HAVE_ENGINE
  if (c.engine_options.model_path.empty()) return Status::InvalidArgument("--model is required");
  return engine::OpenEngine(c.engine_options);
#else
  return Status::Unsupported("this build has no model engine; use --engine null");
#endif
}

constexpr const char* kServeHelp =
    "bitroll serve: run the rollout coordinator with in-process replicas. Flags override the "
    "--config file wherever they appear; the resolved endpoints are printed on stdout.";
constexpr const char* kReplicaHelp =
    "bitroll replica: run one engine replica for a remote coordinator (--connect, the "
    "coordinator's --replica-bind). It takes serve's flags; those of the engine apply.";

// Parses the command line of `bitroll serve` / `bitroll replica` into *c and sets the log level.
// Returns -1 to go on, else the exit status (0 after --help, 2 on a usage error).
int Setup(const std::string& command, int argc, char** argv, ServeConfig* c) {
  CliParser p(command, command == "serve" ? kServeHelp : kReplicaHelp);
  p.Footer("docs/protocol.md lists the config file's keys.");
  AddServeFlags(&p, c);
  Status s = p.Parse(argc, argv);
  if (s.ok() && p.help()) return PrintHelp(p);
  if (s.ok()) s = CheckServeConfig(*c);
  if (!s.ok()) return UsageError(command, s);
  spdlog::set_level(spdlog::level::from_str(c->log_level));
  return -1;
}

// --metrics-bind: starts /metrics and /health (null when the flag is absent) and prints the
// bound address on stdout ("bitroll CMD: metrics HOST:PORT"), so that port 0 can be used.
Result<std::unique_ptr<Metrics>> StartMetrics(const std::string& command, const ServeConfig& c) {
  if (c.metrics_bind.empty()) return std::unique_ptr<Metrics>();
  BR_ASSIGN_OR_RETURN(auto m, Metrics::Start({c.metrics_bind, command == "serve"}));
  const std::string host = c.metrics_bind.substr(0, c.metrics_bind.rfind(':'));
  std::printf("bitroll %s: metrics %s:%d\n", command.c_str(), host.c_str(), m->port());
  std::fflush(stdout);
  return m;
}

}  // namespace

int CmdServe(int argc, char** argv) {
  ServeConfig c;
  if (int rc = Setup("serve", argc, argv, &c); rc >= 0) return rc;
  std::vector<std::unique_ptr<engine::Engine>> engines;
  for (int i = 0; i < c.replicas; ++i) {
    auto e = MakeEngine(c);
    if (!e.ok()) {
      std::fprintf(stderr, "bitroll serve: %s\n", e.status().ToString().c_str());
      return 1;
    }
    engines.push_back(std::move(e).value());
  }
  if (!engines.empty()) {  // every replica runs the same model and options: one test
    c.coordinator.self_test =
        GateOnSelfTest("bitroll serve", *engines[0], c.engine_options, c.skip_self_test);
    if (!c.coordinator.self_test.ok_to_serve()) return 1;
  }
  if (!engines.empty()) {  // what each replica can hold, for sizing batches and contexts
    const engine::EngineStats st = engines[0]->stats();
    const int32_t ctx = engines[0]->info().max_seq_len;
    const int64_t tokens = st.kv_blocks_total * st.kv_block_tokens;
    if (tokens > 0 && ctx > 0) {
      spdlog::info(
          "bitroll serve: each replica's KV cache holds {} tokens = {} full-context "
          "sequences of {}",
          tokens, tokens / ctx, ctx);
    }
  }
  if (!engines.empty() && !c.coordinator.wal.dir.empty()) {  // version 0 in weights.jsonl
    Status w = RecordInitialWeights(c.coordinator.wal.dir, c.engine_options.model_path,
                                    engines[0]->info().fingerprint.weights_hash);
    if (!w.ok()) spdlog::error("bitroll serve: weights registry: {}", w.ToString());
  }
  c.coordinator.local_replica.name = "local";
  auto metrics = StartMetrics("serve", c);
  if (!metrics.ok()) {
    std::fprintf(stderr, "bitroll serve: %s\n", metrics.status().ToString().c_str());
    return 1;
  }
  c.coordinator.metrics = c.coordinator.local_replica.metrics = metrics->get();
  if (*metrics) {  // /health names the verdict (a failed one never gets here: serve refused)
    (*metrics)->SetSelfTest(c.coordinator.self_test.ok_to_serve(), c.coordinator.self_test.reason);
  }
  auto coord = Coordinator::Start(c.coordinator, std::move(engines));
  if (!coord.ok()) {
    std::fprintf(stderr, "bitroll serve: %s\n", coord.status().ToString().c_str());
    return 1;
  }
  InstallSignals();
  // The resolved endpoints on stdout, one per line, so scripts can use port 0 ("*").
  std::printf("bitroll serve: clients %s\n", (*coord)->endpoint().c_str());
  if (!(*coord)->replica_endpoint().empty()) {
    std::printf("bitroll serve: replicas %s\n", (*coord)->replica_endpoint().c_str());
  }
  std::fflush(stdout);
  while (!g_stop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  spdlog::info("bitroll serve: stopping");
  (*coord)->Stop();
  return 0;
}

int CmdReplica(int argc, char** argv) {
  ServeConfig c;
  if (int rc = Setup("replica", argc, argv, &c); rc >= 0) return rc;
  if (c.connect.empty()) {
    return UsageError("replica", Status::InvalidArgument("--connect tcp://HOST:PORT is required"));
  }
  auto e = MakeEngine(c);
  if (!e.ok()) {
    std::fprintf(stderr, "bitroll replica: %s\n", e.status().ToString().c_str());
    return 1;
  }
  if (!GateOnSelfTest("bitroll replica", **e, c.engine_options, c.skip_self_test).ok_to_serve()) {
    return 1;  // does not join the coordinator
  }
  ReplicaOptions ro;
  if (c.name.empty()) {
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    c.name = std::string(host) + ":" + std::to_string(getpid());
  }
  ro.name = c.name;
  ro.remote = true;
  ro.capacity = c.coordinator.local_replica.capacity;
  ro.weights_load_timeout_ms = c.coordinator.local_replica.weights_load_timeout_ms;
  auto metrics = StartMetrics("replica", c);
  if (!metrics.ok()) {
    std::fprintf(stderr, "bitroll replica: %s\n", metrics.status().ToString().c_str());
    return 1;
  }
  ro.metrics = metrics->get();
  InstallSignals();
  zmq::context_t ctx(1);
  spdlog::info("bitroll replica {}: connecting to {}", ro.name, c.connect);
  Status s = RunReplica(**e, ctx, c.connect, ro, g_stop);
  if (!s.ok()) {
    std::fprintf(stderr, "bitroll replica: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace bitroll::rollout
