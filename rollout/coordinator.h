// rollout/coordinator.h: the rollout service's coordinator.
//
// Clients (ZeroMQ DEALER) talk to a ROUTER bound at Options::bind; replicas (DEALER) talk to a
// second ROUTER bound at an inproc:// endpoint (in-process workers) and, when
// Options::replica_bind is set, at a tcp:// / ipc:// endpoint for `bitroll replica` processes.
// docs/protocol.md has the message flow.
//
// One coordinator thread owns both sockets and all state: it validates and queues submitted
// samples (bounded: beyond max_queued a Submit gets Busy), dispatches them to replicas (prefix
// affinity first, then least loaded, never past a replica's capacity), relays trajectories and
// token chunks to clients as they finish, then GroupDone. A replica silent for
// replica_timeout_ms is declared dead and its work is re-queued for the others; as every sample
// is a pure function of (prompt, params, seed, sample_index) the result is the same bits.
//
// With Options::wal.dir set (`bitroll serve --data-dir`) every group, trajectory header, token and
// finish is logged (rollout/wal_log.h), a trajectory is delivered only once durable, Start()
// recovers the log (unfinished trajectories resume with their logged tokens forced), a client
// re-attaches by re-submitting the same group id, and failover resumes from the logged tokens.
// docs/protocol.md "Recovery".
//
// Tools (docs/protocol.md "Tools"): a request with tools runs each sample as a loop of model
// turns. A replica ends a turn on a complete tool call (rollout/tool_detect.h, finish ToolCall);
// the coordinator runs the call on its tool workers (rollout/tool_runner.h; it never blocks on
// one), then queues the next turn with the earlier turns as context and the formatted result to
// inject (coordinator_tools.cc). Calls and results are WAL records: a logged result is replayed
// on resume, never re-run.
//
// Ownership: the Coordinator owns its in-process engines, threads and sockets.
// Thread-safety: Start/Stop/endpoint accessors may be called from any one thread; everything else
// happens on the coordinator's own threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "engine/engine.h"
#include "engine/self_test.h"
#include "rollout/protocol.h"
#include "rollout/replica.h"
#include "rollout/tool_runner.h"
#include "rollout/wal_log.h"
#include "schema/status.h"

namespace bitroll::rollout {

class Metrics;  // rollout/metrics.h

// Converts engine-seconds and sandbox CPU seconds into money.
struct PriceTable {
  double replica_hour_usd = 0.0;      // price of one replica (engine) hour
  double sandbox_cpu_hour_usd = 0.0;  // price of one sandbox CPU hour
};

struct CoordinatorOptions {
  // Client endpoint. "tcp://127.0.0.1:*" picks a free port (see Coordinator::endpoint()).
  std::string bind = "tcp://127.0.0.1:5555";
  // Endpoint for remote replicas; empty = in-process replicas only.
  std::string replica_bind;
  // Samples accepted but not finished, over all clients. A Submit that would exceed it gets Busy.
  uint64_t max_queued = 1 << 20;
  // A replica that sends nothing (heartbeats included) for this long is declared dead.
  int replica_timeout_ms = 5000;
  // A streamed weight update whose client sends no part for this long is abandoned (its staged
  // parts are dropped on every replica).
  int stream_timeout_ms = 60000;
  // Pending outgoing messages per client connection before ZeroMQ reports EAGAIN (then the
  // coordinator buffers them, up to max_client_buffer_bytes).
  int client_sndhwm = 1000;
  // Replies buffered in the coordinator for one connection that does not read. Past it the
  // connection is dropped (logged): nothing more is sent to it, its groups are detached (WAL:
  // the work goes on and stays in the WAL for a re-attach) or aborted (no WAL), and its next
  // message is answered with Error{ResourceExhausted}. Other clients are never held up by it.
  // A re-attach re-sends at this pace too (docs/protocol.md "Owners").
  size_t max_client_buffer_bytes = size_t{64} << 20;
  // WAL only: finished groups leave memory (their trajectories stay in the WAL until
  // acknowledged). One whose trajectories are not all acknowledged within max_age_s, or the
  // oldest beyond max_groups, is discarded from the WAL (logged).
  struct Retention {
    int64_t max_age_s = 7 * 24 * 3600;
    size_t max_groups = 1'000'000;
  } retention;
  DecodeLimits decode;
  SubmitLimits submit;  // submit.vocab_size is taken from the first replica when 0
  PriceTable price;
  ReplicaOptions local_replica;  // options for in-process replicas (name gets "-<i>")
  // The token-level WAL (rollout/wal_log.h). wal.dir empty (default): no WAL, no resume.
  WalServiceOptions wal;
  // The tool loop's workers and sandbox (rollout/tool_runner.h). The service's sandbox uses
  // uids [62000, 62000 + max_concurrent) by default, apart from sandbox tests' 61000.
  // The start-up invariance self-test's verdict (rollout/self_test_gate.h), run by the caller
  // before Start and kept for Status and a /health reason.
  engine::SelfTestVerdict self_test;
  ToolRunnerOptions tools = [] {
    ToolRunnerOptions t;
    t.sandbox.uid_base = 62000;
    return t;
  }();
  // Prometheus metrics and /health (rollout/metrics.h); null: none. Not owned; must outlive
  // the coordinator.
  Metrics* metrics = nullptr;
};

class Coordinator {
 public:
  // Binds the sockets, starts one in-process replica thread per engine and the coordinator
  // thread. Errors: kUnavailable (a bind failed), kInvalidArgument (bad options).
  static Result<std::unique_ptr<Coordinator>> Start(
      const CoordinatorOptions& options, std::vector<std::unique_ptr<engine::Engine>> engines);

  // Stops the threads and closes the sockets. Idempotent.
  void Stop();
  ~Coordinator();

  // Resolved endpoints (wildcard ports replaced by the bound ones).
  const std::string& endpoint() const { return endpoint_; }
  const std::string& replica_endpoint() const { return replica_endpoint_; }
  // CoordinatorOptions::self_test: the verdict of the replicas' start-up self-test.
  const engine::SelfTestVerdict& self_test() const { return self_test_; }

  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  struct State;  // coordinator-thread state (coordinator.cc)

 private:
  Coordinator() = default;

  std::unique_ptr<zmq::context_t> ctx_;
  std::unique_ptr<State> state_;
  std::vector<std::unique_ptr<engine::Engine>> engines_;
  std::vector<std::unique_ptr<ReplicaOptions>> replica_options_;
  std::vector<std::thread> replica_threads_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> stop_replicas_{false};
  std::string endpoint_;
  std::string replica_endpoint_;
  std::string inproc_endpoint_;
  engine::SelfTestVerdict self_test_;
};

}  // namespace bitroll::rollout
