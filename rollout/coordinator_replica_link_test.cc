// The coordinator's link to its replicas (replica protocol 3 and 4), end to end with fake
// replicas: each group's request is sent once per replica connection and kept there (sent again
// after a rejoin or a takeover, refused items re-sent with it, bounded), and a trajectory is
// encoded once, by the replica: the client gets its bytes with only the cost set.
#include "rollout/coordinator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "rollout/client.h"
#include "rollout/coordinator_test_util.h"
#include "rollout/messages.h"
#include "rollout/null_engine.h"
#include "rollout/protocol.h"
#include "rollout/request_store.h"

namespace bitroll::rollout {
namespace {

using namespace std::chrono_literals;
using namespace coordinator_testing;

TEST(CoordinatorTest, ManyPromptGroupSendsItsRequestOncePerReplica) {
  CoordinatorOptions o = FakeReplicaOptions();
  Server s = StartServer(0, o);
  zmq::context_t ctx(1);
  zmq::socket_t fake = FakeReplica(ctx, s.coord->replica_endpoint(), "small",
                                   NullEngineOptions{}.weights_hash, kReplicaProtocolVersion, 4);
  std::this_thread::sleep_for(50ms);
  auto client = Connect(s.endpoint);
  SubmitRequest q;
  q.group_id = 3;
  for (int32_t i = 0; i < 16; ++i) q.prompts.push_back(std::vector<int32_t>(300, 10 + i));
  q.n = 2;
  q.seed = 9;
  q.max_tokens = 8;
  ASSERT_TRUE(client->Submit(q).ok());
  size_t messages = 0, requests = 0, items = 0, request_bytes = 0;
  uint64_t key = 0;
  while (items < 32) {
    ReceivedWork w;
    ASSERT_TRUE(NextWork(fake, &w));
    ++messages;
    EXPECT_LE(w.items(), 4u);  // never more than its capacity
    for (size_t k = 0; k < w.requests(); ++k) {
      ++requests;
      request_bytes += w.request_bytes(k).size();
      key = w.work->requests()->Get(k)->key();
      EXPECT_FALSE(w.work->requests()->Get(k)->transient());
    }
    ASSERT_NE(key, 0u);
    for (const wire::WorkItem* item : *w.work->items()) {
      EXPECT_EQ(item->request_key(), key);
      if (w.requests() > 0) {  // the request it carries is the group's, byte for byte
        auto m = RequestOf(*w.work, *item);
        ASSERT_TRUE(m.ok()) << m.status().ToString();
        const auto* ids = (*m)->prompts()->Get(item->prompt_index())->ids();
        ASSERT_EQ(ids->size(), q.prompts[item->prompt_index()].size());
        EXPECT_EQ(std::memcmp(ids->data(), q.prompts[item->prompt_index()].data(), 4 * ids->size()),
                  0);
        EXPECT_EQ((*m)->seed(), q.seed);
      }
    }
    items += w.items();
    AnswerAll(fake, w);
  }
  // Several messages (the count below means something), one request: protocol 2 sent it with
  // each of the messages.
  EXPECT_GE(messages, 8u);
  EXPECT_EQ(requests, 1u);
  EXPECT_GT(request_bytes, 16u * 300u * 4u);
  GroupSummary done;
  const auto got = Collect(*client, 3, &done);
  EXPECT_EQ(got.size(), 32u);
  EXPECT_EQ(done.trajectories, 32u);
  EXPECT_EQ(done.errors, 0u);
  // The group is done: the replica may drop its request.
  ReceivedWork forget;
  ASSERT_TRUE(NextWork(fake, &forget));
  EXPECT_EQ(forget.items(), 0u);
  EXPECT_EQ(forget.requests(), 0u);
  ASSERT_NE(forget.work->forget(), nullptr);
  ASSERT_EQ(forget.work->forget()->size(), 1u);
  EXPECT_EQ(forget.work->forget()->Get(0), key);
}

// A replica that says hello again, or one that takes over a dead replica's work, holds no
// request yet: the work goes with the request, byte for byte the same.
TEST(CoordinatorTest, RejoinedAndTakeoverReplicasGetTheRequest) {
  CoordinatorOptions o = FakeReplicaOptions();
  o.replica_timeout_ms = 1000;
  Server s = StartServer(0, o);
  zmq::context_t ctx(1);
  zmq::socket_t a = FakeReplica(ctx, s.coord->replica_endpoint(), "a");
  std::this_thread::sleep_for(50ms);
  auto client = Connect(s.endpoint);
  ASSERT_TRUE(client->Submit(TestGroup(1)).ok());
  ReceivedWork first;
  ASSERT_TRUE(NextWork(a, &first));
  ASSERT_EQ(first.requests(), 1u);
  ASSERT_EQ(first.items(), 24u);
  const std::string request(first.request_bytes(0));
  // Hello again: a new connection, its work re-sent with the request.
  SendHello(a, "a", NullEngineOptions{}.weights_hash, kReplicaProtocolVersion, 64);
  ReceivedWork again;
  ASSERT_TRUE(NextWork(a, &again));
  ASSERT_EQ(again.requests(), 1u);
  ASSERT_EQ(again.items(), 24u);
  ASSERT_EQ(again.request_bytes(0).size(), request.size());
  EXPECT_EQ(std::memcmp(again.request_bytes(0).data(), request.data(), request.size()), 0);
  // b joins; a goes silent and times out; its work moves to b with the request.
  zmq::socket_t b = FakeReplica(ctx, s.coord->replica_endpoint(), "b");
  ReceivedWork moved;
  ASSERT_TRUE(NextWork(b, &moved));
  ASSERT_EQ(moved.requests(), 1u);
  ASSERT_EQ(moved.items(), 24u);
  ASSERT_EQ(moved.request_bytes(0).size(), request.size());
  EXPECT_EQ(std::memcmp(moved.request_bytes(0).data(), request.data(), request.size()), 0);
  for (const wire::WorkItem* item : *moved.work->items()) {
    EXPECT_EQ(item->request_key(), moved.work->requests()->Get(0)->key());
  }
  AnswerAll(b, moved);
  GroupSummary done;
  EXPECT_EQ(Collect(*client, 1, &done).size(), 24u);
  EXPECT_EQ(done.errors, 0u);
}

// A replica that does not hold a request its items name sends them back (ReplicaRefused,
// kProtocol); the coordinator queues them again with the request, and the group completes.
TEST(CoordinatorTest, RefusedItemsGoAgainWithTheirRequestAndComplete) {
  CoordinatorOptions o = FakeReplicaOptions();
  Server s = StartServer(0, o);
  zmq::context_t ctx(1);
  zmq::socket_t fake = FakeReplica(ctx, s.coord->replica_endpoint(), "forgetful");
  std::this_thread::sleep_for(50ms);
  auto client = Connect(s.endpoint);
  ASSERT_TRUE(client->Submit(TestGroup(2)).ok());
  ReceivedWork first;
  ASSERT_TRUE(NextWork(fake, &first));
  ASSERT_EQ(first.requests(), 1u);
  ASSERT_EQ(first.items(), 24u);
  const uint64_t key = first.work->requests()->Get(0)->key();
  const std::string request(first.request_bytes(0));
  {
    std::vector<uint64_t> ids;
    for (const wire::WorkItem* item : *first.work->items()) ids.push_back(item->work_id());
    flatbuffers::FlatBufferBuilder fbb;
    auto w = fbb.CreateVector(ids);
    auto k = fbb.CreateVector(std::vector<uint64_t>{key});
    auto err = ErrorToWire(fbb, Status::Protocol("lost it"));
    FinishEnvelope(fbb, 0, wire::Message_ReplicaRefused,
                   wire::CreateReplicaRefused(fbb, w, k, err).Union());
    fake.send(zmq::buffer(fbb.GetBufferPointer(), fbb.GetSize()));
  }
  ReceivedWork again;
  ASSERT_TRUE(NextWork(fake, &again));
  ASSERT_EQ(again.requests(), 1u);  // sent again: the replica said it does not hold it
  ASSERT_EQ(again.items(), 24u);
  EXPECT_EQ(again.work->requests()->Get(0)->key(), key);
  ASSERT_EQ(again.request_bytes(0).size(), request.size());
  EXPECT_EQ(std::memcmp(again.request_bytes(0).data(), request.data(), request.size()), 0);
  AnswerAll(fake, again);
  GroupSummary done;
  const auto got = Collect(*client, 2, &done);
  EXPECT_EQ(got.size(), 24u);
  EXPECT_EQ(done.trajectories, 24u);
  EXPECT_EQ(done.errors, 0u);
  for (const auto& t : got) EXPECT_EQ(t.finish, FinishReason::kLength);
}

// Encoded once (replica protocol 4): the bytes a client receives are the bytes the replica built,
// but for the Cost fields the coordinator sets in place (queue time, price, ...). Setting them
// back to the replica's values gives the replica's bytes again, memcmp-equal.
TEST(CoordinatorTest, ClientGetsTheReplicasBytesWithOnlyTheCostSet) {
  CoordinatorOptions o = FakeReplicaOptions();
  o.price.replica_hour_usd = 3.6;
  Server s = StartServer(0, o);
  zmq::context_t ctx(1);
  zmq::socket_t fake = FakeReplica(ctx, s.coord->replica_endpoint(), "fake");
  std::this_thread::sleep_for(50ms);
  zmq::socket_t raw(ctx, zmq::socket_type::dealer);
  raw.set(zmq::sockopt::linger, 0);
  raw.set(zmq::sockopt::rcvtimeo, kTimeoutMs);
  raw.connect(s.endpoint);
  SubmitRequest q = TestGroup(3);
  q.client_tag = "tagged";
  const std::string submit = EncodeSubmit(q, 1, "raw-owner");
  raw.send(zmq::buffer(submit));
  ReceivedWork w;
  ASSERT_TRUE(NextWork(fake, &w));
  std::map<std::pair<uint32_t, uint32_t>, std::string> built;  // (prompt, sample) -> bytes
  {
    flatbuffers::FlatBufferBuilder fbb;
    std::vector<flatbuffers::Offset<wire::Trajectory>> ts;
    std::vector<flatbuffers::Offset<wire::FinishedTrajectory>> fin;
    for (const wire::WorkItem* item : *w.work->items()) {
      built[{item->prompt_index(), item->sample_index()}] = AddFinalTurn(
          fbb, item->work_id(), {item->group_id(), item->prompt_index(), item->sample_index()}, &ts,
          &fin, &q.client_tag);
    }
    SendResults(fake, fbb, ts, fin);
  }
  Cost replica_cost;
  replica_cost.decode_tokens = 2;
  replica_cost.engine_seconds = 0.5;
  size_t compared = 0, cost_changed = 0;
  std::vector<uint64_t> aligned;
  while (compared < built.size()) {
    zmq::message_t msg;
    ASSERT_TRUE(raw.recv(msg));
    auto env = DecodeEnvelope(AlignForRead(msg.data(), msg.size(), &aligned), msg.size(), {});
    ASSERT_TRUE(env.ok());
    if ((*env)->msg_type() != wire::Message_Trajectory) continue;
    const wire::Trajectory* t = (*env)->msg_as_Trajectory();
    ASSERT_EQ(t->client_tag()->str(), "tagged");
    const std::string& want = built.at({t->prompt_index(), t->sample_index()});
    std::string got(static_cast<const char*>(msg.data()), msg.size());
    ASSERT_EQ(got.size(), want.size());
    if (std::memcmp(got.data(), want.data(), got.size()) != 0) ++cost_changed;
    std::string bad = got;  // negative control: one byte outside the Cost differs
    bad[bad.size() - 1] ^= 0x5a;
    ASSERT_TRUE(SetTrajectoryCost(got, replica_cost));
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size()), 0);
    (void)SetTrajectoryCost(bad, replica_cost);
    EXPECT_NE(std::memcmp(bad.data(), want.data(), bad.size()), 0);
    ++compared;
  }
  // The coordinator did set its fields (the price at least): the comparison can fail.
  EXPECT_EQ(cost_changed, built.size());
}

// A final turn that comes without its client envelope (a replica's fault) reaches the client as a
// typed Protocol error; the group still completes.
TEST(CoordinatorTest, AFinalTurnWithoutItsEnvelopeIsAProtocolError) {
  CoordinatorOptions o = FakeReplicaOptions();
  Server s = StartServer(0, o);
  zmq::context_t ctx(1);
  zmq::socket_t fake = FakeReplica(ctx, s.coord->replica_endpoint(), "fake");
  std::this_thread::sleep_for(50ms);
  auto client = Connect(s.endpoint);
  ASSERT_TRUE(client->Submit(TestGroup(4)).ok());
  ReceivedWork w;
  ASSERT_TRUE(NextWork(fake, &w));
  {
    flatbuffers::FlatBufferBuilder fbb;
    std::vector<flatbuffers::Offset<wire::Trajectory>> ts;
    std::vector<flatbuffers::Offset<wire::FinishedTrajectory>> fin;
    for (const wire::WorkItem* item : *w.work->items()) {
      AddFinalTurn(fbb, item->work_id(),
                   {item->group_id(), item->prompt_index(), item->sample_index()}, &ts, &fin);
    }
    fin.erase(fin.begin());  // the first item's envelope is lost
    SendResults(fake, fbb, ts, fin);
  }
  GroupSummary done;
  const auto got = Collect(*client, 4, &done);
  ASSERT_EQ(got.size(), 24u);
  EXPECT_EQ(done.errors, 1u);
  size_t errors = 0;
  for (const auto& t : got) {
    if (t.finish != FinishReason::kError) continue;
    ++errors;
    EXPECT_EQ(t.error.code(), ErrorCode::kProtocol);
  }
  EXPECT_EQ(errors, 1u);
}

// The replica side: an item naming a request it does not hold is sent back with a kProtocol
// error (never run, never a crash); one it was sent before runs by key; after a forget it is
// unknown again.
TEST(CoordinatorTest, ReplicaRefusesUnknownRequestsAndForgetsOnRequest) {
  zmq::context_t ctx(1);
  std::string ep;
  zmq::socket_t router = BoundRouter(ctx, &ep);
  std::atomic<bool> stop{false};
  NullEngine eng({});
  std::thread replica([&] { EXPECT_TRUE(RunReplica(eng, ctx, ep, ReplicaOptions{}, stop).ok()); });
  zmq::message_t id, body;
  ASSERT_TRUE(router.recv(id));
  ASSERT_TRUE(router.recv(body));  // hello
  const std::string rid = id.to_string();
  auto send = [&](ReplicaWorkBuilder& b) {
    const std::string_view bytes = b.Finish();
    router.send(zmq::buffer(rid), zmq::send_flags::sndmore);
    router.send(zmq::buffer(bytes.data(), bytes.size()));
  };
  // The replica's next answer about work (heartbeats are skipped).
  std::vector<uint64_t> aligned;
  auto answer = [&]() -> const wire::Envelope* {
    while (true) {
      zmq::message_t from, msg;
      if (!router.recv(from) || !router.recv(msg)) return nullptr;
      auto env = DecodeEnvelope(AlignForRead(msg.data(), msg.size(), &aligned), msg.size(), {});
      if (!env.ok()) return nullptr;
      const auto t = (*env)->msg_type();
      if (t == wire::Message_ReplicaResults || t == wire::Message_ReplicaRefused) return *env;
    }
  };
  SubmitRequest q = TestGroup(5);
  q.max_tokens = 4;
  const std::string request = EncodeSubmit(q, 1);
  ReplicaWorkBuilder unknown;
  unknown.Add(9, 100, {5, 0, 0});
  send(unknown);
  const wire::Envelope* e = answer();
  ASSERT_NE(e, nullptr);
  ASSERT_EQ(e->msg_type(), wire::Message_ReplicaRefused);
  const wire::ReplicaRefused* r = e->msg_as_ReplicaRefused();
  ASSERT_EQ(r->work_ids()->size(), 1u);
  EXPECT_EQ(r->work_ids()->Get(0), 100u);
  ASSERT_EQ(r->request_keys()->size(), 1u);
  EXPECT_EQ(r->request_keys()->Get(0), 9u);
  EXPECT_EQ(StatusFromWire(r->error()).code(), ErrorCode::kProtocol);
  // Sent once, then named by key: both run.
  ReplicaWorkBuilder with;
  with.AddRequest(9, request);
  with.Add(9, 101, {5, 0, 0});
  send(with);
  e = answer();
  ASSERT_NE(e, nullptr);
  ASSERT_EQ(e->msg_type(), wire::Message_ReplicaResults);
  ReplicaWorkBuilder by_key;
  by_key.Add(9, 102, {5, 1, 0});
  send(by_key);
  e = answer();
  ASSERT_NE(e, nullptr);
  ASSERT_EQ(e->msg_type(), wire::Message_ReplicaResults);
  const wire::Trajectory* t = e->msg_as_ReplicaResults()->trajectories()->Get(0);
  EXPECT_EQ(t->work_id(), 102u);
  EXPECT_NE(t->finish(), wire::FinishReason_Error);
  // The trajectory ends here: its tokens are in the client's envelope only (protocol 4).
  EXPECT_EQ(t->ids(), nullptr);
  ASSERT_NE(e->msg_as_ReplicaResults()->finished(), nullptr);
  const wire::FinishedTrajectory* f = e->msg_as_ReplicaResults()->finished()->Get(0);
  EXPECT_EQ(f->work_id(), 102u);
  const wire::Trajectory* c = f->envelope_nested_root()->msg_as_Trajectory();
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->prompt_index(), 1u);
  TrajectoryResult ran;
  ran.ids.assign(c->ids()->begin(), c->ids()->end());
  ran.logprobs.assign(c->logprobs()->begin(), c->logprobs()->end());
  EXPECT_TRUE(SameBits(ran, Reference(q.prompts[1], q, 0)));
  // Forgotten: unknown again.
  ReplicaWorkBuilder forget;
  forget.Forget(9);
  forget.Add(9, 103, {5, 0, 1});
  send(forget);
  e = answer();
  ASSERT_NE(e, nullptr);
  ASSERT_EQ(e->msg_type(), wire::Message_ReplicaRefused);
  EXPECT_EQ(e->msg_as_ReplicaRefused()->work_ids()->Get(0), 103u);
  stop.store(true);
  replica.join();
}

// What one replica is made to keep is bounded (kMaxHeldRequests): past it, with every kept
// request still in use there, a request goes transient (used by its message only, not kept).
TEST(CoordinatorTest, HeldRequestsStayWithinTheBound) {
  CoordinatorOptions o = FakeReplicaOptions();
  o.max_queued = 100000;
  Server s = StartServer(0, o);
  zmq::context_t ctx(1);
  zmq::socket_t fake = FakeReplica(ctx, s.coord->replica_endpoint(), "big",
                                   NullEngineOptions{}.weights_hash, kReplicaProtocolVersion, 4096);
  std::this_thread::sleep_for(50ms);
  auto client = Connect(s.endpoint);
  const size_t groups = kMaxHeldRequests + 6;
  for (size_t g = 0; g < groups; ++g) {
    SubmitRequest q;
    q.group_id = 100 + g;
    q.prompts = {{static_cast<int32_t>(g % 500), 1}};
    q.n = 1;
    q.max_tokens = 2;
    ASSERT_TRUE(client->Submit(q).ok());
  }
  size_t items = 0, kept = 0, transient = 0;
  while (items < groups) {
    ReceivedWork w;
    ASSERT_TRUE(NextWork(fake, &w));  // never answered: every request stays in use
    items += w.items();
    for (size_t k = 0; k < w.requests(); ++k) {
      (w.work->requests()->Get(k)->transient() ? transient : kept) += 1;
    }
    EXPECT_EQ(w.work->forget(), nullptr);  // nothing idle to drop
  }
  EXPECT_EQ(kept, kMaxHeldRequests);
  EXPECT_EQ(transient, 6u);
}

// A random schedule (groups of several sizes, a small replica answering random subsets late, a
// restart now and then): the replica, keeping what it is sent as a real one does
// (RequestStore), never gets an item naming a request it does not keep, keeps no more requests
// than there are live groups, and ends with none; every group completes.
TEST(CoordinatorTest, RandomScheduleNeverNamesAnUnknownRequest) {
  CoordinatorOptions o = FakeReplicaOptions();
  o.replica_timeout_ms = 1000;  // a restarted fake's old connection
  Server s = StartServer(0, o);
  zmq::context_t ctx(1);
  zmq::socket_t fake = FakeReplica(ctx, s.coord->replica_endpoint(), "random",
                                   NullEngineOptions{}.weights_hash, kReplicaProtocolVersion, 6);
  std::this_thread::sleep_for(50ms);
  auto client = Connect(s.endpoint);
  std::mt19937 rng(20261201);
  const int kGroups = 8;
  for (int g = 0; g < kGroups; ++g) {
    SubmitRequest q;
    q.group_id = 50 + g;
    const int prompts = 1 + static_cast<int>(rng() % 6);
    for (int i = 0; i < prompts; ++i) q.prompts.push_back({static_cast<int32_t>(rng() % 500), 3});
    q.n = 1 + rng() % 4;
    q.max_tokens = 2;
    ASSERT_TRUE(client->Submit(q).ok());
  }
  RequestStore store;
  std::vector<ItemAt> pending;
  std::set<uint64_t> done;
  size_t unknown = 0, rejoins = 0, messages = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kTimeoutMs);
  while (done.size() < kGroups && std::chrono::steady_clock::now() < deadline) {
    ReceivedWork w;
    if (NextWork(fake, &w, 50)) {
      ++messages;
      ASSERT_TRUE(store.Apply(*w.work).ok());
      for (const wire::WorkItem* item : *w.work->items()) {
        if (!store.Knows(*w.work, item->request_key())) ++unknown;
        auto m = store.Find(*w.work, *item);
        ASSERT_TRUE(m.ok() || !store.Knows(*w.work, item->request_key()));
        if (m.ok()) {
          EXPECT_EQ((*m)->group_id(), item->group_id());
        }
        pending.push_back(
            {item->work_id(), item->group_id(), item->prompt_index(), item->sample_index()});
      }
      EXPECT_LE(store.size(), static_cast<size_t>(kGroups) - done.size());
    }
    if (rng() % 16 == 0 && rejoins < 3) {
      // A restart: a new connection that keeps nothing; the old one falls silent and its work
      // moves once it times out.
      fake = FakeReplica(ctx, s.coord->replica_endpoint(), "random",
                         NullEngineOptions{}.weights_hash, kReplicaProtocolVersion, 6);
      store = RequestStore();
      pending.clear();
      ++rejoins;
      continue;
    }
    std::shuffle(pending.begin(), pending.end(), rng);
    const size_t k = pending.empty() ? 0 : rng() % (pending.size() + 1);
    if (k > 0) {
      AnswerItems(fake, std::vector<ItemAt>(pending.begin(), pending.begin() + k));
      pending.erase(pending.begin(), pending.begin() + k);
    }
    while (true) {
      auto e = client->Next(1);
      if (!e.ok()) break;
      if (e->kind == Event::Kind::kGroupDone) {
        EXPECT_EQ(e->done.errors, 0u);
        done.insert(e->done.group_id);
      }
    }
  }
  EXPECT_EQ(done.size(), static_cast<size_t>(kGroups));
  EXPECT_EQ(unknown, 0u);
  EXPECT_GT(messages, static_cast<size_t>(kGroups));  // the schedule was not one message
  std::printf("random schedule: %zu messages, %zu restarts\n", messages, rejoins);
  // Every group is done: the forgets empty the store.
  for (int i = 0; i < 40 && store.size() > 0; ++i) {
    ReceivedWork w;
    if (NextWork(fake, &w, 50)) {
      ASSERT_TRUE(store.Apply(*w.work).ok());
    }
  }
  EXPECT_EQ(store.size(), 0u);
}

}  // namespace
}  // namespace bitroll::rollout
