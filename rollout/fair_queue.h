// rollout/fair_queue.h: the coordinator's queue of samples waiting for a replica.
//
// Order: the highest priority first; within one priority, round-robin over groups (one sample of
// each group in turn, groups in the order they first queued), so that one large group cannot hold
// back a small one queued after it. Within a group samples keep their order; a re-queued sample
// (replica failover) goes to the front of its group and its group to the front of the round.
// Dispatch order never changes a bit of any result (a sample is a pure function of its inputs):
// it only decides who waits.
//
// Thread-safety: none (the coordinator thread owns it).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>

namespace bitroll::rollout {

class FairQueue {
 public:
  // What Drain's callback did with the id it was offered.
  enum class Take {
    kTaken,  // dispatched: remove it, go on with the next group
    kStale,  // no longer queued (aborted, already running): remove it, offer the next of its group
    kFull,   // no room anywhere: keep it in place and stop
  };

  void Push(int priority, const std::string& group, uint64_t id, bool front = false) {
    Level& l = levels_[priority];
    std::deque<uint64_t>& ids = l.ids[group];
    if (ids.empty()) {
      if (front) {
        l.ring.push_front(group);
      } else {
        l.ring.push_back(group);
      }
    }
    if (front) {
      ids.push_front(id);
    } else {
      ids.push_back(id);
    }
  }

  // Offers ids to `take` in dispatch order until it answers kFull or nothing is left.
  void Drain(const std::function<Take(uint64_t id)>& take) {
    for (auto lit = levels_.begin(); lit != levels_.end();) {
      Level& l = lit->second;
      while (!l.ring.empty()) {
        std::string group = std::move(l.ring.front());
        l.ring.pop_front();
        auto it = l.ids.find(group);
        std::deque<uint64_t>& ids = it->second;
        Take t = Take::kStale;
        while (!ids.empty() && (t = take(ids.front())) == Take::kStale) ids.pop_front();
        if (t == Take::kFull) {
          l.ring.push_front(std::move(group));
          return;
        }
        if (t == Take::kTaken) ids.pop_front();
        if (ids.empty()) {
          l.ids.erase(it);
        } else {
          l.ring.push_back(std::move(group));
        }
      }
      lit = levels_.erase(lit);
    }
  }

  bool empty() const { return levels_.empty(); }

 private:
  struct Level {
    std::deque<std::string> ring;  // groups with queued ids, in turn
    std::unordered_map<std::string, std::deque<uint64_t>> ids;
  };
  std::map<int, Level, std::greater<>> levels_;
};

}  // namespace bitroll::rollout
