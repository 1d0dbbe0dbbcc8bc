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
#include "rollout/messages.h"
#include "rollout/null_engine.h"
#include "rollout/protocol.h"
#include "rollout/request_store.h"

namespace bitroll::rollout {
namespace {

using namespace std::chrono_literals;
constexpr int kTimeoutMs = 20000;

struct Server {
  std::unique_ptr<Coordinator> coord;
  std::string endpoint;
};

Server StartServer(int replicas, CoordinatorOptions o = {}, NullEngineOptions ne = {}) {
  o.bind = "tcp://127.0.0.1:*";
  std::vector<std::unique_ptr<engine::Engine>> engines;
  for (int i = 0; i < replicas; ++i) engines.push_back(std::make_unique<NullEngine>(ne));
  auto c = Coordinator::Start(o, std::move(engines));
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  Server s;
  s.endpoint = (*c)->endpoint();
  s.coord = std::move(c).value();
  return s;
}

std::unique_ptr<Client> Connect(const std::string& ep) {
  ClientOptions co;
  co.endpoint = ep;
  auto c = Client::Connect(co);
  EXPECT_TRUE(c.ok());
  return std::move(c).value();
}

// A replica DEALER that says hello (NullEngine fingerprint unless `weights_hash` says otherwise,
// vocabulary 512, replica protocol `replica_protocol`, 0: the field absent, as from a build of
// version 1) and then whatever the test sends, or nothing at all.
void SendHello(zmq::socket_t& fake, const char* name, uint64_t weights_hash,
               uint32_t replica_protocol, uint32_t capacity) {
  flatbuffers::FlatBufferBuilder fbb;
  auto fp = wire::CreateFingerprint(fbb, weights_hash, 0, 0, fbb.CreateString("null"));
  auto h = wire::CreateReplicaHello(fbb, fbb.CreateString(name), 512, 4096, fp, capacity, 0, true,
                                    -1, replica_protocol);
  FinishEnvelope(fbb, 0, wire::Message_ReplicaHello, h.Union());
  fake.send(zmq::buffer(fbb.GetBufferPointer(), fbb.GetSize()));
}

// `capacity`: the samples it says it runs at once.
zmq::socket_t FakeReplica(zmq::context_t& ctx, const std::string& endpoint, const char* name,
                          uint64_t weights_hash = NullEngineOptions{}.weights_hash,
                          uint32_t replica_protocol = kReplicaProtocolVersion,
                          uint32_t capacity = 64) {
  zmq::socket_t fake(ctx, zmq::socket_type::dealer);
  fake.set(zmq::sockopt::linger, 0);
  fake.set(zmq::sockopt::rcvtimeo, kTimeoutMs);
  fake.connect(endpoint);
  SendHello(fake, name, weights_hash, replica_protocol, capacity);
  return fake;
}

// A ReplicaWork a fake replica received, with its bytes.
struct ReceivedWork {
  std::vector<uint64_t> buf;
  const wire::ReplicaWork* work = nullptr;
  size_t size = 0;  // of the message
  size_t requests() const { return work->requests() ? work->requests()->size() : 0; }
  size_t items() const { return work->items() ? work->items()->size() : 0; }
  std::string_view request_bytes(size_t k) const {
    const auto* v = work->requests()->Get(k)->envelope();
    return {reinterpret_cast<const char*>(v->data()), v->size()};
  }
};

// The fake's next ReplicaWork (other messages are skipped); it sends a heartbeat every 50 ms
// meanwhile, so that it is not declared dead. False after kTimeoutMs.
bool NextWork(zmq::socket_t& fake, ReceivedWork* out, int timeout_ms = kTimeoutMs) {
  for (int waited = 0; waited < timeout_ms; waited += 50) {
    flatbuffers::FlatBufferBuilder hb;
    FinishEnvelope(hb, 0, wire::Message_ReplicaHeartbeat, wire::CreateReplicaHeartbeat(hb).Union());
    fake.send(zmq::buffer(hb.GetBufferPointer(), hb.GetSize()));
    zmq::pollitem_t item{fake.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(50));
    zmq::message_t msg;
    while (fake.recv(msg, zmq::recv_flags::dontwait)) {
      out->buf.assign((msg.size() + 7) / 8, 0);
      std::memcpy(out->buf.data(), msg.data(), msg.size());
      auto env = DecodeEnvelope(out->buf.data(), msg.size(), DecodeLimits{});
      if (!env.ok() || (*env)->msg_type() != wire::Message_ReplicaWork) continue;
      out->work = (*env)->msg_as_ReplicaWork();
      out->size = msg.size();
      return true;
    }
  }
  return false;
}

// A work item's address, for answering it later.
struct ItemAt {
  uint64_t work_id, group_id;
  uint32_t prompt_index, sample_index;
};

// The fake's answer to one item: two tokens, finish Length. The trajectory ends there, so the
// client's envelope goes along, built as a replica builds it (replica protocol 4); its bytes are
// returned.
std::string AddFinalTurn(flatbuffers::FlatBufferBuilder& fbb, uint64_t work_id,
                         const SampleAddress& at,
                         std::vector<flatbuffers::Offset<wire::Trajectory>>* ts,
                         std::vector<flatbuffers::Offset<wire::FinishedTrajectory>>* fin,
                         const std::string* client_tag = nullptr) {
  static const std::vector<int32_t> ids{1, 2};
  static const std::vector<float> lps{-0.5f, -0.25f};
  FinalTurn ft;
  ft.ids = ids;
  ft.lps = lps;
  ft.finish = wire::FinishReason_Length;
  ft.cost.decode_tokens = 2;
  ft.cost.engine_seconds = 0.5;
  flatbuffers::FlatBufferBuilder efbb(256);
  BuildClientTrajectory(efbb, ft, TurnPrefix{}, at, "fake", client_tag);
  std::string envelope(BufferView(efbb));
  fin->push_back(CreateFinished(fbb, work_id, envelope));
  auto c = CostToWire(fbb, ft.cost);
  wire::TrajectoryBuilder b(fbb);  // the turn's: its ids are the envelope's
  b.add_group_id(at.group_id);
  b.add_prompt_index(at.prompt_index);
  b.add_sample_index(at.sample_index);
  b.add_finish(wire::FinishReason_Length);
  b.add_work_id(work_id);
  b.add_cost(c);
  ts->push_back(b.Finish());
  return envelope;
}

void SendResults(zmq::socket_t& fake, flatbuffers::FlatBufferBuilder& fbb,
                 const std::vector<flatbuffers::Offset<wire::Trajectory>>& ts,
                 const std::vector<flatbuffers::Offset<wire::FinishedTrajectory>>& fin) {
  auto res = wire::CreateReplicaResults(fbb, fbb.CreateVector(ts), 0, 0, fbb.CreateVector(fin));
  FinishEnvelope(fbb, 0, wire::Message_ReplicaResults, res.Union());
  fake.send(zmq::buffer(fbb.GetBufferPointer(), fbb.GetSize()));
}

// The fake runs `items`: two tokens each, finish Length.
void AnswerItems(zmq::socket_t& fake, const std::vector<ItemAt>& items) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<flatbuffers::Offset<wire::Trajectory>> ts;
  std::vector<flatbuffers::Offset<wire::FinishedTrajectory>> fin;
  for (const ItemAt& item : items) {
    AddFinalTurn(fbb, item.work_id, {item.group_id, item.prompt_index, item.sample_index}, &ts,
                 &fin);
  }
  SendResults(fake, fbb, ts, fin);
}

// The fake runs every item of `w`: two tokens each, finish Length.
void AnswerAll(zmq::socket_t& fake, const ReceivedWork& w) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<flatbuffers::Offset<wire::Trajectory>> ts;
  std::vector<flatbuffers::Offset<wire::FinishedTrajectory>> fin;
  for (const wire::WorkItem* item : *w.work->items()) {
    AddFinalTurn(fbb, item->work_id(),
                 {item->group_id(), item->prompt_index(), item->sample_index()}, &ts, &fin);
  }
  SendResults(fake, fbb, ts, fin);
}

// The client's trajectories of group `gid` until its GroupDone.
std::vector<TrajectoryResult> Collect(Client& client, uint64_t gid, GroupSummary* done) {
  std::vector<TrajectoryResult> got;
  while (true) {
    auto e = client.Next(kTimeoutMs);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    if (!e.ok()) return got;
    if (e->kind == Event::Kind::kTrajectory) got.push_back(e->trajectory);
    if (e->kind == Event::Kind::kGroupDone && e->done.group_id == gid) {
      *done = e->done;
      return got;
    }
  }
}

// The reference: each sample run alone in a fresh engine, no coordinator involved.
engine::SequenceOutput Reference(const std::vector<int32_t>& prompt, const SubmitRequest& q,
                                 uint32_t sample, NullEngineOptions ne = {},
                                 const std::string& weights = "", uint64_t version = 0) {
  NullEngine e(ne);
  if (!weights.empty()) {
    EXPECT_TRUE(e.UpdateWeights(weights, version).ok());
  }
  engine::SequenceRequest r;
  r.id = 1;
  r.prompt = prompt;
  r.sample_index = sample;
  r.sampling.temperature = q.temperature;
  r.sampling.seed = q.seed;
  r.stop.max_tokens = q.max_tokens;
  r.stop.stop_ids = q.stop_ids;
  EXPECT_TRUE(e.Add(r).ok());
  while (e.HasWork()) {
    auto s = e.Step();
    EXPECT_TRUE(s.ok());
    if (!s->finished.empty()) return s->finished[0];
  }
  return {};
}

bool SameBits(const TrajectoryResult& t, const engine::SequenceOutput& ref) {
  return t.ids.size() == ref.tokens.size() && t.logprobs.size() == ref.logprobs.size() &&
         std::memcmp(t.ids.data(), ref.tokens.data(), 4 * t.ids.size()) == 0 &&
         std::memcmp(t.logprobs.data(), ref.logprobs.data(), 4 * t.logprobs.size()) == 0;
}

SubmitRequest TestGroup(uint64_t gid) {
  SubmitRequest q;
  q.group_id = gid;
  q.prompts = {{5, 6, 7}, {100, 200, 300, 400}, {9}};
  q.n = 8;
  q.seed = 1234;
  q.max_tokens = 40;
  q.stop_ids = {77};
  return q;
}

// Background clients that keep other groups in flight while the test group runs.
class Load {
 public:
  Load(const std::string& ep, int clients) {
    for (int c = 0; c < clients; ++c) {
      threads_.emplace_back([this, ep, c] {
        auto cl = Connect(ep);
        uint64_t gid = 1000 * (c + 1);
        while (!stop_.load()) {
          SubmitRequest q;
          q.group_id = gid++;
          q.prompts = {{static_cast<int32_t>(10 + gid % 50), 11, 12}};
          q.n = 4 + gid % 5;
          q.seed = gid;
          q.max_tokens = 30;
          auto r = cl->Run(q, kTimeoutMs);
          if (r.ok()) groups_.fetch_add(1);
        }
      });
    }
  }
  ~Load() {
    stop_.store(true);
    for (auto& t : threads_) t.join();
  }
  int groups() const { return groups_.load(); }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<int> groups_{0};
  std::vector<std::thread> threads_;
};

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
  CoordinatorOptions o;
  o.replica_bind = "tcp://127.0.0.1:*";
  o.replica_timeout_ms = 1000;  // well above the 100 ms heartbeat, even on a loaded CI box
  o.submit.vocab_size = 512;
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
  zmq::socket_t router(ctx, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 0);
  router.set(zmq::sockopt::rcvtimeo, kTimeoutMs);
  router.bind("tcp://127.0.0.1:*");
  const std::string ep = router.get(zmq::sockopt::last_endpoint);
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
  CoordinatorOptions o;
  o.replica_bind = "tcp://127.0.0.1:*";
  o.replica_timeout_ms = 1000;
  o.submit.vocab_size = 512;
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
TEST(CoordinatorTest, ManyPromptGroupSendsItsRequestOncePerReplica) {
  CoordinatorOptions o;
  o.replica_bind = "tcp://127.0.0.1:*";
  o.submit.vocab_size = 512;
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
  CoordinatorOptions o;
  o.replica_bind = "tcp://127.0.0.1:*";
  o.replica_timeout_ms = 1000;
  o.submit.vocab_size = 512;
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
  CoordinatorOptions o;
  o.replica_bind = "tcp://127.0.0.1:*";
  o.submit.vocab_size = 512;
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
  CoordinatorOptions o;
  o.replica_bind = "tcp://127.0.0.1:*";
  o.submit.vocab_size = 512;
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
  CoordinatorOptions o;
  o.replica_bind = "tcp://127.0.0.1:*";
  o.submit.vocab_size = 512;
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
  zmq::socket_t router(ctx, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 0);
  router.set(zmq::sockopt::rcvtimeo, kTimeoutMs);
  router.bind("tcp://127.0.0.1:*");
  const std::string ep = router.get(zmq::sockopt::last_endpoint);
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
  CoordinatorOptions o;
  o.replica_bind = "tcp://127.0.0.1:*";
  o.submit.vocab_size = 512;
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
  CoordinatorOptions o;
  o.replica_bind = "tcp://127.0.0.1:*";
  o.replica_timeout_ms = 1000;  // a restarted fake's old connection
  o.submit.vocab_size = 512;
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
        if (m.ok()) EXPECT_EQ((*m)->group_id(), item->group_id());
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
    if (NextWork(fake, &w, 50)) ASSERT_TRUE(store.Apply(*w.work).ok());
  }
  EXPECT_EQ(store.size(), 0u);
}

}  // namespace
}  // namespace bitroll::rollout
