// First-heard order of client connections, bounded (see connection_ages.h).
#include "rollout/connection_ages.h"

#include <algorithm>

namespace bitroll::rollout {

uint64_t ConnectionAges::Seen(const std::string& client) {
  if (auto it = seen_.find(client); it != seen_.end()) return it->second;
  if (seen_.size() >= std::max(limit_, prune_at_)) {
    std::unordered_map<std::string, uint64_t> keep;
    for (const std::string& c : holders_()) {
      if (auto it = seen_.find(c); it != seen_.end()) keep.insert(*it);
    }
    seen_ = std::move(keep);
    prune_at_ = 2 * seen_.size();  // amortized: no rebuild per message
  }
  const uint64_t seen = next_++;
  seen_.emplace(client, seen);
  return seen;
}

}  // namespace bitroll::rollout
