// rollout/metrics.h: Prometheus metrics and the /health probe of `bitroll serve` and
// `bitroll replica` (`--metrics-bind HOST:PORT`; off by default).
//
// One Metrics object per process, owned by the command (rollout/cmd_serve.cc) and lent by raw
// pointer to the coordinator (CoordinatorOptions::metrics), the replicas (ReplicaOptions::metrics)
// and the WAL adapter (WalLog::metrics); a null pointer everywhere means no metrics, and every
// hook is `if (metrics) ...`. The object must outlive the coordinator and replicas that use it.
//
// HTTP: prometheus-cpp's Exposer (Debian prometheus-cpp-dev 1.0.1, civetweb inside) serves
// GET /metrics in the Prometheus text format. The Exposer only serves collectables, always with
// status 200, so /health is answered by a civetweb `begin_request` callback on the same server
// and port (passed through Exposer's CivetCallbacks argument): it answers GET /health itself and
// leaves every other URI to the Exposer. The callback is a plain function pointer without user
// data, so it finds its Metrics through a process-wide table keyed by the listening port.
//   200 "ready\n"                          all is well
//   503 "not ready: REASON[; REASON]\n"    REASON: "self-test failed: ..." (SetSelfTest),
//                                          "wal failed: ..." (SetWalFailed), "no replica" (serve:
//                                          no live replica in the last coordinator snapshot)
// Port 0 is allowed: the chosen port is port() (the command logs it). Stopping the server (the
// destructor) takes civetweb up to ~2 s.
//
// Cost on the hot path: counters and gauges are prometheus-cpp atomics; every labelled series a
// hook touches is looked up once (at construction or ForReplica) and kept as a reference, so no
// hook takes a lock except the histograms' (one per WAL commit and per sandbox call). Replica
// engine counters are copied from Engine::stats() at heartbeat time (every ~100 ms), never per
// token; coordinator gauges are published from its loop at most every 100 ms.
//
// Metric names (all `bitroll_*`, with help text; docs: README "Metrics and health"):
//   coordinator: queue_waiting_samples, inflight_samples, live_groups, trajectories_finished_total
//   {regime}, tokens_generated_total, cost_usd_total{regime}, engine_seconds_total{regime},
//   wal_commit_seconds (histogram), wal_bytes_total, wal_failed, sandbox_calls_total{tier},
//   sandbox_call_seconds{tier} (histogram), sandbox_errors_total{tier,error}, weights_version,
//   replicas_alive, replica_alive{replica}, replica_weights_version{replica},
//   replica_inflight_samples{replica}, ready.
//   replicas (in-process ones in serve, or the `bitroll replica` process): replica_running
//   {replica}, replica_waiting{replica}, decode_tokens_total{replica},
//   prefill_tokens_computed_total{replica}, prefill_tokens_cached_total{replica},
//   prefix_cache_hit_tokens_total{replica,tier=memory|disk}, preemptions_total{replica},
//   kv_capacity_tokens{replica}, kv_capacity_sequences{replica}, kv_free_tokens{replica}.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "rollout/protocol.h"
#include "sandbox/sandbox.h"
#include "schema/status.h"

namespace bitroll::rollout {

struct MetricsOptions {
  // HOST:PORT of the HTTP server ("127.0.0.1:9100", "0.0.0.0:0", "[::1]:9100"). Empty: no
  // server (the metrics are still counted and Render() works).
  std::string bind;
  // serve: /health is 503 "no replica" while no replica is alive. `bitroll replica`: false.
  bool require_replica = true;
};

// The coordinator's view, published from its loop (Coordinator::State::PublishMetrics).
struct CoordinatorSnapshot {
  struct Replica {
    std::string name;
    bool alive = false;
    uint64_t weight_version = 0;
    uint64_t inflight = 0;
  };
  uint64_t queued = 0;    // accepted, not dispatched
  uint64_t inflight = 0;  // dispatched, not finished
  uint64_t groups = 0;
  uint64_t weight_version = 0;
  std::vector<Replica> replicas;
};

class ReplicaMetrics;

class Metrics {
 public:
  // Builds the metrics and, when options.bind is set, starts the HTTP server. Errors:
  // kInvalidArgument (bind is not HOST:PORT), kUnavailable (the address cannot be bound).
  static Result<std::unique_ptr<Metrics>> Start(const MetricsOptions& options);
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // The bound port (0 without a server).
  int port() const { return port_; }

  // ---- health ----
  struct Health {
    bool ready = true;
    std::string reason;  // empty when ready
  };
  Health health() const;
  // The start-up self-test's verdict (default: passed). `reason` is shown after "self-test
  // failed: ".
  void SetSelfTest(bool passed, const std::string& reason = "");
  // The WAL became sticky-failed (rollout/wal_log.h); there is no way back.
  void SetWalFailed(const std::string& reason);

  // ---- coordinator hooks ----
  // A model turn finished on a replica (every turn of a tool loop): the tokens it sampled
  // (the logged tokens a resumed turn re-scored are not counted).
  void TurnFinished(int64_t sampled_tokens);
  // A trajectory finished (all turns): its total cost and turn count give the regime
  // (rollout/cost_report.h: agentic, long_context, short_chat).
  void TrajectoryFinished(const Cost& cost, int32_t turns);
  // One WAL commit took `seconds`; `total_bytes` is the WAL's bytes_written so far.
  void WalCommitted(double seconds, uint64_t total_bytes);
  // A tool call returned from the sandbox.
  void SandboxCall(const sandbox::RunResult& result);
  void PublishCoordinator(const CoordinatorSnapshot& snapshot);

  // ---- replicas ----
  // The series of one replica, labelled replica=name.
  std::unique_ptr<ReplicaMetrics> ForReplica(const std::string& name);

  // The text exposition /metrics serves.
  std::string Render() const;

  struct Impl;

 private:
  Metrics();
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
  bool require_replica_ = true;
  mutable std::mutex health_mu_;
  std::string self_test_error_;              // empty: passed
  std::string wal_error_;                    // empty: fine
  std::atomic<int64_t> replicas_alive_{-1};  // -1: no snapshot yet
  std::atomic<uint64_t> wal_bytes_seen_{0};
};

// One replica's engine counters. Update() copies Engine::stats() (cumulative) into counters
// by their increase since the last call; call it from the replica's thread.
class ReplicaMetrics {
 public:
  ~ReplicaMetrics();
  void Update(const engine::EngineStats& s, int32_t max_seq_len);

  struct Series;

 private:
  friend class Metrics;
  explicit ReplicaMetrics(std::unique_ptr<Series> s);
  std::unique_ptr<Series> s_;
  engine::EngineStats last_;
};

}  // namespace bitroll::rollout
