// ConnectionAges alone (rollout/connection_ages.h): stable, increasing, bounded, and a prune
// keeps exactly the connections that hold a group.
#include "rollout/connection_ages.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

namespace bitroll::rollout {
namespace {

TEST(ConnectionAges, StableAndIncreasing) {
  ConnectionAges ages(100, [] { return std::vector<std::string>{}; });
  const uint64_t a = ages.Seen("a");
  const uint64_t b = ages.Seen("b");
  EXPECT_LT(a, b);
  EXPECT_EQ(ages.Seen("a"), a);
  ages.Forget("a");
  EXPECT_GT(ages.Seen("a"), b);  // a forgotten connection counts as new
}

TEST(ConnectionAges, PruneKeepsConnectionsThatHoldGroupsAndStaysBounded) {
  ConnectionAges ages(8, [] { return std::vector<std::string>{"c3", "c7", "never-seen"}; });
  std::map<std::string, uint64_t> first;
  for (int i = 0; i < 8; ++i) {
    const std::string c = "c" + std::to_string(i);
    first[c] = ages.Seen(c);
  }
  EXPECT_EQ(ages.size(), 8u);
  const uint64_t n = ages.Seen("new");  // the limit is reached: prune, then add
  EXPECT_EQ(ages.size(), 3u);
  EXPECT_EQ(ages.Seen("c3"), first["c3"]);  // kept with its original age
  EXPECT_EQ(ages.Seen("c7"), first["c7"]);
  EXPECT_GT(ages.Seen("c1"), n);  // forgotten by the prune: new now
  for (int i = 0; i < 10000; ++i) ages.Seen("x" + std::to_string(i));
  EXPECT_LE(ages.size(), 8u);  // a prune whenever max(limit, 2 x kept) is reached
  EXPECT_EQ(ages.Seen("c3"), first["c3"]);
}

TEST(ConnectionAges, HoldersSurviveEveryPrune) {
  // Many connections that all hold groups: the table grows (amortized prunes keep them all).
  std::vector<std::string> all;
  ConnectionAges ages(4, [&] { return all; });
  std::map<std::string, uint64_t> first;
  for (int i = 0; i < 1000; ++i) {
    all.push_back("h" + std::to_string(i));
    first[all.back()] = ages.Seen(all.back());
  }
  EXPECT_EQ(ages.size(), 1000u);
  for (const auto& [c, v] : first) EXPECT_EQ(ages.Seen(c), v);
}

}  // namespace
}  // namespace bitroll::rollout
