// rollout/client_outbox.h: replies to clients without ever blocking the coordinator. A reply that
// the client's socket cannot take now waits in a per-connection outbox, in order; a client whose
// unread replies pass a byte limit is dropped as a slow reader. It holds no socket: sending goes
// through a Transport (the coordinator's ROUTER in the service, a fake in client_outbox_test.cc).
//
// Contract:
// - Replies to one connection leave in the order they were given, whether sent at once or queued.
// - Pending(c) counts the bytes waiting here for c (not ZeroMQ's own queue).
// - Past max_bytes waiting, a connection is slow: its outbox is discarded, nothing more is sent
//   to it, and TakeSlow() reports it once. A send that finds the peer gone reports it once through
//   TakeGone(). The coordinator handles both between loop iterations (it detaches or aborts the
//   connection's groups) and calls Forget().
// - MarkDropped / ConsumeDropped remember, for a bounded number of connections, that one was
//   dropped, so its next message can be told why.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace bitroll::rollout {

class ClientOutbox {
 public:
  enum class SendResult {
    kSent,        // handed to the transport
    kWouldBlock,  // the peer's queue is full: try again later
    kGone,        // the peer is unreachable
    kFailed,      // any other error: the reply is lost (the transport logs it)
  };
  using Transport = std::function<SendResult(const std::string& client, std::string_view bytes)>;

  // `slow_consequence` ends the warning logged when a slow client is dropped ("its groups are
  // ...").
  ClientOutbox(Transport transport, size_t max_bytes, std::string slow_consequence);

  // Sends `bytes` to `client` now, or queues it behind the client's earlier unsent replies.
  void Send(const std::string& client, std::string_view bytes);

  // Sends queued replies, per client, until its socket blocks.
  void Flush();

  size_t Pending(const std::string& client) const;
  bool Empty() const { return boxes_.empty(); }
  bool IsSlow(const std::string& client) const { return slow_.count(client) != 0; }

  bool AnyFailed() const { return !slow_.empty() || !gone_.empty(); }
  std::vector<std::string> TakeSlow() { return Take(&slow_); }
  std::vector<std::string> TakeGone() { return Take(&gone_); }

  // Discards the connection's queued replies (it is gone).
  void Forget(const std::string& client) { boxes_.erase(client); }

  void MarkDropped(const std::string& client);
  // True once after MarkDropped(client).
  bool ConsumeDropped(const std::string& client) { return dropped_.erase(client) != 0; }

 private:
  struct Box {
    std::deque<std::string> msgs;
    size_t bytes = 0;
  };
  static constexpr size_t kMaxDropped = 100000;

  void Enqueue(const std::string& client, std::string_view bytes);
  static std::vector<std::string> Take(std::unordered_set<std::string>* set);

  Transport transport_;
  size_t max_bytes_;
  std::string slow_consequence_;
  std::unordered_map<std::string, Box> boxes_;  // non-empty ones only
  std::unordered_set<std::string> slow_, gone_, dropped_;
};

}  // namespace bitroll::rollout
