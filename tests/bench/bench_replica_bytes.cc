// tests/bench/bench_replica_bytes.cc: the bytes the coordinator sends to a replica for one large
// group, run by hand:
//
//   bench_replica_bytes [--prompts 64] [--n 8] [--min-tokens 1024] [--max-tokens-prompt 2047]
//                       [--capacity 16] [--reps 5]
//
// One replica of `capacity` samples (a fake one: it answers each ReplicaWork at once with
// two-token trajectories, each with its client envelope, and counts what it got), one group of
// `prompts` prompts of random lengths in [min-tokens, max-tokens-prompt] x `n` samples per rep, so
// its samples go out a few at a time. Prints, per rep and as medians: ReplicaWork messages, bytes
// received, the requests they carried and their bytes, and the group's wall time.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

#include "rollout/client.h"
#include "rollout/coordinator.h"
#include "rollout/messages.h"
#include "rollout/null_engine.h"
#include "tests/bench/bench_flags.h"

using namespace bitroll;
using namespace bitroll::rollout;
using Clock = std::chrono::steady_clock;

namespace {

struct Counts {
  std::atomic<uint64_t> messages{0}, bytes{0}, requests{0}, request_bytes{0}, items{0};
};

// The fake replica: hello, then answer every item at once; heartbeats every 50 ms.
void FakeReplica(zmq::context_t& ctx, const std::string& endpoint, uint32_t capacity,
                 const std::atomic<bool>& stop, Counts* c) {
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.connect(endpoint);
  auto send = [&](flatbuffers::FlatBufferBuilder& fbb) {
    s.send(zmq::buffer(fbb.GetBufferPointer(), fbb.GetSize()));
  };
  {
    flatbuffers::FlatBufferBuilder fbb;
    auto fp = wire::CreateFingerprint(fbb, NullEngineOptions{}.weights_hash, 0, 0,
                                      fbb.CreateString("null"));
    auto h = wire::CreateReplicaHello(fbb, fbb.CreateString("small"), 512, 4096, fp, capacity, 0,
                                      true, -1, kReplicaProtocolVersion);
    FinishEnvelope(fbb, 0, wire::Message_ReplicaHello, h.Union());
    send(fbb);
  }
  std::vector<uint64_t> aligned;
  auto beat = Clock::now();
  while (!stop.load()) {
    if (Clock::now() - beat > std::chrono::milliseconds(50)) {
      flatbuffers::FlatBufferBuilder hb;
      FinishEnvelope(hb, 0, wire::Message_ReplicaHeartbeat,
                     wire::CreateReplicaHeartbeat(hb).Union());
      send(hb);
      beat = Clock::now();
    }
    zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(10));
    zmq::message_t msg;
    while (s.recv(msg, zmq::recv_flags::dontwait)) {
      auto env = DecodeEnvelope(AlignForRead(msg.data(), msg.size(), &aligned), msg.size(),
                                DecodeLimits{});
      if (!env.ok() || (*env)->msg_type() != wire::Message_ReplicaWork) continue;
      const wire::ReplicaWork* w = (*env)->msg_as_ReplicaWork();
      c->messages += 1;
      c->bytes += msg.size();
      if (w->requests()) {
        c->requests += w->requests()->size();
        for (const auto* r : *w->requests()) c->request_bytes += r->envelope()->size();
      }
      if (!w->items()) continue;
      c->items += w->items()->size();
      flatbuffers::FlatBufferBuilder fbb;
      std::vector<flatbuffers::Offset<wire::Trajectory>> ts;
      std::vector<flatbuffers::Offset<wire::FinishedTrajectory>> fin;
      const int32_t ids[2] = {1, 2};
      const float lps[2] = {-0.5f, -0.25f};
      for (const wire::WorkItem* it : *w->items()) {
        FinalTurn ft;  // the client's envelope, as a replica builds it (replica protocol 4)
        ft.ids = ids;
        ft.lps = lps;
        ft.finish = wire::FinishReason_Length;
        flatbuffers::FlatBufferBuilder efbb(256);
        BuildClientTrajectory(efbb, ft, TurnPrefix{},
                              {it->group_id(), it->prompt_index(), it->sample_index()}, "fake",
                              nullptr);
        fin.push_back(CreateFinished(fbb, it->work_id(), BufferView(efbb)));
        wire::TrajectoryBuilder b(fbb);  // the turn's: its ids are the envelope's
        b.add_group_id(it->group_id());
        b.add_prompt_index(it->prompt_index());
        b.add_sample_index(it->sample_index());
        b.add_finish(wire::FinishReason_Length);
        b.add_work_id(it->work_id());
        ts.push_back(b.Finish());
      }
      auto res = wire::CreateReplicaResults(fbb, fbb.CreateVector(ts), 0, 0, fbb.CreateVector(fin));
      FinishEnvelope(fbb, 0, wire::Message_ReplicaResults, res.Union());
      send(fbb);
    }
  }
}

template <typename T>
T Median(std::vector<T> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int prompts = 64, n = 8, min_tokens = 1024, max_tokens = 2047, capacity = 16, reps = 5;
  bench::BenchFlags flags;
  flags.ints = {{"--prompts", &prompts},       {"--n", &n},
                {"--min-tokens", &min_tokens}, {"--max-tokens-prompt", &max_tokens},
                {"--capacity", &capacity},     {"--reps", &reps}};
  if (!flags.Parse(argv[0], argc, argv)) return flags.ExitStatus();
  spdlog::set_level(spdlog::level::warn);
  CoordinatorOptions o;
  o.bind = "tcp://127.0.0.1:*";
  o.replica_bind = "tcp://127.0.0.1:*";
  o.submit.vocab_size = 512;
  auto coord = Coordinator::Start(o, {});
  if (!coord.ok()) {
    std::fprintf(stderr, "%s\n", coord.status().ToString().c_str());
    return 1;
  }
  zmq::context_t ctx(1);
  std::atomic<bool> stop{false};
  Counts c;
  std::thread fake([&] {
    FakeReplica(ctx, (*coord)->replica_endpoint(), static_cast<uint32_t>(capacity), stop, &c);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ClientOptions co;
  co.endpoint = (*coord)->endpoint();
  auto client = Client::Connect(co);
  if (!client.ok()) return 1;
  std::mt19937 rng(7);
  std::vector<uint64_t> messages, bytes, requests, request_bytes;
  std::vector<double> ms;
  std::printf("rep messages bytes requests request_bytes items wall_ms\n");
  for (int rep = 0; rep < reps; ++rep) {
    SubmitRequest q;
    q.group_id = 1 + rep;
    q.n = n;
    q.seed = rep;
    q.max_tokens = 2;
    for (int i = 0; i < prompts; ++i) {
      std::vector<int32_t> p(min_tokens + rng() % (max_tokens - min_tokens + 1));
      for (int32_t& t : p) t = static_cast<int32_t>(rng() % 512);
      q.prompts.push_back(std::move(p));
    }
    const uint64_t m0 = c.messages, b0 = c.bytes, r0 = c.requests, rb0 = c.request_bytes,
                   i0 = c.items;
    const auto t0 = Clock::now();
    auto got = (*client)->Run(q, 60000);
    const double wall = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (!got.ok() || got->size() != static_cast<size_t>(prompts * n)) {
      std::fprintf(stderr, "rep %d failed: %s\n", rep,
                   got.ok() ? "missing trajectories" : got.status().ToString().c_str());
      stop.store(true);
      fake.join();
      return 1;
    }
    messages.push_back(c.messages - m0);
    bytes.push_back(c.bytes - b0);
    requests.push_back(c.requests - r0);
    request_bytes.push_back(c.request_bytes - rb0);
    ms.push_back(wall);
    std::printf("%d %llu %llu %llu %llu %llu %.1f\n", rep,
                static_cast<unsigned long long>(messages.back()),
                static_cast<unsigned long long>(bytes.back()),
                static_cast<unsigned long long>(requests.back()),
                static_cast<unsigned long long>(request_bytes.back()),
                static_cast<unsigned long long>(c.items - i0), wall);
  }
  std::printf("median: messages %llu bytes %llu requests %llu request_bytes %llu wall_ms %.1f\n",
              static_cast<unsigned long long>(Median(messages)),
              static_cast<unsigned long long>(Median(bytes)),
              static_cast<unsigned long long>(Median(requests)),
              static_cast<unsigned long long>(Median(request_bytes)), Median(ms));
  stop.store(true);
  fake.join();
  return 0;
}
