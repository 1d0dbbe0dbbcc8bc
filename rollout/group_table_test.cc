// GroupTable alone (rollout/group_table.h): keys and owners, admission room, the live set and
// counts of a group's works, when a group is done, and the parked groups' retention.
#include "rollout/group_table.h"

#include <gtest/gtest.h>

#include <chrono>

namespace bitroll::rollout {
namespace {

// A SubmitRollouts envelope of `prompts` prompts times `n` samples.
std::string Request(uint64_t group_id, uint32_t prompts, uint32_t n) {
  flatbuffers::FlatBufferBuilder fbb(512);
  std::vector<flatbuffers::Offset<wire::Prompt>> ps;
  for (uint32_t i = 0; i < prompts; ++i) {
    ps.push_back(wire::CreatePrompt(fbb, fbb.CreateVector(std::vector<int32_t>{1, 2, 3})));
  }
  auto m = wire::CreateSubmitRollouts(fbb, group_id, fbb.CreateVector(ps), n);
  FinishEnvelope(fbb, 1, wire::Message_SubmitRollouts, m.Union());
  return std::string(BufferView(fbb));
}

GroupTable::Group* AddGroup(GroupTable& t, const std::string& owner, uint64_t id, uint32_t prompts,
                            uint32_t n, uint64_t serial = 0) {
  return t.Add("conn", 1, owner, GroupTable::Key(owner, id), Request(id, prompts, n), serial);
}

GroupTable::Work* AddWork(GroupTable& t, GroupTable::Group* g) {
  GroupTable::Work w;
  w.id = t.NextWorkId();
  w.group = g;
  return t.AddWork(std::move(w));
}

TEST(GroupTable, KeysAndOwners) {
  GroupTable t;
  GroupTable::Group* g = AddGroup(t, "calice", 7, 2, 3);
  EXPECT_EQ(g->group_id, 7u);
  EXPECT_EQ(g->total, 6u);
  EXPECT_FALSE(g->detached);
  EXPECT_EQ(GroupTable::OwnerOfKey(g->key), "calice");
  EXPECT_EQ(t.Find("calice", 7, false), g);
  EXPECT_EQ(t.Find("cbob", 7, false), nullptr);  // another owner's id space
  EXPECT_EQ(t.Find(g->key), g);
  // Recovered without an owner: any owner names it, but only in WAL mode.
  GroupTable::Group* anon = AddGroup(t, "", 9, 1, 1);
  EXPECT_EQ(t.Find("cbob", 9, /*recovered=*/true), anon);
  EXPECT_EQ(t.Find("cbob", 9, /*recovered=*/false), nullptr);
}

TEST(GroupTable, AdmissionCountsEveryPendingSample) {
  GroupTable t;
  GroupTable::Group* g = AddGroup(t, "ca", 1, 1, 3);
  for (int i = 0; i < 3; ++i) AddWork(t, g);
  EXPECT_TRUE(t.CheckRoom(2, 5).ok());
  EXPECT_EQ(t.CheckRoom(3, 5).code(), ErrorCode::kBusy);
}

TEST(GroupTable, WorksLiveInTheirGroupUntilTakenOrAborted) {
  GroupTable t;
  GroupTable::Group* g = AddGroup(t, "ca", 1, 2, 2);
  GroupTable::Work* a = AddWork(t, g);
  const uint64_t a_id = a->id;
  std::vector<uint64_t> ids = {a_id};
  for (int i = 0; i < 3; ++i) ids.push_back(AddWork(t, g)->id);
  EXPECT_EQ(g->live.size(), 4u);
  for (int i = 0; i < 4; ++i) t.CountQueued();
  t.CountDequeued();
  EXPECT_EQ(t.queued(), 3u);
  EXPECT_EQ(t.InFlight(), 1u);
  GroupTable::Work w = t.TakeWork(t.FindWork(a_id));
  EXPECT_EQ(w.id, a_id);
  EXPECT_EQ(t.FindWork(a_id), nullptr);
  EXPECT_EQ(g->live.count(a_id), 0u);
  GroupTable::CountDelivered(g, /*failed=*/true, 100);
  EXPECT_FALSE(GroupTable::Done(*g));
  std::vector<uint64_t> seen;
  t.AbortWorks(g, [&](GroupTable::Work& x) { seen.push_back(x.id); });
  EXPECT_EQ(seen.size(), 3u);
  EXPECT_EQ(g->aborted, 3u);
  EXPECT_EQ(g->errors, 1u);
  EXPECT_EQ(g->cost.wal_bytes, 100);
  EXPECT_TRUE(g->live.empty());
  EXPECT_EQ(t.works(), 0u);
  EXPECT_TRUE(GroupTable::Done(*g));
  g->redelivering = true;  // a re-attach still re-sends: not done
  EXPECT_FALSE(GroupTable::Done(*g));
}

TEST(GroupTable, ParkKeepsOnlyGroupsWithUnacknowledgedTrajectories) {
  GroupTable t;
  GroupTable::Group* acked = AddGroup(t, "ca", 1, 1, 2, 11);
  acked->delivered = 2;
  acked->acked = 2;
  t.Park(acked, Clock::now());
  EXPECT_EQ(t.size(), 0u);
  EXPECT_EQ(t.parked(), 0u);
  GroupTable::Group* g = AddGroup(t, "ca", 2, 1, 2, 12);
  g->delivered = 2;
  g->acked = 1;
  const std::string key = g->key;
  t.Park(g, Clock::now());
  ASSERT_NE(t.FindParked(key), nullptr);
  EXPECT_EQ(t.FindParked(key)->serial, 12u);
  std::string parked_key;
  EXPECT_EQ(t.Find("ca", 2, true, &parked_key), nullptr);
  EXPECT_EQ(parked_key, key);
  const ParkedGroup p = t.TakeParked(key);
  EXPECT_EQ(p.acked, 1u);
  EXPECT_EQ(t.FindParked(key), nullptr);
}

TEST(GroupTable, ExpireTakesTheOldestPastTheBound) {
  GroupTable t;
  const auto t0 = Clock::now();
  for (uint64_t id = 1; id <= 3; ++id) {
    GroupTable::Group* g = AddGroup(t, "ca", id, 1, 1, id);
    g->delivered = 1;
    t.Park(g, t0 + std::chrono::seconds(id));
  }
  // Re-attached meanwhile: its order entry is stale and skipped.
  (void)t.TakeParked(GroupTable::Key("ca", 1));
  auto none = t.Expire(t0 + std::chrono::seconds(4), std::chrono::seconds(10), 5);
  EXPECT_TRUE(none.empty());
  auto count = t.Expire(t0 + std::chrono::seconds(4), std::chrono::seconds(10), 1);
  ASSERT_EQ(count.size(), 1u);
  EXPECT_EQ(count[0].group.group_id, 2u);
  EXPECT_TRUE(count[0].too_many);
  auto age = t.Expire(t0 + std::chrono::seconds(20), std::chrono::seconds(10), 5);
  ASSERT_EQ(age.size(), 1u);
  EXPECT_EQ(age[0].group.group_id, 3u);
  EXPECT_FALSE(age[0].too_many);
  EXPECT_EQ(t.parked(), 0u);
}

}  // namespace
}  // namespace bitroll::rollout
