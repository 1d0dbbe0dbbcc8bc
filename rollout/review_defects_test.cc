// Regression tests for the service defects an outside review found (issue "frozen or lost work, a
// returning acknowledged trajectory"). Each drives the service only through its public surface:
// the C++ client, raw envelopes on a DEALER socket, and a `bitroll serve` child for kill -9. Each
// test names the defect it pins; every one failed on the code before the fix.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "rollout/client.h"
#include "rollout/coordinator.h"
#include "rollout/null_engine.h"
#include "rollout/protocol.h"
#include "rollout/service_test_util.h"

namespace bitroll::rollout {
namespace {

using namespace std::chrono_literals;
constexpr int kTimeoutMs = 20000;

std::string TempDir(const char* name) {
  const std::string d =
      std::string(BITROLL_BINARY_DIR) + "/review_" + name + "_" + std::to_string(getpid());
  std::filesystem::remove_all(d);
  return d;
}

struct Service {
  std::unique_ptr<Coordinator> coord;
  std::string endpoint;
};

Service Start(CoordinatorOptions o, int replicas = 2, NullEngineOptions ne = {}) {
  o.bind = "tcp://127.0.0.1:*";
  std::vector<std::unique_ptr<engine::Engine>> engines;
  for (int i = 0; i < replicas; ++i) engines.push_back(std::make_unique<NullEngine>(ne));
  auto c = Coordinator::Start(o, std::move(engines));
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  Service s;
  if (!c.ok()) return s;
  s.endpoint = (*c)->endpoint();
  s.coord = std::move(c).value();
  return s;
}

CoordinatorOptions WalOptions(const std::string& dir) {
  CoordinatorOptions o;
  o.wal.dir = dir;
  o.wal.durability = wal::Durability::kNone;
  return o;
}

std::unique_ptr<Client> Connect(const std::string& ep, const std::string& client_id = "") {
  ClientOptions co;
  co.endpoint = ep;
  co.client_id = client_id;
  return std::move(Client::Connect(co)).value();
}

SubmitRequest Group(uint64_t gid, uint64_t seed = 7, uint32_t n = 4) {
  SubmitRequest q;
  q.group_id = gid;
  q.prompts = {{5, 6, 7}, {9, 10}};
  q.n = n;
  q.seed = seed;
  q.max_tokens = 24;
  return q;
}

std::map<SampleKey, SampleOutput> Reference(const SubmitRequest& q) {
  NullEngine e(NullEngineOptions{});
  return RunDirect(e, q);
}

// Collects one group's trajectories until its GroupDone (or an Error for it).
struct Collected {
  std::map<SampleKey, SampleOutput> got;
  int duplicates = 0;
  bool done = false;
  GroupSummary summary;
  Status error;
};

Collected Collect(Client& c, uint64_t gid, int timeout_ms = kTimeoutMs) {
  Collected out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!out.done && std::chrono::steady_clock::now() < deadline) {
    auto ev = c.Next(200);
    if (!ev.ok()) continue;
    if (ev->kind == Event::Kind::kTrajectory && ev->trajectory.group_id == gid) {
      const auto& t = ev->trajectory;
      const SampleKey k{t.prompt_index, t.sample_index};
      if (out.got.count(k)) ++out.duplicates;
      out.got[k] = {t.ids, t.logprobs};
    } else if (ev->kind == Event::Kind::kGroupDone && ev->done.group_id == gid) {
      out.done = true;
      out.summary = ev->done;
    } else if (ev->kind == Event::Kind::kError && ev->error_group_id == gid) {
      out.error = ev->error;
      out.done = true;
    }
  }
  return out;
}

Collected SubmitAndCollect(Client& c, const SubmitRequest& q, int timeout_ms = kTimeoutMs) {
  Status s = c.Submit(q);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return Collect(c, q.group_id, timeout_ms);
}

// Defect 1: an Ack that arrives after a trajectory finished but before it was delivered froze
// delivery for every client.
TEST(ReviewDefects, EarlyAckDoesNotFreezeDelivery) {
  const std::string dir = TempDir("early_ack");
  CoordinatorOptions o = WalOptions(dir);
  o.wal.commit_interval_ms = 200;  // a wide window between finish and delivery
  Service s = Start(o);
  auto a = Connect(s.endpoint, "a");
  auto b = Connect(s.endpoint, "b");
  const SubmitRequest qa = Group(1), qb = Group(2, 9);
  ASSERT_TRUE(a->Submit(qa).ok());
  std::vector<std::pair<uint32_t, uint32_t>> all;
  for (uint32_t p = 0; p < 2; ++p) {
    for (uint32_t j = 0; j < 4; ++j) all.push_back({p, j});
  }
  for (int i = 0; i < 20; ++i) {  // early (some before, some after the trajectories finish)
    ASSERT_TRUE(a->Ack(1, all).ok());
    std::this_thread::sleep_for(5ms);
  }
  ASSERT_TRUE(b->Submit(qb).ok());
  Collected ca = Collect(*a, 1), cb = Collect(*b, 2);
  EXPECT_TRUE(ca.done) << "client a's group never finished";
  EXPECT_TRUE(cb.done) << "client b was frozen by client a's early Ack";
  EXPECT_EQ(ca.got, Reference(qa));  // early Acks acknowledge nothing
  EXPECT_EQ(cb.got, Reference(qb));
  s.coord->Stop();
  std::filesystem::remove_all(dir);
}

// Defect 9a: Ack indexes are bounds-checked: out-of-range ones cannot reach other groups'
// trajectory ids (prompt_index * n + sample_index of the first group = a trajectory of a later
// one), and acknowledge nothing.
TEST(ReviewDefects, AckIndexesAreBoundsChecked) {
  const std::string dir = TempDir("ack_bounds");
  Service s = Start(WalOptions(dir));
  auto a = Connect(s.endpoint, "a");
  const SubmitRequest q1 = Group(1, 3, 2), q2 = Group(2, 4, 2);
  ASSERT_TRUE(SubmitAndCollect(*a, q1).done);
  ASSERT_TRUE(SubmitAndCollect(*a, q2).done);
  // Crafted indexes: with n = 2, (prompt 0, sample 1 << 24) names flat index 2^24, which in the
  // WAL's id scheme is the next group's (group 2's) trajectory 0.
  ASSERT_TRUE(a->Ack(1, {{0, 1u << 24}, {1u << 23, 0}, {5, 0}, {0, 7}}).ok());
  std::this_thread::sleep_for(100ms);
  // Nothing was acknowledged: after a restart both groups re-attach with every trajectory.
  s.coord.reset();
  s = Start(WalOptions(dir));
  auto again = Connect(s.endpoint, "a");
  Collected r1 = SubmitAndCollect(*again, q1);
  Collected r2 = SubmitAndCollect(*again, q2);
  EXPECT_EQ(r1.got, Reference(q1)) << "an out-of-range Ack removed a trajectory";
  EXPECT_EQ(r2.got, Reference(q2)) << "an out-of-range Ack of group 1 reached group 2";
  s.coord->Stop();
  std::filesystem::remove_all(dir);
}

// Defect 4: with a WAL, group ids were global: another client re-using a live group id took over
// its results, and another client's Abort cancelled it. Groups are owned by the client_id.
TEST(ReviewDefects, GroupsBelongToTheirOwner) {
  const std::string dir = TempDir("owners");
  NullEngineOptions slow;
  slow.step_delay_us = 5000;
  Service s = Start(WalOptions(dir), 2, slow);
  auto a = Connect(s.endpoint, "owner-a");
  auto b = Connect(s.endpoint, "owner-b");
  auto c = Connect(s.endpoint, "owner-c");
  const SubmitRequest qa = Group(7, 11), qb = Group(7, 12);
  ASSERT_TRUE(a->Submit(qa).ok());
  std::this_thread::sleep_for(30ms);
  ASSERT_TRUE(b->Submit(qb).ok());  // the same group id, another owner: its own group
  ASSERT_TRUE(c->Abort(7).ok());    // names no group of owner-c
  Collected cc = Collect(*c, 7, 5000);
  EXPECT_EQ(cc.error.code(), ErrorCode::kNotFound) << cc.error.ToString();
  Collected ca = Collect(*a, 7), cb = Collect(*b, 7);
  EXPECT_TRUE(ca.done && cb.done);
  EXPECT_EQ(ca.summary.aborted, 0u) << "another client's Abort cancelled the group";
  EXPECT_EQ(ca.got, Reference(qa)) << "owner-a lost its results to owner-b";
  EXPECT_EQ(cb.got, Reference(qb));
  s.coord->Stop();
  std::filesystem::remove_all(dir);
}

// Defect 5: groups of clients that vanished were kept in memory forever. A finished group of a
// vanished client leaves memory (Status.groups) and a later re-attach still gets it, bit-exact.
TEST(ReviewDefects, VanishedClientsGroupsLeaveMemoryAndReattach) {
  const std::string dir = TempDir("vanish");
  Service s = Start(WalOptions(dir));
  constexpr int kClients = 50;
  for (int i = 0; i < kClients; ++i) {
    auto c = Connect(s.endpoint, "v" + std::to_string(i));
    ASSERT_TRUE(c->Submit(Group(100 + i, i)).ok());
    ASSERT_TRUE(c->Next(kTimeoutMs).ok());  // accepted: its first trajectory came
  }  // every client is gone, most of their trajectories unread
  auto probe = Connect(s.endpoint, "probe");
  uint32_t groups = ~0u;
  for (int i = 0; i < 100 && groups != 0; ++i) {
    auto st = probe->GetStatus(kTimeoutMs);
    ASSERT_TRUE(st.ok());
    groups = st->groups;
    if (groups != 0) std::this_thread::sleep_for(100ms);
  }
  EXPECT_EQ(groups, 0u) << "finished groups of vanished clients are still in memory";
  auto back = Connect(s.endpoint, "v18");
  const SubmitRequest q = Group(118, 18);
  Collected r = SubmitAndCollect(*back, q);
  EXPECT_TRUE(r.done);
  EXPECT_EQ(r.duplicates, 0);
  EXPECT_EQ(r.got, Reference(q)) << "the parked group's re-attach lost trajectories";
  // Its owner acknowledges two before re-attaching: they are not sent again; another owner's
  // Ack of the same group id does nothing.
  auto other = Connect(s.endpoint, "not-v17");
  ASSERT_TRUE(other->Ack(117, {{0, 1}}).ok());
  auto again = Connect(s.endpoint, "v17");
  ASSERT_TRUE(again->Ack(117, {{0, 0}, {1, 3}}).ok());
  const SubmitRequest q17 = Group(117, 17);
  Collected r2 = SubmitAndCollect(*again, q17);
  EXPECT_TRUE(r2.done);
  EXPECT_EQ(r2.got.size(), 6u);
  EXPECT_EQ(r2.got.count({0, 0}) + r2.got.count({1, 3}), 0u);
  EXPECT_EQ(r2.got.count({0, 1}), 1u) << "another owner's Ack acknowledged a trajectory";
  s.coord->Stop();
  std::filesystem::remove_all(dir);
}

// Defect 3: a client that never reads blocked every other client once its ZeroMQ queue filled.
// Its replies are bounded; past the bound it is dropped and told so on its next message.
TEST(ReviewDefects, ClientThatNeverReadsDoesNotBlockOthers) {
  for (const bool with_wal : {false, true}) {
    SCOPED_TRACE(with_wal ? "with a WAL" : "without a WAL");
    const std::string dir = TempDir("slow");
    CoordinatorOptions o = with_wal ? WalOptions(dir) : CoordinatorOptions{};
    o.client_sndhwm = 8;
    o.max_client_buffer_bytes = 64 << 10;
    Service s = Start(o);
    zmq::context_t ctx(1);
    zmq::socket_t slow(ctx, zmq::socket_type::dealer);
    slow.set(zmq::sockopt::linger, 0);
    slow.set(zmq::sockopt::rcvhwm, 1);  // and its receive side is full at once
    slow.connect(s.endpoint);
    for (uint64_t gid = 1; gid <= 100; ++gid) {  // ~30 MB of replies: more than socket buffers
      SubmitRequest q = Group(gid, gid, 16);
      q.max_tokens = 1024;
      q.stop_at_eos = false;
      const std::string m = EncodeSubmit(q, gid, "slow");
      slow.send(zmq::buffer(m), zmq::send_flags::none);
    }
    std::this_thread::sleep_for(1500ms);  // its replies pile up
    auto c = Connect(s.endpoint, "reader");
    const SubmitRequest q = Group(500, 5);
    Collected r = SubmitAndCollect(*c, q, 10000);
    EXPECT_TRUE(r.done) << "a client that never reads blocked another client";
    EXPECT_EQ(r.got, Reference(q));
    // The slow client, reading at last, is told why it stopped getting replies.
    slow.set(zmq::sockopt::rcvtimeo, 200);
    zmq::message_t msg;
    while (slow.recv(msg, zmq::recv_flags::none)) {
    }
    const std::string st = [] {
      flatbuffers::FlatBufferBuilder fbb(64);
      FinishEnvelope(fbb, 4242, wire::Message_Status, wire::CreateStatus(fbb).Union(), "slow");
      return std::string(BufferView(fbb));
    }();
    slow.send(zmq::buffer(st), zmq::send_flags::none);
    bool told = false, status = false;
    slow.set(zmq::sockopt::rcvtimeo, 2000);
    while (!(told && status) && slow.recv(msg, zmq::recv_flags::none)) {
      std::vector<uint64_t> align;
      auto env = DecodeEnvelope(AlignForRead(msg.data(), msg.size(), &align), msg.size(), {});
      ASSERT_TRUE(env.ok());
      if ((*env)->msg_type() == wire::Message_Error &&
          (*env)->msg_as_Error()->code() == ErrorCodeToWire(ErrorCode::kResourceExhausted)) {
        told = true;
      }
      status = status || (*env)->msg_type() == wire::Message_StatusReply;
    }
    EXPECT_TRUE(told) << "the dropped client was not told why";
    EXPECT_TRUE(status) << "the dropped client is not served again";
    s.coord->Stop();
    std::filesystem::remove_all(dir);
  }
}

// Defect 2: one prompt of 1,048,576 ids with n = 16 (inside every documented limit) made a
// dispatch message over 64 MiB that the replica dropped: its samples and an innocent group in the
// same batch hung, and a later drained UpdateWeights never completed.
TEST(ReviewDefects, LargeRequestIsServedOrRefusedAndLosesNothing) {
  for (const bool fits : {true, false}) {
    SCOPED_TRACE(fits ? "the prompt fits the model's context" : "the prompt is too long");
    NullEngineOptions ne;
    if (fits) ne.max_seq_len = 1 << 21;  // 16 work items of 4 MiB: one 64 MiB batch before
    Service s = Start(CoordinatorOptions{}, 1, ne);
    auto big_client = Connect(s.endpoint, "big");
    auto small_client = Connect(s.endpoint, "small");
    SubmitRequest big = Group(1, 1, 16);
    big.prompts = {std::vector<int32_t>(size_t{1} << 20, 3)};
    big.max_tokens = 4;
    ASSERT_TRUE(big_client->Submit(big).ok());
    const SubmitRequest small = Group(2, 2);
    ASSERT_TRUE(small_client->Submit(small).ok());
    Collected cs = Collect(*small_client, 2, 60000);
    EXPECT_TRUE(cs.done) << "an innocent group was lost with the large request";
    EXPECT_EQ(cs.got, Reference(small));
    Collected cb = Collect(*big_client, 1, 60000);
    ASSERT_TRUE(cb.done) << "the large request got no answer";
    if (fits) {
      EXPECT_TRUE(cb.error.ok()) << cb.error.ToString();
      EXPECT_EQ(cb.summary.trajectories, 16u);
      EXPECT_EQ(cb.summary.errors, 0u);
      EXPECT_EQ(cb.got.size(), 16u);
    } else {  // refused where it arrives, with a typed error
      EXPECT_EQ(cb.error.code(), ErrorCode::kOutOfRange) << cb.error.ToString();
      EXPECT_TRUE(cb.got.empty());
    }
    const std::string weights = TempDir("large_weights");
    {
      std::FILE* f = std::fopen(weights.c_str(), "w");
      ASSERT_NE(f, nullptr);
      std::fputs("w", f);
      std::fclose(f);
    }
    auto v = small_client->UpdateWeights(weights, 2, /*drain=*/true, 20000);
    std::filesystem::remove(weights);
    EXPECT_TRUE(v.ok()) << v.status().ToString();
    s.coord->Stop();
  }
}

// One group at the size limit must not hold back a small group submitted after it: within a
// priority, dispatch takes one sample of each queued group in turn.
TEST(ReviewDefects, LargeGroupDoesNotStarveASmallOne) {
  NullEngineOptions slow;
  slow.step_delay_us = 2000;
  CoordinatorOptions o;
  o.local_replica.capacity = 8;
  Service s = Start(o, 1, slow);
  auto big_client = Connect(s.endpoint, "big");
  auto small_client = Connect(s.endpoint, "small");
  SubmitRequest big = Group(1, 1, 4096);  // 8192 samples: minutes at 8 in flight
  big.max_tokens = 16;
  ASSERT_TRUE(big_client->Submit(big).ok());
  std::this_thread::sleep_for(50ms);
  const SubmitRequest small = Group(2, 2);
  const auto t0 = std::chrono::steady_clock::now();
  Collected cs = SubmitAndCollect(*small_client, small, 20000);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(cs.done) << "the small group waited behind the large one";
  EXPECT_EQ(cs.got, Reference(small));
  EXPECT_LT(waited, 10.0);
  ASSERT_TRUE(big_client->Abort(1).ok());
  EXPECT_TRUE(Collect(*big_client, 1).done);
  s.coord->Stop();
}

// A malformed Ack (index lists of different lengths) is refused and acknowledges nothing; it
// used to be zipped to the shorter list.
TEST(ReviewDefects, MalformedAckIsRefused) {
  const std::string dir = TempDir("bad_ack");
  Service s = Start(WalOptions(dir));
  auto a = Connect(s.endpoint, "a");
  const SubmitRequest q = Group(3, 3, 2);
  ASSERT_TRUE(SubmitAndCollect(*a, q).done);
  flatbuffers::FlatBufferBuilder fbb(128);
  const std::vector<uint32_t> prompts = {0, 1}, samples = {0};
  auto ack = wire::CreateAck(fbb, 3, fbb.CreateVector(prompts), fbb.CreateVector(samples));
  FinishEnvelope(fbb, 77, wire::Message_Ack, ack.Union(), a->client_id());
  ASSERT_TRUE(a->SendRaw(BufferView(fbb)).ok());
  Collected bad = Collect(*a, 3, 5000);
  EXPECT_EQ(bad.error.code(), ErrorCode::kInvalidArgument) << bad.error.ToString();
  s.coord.reset();  // nothing was acknowledged: every trajectory comes back after a restart
  s = Start(WalOptions(dir));
  auto again = Connect(s.endpoint, "a");
  EXPECT_EQ(SubmitAndCollect(*again, q).got, Reference(q));
  s.coord->Stop();
  std::filesystem::remove_all(dir);
}

// Defect 6b: GroupDone.cost.wal_bytes was always 0 with the WAL on.
TEST(ReviewDefects, GroupDoneCountsWalBytes) {
  const std::string dir = TempDir("wal_bytes");
  Service s = Start(WalOptions(dir));
  auto c = Connect(s.endpoint, "a");
  const SubmitRequest q = Group(1);
  GroupSummary sum;
  auto r = c->Run(q, kTimeoutMs, &sum);
  ASSERT_TRUE(r.ok());
  int64_t each = 0;
  for (const auto& t : *r) each += t.cost.wal_bytes;
  EXPECT_GT(each, 0);
  EXPECT_EQ(sum.cost.wal_bytes, each);
  s.coord->Stop();
  std::filesystem::remove_all(dir);
}

// Defect 6: with the service idle after an Ack the acknowledgement was never committed, so after
// kill -9 the acknowledged trajectory came back.
TEST(ReviewDefects, AcknowledgedTrajectoryStaysGoneAfterKill) {
  const std::string dir = TempDir("ack_kill");
  const std::string ep = FreeLoopbackEndpoint();
  auto serve = [&] {
    return SpawnQuiet({BITROLL_EXE, "serve", "--data-dir", dir, "--bind", ep, "--log-level", "warn",
                       "--replicas", "1", "--engine", "null"});
  };
  pid_t pid = serve();
  ASSERT_GT(pid, 0);
  const SubmitRequest q = Group(5, 5);
  {
    auto c = Connect(ep, "trainer");
    Collected r = SubmitAndCollect(*c, q);
    ASSERT_TRUE(r.done);
    ASSERT_EQ(r.got.size(), 8u);
    auto before = c->GetStatus(kTimeoutMs);
    ASSERT_TRUE(before.ok());
    ASSERT_TRUE(c->Ack(5, {{0, 0}, {0, 1}, {1, 2}}).ok());
    // Idle after the Ack: it must still be committed (the defect), and WaitCommitted says when.
    const Status committed = c->WaitCommitted(kTimeoutMs);
    ASSERT_TRUE(committed.ok()) << committed.ToString();
    auto after = c->GetStatus(kTimeoutMs);
    ASSERT_TRUE(after.ok());
    EXPECT_TRUE(after->wal_enabled);
    EXPECT_GT(after->wal_last_lsn, before->wal_last_lsn) << "the Ack took no place in the log";
    EXPECT_GE(after->wal_committed_lsn, after->wal_last_lsn);
    EXPECT_GE(after->wal_committed_lsn, after->wal_durable_lsn);
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  pid = serve();
  auto c = Connect(ep, "trainer");
  Collected r = SubmitAndCollect(*c, q);
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  EXPECT_TRUE(r.done);
  EXPECT_EQ(r.got.size(), 5u);
  EXPECT_EQ(r.got.count({0, 0}) + r.got.count({0, 1}) + r.got.count({1, 2}), 0u)
      << "an acknowledged trajectory came back after kill -9";
  std::filesystem::remove_all(dir);
}

// Without --data-dir there is nothing to wait for: WaitCommitted is a typed error, not a hang
// and not a false "committed".
TEST(ReviewDefects, WaitCommittedWithoutAWalIsAClearError) {
  Service s = Start(CoordinatorOptions{});
  auto c = Connect(s.endpoint, "a");
  auto st = c->GetStatus(kTimeoutMs);
  ASSERT_TRUE(st.ok());
  EXPECT_FALSE(st->wal_enabled);
  EXPECT_EQ(st->wal_last_lsn, 0u);
  const Status w = c->WaitCommitted(kTimeoutMs);
  EXPECT_EQ(w.code(), ErrorCode::kFailedPrecondition) << w.ToString();
  s.coord->Stop();
}

}  // namespace
}  // namespace bitroll::rollout
