// rollout/replica_set.h: the coordinator's replicas: who joined, what each is running, which one
// a sample goes to, and which ones failed. Owned by the coordinator thread; it holds no socket
// (the coordinator sends), so its policies are testable alone (replica_set_test.cc).
//
// Contract:
// - A replica keeps its index for the life of the coordinator: one that says hello again under
//   the same ZeroMQ identity gets its old slot back (Join), so work ids recorded against it stay
//   meaningful.
// - Choose prefers the replica that served the same prompt before (the affinity key, a hash of the
//   prompt) while it is alive, current and has room; otherwise the least loaded live, current
//   replica with room (ties to the lowest index); -1 when every one is full, dead or stale.
// - Each entry tracks the group requests its replica keeps (replica protocol 3: held, forget);
//   the coordinator fills them, and a new connection (ForgetHeld) keeps none.
// - Failures found while sending (MarkUnreachable) are only recorded: the coordinator handles them
//   between loop iterations (TakeUnreachable), so no iteration over replicas is invalidated.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "rollout/rate_meter.h"

namespace bitroll::rollout {

struct ReplicaEntry {
  std::string identity;
  std::string name;
  bool remote = false, alive = true;
  uint32_t capacity = 256;
  std::unordered_set<uint64_t> inflight;  // work ids dispatched to it
  Clock::time_point last_seen;
  uint64_t weight_version = 0;
  int64_t running = 0;
  RateMeter rate;
  // Weight catch-up of a (re)joined replica (rollout/weights_gate.h): the request ids of the
  // updates replayed to it; stale = it cannot serve the live weights (a replay failed, or they
  // came by NCCL broadcast): nothing is dispatched to it.
  std::unordered_set<uint64_t> catchup;
  bool stale = false;
  // Replica protocol 3: the group requests this replica keeps (request key -> bytes), their
  // bytes in all, and the keys it may drop, told with its next ReplicaWork. A (re)joined or dead
  // replica holds none (ForgetHeld).
  std::unordered_map<uint64_t, size_t> held;
  size_t held_bytes = 0;
  std::vector<uint64_t> forget;
  uint32_t refusals = 0;  // ReplicaRefused messages on this connection

  bool HasRoom() const { return alive && !stale && inflight.size() < capacity; }
  bool Holds(uint64_t key) const { return held.count(key) > 0; }
  void Keep(uint64_t key, size_t bytes) {
    if (held.emplace(key, bytes).second) held_bytes += bytes;
  }
  // The replica keeps it no more: `tell` queues a forget for its next ReplicaWork.
  void Drop(uint64_t key, bool tell) {
    auto it = held.find(key);
    if (it == held.end()) return;
    held_bytes -= it->second;
    held.erase(it);
    if (tell) forget.push_back(key);
  }
  // A new connection (or none): nothing held, nothing to tell.
  void ForgetHeld() {
    held.clear();
    held_bytes = 0;
    forget.clear();
    refusals = 0;
  }
};

class ReplicaSet {
 public:
  int size() const { return static_cast<int>(replicas_.size()); }
  ReplicaEntry& operator[](int r) { return replicas_[r]; }
  const ReplicaEntry& operator[](int r) const { return replicas_[r]; }
  auto begin() { return replicas_.begin(); }
  auto end() { return replicas_.end(); }
  auto begin() const { return replicas_.begin(); }
  auto end() const { return replicas_.end(); }

  // The index of the replica that joined as `identity`, or -1.
  int Find(const std::string& identity) const;

  // The slot of a replica saying hello as `identity`: its old one when the identity joined before
  // (`*rejoined` = true; the caller declares the old incarnation dead if it was alive), else a
  // new one. The slot's fields are the caller's to fill.
  int Join(const std::string& identity, bool* rejoined);

  // Where a sample with this affinity key goes (see the contract above); remembers the choice.
  int Choose(uint64_t affinity_key);

  int Live() const;

  // Live replicas not heard from for longer than `limit` at `now`.
  std::vector<int> Silent(Clock::time_point now, Clock::duration limit) const;

  void MarkUnreachable(int r) { unreachable_.insert(r); }
  bool AnyUnreachable() const { return !unreachable_.empty(); }
  std::vector<int> TakeUnreachable();

 private:
  // Remembered choices are forgotten wholesale past this many prompts (a bound, not an LRU).
  static constexpr size_t kMaxAffinity = 100000;

  std::vector<ReplicaEntry> replicas_;
  std::unordered_map<std::string, int> by_identity_;
  std::unordered_map<uint64_t, int> affinity_;
  std::unordered_set<int> unreachable_;
};

}  // namespace bitroll::rollout
