// rollout/cmd_serve.cc: `bitroll serve` and `bitroll replica`.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <thread>

#include <spdlog/spdlog.h>

#include "rollout/commands.h"
#include "rollout/config.h"
#include "rollout/coordinator.h"
#include "rollout/null_engine.h"
#include "rollout/replica.h"

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

Status Setup(int argc, char** argv, ServeConfig* c) {
  BR_RETURN_IF_ERROR(ApplyFlags(argc, argv, 1, c));
  spdlog::set_level(spdlog::level::from_str(c->log_level));
  return Status::Ok();
}

}  // namespace

int CmdServe(int argc, char** argv) {
  ServeConfig c;
  if (Status s = Setup(argc, argv, &c); !s.ok()) {
    std::fprintf(stderr, "bitroll serve: %s\n", s.ToString().c_str());
    return 2;
  }
  std::vector<std::unique_ptr<engine::Engine>> engines;
  for (int i = 0; i < c.replicas; ++i) {
    auto e = MakeEngine(c);
    if (!e.ok()) {
      std::fprintf(stderr, "bitroll serve: %s\n", e.status().ToString().c_str());
      return 1;
    }
    engines.push_back(std::move(e).value());
  }
  c.coordinator.local_replica.name = "local";
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
  if (Status s = Setup(argc, argv, &c); !s.ok()) {
    std::fprintf(stderr, "bitroll replica: %s\n", s.ToString().c_str());
    return 2;
  }
  if (c.connect.empty()) {
    std::fprintf(stderr, "bitroll replica: --connect tcp://HOST:PORT is required\n");
    return 2;
  }
  auto e = MakeEngine(c);
  if (!e.ok()) {
    std::fprintf(stderr, "bitroll replica: %s\n", e.status().ToString().c_str());
    return 1;
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
