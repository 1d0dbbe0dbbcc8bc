// rollout/connection_ages.h: the order in which the coordinator first heard from each client
// connection (WAL mode), so that a re-attach never moves a group from a newer connection of its
// owner back to an older one whose Submit arrived late (ZeroMQ orders messages per connection
// only). No socket: testable alone (connection_ages_test.cc).
//
// Contract:
// - Seen(c) is the same number on every call until c is forgotten; a connection first heard later
//   gets a larger number.
// - The table is bounded: when it reaches max(limit, twice what the last prune kept), only the
//   connections `holders` names (those that hold a group) stay; a forgotten connection that speaks
//   again counts as new (it gets a fresh, larger number). Pruning is amortized: not a rebuild per
//   message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace bitroll::rollout {

class ConnectionAges {
 public:
  // `holders()`: the connections that must survive a prune (they hold a group); called once per
  // prune.
  ConnectionAges(size_t limit, std::function<std::vector<std::string>()> holders)
      : limit_(limit), holders_(std::move(holders)) {}

  uint64_t Seen(const std::string& client);
  void Forget(const std::string& client) { seen_.erase(client); }
  size_t size() const { return seen_.size(); }

 private:
  size_t limit_;
  std::function<std::vector<std::string>()> holders_;
  std::unordered_map<std::string, uint64_t> seen_;
  uint64_t next_ = 1;
  size_t prune_at_ = 0;
};

}  // namespace bitroll::rollout
