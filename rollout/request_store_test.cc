// The requests a replica keeps for its coordinator (replica protocol 3): kept byte for byte,
// named by key in later messages, dropped on forget, bounded.
#include "rollout/request_store.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "rollout/client.h"
#include "rollout/messages.h"

namespace bitroll::rollout {
namespace {

std::string Request(uint64_t group_id, uint64_t seed) {
  SubmitRequest q;
  q.group_id = group_id;
  q.prompts = {{1, 5, 9, 200}, {3, 4}};
  q.n = 4;
  q.seed = seed;
  q.max_tokens = 16;
  return EncodeSubmit(q, 3);
}

// A decoded ReplicaWork that owns its bytes.
struct Work {
  explicit Work(ReplicaWorkBuilder& b) : bytes(b.Finish()) {
    auto env = DecodeEnvelope(bytes.data(), bytes.size(), DecodeLimits{});
    EXPECT_TRUE(env.ok()) << env.status().ToString();
    work = env.ok() ? (*env)->msg_as_ReplicaWork() : nullptr;
  }
  const wire::WorkItem& item(size_t k) const { return *work->items()->Get(k); }
  std::string bytes;
  const wire::ReplicaWork* work = nullptr;
};

TEST(ReplicaRequestStoreTest, KeepsTheRequestVerbatimAndLaterItemsNameItByKey) {
  const std::string a = Request(7, 42);
  RequestStore store;
  ReplicaWorkBuilder first;
  first.AddRequest(3, a);
  first.Add(3, 100, {7, 1, 0});
  Work w1(first);
  ASSERT_NE(w1.work, nullptr);
  ASSERT_TRUE(store.Apply(*w1.work).ok());
  ASSERT_TRUE(store.Holds(3));
  ASSERT_EQ(store.Bytes(3).size(), a.size());
  EXPECT_EQ(std::memcmp(store.Bytes(3).data(), a.data(), a.size()), 0);
  EXPECT_EQ(store.bytes(), a.size());
  // A later message carries no request: its items name the kept one.
  ReplicaWorkBuilder later;
  later.Add(3, 101, {7, 0, 2});
  later.Add(4, 102, {9, 0, 0});  // never sent
  Work w2(later);
  ASSERT_NE(w2.work, nullptr);
  EXPECT_EQ(w2.work->requests()->size(), 0u);
  ASSERT_TRUE(store.Apply(*w2.work).ok());
  auto m = store.Find(*w2.work, w2.item(0));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ((*m)->group_id(), 7u);
  EXPECT_EQ((*m)->seed(), 42u);
  EXPECT_TRUE(store.Knows(*w2.work, 3));
  // Negative control: an unknown key is a typed error, not a crash.
  EXPECT_FALSE(store.Knows(*w2.work, 4));
  EXPECT_EQ(store.Find(*w2.work, w2.item(1)).status().code(), ErrorCode::kProtocol);
}

TEST(ReplicaRequestStoreTest, ForgetFreesTheRequest) {
  RequestStore store;
  ReplicaWorkBuilder b;
  b.AddRequest(1, Request(1, 1));
  b.AddRequest(2, Request(2, 2));
  Work w(b);
  ASSERT_TRUE(store.Apply(*w.work).ok());
  ASSERT_EQ(store.size(), 2u);
  ReplicaWorkBuilder f;
  f.Forget(1);
  f.Forget(99);  // not held: nothing happens
  f.Add(1, 5, {1, 0, 0});
  Work wf(f);
  // Before: item 5 finds its request (control); after the forget it does not.
  EXPECT_TRUE(store.Find(*wf.work, wf.item(0)).ok());
  ASSERT_TRUE(store.Apply(*wf.work).ok());
  EXPECT_FALSE(store.Holds(1));
  EXPECT_TRUE(store.Holds(2));
  EXPECT_EQ(store.size(), 1u);
  EXPECT_EQ(store.bytes(), Request(2, 2).size());
  EXPECT_EQ(store.Find(*wf.work, wf.item(0)).status().code(), ErrorCode::kProtocol);
  // Forget, then keep the same key again in one message: kept (forgets go first).
  ReplicaWorkBuilder again;
  again.Forget(2);
  again.AddRequest(2, Request(2, 3));
  Work wa(again);
  ASSERT_TRUE(store.Apply(*wa.work).ok());
  ASSERT_TRUE(store.Holds(2));
  EXPECT_EQ(std::memcmp(store.Bytes(2).data(), Request(2, 3).data(), store.Bytes(2).size()), 0);
}

TEST(ReplicaRequestStoreTest, TransientRequestsServeTheirMessageOnly) {
  RequestStore store;
  ReplicaWorkBuilder b;
  b.AddRequest(8, Request(8, 1), /*transient=*/true);
  b.Add(8, 1, {8, 0, 0});
  Work w(b);
  ASSERT_TRUE(store.Apply(*w.work).ok());
  EXPECT_TRUE(store.Find(*w.work, w.item(0)).ok());
  EXPECT_FALSE(store.Holds(8));
  EXPECT_EQ(store.bytes(), 0u);
}

TEST(ReplicaRequestStoreTest, KeepsNoMoreThanTheBound) {
  RequestStore store;
  ReplicaWorkBuilder b;
  for (uint64_t k = 1; k <= kMaxHeldRequests + 1; ++k) b.AddRequest(k, Request(k, k));
  Work w(b);
  const Status s = store.Apply(*w.work);
  EXPECT_EQ(s.code(), ErrorCode::kResourceExhausted) << s.ToString();
  EXPECT_EQ(store.size(), kMaxHeldRequests);
  EXPECT_FALSE(store.Holds(kMaxHeldRequests + 1));
  // Room again after a forget.
  ReplicaWorkBuilder f;
  f.Forget(1);
  f.AddRequest(kMaxHeldRequests + 1, Request(5000, 1));
  Work wf(f);
  EXPECT_TRUE(store.Apply(*wf.work).ok());
  EXPECT_TRUE(store.Holds(kMaxHeldRequests + 1));
  EXPECT_EQ(store.size(), kMaxHeldRequests);
}

}  // namespace
}  // namespace bitroll::rollout
