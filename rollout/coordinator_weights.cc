// The coordinator's glue to its weights (rollout/weights_gate.h, which owns the update in flight,
// the catch-up of late joiners and the version gate): queueing under the version gate, and the
// records of the live weights that a restart reads. schema/rollout.fbs (UpdateWeights) has the
// protocol, docs/weights.md the guide.
#include "rollout/coordinator_state.h"

namespace bitroll::rollout {

void Coordinator::State::OnUpdateWeights(const std::string& client, const wire::Envelope* e,
                                         const void* data, size_t size) {
  weights.OnUpdate(client, e, data, size);
  weights.MaybeSend(table.InFlight());
}

void Coordinator::State::Enqueue(Work* w, bool front) {
  table.CountQueued();
  if (!weights.Admit(w->id, w->needs_version)) return;  // RecoverFromWal logs how many wait
  queue.Push(w->group->submit->priority(), w->group->key, w->id, front);
}

void Coordinator::State::ReleaseWaitingWork() {
  const std::vector<uint64_t> runnable = weights.TakeRunnable();
  for (uint64_t id : runnable) {
    const Work* w = table.FindWork(id);
    if (w == nullptr) continue;  // aborted meanwhile (AbortGroup counted it)
    queue.Push(w->group->submit->priority(), w->group->key, id);
  }
  if (!runnable.empty()) {
    spdlog::info("coordinator: weights version={} live: {} waiting trajectories queued",
                 weights.version(), runnable.size());
  }
}

}  // namespace bitroll::rollout
