// End-to-end tests of the coordinator with NullEngine replicas and the C++ client: bit-identity
// whatever the replica count and load, bad input, backpressure, disconnects, dead replicas,
// weight updates, drain, abort, status and cost.
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

TEST(CoordinatorTest, BitIdenticalForAnyReplicaCountAndLoad) {
  const SubmitRequest q = TestGroup(1);
  for (int replicas : {1, 2, 4}) {
    SCOPED_TRACE("replicas=" + std::to_string(replicas));
    Server s = StartServer(replicas);
    Load load(s.endpoint, 2);
    auto client = Connect(s.endpoint);
    for (int i = 0; i < 500 && load.groups() < 2; ++i) std::this_thread::sleep_for(10ms);
    ASSERT_GE(load.groups(), 2) << "the background load never ran";
    GroupSummary sum;
    auto r = client->Run(q, kTimeoutMs, &sum);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->size(), 24u);
    EXPECT_EQ(sum.trajectories, 24u);
    EXPECT_EQ(sum.errors, 0u);
    for (const TrajectoryResult& t : *r) {
      const auto ref = Reference(q.prompts[t.prompt_index], q, t.sample_index);
      EXPECT_TRUE(SameBits(t, ref)) << t.prompt_index << "/" << t.sample_index;
      EXPECT_EQ(static_cast<int>(t.finish), static_cast<int>(ref.finish));
      EXPECT_EQ(t.fingerprint.backend, "null");
      EXPECT_FALSE(t.replica.empty());
    }
    // Prefix affinity: a prompt's samples share one replica; least-loaded spreads the prompts.
    std::map<uint32_t, std::set<std::string>> by_prompt;
    std::set<std::string> used;
    for (const TrajectoryResult& t : *r) {
      by_prompt[t.prompt_index].insert(t.replica);
      used.insert(t.replica);
    }
    for (const auto& [p, names] : by_prompt) EXPECT_EQ(names.size(), 1u) << "prompt " << p;
    EXPECT_EQ(used.size(), static_cast<size_t>(std::min(replicas, 3)));
    // Negative control: the check sees a one-sample shift.
    const auto& t0 = (*r)[0];
    EXPECT_FALSE(SameBits(t0, Reference(q.prompts[0], q, 1)));
    SubmitRequest other = q;
    other.seed = 1235;
    EXPECT_FALSE(SameBits(t0, Reference(q.prompts[0], other, 0)));
  }
}

TEST(CoordinatorTest, StreamedTokensMatchTrajectory) {
  Server s = StartServer(2);
  auto client = Connect(s.endpoint);
  SubmitRequest q = TestGroup(2);
  q.stream_tokens = true;
  q.n = 2;
  ASSERT_TRUE(client->Submit(q).ok());
  std::map<std::pair<uint32_t, uint32_t>, std::vector<int32_t>> streamed;
  std::vector<TrajectoryResult> trajs;
  while (true) {
    auto e = client->Next(kTimeoutMs);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    if (e->kind == Event::Kind::kTokenChunk) {
      auto& v = streamed[{e->chunk.prompt_index, e->chunk.sample_index}];
      EXPECT_EQ(e->chunk.position_begin, static_cast<int32_t>(v.size()));
      v.insert(v.end(), e->chunk.ids.begin(), e->chunk.ids.end());
    } else if (e->kind == Event::Kind::kTrajectory) {
      trajs.push_back(e->trajectory);
    } else if (e->kind == Event::Kind::kGroupDone) {
      break;
    } else {
      FAIL() << e->error.ToString();
    }
  }
  ASSERT_EQ(trajs.size(), 6u);
  for (const auto& t : trajs) {
    const std::pair<uint32_t, uint32_t> key{t.prompt_index, t.sample_index};
    EXPECT_EQ(streamed[key], t.ids);
  }
}

TEST(CoordinatorTest, BadInputGetsTypedErrorsAndServiceContinues) {
  CoordinatorOptions o;
  o.decode.max_message_bytes = 64 << 10;
  Server s = StartServer(2, o);
  auto client = Connect(s.endpoint);
  auto expect_error = [&](ErrorCode code, const std::string& what) {
    auto e = client->Next(kTimeoutMs);
    ASSERT_TRUE(e.ok()) << what << ": " << e.status().ToString();
    ASSERT_EQ(e->kind, Event::Kind::kError) << what;
    EXPECT_EQ(e->error.code(), code) << what << ": " << e->error.ToString();
  };
  ASSERT_TRUE(client->SendRaw("definitely not a flatbuffer").ok());
  expect_error(ErrorCode::kProtocol, "garbage");
  std::string good = EncodeSubmit(TestGroup(3), 1);
  ASSERT_TRUE(client->SendRaw(good.substr(0, good.size() - 9)).ok());
  expect_error(ErrorCode::kProtocol, "truncated");
  {
    flatbuffers::FlatBufferBuilder fbb;
    auto st = wire::CreateStatus(fbb);
    wire::FinishEnvelopeBuffer(
        fbb, wire::CreateEnvelope(fbb, 1, 0, static_cast<wire::Message>(99), st.Union()));
    ASSERT_TRUE(client->SendRaw(BufferView(fbb)).ok());
    expect_error(ErrorCode::kProtocol, "unknown type");
  }
  {
    flatbuffers::FlatBufferBuilder fbb;
    auto st = wire::CreateStatus(fbb);
    wire::FinishEnvelopeBuffer(fbb,
                               wire::CreateEnvelope(fbb, 77, 0, wire::Message_Status, st.Union()));
    ASSERT_TRUE(client->SendRaw(BufferView(fbb)).ok());
    expect_error(ErrorCode::kProtocol, "version");
  }
  {
    flatbuffers::FlatBufferBuilder fbb;
    auto t = wire::CreateTrajectory(fbb, 1);
    FinishEnvelope(fbb, 0, wire::Message_Trajectory, t.Union());
    ASSERT_TRUE(client->SendRaw(BufferView(fbb)).ok());
    expect_error(ErrorCode::kProtocol, "wrong direction");
  }
  SubmitRequest big = TestGroup(4);
  big.prompts = {std::vector<int32_t>(100000, 5)};
  ASSERT_TRUE(client->Submit(big).ok());
  expect_error(ErrorCode::kResourceExhausted, "oversized");
  SubmitRequest q = TestGroup(5);
  q.n = 1000000000;
  ASSERT_TRUE(client->Submit(q).ok());
  expect_error(ErrorCode::kInvalidArgument, "n=1e9");
  q = TestGroup(6);
  q.max_tokens = -1;
  ASSERT_TRUE(client->Submit(q).ok());
  expect_error(ErrorCode::kInvalidArgument, "negative max_tokens");
  q = TestGroup(7);
  q.prompts[0][0] = 100000;
  ASSERT_TRUE(client->Submit(q).ok());
  expect_error(ErrorCode::kOutOfRange, "out of vocabulary");
  q = TestGroup(12);
  q.tool_open = "<tool>";
  q.tool_close = "</tool>";
  ASSERT_TRUE(client->Submit(q).ok());
  expect_error(ErrorCode::kInvalidArgument, "tool delimiters without tools");
  {
    // max_turns > 1 without tools is plain generation (the tool loop has nothing to call).
    q = TestGroup(10);
    q.max_turns = 3;
    auto mt = client->Run(q, kTimeoutMs);
    ASSERT_TRUE(mt.ok()) << mt.status().ToString();
    for (const auto& t : *mt) {
      EXPECT_TRUE(t.error.ok());
      EXPECT_EQ(t.turns, 1);
    }
    // Stop strings need a tokenizer: the NullEngine answers each sample with a typed error.
    q = TestGroup(11);
    q.stop_strings = {"\n\n"};
    auto ss = client->Run(q, kTimeoutMs);
    ASSERT_TRUE(ss.ok()) << ss.status().ToString();
    for (const auto& t : *ss) {
      EXPECT_EQ(t.finish, FinishReason::kError);
      EXPECT_EQ(t.error.code(), ErrorCode::kUnsupported) << t.error.ToString();
    }
  }
  q = TestGroup(8);
  q.prompts.clear();
  q.text_prompts = {"text needs a tokenizer"};
  auto r = client->Run(q, kTimeoutMs);
  ASSERT_TRUE(r.ok());
  for (const auto& t : *r) {
    EXPECT_EQ(t.finish, FinishReason::kError);
    EXPECT_EQ(t.error.code(), ErrorCode::kUnsupported);
  }
  // The service still serves good work.
  auto good_r = client->Run(TestGroup(9), kTimeoutMs);
  ASSERT_TRUE(good_r.ok()) << good_r.status().ToString();
  EXPECT_EQ(good_r->size(), 24u);
}

TEST(CoordinatorTest, TextPromptsUseTheReplicaEncoder) {
  CoordinatorOptions o;
  o.local_replica.encode_text = [](std::string_view t) -> Result<std::vector<int32_t>> {
    std::vector<int32_t> ids;
    for (unsigned char c : t) ids.push_back(3 + c);
    return ids;
  };
  Server s = StartServer(2, o);
  auto client = Connect(s.endpoint);
  SubmitRequest q = TestGroup(1);
  q.prompts.clear();
  q.text_prompts = {"Once upon a time", "hi"};
  q.n = 3;
  auto r = client->Run(q, kTimeoutMs);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 6u);
  for (const auto& t : *r) {
    std::vector<int32_t> ids;
    for (unsigned char c : q.text_prompts[t.prompt_index]) ids.push_back(3 + c);
    EXPECT_TRUE(SameBits(t, Reference(ids, q, t.sample_index)));
  }
}

TEST(CoordinatorTest, BackpressureBusy) {
  CoordinatorOptions o;
  o.max_queued = 10;
  NullEngineOptions ne;
  ne.step_delay_us = 2000;
  ne.eos_period = 0;
  Server s = StartServer(1, o, ne);
  auto client = Connect(s.endpoint);
  SubmitRequest a = TestGroup(1);
  a.prompts = {{5}};
  a.n = 8;
  a.max_tokens = 20;
  ASSERT_TRUE(client->Submit(a).ok());
  SubmitRequest b = a;
  b.group_id = 2;
  auto r = client->Run(b, kTimeoutMs);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kBusy);
  // The first group still completes; afterwards the second is accepted.
  int got = 0;
  while (true) {
    auto e = client->Next(kTimeoutMs);
    ASSERT_TRUE(e.ok());
    if (e->kind == Event::Kind::kTrajectory) ++got;
    if (e->kind == Event::Kind::kGroupDone) break;
  }
  EXPECT_EQ(got, 8);
  auto r2 = client->Run(b, kTimeoutMs);
  ASSERT_TRUE(r2.ok()) << r2.status().ToString();
}

TEST(CoordinatorTest, ClientDisconnectMidGroupCancelsItsWork) {
  CoordinatorOptions o;
  o.local_replica.capacity = 4;
  NullEngineOptions ne;
  ne.step_delay_us = 1000;
  ne.eos_period = 0;
  Server s = StartServer(1, o, ne);
  {
    auto quitter = Connect(s.endpoint);
    SubmitRequest q = TestGroup(1);
    q.prompts = {{5, 6}};
    q.n = 64;
    q.max_tokens = 30;
    ASSERT_TRUE(quitter->Submit(q).ok());
    std::this_thread::sleep_for(50ms);
  }  // disconnects with 64 samples pending
  auto client = Connect(s.endpoint);
  SubmitRequest q = TestGroup(2);
  q.n = 1;
  q.max_tokens = 5;
  auto r = client->Run(q, kTimeoutMs);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->size(), 3u);
  // The quitter's group is cancelled once the coordinator notices: nothing stays queued.
  StatusInfo st;
  for (int i = 0; i < 200; ++i) {
    auto sr = client->GetStatus(kTimeoutMs);
    ASSERT_TRUE(sr.ok());
    st = *sr;
    if (st.groups == 0 && st.queued == 0 && st.inflight == 0) break;
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(st.groups, 0u);
  EXPECT_EQ(st.queued, 0u);
  EXPECT_LT(st.trajectories_done, 64u + 3u);  // most of the 64 never ran
}

TEST(CoordinatorTest, SilentReplicaTimesOutAndItsWorkMoves) {
  CoordinatorOptions o = FakeReplicaOptions();
  o.replica_timeout_ms = 1000;  // well above the 100 ms heartbeat, even on a loaded CI box
  Server s = StartServer(0, o);
  zmq::context_t ctx(1);
  zmq::socket_t fake = FakeReplica(ctx, s.coord->replica_endpoint(), "silent");
  std::this_thread::sleep_for(50ms);
  auto client = Connect(s.endpoint);
  const SubmitRequest q = TestGroup(1);
  ASSERT_TRUE(client->Submit(q).ok());
  zmq::message_t work;
  ASSERT_TRUE(fake.recv(work));  // the silent replica got the work and never answers
  std::vector<uint64_t> aligned;
  auto env = DecodeEnvelope(AlignForRead(work.data(), work.size(), &aligned), work.size(), {});
  ASSERT_TRUE(env.ok());
  ASSERT_EQ((*env)->msg_type(), wire::Message_ReplicaWork);
  // The group's request travels once, its 24 items naming it.
  const wire::ReplicaWork* rw = (*env)->msg_as_ReplicaWork();
  ASSERT_NE(rw->requests(), nullptr);
  ASSERT_EQ(rw->requests()->size(), 1u);
  ASSERT_EQ(rw->items()->size(), 24u);
  for (const wire::WorkItem* item : *rw->items()) {
    auto m = RequestOf(*rw, *item);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ((*m)->group_id(), 1u);
    EXPECT_EQ(SamplingFromWire(**m).seed, q.seed);
  }
  // A good replica joins; once the silent one times out its work moves there.
  std::atomic<bool> stop{false};
  NullEngine eng({});
  ReplicaOptions ro;
  ro.name = "good";
  std::thread good([&] {
    zmq::context_t c2(1);
    EXPECT_TRUE(RunReplica(eng, c2, s.coord->replica_endpoint(), ro, stop).ok());
  });
  std::vector<TrajectoryResult> got;
  while (true) {
    auto e = client->Next(kTimeoutMs);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    if (e->kind == Event::Kind::kTrajectory) got.push_back(e->trajectory);
    if (e->kind == Event::Kind::kGroupDone && e->done.group_id == 1) break;
  }
  ASSERT_EQ(got.size(), 24u);
  for (const auto& t : got) {
    EXPECT_EQ(t.replica, "good");
    EXPECT_TRUE(SameBits(t, Reference(q.prompts[t.prompt_index], q, t.sample_index)));
  }
  auto st = client->GetStatus(kTimeoutMs);
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->replicas.size(), 2u);
  EXPECT_FALSE(st->replicas[0].alive);
  EXPECT_TRUE(st->replicas[1].alive);
  stop.store(true);
  good.join();
}

// A replica of another replica protocol version (here: a build that does not send the field,
// version 1) gets Error{code: Protocol} and is not admitted; one of this version is.
TEST(CoordinatorTest, ReplicaOfAnotherProtocolVersionGetsTypedError) {
  CoordinatorOptions o;
  o.replica_bind = "tcp://127.0.0.1:*";
  Server s = StartServer(1, o);
  zmq::context_t ctx(1);
  zmq::socket_t old = FakeReplica(ctx, s.coord->replica_endpoint(), "old",
                                  NullEngineOptions{}.weights_hash, /*replica_protocol=*/0);
  zmq::message_t reply;
  ASSERT_TRUE(old.recv(reply));
  std::vector<uint64_t> aligned;
  auto env = DecodeEnvelope(AlignForRead(reply.data(), reply.size(), &aligned), reply.size(), {});
  ASSERT_TRUE(env.ok()) << env.status().ToString();
  ASSERT_EQ((*env)->msg_type(), wire::Message_Error);
  EXPECT_EQ(StatusFromWire((*env)->msg_as_Error()).code(), ErrorCode::kProtocol);
  auto client = Connect(s.endpoint);
  auto st = client->GetStatus(kTimeoutMs);
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->replicas.size(), 1u);  // the in-process one only
  // Control: a replica of this version is admitted.
  zmq::socket_t good = FakeReplica(ctx, s.coord->replica_endpoint(), "good");
  for (int i = 0; i < 200 && st->replicas.size() < 2; ++i) {
    std::this_thread::sleep_for(10ms);
    st = client->GetStatus(kTimeoutMs);
    ASSERT_TRUE(st.ok());
  }
  EXPECT_EQ(st->replicas.size(), 2u);
}

// The replica side: a coordinator's kProtocol refusal ends RunReplica with that error.
TEST(CoordinatorTest, RefusedReplicaReturnsTheProtocolError) {
  zmq::context_t ctx(1);
  std::string ep;
  zmq::socket_t router = BoundRouter(ctx, &ep);
  std::atomic<bool> stop{false};
  NullEngine eng({});
  Status ended;
  std::atomic<bool> done{false};
  std::thread replica([&] {
    ended = RunReplica(eng, ctx, ep, ReplicaOptions{}, stop);
    done.store(true);
  });
  zmq::message_t id, body;
  ASSERT_TRUE(router.recv(id));
  ASSERT_TRUE(router.recv(body));
  std::vector<uint64_t> aligned;
  auto env = DecodeEnvelope(AlignForRead(body.data(), body.size(), &aligned), body.size(), {});
  ASSERT_TRUE(env.ok());
  ASSERT_EQ((*env)->msg_type(), wire::Message_ReplicaHello);
  EXPECT_EQ((*env)->msg_as_ReplicaHello()->replica_protocol(), kReplicaProtocolVersion);
  router.send(id, zmq::send_flags::sndmore);
  const std::string err = EncodeError(0, Status::Protocol("replica protocol version 2 is not "
                                                          "supported (this coordinator speaks 3)"));
  router.send(zmq::buffer(err));
  for (int i = 0; i < 4000 && !done.load(); ++i) std::this_thread::sleep_for(5ms);
  const bool by_itself = done.load();
  stop.store(true);  // ends a replica that ignored the error (the checks below then fail)
  replica.join();
  EXPECT_TRUE(by_itself);
  EXPECT_EQ(ended.code(), ErrorCode::kProtocol) << ended.ToString();
}

TEST(CoordinatorTest, ReplicaWithOtherFingerprintIsRefused) {
  CoordinatorOptions o;
  o.replica_bind = "tcp://127.0.0.1:*";
  Server s = StartServer(1, o);
  zmq::context_t ctx(1);
  zmq::socket_t fake = FakeReplica(ctx, s.coord->replica_endpoint(), "alien", 12345);
  auto client = Connect(s.endpoint);
  std::this_thread::sleep_for(100ms);
  auto st = client->GetStatus(kTimeoutMs);
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->replicas.size(), 1u);
  EXPECT_EQ(st->replicas[0].name, "replica-0");  // the in-process one, not "alien"
}

TEST(CoordinatorTest, UpdateWeightsDrainAndVersions) {
  Server s = StartServer(2);
  auto client = Connect(s.endpoint);
  auto v = client->UpdateWeights("weights-v5", 5, /*drain=*/true, kTimeoutMs);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, 5u);
  const SubmitRequest q = TestGroup(1);
  auto r = client->Run(q, kTimeoutMs);
  ASSERT_TRUE(r.ok());
  for (const auto& t : *r) {
    ASSERT_EQ(t.versions.size(), 1u);
    EXPECT_EQ(t.versions[0], (std::pair<int32_t, uint64_t>{0, 5}));
    EXPECT_TRUE(
        SameBits(t, Reference(q.prompts[t.prompt_index], q, t.sample_index, {}, "weights-v5", 5)));
    EXPECT_FALSE(SameBits(t, Reference(q.prompts[t.prompt_index], q, t.sample_index)));
  }
  auto st = client->GetStatus(kTimeoutMs);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->weight_version, 5u);
  for (const auto& rep : st->replicas) EXPECT_EQ(rep.weight_version, 5u);
  auto bad = client->UpdateWeights("", 6, false, kTimeoutMs);
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument);
  ASSERT_TRUE(client->Drain(false, kTimeoutMs).ok());
  ASSERT_TRUE(client->Drain(true, kTimeoutMs).ok());
}

// Issue 12 item 8: an Ack to UpdateWeights means some live replica installed the weights. With
// no replica, or when every replica dies before answering, the update gets a typed error and the
// live version does not move.
TEST(CoordinatorTest, UpdateNoReplicaInstalledIsNotAcked) {
  CoordinatorOptions o = FakeReplicaOptions();
  o.replica_timeout_ms = 1000;
  Server s = StartServer(0, o);
  auto client = Connect(s.endpoint);
  auto none = client->UpdateWeights("w3", 3, /*drain=*/false, kTimeoutMs);
  ASSERT_FALSE(none.ok()) << "acked version " << *none << " with no replica";
  EXPECT_EQ(none.status().code(), ErrorCode::kUnavailable) << none.status().ToString();

  // A replica that takes the update and never answers (it hangs) is declared dead.
  zmq::context_t ctx(1);
  zmq::socket_t fake = FakeReplica(ctx, s.coord->replica_endpoint(), "hung");
  std::this_thread::sleep_for(100ms);
  const auto t0 = std::chrono::steady_clock::now();
  auto dead = client->UpdateWeights("w4", 4, /*drain=*/false, kTimeoutMs);
  ASSERT_FALSE(dead.ok()) << "acked version " << *dead << " that no replica installed";
  EXPECT_EQ(dead.status().code(), ErrorCode::kUnavailable) << dead.status().ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  zmq::message_t got;
  fake.set(zmq::sockopt::rcvtimeo, 1000);
  ASSERT_TRUE(fake.recv(got));  // it did receive the update
  std::vector<uint64_t> aligned;
  auto env = DecodeEnvelope(AlignForRead(got.data(), got.size(), &aligned), got.size(), {});
  ASSERT_TRUE(env.ok());
  EXPECT_EQ((*env)->msg_type(), wire::Message_UpdateWeights);
  auto st = client->GetStatus(kTimeoutMs);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->weight_version, 0u);

  // A good replica joins: the next update is installed and acked.
  std::atomic<bool> stop{false};
  NullEngine eng({});
  ReplicaOptions ro;
  ro.name = "good";
  std::thread good([&] {
    zmq::context_t c2(1);
    EXPECT_TRUE(RunReplica(eng, c2, s.coord->replica_endpoint(), ro, stop).ok());
  });
  Result<uint64_t> v = Status::Unavailable("not tried");
  for (int i = 0; i < 100 && !v.ok(); ++i) {  // until the replica has said hello
    v = client->UpdateWeights("w5", 5, /*drain=*/false, kTimeoutMs);
    if (!v.ok()) std::this_thread::sleep_for(50ms);
  }
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, 5u);
  st = client->GetStatus(kTimeoutMs);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->weight_version, 5u);
  stop.store(true);
  good.join();
}

TEST(CoordinatorTest, UpdateMidGenerationSplitsSpans) {
  NullEngineOptions ne;
  ne.step_delay_us = 2000;
  ne.eos_period = 0;
  Server s = StartServer(1, {}, ne);
  auto client = Connect(s.endpoint);
  auto other = Connect(s.endpoint);
  SubmitRequest q = TestGroup(1);
  q.prompts = {{5}};
  q.n = 2;
  q.max_tokens = 200;
  q.stream_tokens = true;
  ASSERT_TRUE(client->Submit(q).ok());
  // Wait for the first streamed token, so the update surely lands mid-generation.
  while (true) {
    auto e = client->Next(kTimeoutMs);
    ASSERT_TRUE(e.ok());
    if (e->kind == Event::Kind::kTokenChunk) break;
  }
  auto v = other->UpdateWeights("w9", 9, /*drain=*/false, kTimeoutMs);
  ASSERT_TRUE(v.ok());
  int got = 0;
  while (true) {
    auto e = client->Next(kTimeoutMs);
    ASSERT_TRUE(e.ok());
    if (e->kind == Event::Kind::kGroupDone) break;
    if (e->kind != Event::Kind::kTrajectory) continue;
    ++got;
    const auto& t = e->trajectory;
    ASSERT_EQ(t.versions.size(), 2u);
    EXPECT_EQ(t.versions[0].second, 0u);
    EXPECT_EQ(t.versions[1].second, 9u);
    EXPECT_GT(t.versions[1].first, 0);
    EXPECT_LT(t.versions[1].first, 200);
  }
  EXPECT_EQ(got, 2);
}

TEST(CoordinatorTest, HigherPriorityIsDispatchedFirst) {
  CoordinatorOptions o;
  o.local_replica.capacity = 1;  // one sample at a time: the queue order is visible
  NullEngineOptions ne;
  ne.step_delay_us = 500;
  ne.eos_period = 0;
  Server s = StartServer(1, o, ne);
  auto client = Connect(s.endpoint);
  SubmitRequest low = TestGroup(1);
  low.prompts = {{5}};
  low.n = 4;
  low.max_tokens = 20;
  low.stop_ids.clear();
  SubmitRequest high = low;
  high.group_id = 2;
  high.priority = 5;
  ASSERT_TRUE(client->Submit(low).ok());
  ASSERT_TRUE(client->Submit(high).ok());
  std::vector<uint64_t> done_order;
  while (done_order.size() < 2) {
    auto e = client->Next(kTimeoutMs);
    ASSERT_TRUE(e.ok());
    if (e->kind == Event::Kind::kGroupDone) done_order.push_back(e->done.group_id);
  }
  EXPECT_EQ(done_order, (std::vector<uint64_t>{2, 1}));
}

TEST(CoordinatorTest, DrainPausesDispatchUntilResumed) {
  Server s = StartServer(2);
  auto client = Connect(s.endpoint);
  ASSERT_TRUE(client->Drain(/*resume=*/false, kTimeoutMs).ok());
  const SubmitRequest q = TestGroup(1);
  ASSERT_TRUE(client->Submit(q).ok());
  std::this_thread::sleep_for(100ms);
  auto st = client->GetStatus(kTimeoutMs);
  ASSERT_TRUE(st.ok());
  EXPECT_TRUE(st->draining);
  EXPECT_EQ(st->queued, 24u);  // accepted, not dispatched
  EXPECT_EQ(st->trajectories_done, 0u);
  ASSERT_TRUE(client->Drain(/*resume=*/true, kTimeoutMs).ok());
  int got = 0;
  while (true) {
    auto e = client->Next(kTimeoutMs);
    ASSERT_TRUE(e.ok());
    if (e->kind == Event::Kind::kTrajectory) ++got;
    if (e->kind == Event::Kind::kGroupDone) break;
  }
  EXPECT_EQ(got, 24);
}

TEST(CoordinatorTest, AbortStatusAndCost) {
  CoordinatorOptions o;
  o.price.replica_hour_usd = 3.6;  // $0.001 per engine-second
  NullEngineOptions ne;
  ne.step_delay_us = 1000;
  ne.eos_period = 0;
  Server s = StartServer(2, o, ne);
  auto client = Connect(s.endpoint);
  SubmitRequest q = TestGroup(1);
  q.max_tokens = 10;
  q.stop_ids.clear();
  GroupSummary sum;
  auto r = client->Run(q, kTimeoutMs, &sum);
  ASSERT_TRUE(r.ok());
  for (const auto& t : *r) {
    EXPECT_EQ(t.cost.decode_tokens, 10);
    EXPECT_EQ(t.cost.prefill_computed + t.cost.prefill_cached,
              static_cast<int64_t>(q.prompts[t.prompt_index].size()));
    EXPECT_GT(t.cost.engine_seconds, 0.0);
    EXPECT_GE(t.cost.queue_seconds, 0.0);
    EXPECT_NEAR(t.cost.price_usd, t.cost.engine_seconds * 0.001, 1e-12);
  }
  EXPECT_EQ(sum.cost.decode_tokens, 240);
  auto st = client->GetStatus(kTimeoutMs);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->trajectories_done, 24u);
  EXPECT_GT(st->cache_hit_rate, 0.0);  // samples 2..8 of a prompt hit the toy prefix cache
  EXPECT_GT(st->tokens_per_s, 0.0);
  EXPECT_EQ(st->replicas.size(), 2u);

  SubmitRequest longq = TestGroup(2);
  longq.max_tokens = 5000;
  longq.stop_ids.clear();
  ASSERT_TRUE(client->Submit(longq).ok());
  std::this_thread::sleep_for(30ms);
  ASSERT_TRUE(client->Abort(2).ok());
  while (true) {
    auto e = client->Next(kTimeoutMs);
    ASSERT_TRUE(e.ok());
    if (e->kind == Event::Kind::kGroupDone) {
      EXPECT_EQ(e->done.aborted, 24u);
      break;
    }
  }
  ASSERT_TRUE(client->Abort(12345).ok());
  auto e = client->Next(kTimeoutMs);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->error.code(), ErrorCode::kNotFound);
}

// Replica protocol 3: a group whose samples go out a few at a time (the replica is full) sends
// its request to the replica once; later messages name it by key. Once the group is done the
// replica is told to forget it.

}  // namespace
}  // namespace bitroll::rollout
