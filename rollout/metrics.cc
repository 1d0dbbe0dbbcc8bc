#include "rollout/metrics.h"

#include <civetweb.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <exception>
#include <map>
#include <sstream>

#include <CivetServer.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

namespace bitroll::rollout {

namespace {

using prometheus::Counter;
using prometheus::Family;
using prometheus::Gauge;
using prometheus::Histogram;

constexpr int kTiers = 4;    // sandbox::Tier values
constexpr int kErrors = 11;  // sandbox::SandboxError values
constexpr int kRegimes = 3;  // agentic, long_context, short_chat
constexpr const char* kRegimeNames[kRegimes] = {"agentic", "long_context", "short_chat"};
// rollout/cost_report.h's rule with its default threshold; the prompt length is the prefill
// (computed + cached), as the report does when a record has no prompt ids.
constexpr int64_t kLongContextTokens = 2048;

int RegimeOf(const Cost& c, int32_t turns) {
  if (turns > 1) return 0;
  if (c.prefill_computed + c.prefill_cached + c.decode_tokens >= kLongContextTokens) return 1;
  return 2;
}

// ---- /health on the Exposer's civetweb: begin_request, keyed by the listening port ----

std::mutex g_health_mu;
std::map<int, Metrics*>& HealthTable() {
  static auto* table = new std::map<int, Metrics*>();  // never destroyed: threads may outlive
  return *table;
}

int BeginRequest(mg_connection* conn) {
  const mg_request_info* ri = mg_get_request_info(conn);
  if (ri == nullptr || ri->local_uri == nullptr || std::strcmp(ri->local_uri, "/health") != 0) {
    return 0;  // the Exposer's
  }
  Metrics::Health h;
  bool found = false;
  {
    std::lock_guard<std::mutex> l(g_health_mu);
    auto it = HealthTable().find(ri->server_port);
    if (it != HealthTable().end()) {
      h = it->second->health();  // under g_health_mu: ~Metrics unregisters under it too
      found = true;
    }
  }
  if (!found) h = {false, "starting"};
  const std::string body = h.ready ? "ready\n" : "not ready: " + h.reason + "\n";
  const int code = h.ready ? 200 : 503;
  const bool head = ri->request_method != nullptr && std::strcmp(ri->request_method, "HEAD") == 0;
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\n"
            "Content-Length: %zu\r\nConnection: close\r\n\r\n",
            code, h.ready ? "OK" : "Service Unavailable", body.size());
  if (!head) mg_write(conn, body.data(), body.size());
  return code;
}

// "HOST:PORT" with a numeric port; HOST may be "[v6]". Errors: kInvalidArgument.
Status CheckBind(const std::string& bind) {
  const size_t colon = bind.rfind(':');
  const std::string port = colon == std::string::npos ? "" : bind.substr(colon + 1);
  const bool digits =
      !port.empty() && port.size() <= 5 &&
      std::all_of(port.begin(), port.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
  if (colon == 0 || !digits || std::stoi(port) > 65535) {
    return Status::InvalidArgument("--metrics-bind: '" + bind + "' is not HOST:PORT");
  }
  return Status::Ok();
}

}  // namespace

struct Metrics::Impl {
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  CivetCallbacks callbacks;
  std::unique_ptr<prometheus::Exposer> exposer;

  Family<Gauge>& queued = prometheus::BuildGauge()
                              .Name("bitroll_queue_waiting_samples")
                              .Help("Samples accepted and waiting for a replica")
                              .Register(*registry);
  Family<Gauge>& inflight = prometheus::BuildGauge()
                                .Name("bitroll_inflight_samples")
                                .Help("Samples dispatched to a replica, not finished")
                                .Register(*registry);
  Family<Gauge>& groups = prometheus::BuildGauge()
                              .Name("bitroll_live_groups")
                              .Help("Groups accepted and not finished")
                              .Register(*registry);
  Family<Counter>& trajectories = prometheus::BuildCounter()
                                      .Name("bitroll_trajectories_finished_total")
                                      .Help("Trajectories finished, by cost regime")
                                      .Register(*registry);
  Family<Counter>& tokens =
      prometheus::BuildCounter()
          .Name("bitroll_tokens_generated_total")
          .Help("Tokens sampled in finished model turns (resumed tokens not counted)")
          .Register(*registry);
  Family<Counter>& cost = prometheus::BuildCounter()
                              .Name("bitroll_cost_usd_total")
                              .Help("Price of finished trajectories (--price-*), by cost regime")
                              .Register(*registry);
  Family<Counter>& engine_seconds = prometheus::BuildCounter()
                                        .Name("bitroll_engine_seconds_total")
                                        .Help("Engine seconds of finished trajectories, by regime")
                                        .Register(*registry);
  Family<Histogram>& wal_commit = prometheus::BuildHistogram()
                                      .Name("bitroll_wal_commit_seconds")
                                      .Help("Latency of one WAL group commit (sync included)")
                                      .Register(*registry);
  Family<Counter>& wal_bytes = prometheus::BuildCounter()
                                   .Name("bitroll_wal_bytes_total")
                                   .Help("Bytes (keys + values) committed to the WAL")
                                   .Register(*registry);
  Family<Gauge>& wal_failed = prometheus::BuildGauge()
                                  .Name("bitroll_wal_failed")
                                  .Help("1 once the WAL is sticky-failed (no new work accepted)")
                                  .Register(*registry);
  Family<Counter>& sandbox_calls = prometheus::BuildCounter()
                                       .Name("bitroll_sandbox_calls_total")
                                       .Help("Tool calls run by the sandbox, by tier")
                                       .Register(*registry);
  Family<Histogram>& sandbox_seconds = prometheus::BuildHistogram()
                                           .Name("bitroll_sandbox_call_seconds")
                                           .Help("Wall time of one sandbox call, by tier")
                                           .Register(*registry);
  Family<Counter>& sandbox_errors = prometheus::BuildCounter()
                                        .Name("bitroll_sandbox_errors_total")
                                        .Help("Sandbox calls that ended on a typed error")
                                        .Register(*registry);
  Family<Gauge>& weights_version = prometheus::BuildGauge()
                                       .Name("bitroll_weights_version")
                                       .Help("The coordinator's live weights version")
                                       .Register(*registry);
  Family<Gauge>& replicas_alive = prometheus::BuildGauge()
                                      .Name("bitroll_replicas_alive")
                                      .Help("Replicas the coordinator counts as alive")
                                      .Register(*registry);
  Family<Gauge>& replica_alive = prometheus::BuildGauge()
                                     .Name("bitroll_replica_alive")
                                     .Help("1 while the coordinator hears from the replica")
                                     .Register(*registry);
  Family<Gauge>& replica_version = prometheus::BuildGauge()
                                       .Name("bitroll_replica_weights_version")
                                       .Help("Weights version a replica serves")
                                       .Register(*registry);
  Family<Gauge>& replica_inflight = prometheus::BuildGauge()
                                        .Name("bitroll_replica_inflight_samples")
                                        .Help("Samples dispatched to a replica, not finished")
                                        .Register(*registry);
  Family<Gauge>& ready = prometheus::BuildGauge()
                             .Name("bitroll_ready")
                             .Help("1 when /health answers ready")
                             .Register(*registry);
  // Replica engine series.
  Family<Gauge>& running = prometheus::BuildGauge()
                               .Name("bitroll_replica_running")
                               .Help("Sequences in the replica's engine")
                               .Register(*registry);
  Family<Gauge>& waiting = prometheus::BuildGauge()
                               .Name("bitroll_replica_waiting")
                               .Help("Sequences waiting in the replica's engine")
                               .Register(*registry);
  Family<Counter>& decode =
      prometheus::BuildCounter()
          .Name("bitroll_decode_tokens_total")
          .Help("Decode steps the engine ran (a sequence's first token comes from its prefill)")
          .Register(*registry);
  Family<Counter>& computed = prometheus::BuildCounter()
                                  .Name("bitroll_prefill_tokens_computed_total")
                                  .Help("Prefill tokens the engine computed (cache misses)")
                                  .Register(*registry);
  Family<Counter>& cached = prometheus::BuildCounter()
                                .Name("bitroll_prefill_tokens_cached_total")
                                .Help("Prefill tokens taken from the prefix cache")
                                .Register(*registry);
  Family<Counter>& hits = prometheus::BuildCounter()
                              .Name("bitroll_prefix_cache_hit_tokens_total")
                              .Help("Prefill tokens served by the prefix cache, by tier")
                              .Register(*registry);
  Family<Counter>& preemptions = prometheus::BuildCounter()
                                     .Name("bitroll_preemptions_total")
                                     .Help("Sequences preempted (KV blocks released for room)")
                                     .Register(*registry);
  Family<Gauge>& kv_tokens = prometheus::BuildGauge()
                                 .Name("bitroll_kv_capacity_tokens")
                                 .Help("Tokens the replica's KV cache holds")
                                 .Register(*registry);
  Family<Gauge>& kv_sequences = prometheus::BuildGauge()
                                    .Name("bitroll_kv_capacity_sequences")
                                    .Help("Full-context sequences the replica's KV cache holds")
                                    .Register(*registry);
  Family<Gauge>& kv_free = prometheus::BuildGauge()
                               .Name("bitroll_kv_free_tokens")
                               .Help("Tokens of free KV blocks")
                               .Register(*registry);
  // KV memory by layer kind (kind="full" | "sliding"; docs/design.md "KV memory per layer kind").
  Family<Gauge>& kv_bytes_per_token = prometheus::BuildGauge()
                                          .Name("bitroll_kv_bytes_per_token")
                                          .Help("K and V bytes of one token, by layer kind")
                                          .Register(*registry);
  Family<Gauge>& kv_live_bytes =
      prometheus::BuildGauge()
          .Name("bitroll_kv_live_bytes")
          .Help("KV bytes held by sequences and the prefix cache, by layer kind")
          .Register(*registry);
  Family<Gauge>& prefix_cached_bytes =
      prometheus::BuildGauge()
          .Name("bitroll_prefix_cached_bytes")
          .Help("KV bytes the prefix cache's memory tier keeps, by layer kind")
          .Register(*registry);
  Family<Gauge>& disk_bytes = prometheus::BuildGauge()
                                  .Name("bitroll_kv_disk_bytes")
                                  .Help("Bytes of the KV disk tier's files, by layer kind")
                                  .Register(*registry);
  Family<Counter>& swa_rebuilds =
      prometheus::BuildCounter()
          .Name("bitroll_swa_rebuilds_total")
          .Help("Prefix hits whose sliding-window state was recomputed (SWA cache policy)")
          .Register(*registry);
  Family<Counter>& swa_recomputed =
      prometheus::BuildCounter()
          .Name("bitroll_swa_recomputed_tokens_total")
          .Help("Tokens run again to rebuild sliding-window state on prefix hits")
          .Register(*registry);

  // Series the hooks touch, looked up once.
  Counter& tokens_total = tokens.Add({});
  Histogram& wal_commit_h =
      wal_commit.Add({}, Histogram::BucketBoundaries{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                                     0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5});
  Counter& wal_bytes_total = wal_bytes.Add({});
  Gauge& wal_failed_g = wal_failed.Add({});
  Gauge& queued_g = queued.Add({});
  Gauge& inflight_g = inflight.Add({});
  Gauge& groups_g = groups.Add({});
  Gauge& version_g = weights_version.Add({});
  Gauge& alive_g = replicas_alive.Add({});
  Gauge& ready_g = ready.Add({});
  std::array<Counter*, kRegimes> traj_by_regime{}, cost_by_regime{}, seconds_by_regime{};
  std::array<Counter*, kTiers> calls_by_tier{};
  std::array<Histogram*, kTiers> seconds_by_tier{};
  std::array<std::array<Counter*, kErrors>, kTiers> errors_by_tier{};

  Impl() {
    for (int r = 0; r < kRegimes; ++r) {
      traj_by_regime[r] = &trajectories.Add({{"regime", kRegimeNames[r]}});
      cost_by_regime[r] = &cost.Add({{"regime", kRegimeNames[r]}});
      seconds_by_regime[r] = &engine_seconds.Add({{"regime", kRegimeNames[r]}});
    }
    for (int t = 0; t < kTiers; ++t) {
      const std::string tier = sandbox::TierName(static_cast<sandbox::Tier>(t));
      calls_by_tier[t] = &sandbox_calls.Add({{"tier", tier}});
      seconds_by_tier[t] = &sandbox_seconds.Add(
          {{"tier", tier}},
          Histogram::BucketBoundaries{0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60});
      for (int e = 1; e < kErrors; ++e) {  // kNone is no error
        errors_by_tier[t][e] = &sandbox_errors.Add(
            {{"tier", tier},
             {"error", sandbox::SandboxErrorName(static_cast<sandbox::SandboxError>(e))}});
      }
    }
    ready_g.Set(1);
  }
};

struct ReplicaMetrics::Series {
  Gauge *running, *waiting, *kv_tokens, *kv_sequences, *kv_free;
  Counter *decode, *computed, *cached, *hit_memory, *hit_disk, *preemptions;
  // By layer kind: [0] full-attention layers, [1] sliding-window layers.
  Gauge *kv_bytes_per_token[2], *kv_live_bytes[2], *prefix_cached_bytes[2], *disk_bytes[2];
  Counter *swa_rebuilds, *swa_recomputed;
};

Metrics::Metrics() : impl_(std::make_unique<Impl>()) {}

Result<std::unique_ptr<Metrics>> Metrics::Start(const MetricsOptions& options) {
  std::unique_ptr<Metrics> m(new Metrics());
  m->require_replica_ = options.require_replica;
  if (options.bind.empty()) return m;
  BR_RETURN_IF_ERROR(CheckBind(options.bind));
  Impl& im = *m->impl_;
  std::memset(static_cast<mg_callbacks*>(&im.callbacks), 0, sizeof(mg_callbacks));
  im.callbacks.begin_request = &BeginRequest;
  try {
    // civetweb's listening_ports syntax is HOST:PORT too ("[::1]:9100" for IPv6 is "[::1]:9100").
    im.exposer = std::make_unique<prometheus::Exposer>(
        std::vector<std::string>{"listening_ports", options.bind, "num_threads", "2"},
        &im.callbacks);
  } catch (const std::exception& e) {
    return Status::Unavailable("--metrics-bind " + options.bind + ": " + e.what());
  }
  im.exposer->RegisterCollectable(im.registry);
  const std::vector<int> ports = im.exposer->GetListeningPorts();
  if (ports.empty() || ports[0] <= 0) {
    return Status::Unavailable("--metrics-bind " + options.bind + ": no listening port");
  }
  m->port_ = ports[0];
  std::lock_guard<std::mutex> l(g_health_mu);
  HealthTable()[m->port_] = m.get();
  return m;
}

Metrics::~Metrics() {
  if (port_ > 0) {
    std::lock_guard<std::mutex> l(g_health_mu);
    auto it = HealthTable().find(port_);
    if (it != HealthTable().end() && it->second == this) HealthTable().erase(it);
  }
  if (impl_) impl_->exposer.reset();  // joins the HTTP threads before the registry goes
}

Metrics::Health Metrics::health() const {
  std::vector<std::string> why;
  {
    std::lock_guard<std::mutex> l(health_mu_);
    if (!self_test_error_.empty()) why.push_back("self-test failed: " + self_test_error_);
    if (!wal_error_.empty()) why.push_back("wal failed: " + wal_error_);
  }
  if (require_replica_ && replicas_alive_.load(std::memory_order_relaxed) <= 0) {
    why.push_back("no replica");
  }
  Health h;
  for (const std::string& w : why) h.reason += (h.reason.empty() ? "" : "; ") + w;
  h.ready = why.empty();
  return h;
}

void Metrics::SetSelfTest(bool passed, const std::string& reason) {
  {
    std::lock_guard<std::mutex> l(health_mu_);
    self_test_error_ = passed ? "" : (reason.empty() ? "unknown" : reason);
  }
  impl_->ready_g.Set(health().ready ? 1 : 0);
}

void Metrics::SetWalFailed(const std::string& reason) {
  {
    std::lock_guard<std::mutex> l(health_mu_);
    wal_error_ = reason.empty() ? "unknown" : reason;
  }
  impl_->wal_failed_g.Set(1);
  impl_->ready_g.Set(0);
}

void Metrics::TurnFinished(int64_t sampled_tokens) {
  if (sampled_tokens > 0) impl_->tokens_total.Increment(static_cast<double>(sampled_tokens));
}

void Metrics::TrajectoryFinished(const Cost& cost, int32_t turns) {
  const int r = RegimeOf(cost, turns);
  impl_->traj_by_regime[r]->Increment();
  if (cost.price_usd > 0) impl_->cost_by_regime[r]->Increment(cost.price_usd);
  if (cost.engine_seconds > 0) impl_->seconds_by_regime[r]->Increment(cost.engine_seconds);
}

void Metrics::WalCommitted(double seconds, uint64_t total_bytes) {
  impl_->wal_commit_h.Observe(seconds);
  const uint64_t before = wal_bytes_seen_.exchange(total_bytes, std::memory_order_relaxed);
  if (total_bytes > before)
    impl_->wal_bytes_total.Increment(static_cast<double>(total_bytes - before));
}

void Metrics::SandboxCall(const sandbox::RunResult& result) {
  const int t = std::clamp(static_cast<int>(result.tier), 0, kTiers - 1);
  impl_->calls_by_tier[t]->Increment();
  impl_->seconds_by_tier[t]->Observe(result.duration_seconds);
  const int e = static_cast<int>(result.error);
  if (e > 0 && e < kErrors) impl_->errors_by_tier[t][e]->Increment();
}

void Metrics::PublishCoordinator(const CoordinatorSnapshot& s) {
  Impl& im = *impl_;
  im.queued_g.Set(static_cast<double>(s.queued));
  im.inflight_g.Set(static_cast<double>(s.inflight));
  im.groups_g.Set(static_cast<double>(s.groups));
  im.version_g.Set(static_cast<double>(s.weight_version));
  int64_t alive = 0;
  for (const CoordinatorSnapshot::Replica& r : s.replicas) {
    const prometheus::Labels labels{{"replica", r.name}};
    im.replica_alive.Add(labels).Set(r.alive ? 1 : 0);
    im.replica_version.Add(labels).Set(static_cast<double>(r.weight_version));
    im.replica_inflight.Add(labels).Set(static_cast<double>(r.inflight));
    alive += r.alive ? 1 : 0;
  }
  im.alive_g.Set(static_cast<double>(alive));
  replicas_alive_.store(alive, std::memory_order_relaxed);
  im.ready_g.Set(health().ready ? 1 : 0);
}

std::unique_ptr<ReplicaMetrics> Metrics::ForReplica(const std::string& name) {
  Impl& im = *impl_;
  const prometheus::Labels l{{"replica", name}};
  auto s = std::make_unique<ReplicaMetrics::Series>();
  s->running = &im.running.Add(l);
  s->waiting = &im.waiting.Add(l);
  s->kv_tokens = &im.kv_tokens.Add(l);
  s->kv_sequences = &im.kv_sequences.Add(l);
  s->kv_free = &im.kv_free.Add(l);
  s->decode = &im.decode.Add(l);
  s->computed = &im.computed.Add(l);
  s->cached = &im.cached.Add(l);
  s->hit_memory = &im.hits.Add({{"replica", name}, {"tier", "memory"}});
  s->hit_disk = &im.hits.Add({{"replica", name}, {"tier", "disk"}});
  s->preemptions = &im.preemptions.Add(l);
  for (int k = 0; k < 2; ++k) {
    const prometheus::Labels kl{{"replica", name}, {"kind", k == 0 ? "full" : "sliding"}};
    s->kv_bytes_per_token[k] = &im.kv_bytes_per_token.Add(kl);
    s->kv_live_bytes[k] = &im.kv_live_bytes.Add(kl);
    s->prefix_cached_bytes[k] = &im.prefix_cached_bytes.Add(kl);
    s->disk_bytes[k] = &im.disk_bytes.Add(kl);
  }
  s->swa_rebuilds = &im.swa_rebuilds.Add(l);
  s->swa_recomputed = &im.swa_recomputed.Add(l);
  return std::unique_ptr<ReplicaMetrics>(new ReplicaMetrics(std::move(s)));
}

std::string Metrics::Render() const {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, impl_->registry->Collect());
  return out.str();
}

ReplicaMetrics::ReplicaMetrics(std::unique_ptr<Series> s) : s_(std::move(s)) {}
ReplicaMetrics::~ReplicaMetrics() = default;

void ReplicaMetrics::Update(const engine::EngineStats& s, int32_t max_seq_len) {
  // Counters move by the increase since the last call (a counter never goes down; an engine
  // whose totals were reset just starts again from there).
  auto add = [](Counter* c, int64_t now, int64_t before) {
    if (now > before) c->Increment(static_cast<double>(now - before));
  };
  const int64_t disk_now = s.disk_hit_blocks * s.kv_block_tokens;
  const int64_t disk_before = last_.disk_hit_blocks * last_.kv_block_tokens;
  add(s_->decode, s.decode_tokens, last_.decode_tokens);
  add(s_->computed, s.prefill_tokens_computed, last_.prefill_tokens_computed);
  add(s_->cached, s.prefill_tokens_cached, last_.prefill_tokens_cached);
  add(s_->hit_disk, disk_now, disk_before);
  add(s_->hit_memory, s.prefill_tokens_cached - disk_now,
      last_.prefill_tokens_cached - disk_before);
  add(s_->preemptions, s.preemptions, last_.preemptions);
  s_->running->Set(static_cast<double>(s.running));
  s_->waiting->Set(static_cast<double>(s.waiting));
  const int64_t tokens = s.kv_blocks_total * s.kv_block_tokens;
  s_->kv_tokens->Set(static_cast<double>(tokens));
  s_->kv_sequences->Set(max_seq_len > 0 ? static_cast<double>(tokens / max_seq_len) : 0.0);
  s_->kv_free->Set(static_cast<double>(s.kv_blocks_free * s.kv_block_tokens));
  add(s_->swa_rebuilds, s.swa_rebuilds, last_.swa_rebuilds);
  add(s_->swa_recomputed, s.swa_recomputed_tokens, last_.swa_recomputed_tokens);
  const int64_t per_token[2] = {s.kv_bytes_per_token_full, s.kv_bytes_per_token_sliding};
  const int64_t live[2] = {s.kv_live_bytes_full, s.kv_live_bytes_sliding};
  const int64_t cached_bytes[2] = {s.prefix_cached_bytes_full, s.prefix_cached_bytes_sliding};
  const int64_t disk[2] = {s.disk_bytes_full, s.disk_bytes_sliding};
  for (int k = 0; k < 2; ++k) {
    s_->kv_bytes_per_token[k]->Set(static_cast<double>(per_token[k]));
    s_->kv_live_bytes[k]->Set(static_cast<double>(live[k]));
    s_->prefix_cached_bytes[k]->Set(static_cast<double>(cached_bytes[k]));
    s_->disk_bytes[k]->Set(static_cast<double>(disk[k]));
  }
  last_ = s;
}

}  // namespace bitroll::rollout
