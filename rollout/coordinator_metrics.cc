// The coordinator's metrics snapshot (rollout/metrics.h): queue depths, replicas, weights.
#include "rollout/coordinator_state.h"

namespace bitroll::rollout {

void Coordinator::State::PublishMetrics(Clock::time_point now) {
  // At most every 100 ms: per-replica series are looked up by label here.
  if (now - metrics_published < std::chrono::milliseconds(100)) return;
  metrics_published = now;
  CoordinatorSnapshot s;
  s.queued = table.queued();
  s.inflight = table.InFlight();
  s.groups = table.size();
  s.weight_version = weights.version();
  s.replicas.reserve(replicas.size());
  for (const Replica& r : replicas) {
    s.replicas.push_back({r.name, r.alive, r.weight_version, r.inflight.size()});
  }
  options.metrics->PublishCoordinator(s);
}

}  // namespace bitroll::rollout
