// FairQueue: priority first, round-robin over groups within a priority, failover to the front.
#include "rollout/fair_queue.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

namespace bitroll::rollout {
namespace {

std::vector<uint64_t> DrainAll(FairQueue& q, size_t room = ~size_t{0},
                               const std::set<uint64_t>& stale = {}) {
  std::vector<uint64_t> out;
  q.Drain([&](uint64_t id) {
    if (stale.count(id)) return FairQueue::Take::kStale;
    if (out.size() == room) return FairQueue::Take::kFull;
    out.push_back(id);
    return FairQueue::Take::kTaken;
  });
  return out;
}

TEST(FairQueue, RoundRobinOverGroupsWithinAPriority) {
  FairQueue q;
  for (uint64_t i = 0; i < 1000; ++i) q.Push(0, "big", 1000 + i);  // a large group first
  q.Push(0, "small", 1);
  q.Push(0, "small", 2);
  const std::vector<uint64_t> got = DrainAll(q, 4);
  // FIFO would give 1000..1003: the small group would wait behind the whole large one.
  EXPECT_EQ(got, (std::vector<uint64_t>{1000, 1, 1001, 2}));
  EXPECT_FALSE(q.empty());
  EXPECT_EQ(DrainAll(q).size(), 998u);
  EXPECT_TRUE(q.empty());
}

TEST(FairQueue, HigherPriorityFirstAndFailoverToTheFront) {
  FairQueue q;
  q.Push(0, "a", 1);
  q.Push(5, "b", 2);
  q.Push(5, "b", 3);
  q.Push(0, "a", 4, /*front=*/true);  // re-queued after a replica died
  EXPECT_EQ(DrainAll(q), (std::vector<uint64_t>{2, 3, 4, 1}));
}

TEST(FairQueue, StaleIdsAreDroppedAndFullKeepsTheRest) {
  FairQueue q;
  q.Push(0, "a", 1);
  q.Push(0, "a", 2);
  q.Push(0, "b", 3);
  EXPECT_EQ(DrainAll(q, 1, {1}), (std::vector<uint64_t>{2}));  // 1 aborted; full after one
  EXPECT_EQ(DrainAll(q), (std::vector<uint64_t>{3}));
  EXPECT_TRUE(q.empty());
  EXPECT_TRUE(DrainAll(q).empty());
}

}  // namespace
}  // namespace bitroll::rollout
