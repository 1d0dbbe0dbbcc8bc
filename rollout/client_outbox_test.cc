// ClientOutbox alone (rollout/client_outbox.h), over a fake transport checked against a simple
// model: every reply to a connection arrives once and in order, unless the connection is dropped
// (slow) or gone, and nothing is ever sent to a dropped connection.
#include "rollout/client_outbox.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

namespace bitroll::rollout {
namespace {

using R = ClientOutbox::SendResult;

// A transport whose peers take `room[client]` more messages (absent: unlimited) and then block.
struct FakeTransport {
  std::map<std::string, std::vector<std::string>> got;
  std::map<std::string, int> room;
  std::map<std::string, R> fail;  // kGone / kFailed for this client

  ClientOutbox::Transport Fn() {
    return [this](const std::string& c, std::string_view b) {
      if (auto f = fail.find(c); f != fail.end()) return f->second;
      if (auto r = room.find(c); r != room.end()) {
        if (r->second == 0) return R::kWouldBlock;
        --r->second;
      }
      got[c].emplace_back(b);
      return R::kSent;
    };
  }
};

TEST(ClientOutbox, QueuedRepliesKeepTheirOrderBehindABlockedSocket) {
  FakeTransport t;
  ClientOutbox box(t.Fn(), 1 << 20, "aborted");
  t.room["a"] = 1;
  box.Send("a", "1");
  box.Send("a", "2");  // blocks: queued
  box.Send("b", "x");
  t.room["a"] = 100;
  box.Send("a", "3");  // the socket has room again, but "2" waits: queued behind it
  EXPECT_EQ(box.Pending("a"), 2u);
  EXPECT_EQ(t.got["a"], std::vector<std::string>{"1"});
  box.Flush();
  EXPECT_EQ(t.got["a"], (std::vector<std::string>{"1", "2", "3"}));
  EXPECT_EQ(t.got["b"], std::vector<std::string>{"x"});
  EXPECT_EQ(box.Pending("a"), 0u);
  EXPECT_TRUE(box.Empty());
}

TEST(ClientOutbox, AClientPastTheLimitIsDroppedOnceAndNeverSentTo) {
  FakeTransport t;
  ClientOutbox box(t.Fn(), 10, "aborted");
  t.room["slow"] = 0;
  box.Send("slow", "12345");
  box.Send("slow", "12345");  // exactly the limit: still queued
  EXPECT_FALSE(box.IsSlow("slow"));
  box.Send("slow", "1");  // past it
  EXPECT_TRUE(box.IsSlow("slow"));
  EXPECT_EQ(box.Pending("slow"), 0u);
  EXPECT_TRUE(box.AnyFailed());
  t.room["slow"] = 100;
  box.Send("slow", "later");  // until the coordinator handled the drop, nothing goes out
  box.Flush();
  EXPECT_TRUE(t.got["slow"].empty());
  EXPECT_EQ(box.TakeSlow(), std::vector<std::string>{"slow"});
  EXPECT_TRUE(box.TakeSlow().empty());
  EXPECT_FALSE(box.AnyFailed());
  // Handled (its groups detached or aborted): the connection counts as new if it speaks again.
  box.Send("slow", "again");
  EXPECT_EQ(t.got["slow"], std::vector<std::string>{"again"});
}

TEST(ClientOutbox, GoneAndFailedPeers) {
  FakeTransport t;
  ClientOutbox box(t.Fn(), 1 << 20, "aborted");
  t.fail["gone"] = R::kGone;
  t.fail["broken"] = R::kFailed;
  box.Send("gone", "x");
  box.Send("broken", "y");  // lost, and logged by the transport: not a failure to handle
  EXPECT_EQ(box.TakeGone(), std::vector<std::string>{"gone"});
  EXPECT_TRUE(box.Empty());
  // A queued connection that turns out gone while flushing: its queue is discarded.
  t.room["late"] = 0;
  box.Send("late", "1");
  box.Send("late", "2");
  t.fail["late"] = R::kGone;
  box.Flush();
  EXPECT_EQ(box.TakeGone(), std::vector<std::string>{"late"});
  EXPECT_EQ(box.Pending("late"), 0u);
  box.Forget("late");
  EXPECT_TRUE(box.Empty());
}

TEST(ClientOutbox, DroppedIsToldOnce) {
  FakeTransport t;
  ClientOutbox box(t.Fn(), 1, "aborted");
  EXPECT_FALSE(box.ConsumeDropped("a"));
  box.MarkDropped("a");
  EXPECT_TRUE(box.ConsumeDropped("a"));
  EXPECT_FALSE(box.ConsumeDropped("a"));
}

// Random sends, blocking and flushes against the model: what each connection received is exactly
// the prefix-free sequence it was sent, in order, unless it was dropped as slow.
TEST(ClientOutbox, RandomScheduleMatchesTheModel) {
  std::mt19937 rng(1234);
  for (int round = 0; round < 200; ++round) {
    FakeTransport t;
    ClientOutbox box(t.Fn(), 40, "aborted");
    std::map<std::string, std::vector<std::string>> sent;
    const std::string clients[] = {"a", "b", "c"};
    for (const auto& c : clients) t.room[c] = 0;
    for (int step = 0; step < 60; ++step) {
      const std::string& c = clients[rng() % 3];
      switch (rng() % 3) {
        case 0: {
          std::string msg = std::to_string(step) + std::string(rng() % 8, '.');
          if (!box.IsSlow(c)) sent[c].push_back(msg);
          box.Send(c, msg);
          break;
        }
        case 1:
          t.room[c] += static_cast<int>(rng() % 3);
          break;
        default:
          box.Flush();
      }
    }
    const auto slow = box.TakeSlow();
    for (const auto& c : clients) t.room[c] = 1 << 20;
    box.Flush();
    for (const auto& c : clients) {
      const bool dropped = std::find(slow.begin(), slow.end(), c) != slow.end();
      const auto& got = t.got[c];
      const auto& want = sent[c];
      ASSERT_LE(got.size(), want.size());
      EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin())) << "round " << round;
      if (!dropped) {
        EXPECT_EQ(got.size(), want.size()) << "round " << round << " client " << c;
      }
    }
  }
}

}  // namespace
}  // namespace bitroll::rollout
