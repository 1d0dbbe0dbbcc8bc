// ReplicaSet alone (rollout/replica_set.h): joins keep their slot, the choice follows the
// affinity while the replica has room, else the least loaded; silence and send failures.
#include "rollout/replica_set.h"

#include <gtest/gtest.h>

namespace bitroll::rollout {
namespace {

int Add(ReplicaSet& set, const std::string& identity, uint32_t capacity) {
  bool rejoined = true;
  const int r = set.Join(identity, &rejoined);
  EXPECT_FALSE(rejoined);
  set[r].capacity = capacity;
  set[r].last_seen = Clock::now();
  return r;
}

TEST(ReplicaSet, RejoinKeepsTheSlot) {
  ReplicaSet set;
  EXPECT_EQ(Add(set, "a", 4), 0);
  EXPECT_EQ(Add(set, "b", 4), 1);
  EXPECT_EQ(set.Find("b"), 1);
  EXPECT_EQ(set.Find("c"), -1);
  bool rejoined = false;
  EXPECT_EQ(set.Join("a", &rejoined), 0);
  EXPECT_TRUE(rejoined);
  EXPECT_EQ(set.size(), 2);
  EXPECT_EQ(set[0].identity, "a");
}

TEST(ReplicaSet, AffinityWinsWhileTheReplicaHasRoom) {
  ReplicaSet set;
  Add(set, "a", 2);
  Add(set, "b", 2);
  set[1].inflight = {7};  // a is less loaded: the first choice of prompt 42 is a
  EXPECT_EQ(set.Choose(42), 0);
  set[0].inflight = {1};
  EXPECT_EQ(set.Choose(42), 0);  // same load (1/2 each): the affinity keeps it on a
  set[0].inflight = {1, 2};      // a is full
  EXPECT_EQ(set.Choose(42), 1);
  set[0].inflight.clear();
  EXPECT_EQ(set.Choose(42), 1);  // the affinity moved with the last choice
}

TEST(ReplicaSet, LeastLoadedByFractionOfCapacityTiesToTheLowestIndex) {
  ReplicaSet set;
  Add(set, "small", 2);
  Add(set, "big", 8);
  Add(set, "twin", 8);
  set[0].inflight = {1};        // 1/2
  set[1].inflight = {2, 3, 4};  // 3/8
  set[2].inflight = {5, 6, 7};  // 3/8
  EXPECT_EQ(set.Choose(1), 1);
}

TEST(ReplicaSet, DeadStaleAndFullReplicasAreNeverChosen) {
  ReplicaSet set;
  Add(set, "dead", 4);
  Add(set, "stale", 4);
  Add(set, "full", 1);
  set[0].alive = false;
  set[1].stale = true;
  set[2].inflight = {9};
  EXPECT_EQ(set.Choose(5), -1);
  EXPECT_EQ(set.Live(), 2);  // stale and full ones are alive
  set[2].inflight.clear();
  EXPECT_EQ(set.Choose(5), 2);
}

TEST(ReplicaSet, SilentListsOnlyLiveReplicasPastTheLimit) {
  ReplicaSet set;
  Add(set, "a", 1);
  Add(set, "b", 1);
  Add(set, "c", 1);
  const auto now = Clock::now();
  set[0].last_seen = now - std::chrono::seconds(10);
  set[1].last_seen = now - std::chrono::seconds(1);
  set[2].last_seen = now - std::chrono::seconds(10);
  set[2].alive = false;
  EXPECT_EQ(set.Silent(now, std::chrono::seconds(5)), std::vector<int>{0});
}

TEST(ReplicaSet, UnreachableIsReportedOnceInIndexOrder) {
  ReplicaSet set;
  Add(set, "a", 1);
  Add(set, "b", 1);
  EXPECT_FALSE(set.AnyUnreachable());
  set.MarkUnreachable(1);
  set.MarkUnreachable(0);
  set.MarkUnreachable(1);
  EXPECT_TRUE(set.AnyUnreachable());
  EXPECT_EQ(set.TakeUnreachable(), (std::vector<int>{0, 1}));
  EXPECT_FALSE(set.AnyUnreachable());
  EXPECT_TRUE(set.TakeUnreachable().empty());
}

}  // namespace
}  // namespace bitroll::rollout
