// Replies to clients that never block the coordinator (see client_outbox.h).
#include "rollout/client_outbox.h"

#include <algorithm>
#include <utility>

#include <spdlog/spdlog.h>

namespace bitroll::rollout {

ClientOutbox::ClientOutbox(Transport transport, size_t max_bytes, std::string slow_consequence)
    : transport_(std::move(transport)),
      max_bytes_(max_bytes),
      slow_consequence_(std::move(slow_consequence)) {}

void ClientOutbox::Send(const std::string& client, std::string_view bytes) {
  if (IsSlow(client)) return;                                    // dropped as a slow reader
  if (boxes_.count(client) != 0) return Enqueue(client, bytes);  // keeps this client's order
  switch (transport_(client, bytes)) {
    case SendResult::kWouldBlock:
      return Enqueue(client, bytes);
    case SendResult::kGone:
      gone_.insert(client);
      return;
    case SendResult::kSent:
    case SendResult::kFailed:
      return;
  }
}

void ClientOutbox::Enqueue(const std::string& client, std::string_view bytes) {
  Box& box = boxes_[client];
  box.msgs.emplace_back(bytes);
  box.bytes += bytes.size();
  if (box.bytes > max_bytes_) {
    spdlog::warn(
        "coordinator: dropping a client that does not read: {} replies ({} bytes) unread, limit "
        "{} bytes; its groups are {}",
        box.msgs.size(), box.bytes, max_bytes_, slow_consequence_);
    boxes_.erase(client);
    slow_.insert(client);
  }
}

size_t ClientOutbox::Pending(const std::string& client) const {
  auto it = boxes_.find(client);
  return it == boxes_.end() ? 0 : it->second.bytes;
}

void ClientOutbox::Flush() {
  for (auto it = boxes_.begin(); it != boxes_.end();) {
    Box& box = it->second;
    while (!box.msgs.empty()) {
      const SendResult r = transport_(it->first, box.msgs.front());
      if (r == SendResult::kWouldBlock) break;
      if (r == SendResult::kGone || r == SendResult::kFailed) {
        if (r == SendResult::kGone) gone_.insert(it->first);
        box.msgs.clear();
        break;
      }
      box.bytes -= box.msgs.front().size();
      box.msgs.pop_front();
    }
    if (box.msgs.empty()) {
      it = boxes_.erase(it);
    } else {
      ++it;
    }
  }
}

void ClientOutbox::MarkDropped(const std::string& client) {
  if (dropped_.size() > kMaxDropped) dropped_.clear();
  dropped_.insert(client);
}

std::vector<std::string> ClientOutbox::Take(std::unordered_set<std::string>* set) {
  std::vector<std::string> out(set->begin(), set->end());
  std::sort(out.begin(), out.end());
  set->clear();
  return out;
}

}  // namespace bitroll::rollout
