#include "rollout/request_store.h"

#include <cstring>
#include <string>

namespace bitroll::rollout {

void RequestStore::Forget(uint64_t key) {
  auto it = held_.find(key);
  if (it == held_.end()) return;
  bytes_ -= it->second.size;
  held_.erase(it);
}

Status RequestStore::Apply(const wire::ReplicaWork& work) {
  if (work.forget() != nullptr) {
    for (uint64_t key : *work.forget()) Forget(key);
  }
  if (work.requests() == nullptr) return Status::Ok();
  Status refused;
  for (const wire::GroupRequest* r : *work.requests()) {
    if (r->transient() || r->envelope() == nullptr) continue;
    Forget(r->key());  // a key sent again replaces what was kept
    const size_t n = r->envelope()->size();
    if (held_.size() + 1 > kMaxHeldRequests || bytes_ + n > kMaxHeldRequestBytes) {
      refused = Status::ResourceExhausted(
          "request " + std::to_string(r->key()) + " of " + std::to_string(n) +
          " bytes not kept: the replica holds " + std::to_string(held_.size()) + " requests of " +
          std::to_string(bytes_) + " bytes (at most " + std::to_string(kMaxHeldRequests) + ", " +
          std::to_string(kMaxHeldRequestBytes) + " bytes)");
      continue;
    }
    Held h;
    h.storage.resize((n + 7) / 8);
    std::memcpy(h.storage.data(), r->envelope()->data(), n);
    h.size = n;
    bytes_ += n;
    held_[r->key()] = std::move(h);
  }
  return refused;
}

Result<const wire::SubmitRollouts*> RequestStore::Find(const wire::ReplicaWork& work,
                                                       const wire::WorkItem& item) const {
  if (FindRequest(work, item.request_key()) != nullptr) return RequestOf(work, item);
  auto it = held_.find(item.request_key());
  if (it == held_.end()) {
    return Status::Protocol("work item " + std::to_string(item.work_id()) + " names request " +
                            std::to_string(item.request_key()) +
                            ", which this replica does not hold and its message does not carry");
  }
  // Verified when its message was: the copy has the same bytes at the same alignment.
  return SubmitOf(flatbuffers::GetRoot<wire::Envelope>(it->second.storage.data()), item);
}

}  // namespace bitroll::rollout
