// Shared by the coordinator's end-to-end tests (coordinator_test.cc,
// coordinator_replica_link_test.cc): a coordinator with in-process NullEngine replicas, the C++
// client, and fake replicas on a DEALER socket that read ReplicaWork and answer it by hand.
#pragma once

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
#include "rollout/coordinator.h"
#include "rollout/messages.h"
#include "rollout/null_engine.h"
#include "rollout/protocol.h"
#include "rollout/request_store.h"

namespace bitroll::rollout::coordinator_testing {

using namespace std::chrono_literals;

inline constexpr int kTimeoutMs = 20000;

struct Server {
  std::unique_ptr<Coordinator> coord;
  std::string endpoint;
};

inline Server StartServer(int replicas, CoordinatorOptions o = {}, NullEngineOptions ne = {}) {
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

// Options of a coordinator that takes remote replicas on an ephemeral port and accepts the fake
// replicas' vocabulary of 512.
inline CoordinatorOptions FakeReplicaOptions() {
  CoordinatorOptions o;
  o.replica_bind = "tcp://127.0.0.1:*";
  o.submit.vocab_size = 512;
  return o;
}

// The coordinator side of a replica link for tests that drive RunReplica: a ROUTER bound on an
// ephemeral port (its endpoint in *endpoint), receives timing out after kTimeoutMs.
inline zmq::socket_t BoundRouter(zmq::context_t& ctx, std::string* endpoint) {
  zmq::socket_t router(ctx, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 0);
  router.set(zmq::sockopt::rcvtimeo, kTimeoutMs);
  router.bind("tcp://127.0.0.1:*");
  *endpoint = router.get(zmq::sockopt::last_endpoint);
  return router;
}

inline std::unique_ptr<Client> Connect(const std::string& ep) {
  ClientOptions co;
  co.endpoint = ep;
  auto c = Client::Connect(co);
  EXPECT_TRUE(c.ok());
  return std::move(c).value();
}

// A replica DEALER that says hello (NullEngine fingerprint unless `weights_hash` says otherwise,
// vocabulary 512, replica protocol `replica_protocol`, 0: the field absent, as from a build of
// version 1) and then whatever the test sends, or nothing at all.
inline void SendHello(zmq::socket_t& fake, const char* name, uint64_t weights_hash,
                      uint32_t replica_protocol, uint32_t capacity) {
  flatbuffers::FlatBufferBuilder fbb;
  auto fp = wire::CreateFingerprint(fbb, weights_hash, 0, 0, fbb.CreateString("null"));
  auto h = wire::CreateReplicaHello(fbb, fbb.CreateString(name), 512, 4096, fp, capacity, 0, true,
                                    -1, replica_protocol);
  FinishEnvelope(fbb, 0, wire::Message_ReplicaHello, h.Union());
  fake.send(zmq::buffer(fbb.GetBufferPointer(), fbb.GetSize()));
}

// `capacity`: the samples it says it runs at once.
inline zmq::socket_t FakeReplica(zmq::context_t& ctx, const std::string& endpoint, const char* name,
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
inline bool NextWork(zmq::socket_t& fake, ReceivedWork* out, int timeout_ms = kTimeoutMs) {
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
inline std::string AddFinalTurn(flatbuffers::FlatBufferBuilder& fbb, uint64_t work_id,
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

inline void SendResults(zmq::socket_t& fake, flatbuffers::FlatBufferBuilder& fbb,
                        const std::vector<flatbuffers::Offset<wire::Trajectory>>& ts,
                        const std::vector<flatbuffers::Offset<wire::FinishedTrajectory>>& fin) {
  auto res = wire::CreateReplicaResults(fbb, fbb.CreateVector(ts), 0, 0, fbb.CreateVector(fin));
  FinishEnvelope(fbb, 0, wire::Message_ReplicaResults, res.Union());
  fake.send(zmq::buffer(fbb.GetBufferPointer(), fbb.GetSize()));
}

// The fake runs `items`: two tokens each, finish Length.
inline void AnswerItems(zmq::socket_t& fake, const std::vector<ItemAt>& items) {
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
inline void AnswerAll(zmq::socket_t& fake, const ReceivedWork& w) {
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
inline std::vector<TrajectoryResult> Collect(Client& client, uint64_t gid, GroupSummary* done) {
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
inline engine::SequenceOutput Reference(const std::vector<int32_t>& prompt, const SubmitRequest& q,
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

inline bool SameBits(const TrajectoryResult& t, const engine::SequenceOutput& ref) {
  return t.ids.size() == ref.tokens.size() && t.logprobs.size() == ref.logprobs.size() &&
         std::memcmp(t.ids.data(), ref.tokens.data(), 4 * t.ids.size()) == 0 &&
         std::memcmp(t.logprobs.data(), ref.logprobs.data(), 4 * t.logprobs.size()) == 0;
}

inline SubmitRequest TestGroup(uint64_t gid) {
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

}  // namespace bitroll::rollout::coordinator_testing
