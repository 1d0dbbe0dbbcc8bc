// rollout/request_store.h: the group requests a replica keeps for its coordinator (replica
// protocol 3). The coordinator sends each group's request (a SubmitRollouts envelope, nested in
// a ReplicaWork as a GroupRequest) to a replica once; the replica keeps a copy under the
// request's key, and later WorkItems name it by key alone. Owned by the replica loop; one per
// connection (a replica that reconnects or restarts starts empty).
//
// Contract:
// - Apply(work) applies a ReplicaWork in the protocol's order: its `forget` keys are dropped,
//   then its requests that are not transient are kept (a key already held is replaced).
// - At most kMaxHeldRequests requests of at most kMaxHeldRequestBytes bytes in all are kept
//   (rollout/protocol.h): one past that is not kept, and Apply returns kResourceExhausted naming
//   it (the items of its own message still run from the message; later items naming it are
//   refused). The coordinator keeps within the same bound, so this is a guard only.
// - Find(work, item) gives the request the item names: the one its message carries, else a kept
//   one; kProtocol when neither has the key (the replica sends the item back: ReplicaRefused),
//   or the request is no SubmitRollouts / has no such prompt.
// - The SubmitRollouts a kept request gives stays valid until the key is forgotten or replaced.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "rollout/protocol.h"

namespace bitroll::rollout {

class RequestStore {
 public:
  Status Apply(const wire::ReplicaWork& work);
  Result<const wire::SubmitRollouts*> Find(const wire::ReplicaWork& work,
                                           const wire::WorkItem& item) const;
  bool Holds(uint64_t key) const { return held_.count(key) > 0; }
  // Whether `key` names a request: one `work` carries, or a kept one.
  bool Knows(const wire::ReplicaWork& work, uint64_t key) const {
    return Holds(key) || FindRequest(work, key) != nullptr;
  }
  // The kept bytes of `key` (empty when not kept).
  std::string_view Bytes(uint64_t key) const {
    auto it = held_.find(key);
    if (it == held_.end()) return {};
    return {reinterpret_cast<const char*>(it->second.storage.data()), it->second.size};
  }
  size_t size() const { return held_.size(); }
  size_t bytes() const { return bytes_; }

 private:
  struct Held {
    std::vector<uint64_t> storage;  // the envelope's bytes, 8-byte aligned like in the message
    size_t size = 0;
  };
  void Forget(uint64_t key);

  std::unordered_map<uint64_t, Held> held_;
  size_t bytes_ = 0;
};

}  // namespace bitroll::rollout
