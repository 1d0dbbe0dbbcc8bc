// The coordinator's replicas: join, choice and failure bookkeeping (see replica_set.h).
#include "rollout/replica_set.h"

#include <algorithm>

namespace bitroll::rollout {

int ReplicaSet::Find(const std::string& identity) const {
  auto it = by_identity_.find(identity);
  return it == by_identity_.end() ? -1 : it->second;
}

int ReplicaSet::Join(const std::string& identity, bool* rejoined) {
  const int old = Find(identity);
  *rejoined = old >= 0;
  if (old >= 0) return old;
  const int r = size();
  replicas_.emplace_back();
  replicas_.back().identity = identity;
  by_identity_[identity] = r;
  return r;
}

int ReplicaSet::Choose(uint64_t affinity_key) {
  auto it = affinity_.find(affinity_key);
  if (it != affinity_.end() && replicas_[it->second].HasRoom()) return it->second;
  int best = -1;
  double best_load = 2.0;
  for (int i = 0; i < size(); ++i) {
    const ReplicaEntry& r = replicas_[i];
    if (!r.HasRoom()) continue;
    const double load = static_cast<double>(r.inflight.size()) / r.capacity;
    if (load < best_load) {
      best = i;
      best_load = load;
    }
  }
  if (best >= 0) {
    if (affinity_.size() > kMaxAffinity) affinity_.clear();
    affinity_[affinity_key] = best;
  }
  return best;
}

int ReplicaSet::Live() const {
  return static_cast<int>(
      std::count_if(replicas_.begin(), replicas_.end(), [](const auto& r) { return r.alive; }));
}

std::vector<int> ReplicaSet::Silent(Clock::time_point now, Clock::duration limit) const {
  std::vector<int> out;
  for (int r = 0; r < size(); ++r) {
    if (replicas_[r].alive && now - replicas_[r].last_seen > limit) out.push_back(r);
  }
  return out;
}

std::vector<int> ReplicaSet::TakeUnreachable() {
  std::vector<int> out(unreachable_.begin(), unreachable_.end());
  std::sort(out.begin(), out.end());
  unreachable_.clear();
  return out;
}

}  // namespace bitroll::rollout
