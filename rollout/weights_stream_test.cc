// Weight updates through the service (UpdateWeights with streamed tensors or an NCCL source) on
// the real engine: replicas serving random weights of stories260K's shape receive the real
// stories260K tensor by tensor from a client and then generate exactly (memcmp of ids and
// logprob bits) what a service started on stories260K generates. Also: partial updates replayed
// to a replica that joins late, typed errors that install nothing, part ordering, abandoned
// streams, and the NCCL source's checks that run without a GPU.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "engine/forward_backend.h"
#include "engine/make_model.h"
#include "engine/model_loader.h"
#include "engine/weight_update.h"
#include "rollout/client.h"
#include "rollout/coordinator.h"
#include "rollout/protocol.h"
#include "rollout/replica.h"

namespace bitroll::rollout {
namespace {

namespace fs = std::filesystem;
constexpr int kTimeoutMs = 60000;

std::string ModelsDir() {
  return BITROLL_MODELS_DIR;
}

std::unique_ptr<Client> Connect(const std::string& endpoint) {
  ClientOptions co;
  co.endpoint = endpoint;
  auto c = Client::Connect(co);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

// A random model of stories260K's shape (seed 1), written once per process.
const std::string& RandomModelPath() {
  static const std::string path = [] {
    const fs::path dir =
        fs::temp_directory_path() / ("bitroll_weights_stream_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    auto shape = engine::NamedShape("stories260k");
    EXPECT_TRUE(shape.ok());
    EXPECT_TRUE(engine::WriteRandomModel(*shape, 1, (dir / "random.bin").string(),
                                         (dir / "random_tok.bin").string())
                    .ok());
    return (dir / "random.bin").string();
  }();
  return path;
}

std::unique_ptr<engine::Engine> Open(const std::string& model) {
  engine::EngineOptions o;
  o.model_path = model;
  o.tokenizer_path = ModelsDir() + "/tok512.bin";
  o.kv_cache_bytes = 32ll << 20;
  auto e = engine::OpenEngine(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(e).value() : nullptr;
}

struct Service {
  std::unique_ptr<Coordinator> coord;
  std::unique_ptr<Client> client;
};

Service Start(const std::string& model, int replicas, CoordinatorOptions o = {}) {
  Service s;
  o.bind = "tcp://127.0.0.1:*";
  std::vector<std::unique_ptr<engine::Engine>> engines;
  for (int i = 0; i < replicas; ++i) engines.push_back(Open(model));
  auto c = Coordinator::Start(o, std::move(engines));
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  s.coord = std::move(c).value();
  s.client = Connect(s.coord->endpoint());
  // Replicas say hello asynchronously; an update sent before they have is answered for a world
  // without them.
  for (int i = 0; i < 1000; ++i) {
    auto st = s.client->GetStatus(kTimeoutMs);
    if (st.ok() && std::count_if(st->replicas.begin(), st->replicas.end(),
                                 [](const ReplicaInfo& r) { return r.alive; }) >= replicas) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return s;
}

// The real model's tensors as a trainer would send them (names of its llama2.c format).
struct Source {
  std::shared_ptr<const engine::ModelWeights> weights;
  std::vector<WeightTensor> tensors;
};

Source RealModel() {
  auto w = engine::LoadModelWeights(ModelsDir() + "/stories260K.bin");
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  Source s;
  s.weights = std::make_shared<const engine::ModelWeights>(std::move(*w));
  for (const engine::NamedTensor& t : engine::TensorManifest(*s.weights)) {
    s.tensors.push_back(
        {t.name, std::string(DTypeName(t.tensor.dtype)), t.tensor.shape, t.tensor.data});
  }
  return s;
}

SubmitRequest Group(uint64_t gid) {
  SubmitRequest q;
  q.group_id = gid;
  q.text_prompts = {"Once upon a time", "The little dog", "Lily saw a big", "Tom"};
  q.n = 4;
  q.seed = 99;
  q.max_tokens = 40;
  return q;
}

// Trajectories of one group, keyed by (prompt, sample); fails the test on an error.
std::vector<TrajectoryResult> RunGroup(Client& c, uint64_t gid) {
  auto r = c.Run(Group(gid), kTimeoutMs);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : std::vector<TrajectoryResult>{};
}

bool SameBits(const TrajectoryResult& a, const TrajectoryResult& b) {
  return a.ids.size() == b.ids.size() && a.logprobs.size() == b.logprobs.size() &&
         std::memcmp(a.ids.data(), b.ids.data(), 4 * a.ids.size()) == 0 &&
         std::memcmp(a.logprobs.data(), b.logprobs.data(), 4 * a.logprobs.size()) == 0;
}

// How many trajectories of `got` equal (memcmp) the reference's at the same (prompt, sample).
int Matching(const std::vector<TrajectoryResult>& got, const std::vector<TrajectoryResult>& ref) {
  int n = 0;
  for (const auto& t : got) {
    for (const auto& r : ref) {
      if (r.prompt_index == t.prompt_index && r.sample_index == t.sample_index) {
        n += SameBits(t, r) ? 1 : 0;
      }
    }
  }
  return n;
}

// The reference: a service started on the real model.
const std::vector<TrajectoryResult>& Reference() {
  static const std::vector<TrajectoryResult> ref = [] {
    Service s = Start(ModelsDir() + "/stories260K.bin", 1);
    return RunGroup(*s.client, 1);
  }();
  return ref;
}

uint64_t LiveVersion(Client& c) {
  auto st = c.GetStatus(kTimeoutMs);
  EXPECT_TRUE(st.ok());
  return st.ok() ? st->weight_version : ~0ull;
}

// One raw streamed part (tests of ordering and of abandoned streams).
Result<uint64_t> SendPart(Client& c, const WeightTensor& t, uint64_t version, uint32_t part,
                          bool more) {
  flatbuffers::FlatBufferBuilder fbb(1 << 16);
  size_t bytes = t.dtype == "f32" ? 4 : 2;
  for (int64_t d : t.shape) bytes *= static_cast<size_t>(d);
  std::vector<flatbuffers::Offset<wire::TensorFrame>> frames;
  frames.push_back(wire::CreateTensorFrame(
      fbb, fbb.CreateString(t.name), fbb.CreateString(t.dtype), fbb.CreateVector(t.shape),
      fbb.CreateVector(static_cast<const uint8_t*>(t.data), bytes), 0));
  auto m = wire::CreateUpdateWeights(fbb, 0, version, false, fbb.CreateVector(frames), more, false,
                                     0, false, part);
  static uint64_t rid = 1u << 30;
  const uint64_t id = ++rid;
  FinishEnvelope(fbb, id, wire::Message_UpdateWeights, m.Union());
  BR_RETURN_IF_ERROR(c.SendRaw(BufferView(fbb)));
  return c.WaitUpdateReply(id, kTimeoutMs);
}

TEST(WeightsStreamTest, StreamedModelGeneratesWhatTheModelGenerates) {
  const auto& ref = Reference();
  ASSERT_EQ(ref.size(), 16u);
  Source real = RealModel();
  Service s = Start(RandomModelPath(), 2);
  const auto before = RunGroup(*s.client, 1);
  EXPECT_EQ(Matching(before, ref), 0) << "negative control: the random weights";

  // 64 KiB parts: the 128 KiB embedding is sliced over parts; 1 MiB in all, ~17 parts.
  auto v = s.client->UpdateWeightsStreamed(real.tensors, 3, /*drain=*/true, /*full=*/true,
                                           kTimeoutMs, 64 << 10);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, 3u);
  auto st = s.client->GetStatus(kTimeoutMs);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->weight_version, 3u);
  ASSERT_EQ(st->replicas.size(), 2u);
  for (const auto& r : st->replicas) EXPECT_EQ(r.weight_version, 3u) << r.name;

  const auto after = RunGroup(*s.client, 2);
  ASSERT_EQ(after.size(), 16u);
  EXPECT_EQ(Matching(after, ref), 16);
  for (const auto& t : after) {
    EXPECT_EQ(t.fingerprint.weights_hash, real.weights->weights_hash);
    ASSERT_EQ(t.versions.size(), 1u);
    EXPECT_EQ(t.versions[0].second, 3u);
  }
}

TEST(WeightsStreamTest, PartialUpdatesAreReplayedToALateReplica) {
  const auto& ref = Reference();
  Source real = RealModel();
  CoordinatorOptions o;
  o.replica_bind = "tcp://127.0.0.1:*";
  o.local_replica.capacity = 2;  // the rest of each group overflows to the late replica
  Service s = Start(RandomModelPath(), 1, o);
  // Two partial updates: the first half of the tensors as version 2, the rest as version 3.
  const size_t half = real.tensors.size() / 2;
  std::span<const WeightTensor> all(real.tensors);
  ASSERT_TRUE(s.client->UpdateWeightsStreamed(all.first(half), 2, false, false, kTimeoutMs).ok());
  EXPECT_EQ(Matching(RunGroup(*s.client, 1), ref), 0) << "half the tensors is not the model";
  ASSERT_TRUE(s.client->UpdateWeightsStreamed(all.subspan(half), 3, false, false, kTimeoutMs).ok());

  // A replica process-alike joins now, on the random weights.
  std::unique_ptr<engine::Engine> late_engine = Open(RandomModelPath());
  zmq::context_t ctx(1);
  std::atomic<bool> stop{false};
  ReplicaOptions ro;
  ro.name = "late";
  ro.remote = true;
  ro.capacity = 8;
  std::thread late([&] {
    Status st = RunReplica(*late_engine, ctx, s.coord->replica_endpoint(), ro, stop);
    EXPECT_TRUE(st.ok()) << st.ToString();
  });
  bool caught_up = false;
  for (int i = 0; i < 500 && !caught_up; ++i) {
    auto st = s.client->GetStatus(kTimeoutMs);
    ASSERT_TRUE(st.ok());
    for (const auto& r : st->replicas) caught_up |= r.name == "late" && r.weight_version == 3;
    if (!caught_up) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(caught_up) << "the late replica never reported version 3";
  EXPECT_EQ(late_engine->weights()->weights_hash, real.weights->weights_hash);
  int on_late = 0;
  for (uint64_t g = 10; g < 14; ++g) {
    const auto got = RunGroup(*s.client, g);
    EXPECT_EQ(Matching(got, ref), 16) << "group " << g;
    for (const auto& t : got) on_late += t.replica == "late" ? 1 : 0;
  }
  EXPECT_GT(on_late, 0) << "no work reached the late replica";
  stop = true;
  late.join();
}

TEST(WeightsStreamTest, BadUpdatesGetTypedErrorsAndInstallNothing) {
  const auto& ref = Reference();
  Source real = RealModel();
  Service s = Start(RandomModelPath(), 2);
  const auto before = RunGroup(*s.client, 1);
  auto check_unchanged = [&](const char* what) {
    EXPECT_EQ(LiveVersion(*s.client), 0u) << what;
    const auto now = RunGroup(*s.client, 1);
    ASSERT_EQ(now.size(), before.size());
    EXPECT_EQ(Matching(now, before), 16) << what << ": the old weights still serve";
  };
  struct Case {
    const char* what;
    std::function<void(std::vector<WeightTensor>&)> edit;
    bool full;
    ErrorCode code;
    const char* message;
  };
  std::vector<float> nan(64, 0.0f);
  nan[5] = std::nanf("");
  const std::vector<Case> cases = {
      {"unknown name", [](auto& t) { t[3].name = "layers.0.attention.wz.weight"; }, false,
       ErrorCode::kNotFound, "has no tensor 'layers.0.attention.wz.weight'"},
      {"wrong shape", [](auto& t) { t.back().shape = {32}; }, false, ErrorCode::kInvalidArgument,
       "norm.weight has shape [32], the model's is [64]"},
      {"non-finite", [&](auto& t) { t.back().data = nan.data(); }, false,
       ErrorCode::kInvalidArgument, "norm.weight element 5 is not finite"},
      {"full but missing", [](auto& t) { t.erase(t.begin() + 7); }, true,
       ErrorCode::kInvalidArgument,
       "full update misses 1 tensors: layers.0.feed_forward.w1.weight"},
      {"bad dtype", [](auto& t) { t[0].dtype = "int8"; }, false, ErrorCode::kInvalidArgument,
       "unknown dtype 'int8'"},
  };
  for (const Case& c : cases) {
    std::vector<WeightTensor> t = real.tensors;
    c.edit(t);
    auto v = s.client->UpdateWeightsStreamed(t, 5, false, c.full, kTimeoutMs, 64 << 10);
    ASSERT_FALSE(v.ok()) << c.what;
    EXPECT_EQ(v.status().code(), c.code) << c.what << ": " << v.status().ToString();
    EXPECT_NE(v.status().message().find(c.message), std::string::npos)
        << c.what << ": " << v.status().message();
    check_unchanged(c.what);
  }
  // After all that, the same version streams and installs.
  ASSERT_TRUE(
      s.client->UpdateWeightsStreamed(real.tensors, 5, false, true, kTimeoutMs, 64 << 10).ok());
  EXPECT_EQ(Matching(RunGroup(*s.client, 2), ref), 16);
}

TEST(WeightsStreamTest, PartsMustContinueTheStream) {
  Source real = RealModel();
  CoordinatorOptions o;
  o.stream_timeout_ms = 300;
  Service s = Start(RandomModelPath(), 1, o);
  std::unique_ptr<Client> other = Connect(s.coord->endpoint());
  const WeightTensor& t0 = real.tensors[1];
  const WeightTensor& t1 = real.tensors[2];
  // Part 1 without part 0.
  auto r = SendPart(*s.client, t0, 4, 1, true);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("part 1 arrived, expected part 0"), std::string::npos)
      << r.status().message();
  // A stream in progress blocks other clients' updates.
  ASSERT_TRUE(SendPart(*s.client, t0, 4, 0, true).ok());
  auto busy = other->UpdateWeights(ModelsDir() + "/stories260K.bin", 9, false, kTimeoutMs);
  ASSERT_FALSE(busy.ok());
  EXPECT_EQ(busy.status().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(busy.status().message().find("from another client is in progress"), std::string::npos);
  // A part skipped.
  r = SendPart(*s.client, t1, 4, 2, true);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("part 2 arrived, expected part 1"), std::string::npos);
  // The client goes quiet past stream_timeout_ms: the stream is abandoned, its commit refused,
  // nothing installed, and other clients may update again.
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  r = SendPart(*s.client, t1, 4, 1, false);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("abandoned"), std::string::npos) << r.status().message();
  EXPECT_EQ(LiveVersion(*s.client), 0u);
  auto v = other->UpdateWeights(ModelsDir() + "/stories260K.bin", 9, false, kTimeoutMs);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(Matching(RunGroup(*s.client, 3), Reference()), 16);
}

// Issue 12 item 8: UpdateWeights{path = a FIFO}. open() of a FIFO blocks until a writer comes;
// it hung both replica threads, the coordinator declared them dead for good and acked the
// update. Now the path is refused with a typed error at once, the replicas stay alive and serve,
// and a later valid update succeeds.
TEST(WeightsStreamTest, PathThatBlocksOnOpenIsRefusedAndReplicasLive) {
  const fs::path dir =
      fs::temp_directory_path() / ("bitroll_weights_fifo_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string fifo = (dir / "weights.fifo").string();
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  CoordinatorOptions o;
  o.replica_timeout_ms = 2000;
  Service s = Start(ModelsDir() + "/stories260K.bin", 2, o);
  // Declared after the service, so it runs first: a replica thread stuck in open() (the bug) is
  // released by a writer, else the service's destructor would wait for it forever.
  struct Unblock {
    std::string path;
    fs::path dir;
    ~Unblock() {
      for (int i = 0; i < 5; ++i) {
        const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
        if (fd >= 0) ::close(fd);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } unblock{fifo, dir};

  const auto t0 = std::chrono::steady_clock::now();
  auto v = s.client->UpdateWeights(fifo, 7, false, kTimeoutMs);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(v.ok()) << "acked version " << *v << " after " << secs << " s";
  EXPECT_EQ(v.status().code(), ErrorCode::kInvalidArgument) << v.status().ToString();
  EXPECT_NE(v.status().message().find("not a regular file"), std::string::npos)
      << v.status().message();
  EXPECT_LT(secs, 5.0);
  // A character device is refused the same way (it never reaches the loader).
  v = s.client->UpdateWeights("/dev/zero", 7, false, kTimeoutMs);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), ErrorCode::kInvalidArgument) << v.status().ToString();

  // Past the replica timeout both replicas are alive and on the old weights, and serve.
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  auto st = s.client->GetStatus(kTimeoutMs);
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->replicas.size(), 2u);
  for (const auto& r : st->replicas) {
    EXPECT_TRUE(r.alive) << r.name;
    EXPECT_EQ(r.weight_version, 0u) << r.name;
  }
  EXPECT_EQ(st->weight_version, 0u);
  EXPECT_EQ(Matching(RunGroup(*s.client, 2), Reference()), 16);
  // A valid update afterwards is installed on both.
  v = s.client->UpdateWeights(RandomModelPath(), 8, false, kTimeoutMs);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, 8u);
  st = s.client->GetStatus(kTimeoutMs);
  ASSERT_TRUE(st.ok());
  for (const auto& r : st->replicas) {
    EXPECT_TRUE(r.alive) << r.name;
    EXPECT_EQ(r.weight_version, 8u) << r.name;
  }
  EXPECT_EQ(Matching(RunGroup(*s.client, 3), Reference()), 0);  // the random weights now
}

// The deadline for slow or hung filesystems: a load that takes longer than
// weights_load_timeout_ms is answered Timeout while the replicas keep heartbeating (they outlive
// replica_timeout_ms) and serving; the stuck loader finishes later and nothing is installed; a
// later update succeeds.
TEST(WeightsStreamTest, SlowPathLoadTimesOutAndReplicasLive) {
  struct Gate {
    std::mutex mu;
    std::condition_variable cv;
    bool open = false;
  };
  auto gate = std::make_shared<Gate>();
  CoordinatorOptions o;
  o.replica_timeout_ms = 1000;
  o.local_replica.weights_load_timeout_ms = 2500;
  // A filesystem that hangs for paths under "slow/" until the test opens the gate.
  o.local_replica.load_weights = [gate](const std::string& path) {
    if (path.find("/slow/") != std::string::npos) {
      std::unique_lock<std::mutex> lock(gate->mu);
      gate->cv.wait(lock, [&] { return gate->open; });
    }
    return engine::LoadModelWeights(path);
  };
  const fs::path slow =
      fs::temp_directory_path() / ("bitroll_weights_slow_" + std::to_string(::getpid())) / "slow";
  fs::create_directories(slow);
  fs::copy_file(RandomModelPath(), slow / "random.bin", fs::copy_options::overwrite_existing);
  Service s = Start(ModelsDir() + "/stories260K.bin", 2, o);
  struct OpenAtEnd {
    std::shared_ptr<Gate> g;
    fs::path dir;
    ~OpenAtEnd() {
      {
        std::lock_guard<std::mutex> lock(g->mu);
        g->open = true;
        g->cv.notify_all();
      }
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } open_at_end{gate, slow.parent_path()};

  const auto t0 = std::chrono::steady_clock::now();
  auto v = s.client->UpdateWeights((slow / "random.bin").string(), 7, false, kTimeoutMs);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(v.ok()) << "acked version " << *v;
  EXPECT_EQ(v.status().code(), ErrorCode::kTimeout) << v.status().ToString();
  EXPECT_NE(v.status().message().find("weights_load_timeout_ms"), std::string::npos);
  EXPECT_GE(secs, 2.4);
  EXPECT_LT(secs, 10.0);
  auto st = s.client->GetStatus(kTimeoutMs);
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->replicas.size(), 2u);
  for (const auto& r : st->replicas) {
    EXPECT_TRUE(r.alive) << r.name << " missed heartbeats during the load";
    EXPECT_EQ(r.weight_version, 0u);
  }
  EXPECT_EQ(st->weight_version, 0u);
  // The stuck loaders finish now; what they loaded is dropped.
  {
    std::lock_guard<std::mutex> lock(gate->mu);
    gate->open = true;
    gate->cv.notify_all();
  }
  EXPECT_EQ(Matching(RunGroup(*s.client, 2), Reference()), 16);
  EXPECT_EQ(LiveVersion(*s.client), 0u);
  v = s.client->UpdateWeights(RandomModelPath(), 8, false, kTimeoutMs);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, 8u);
  EXPECT_EQ(Matching(RunGroup(*s.client, 3), Reference()), 0);
}

// drain = true: the parts are staged while the running group keeps decoding on the old weights;
// the commit waits until nothing is in flight, so every token of that group is version 0 and
// every token of the next group version 3. (With drain = false the first check fails: later
// tokens of the running group carry version 3; checked by hand.)
TEST(WeightsStreamTest, DrainedCommitWaitsForInFlightWork) {
  Source real = RealModel();
  Service s = Start(RandomModelPath(), 1);
  std::unique_ptr<Client> trainer = Connect(s.coord->endpoint());
  SubmitRequest q = Group(1);
  q.n = 16;  // 64 samples x 440 tokens: decoding lasts well beyond the update's transfer
  q.max_tokens = 440;
  q.stop_at_eos = false;
  q.stream_tokens = true;
  ASSERT_TRUE(s.client->Submit(q).ok());
  while (true) {  // the group is decoding
    auto e = s.client->Next(kTimeoutMs);
    ASSERT_TRUE(e.ok());
    if (e->kind == Event::Kind::kTokenChunk) break;
  }
  auto v =
      trainer->UpdateWeightsStreamed(real.tensors, 3, /*drain=*/true, true, kTimeoutMs, 64 << 10);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  int old = 0;
  while (true) {  // already finished by the time the update returned
    auto e = s.client->Next(1000);
    ASSERT_TRUE(e.ok()) << "the group had not finished before the drained commit";
    if (e->kind == Event::Kind::kGroupDone) break;
    if (e->kind != Event::Kind::kTrajectory) continue;
    ASSERT_EQ(e->trajectory.versions.size(), 1u);
    EXPECT_EQ(e->trajectory.versions[0].second, 0u);
    ++old;
  }
  EXPECT_EQ(old, 64);
  for (const auto& t : RunGroup(*s.client, 2)) {
    ASSERT_EQ(t.versions.size(), 1u);
    EXPECT_EQ(t.versions[0].second, 3u);
  }
}

// `bitroll update-weights`: the command-line way to stream a model file (or name a path).
TEST(WeightsStreamTest, CommandLineStreamsAModelFile) {
  Service s = Start(RandomModelPath(), 2);
  const std::string cli =
      std::string(BITROLL_EXE) + " update-weights --connect " + s.coord->endpoint() + " --version ";
  // A model of another shape: a typed error, exit status 1, nothing installed.
  const std::string other = ModelsDir() + "/llama-2-tiny-random.gguf";
  int rc = std::system((cli + "4 --stream " + other + " 2>/dev/null >/dev/null").c_str());
  ASSERT_TRUE(WIFEXITED(rc));
  EXPECT_EQ(WEXITSTATUS(rc), 1);
  EXPECT_EQ(LiveVersion(*s.client), 0u);
  rc = std::system((cli + "4 --stream " + ModelsDir() + "/stories260K.bin --full --part-kib 64" +
                    " >/dev/null 2>&1")
                       .c_str());
  ASSERT_TRUE(WIFEXITED(rc));
  EXPECT_EQ(WEXITSTATUS(rc), 0);
  EXPECT_EQ(LiveVersion(*s.client), 4u);
  EXPECT_EQ(Matching(RunGroup(*s.client, 1), Reference()), 16);
  rc = std::system((cli + "5 --path " + RandomModelPath() + " >/dev/null 2>&1").c_str());
  ASSERT_TRUE(WIFEXITED(rc));
  EXPECT_EQ(WEXITSTATUS(rc), 0);
  EXPECT_EQ(Matching(RunGroup(*s.client, 2), Reference()), 0) << "back on the random weights";
  rc = std::system(
      (std::string(BITROLL_EXE) + " update-weights --version 1 >/dev/null 2>&1").c_str());
  EXPECT_EQ(WEXITSTATUS(rc), 2) << "usage error";
}

TEST(WeightsStreamTest, NcclSourceChecksRunWithoutAGpu) {
  Source real = RealModel();
  Service s = Start(RandomModelPath(), 2);
  std::array<uint8_t, 128> id{};
  // The world must be the trainer plus every live replica.
  auto rid = s.client->BeginUpdateWeightsNccl(id, 2, real.tensors, 6, false);
  ASSERT_TRUE(rid.ok());
  auto v = s.client->WaitUpdateReply(*rid, kTimeoutMs);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(v.status().message().find("world_size is 2 but 2 replicas are live"), std::string::npos)
      << v.status().message();
  // A manifest the model cannot take is refused by every replica before any NCCL call.
  std::vector<WeightTensor> bad = real.tensors;
  bad[2].shape = {64, 65};
  rid = s.client->BeginUpdateWeightsNccl(id, 3, bad, 6, false);
  ASSERT_TRUE(rid.ok());
  v = s.client->WaitUpdateReply(*rid, kTimeoutMs);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), ErrorCode::kInvalidArgument) << v.status().ToString();
  EXPECT_NE(v.status().message().find("has shape [64, 65]"), std::string::npos)
      << v.status().message();
  // A good manifest on a machine without a GPU (or a build without NCCL): a typed refusal.
  if (engine::CheckDevice("cuda").ok()) {
    std::fprintf(stderr, "*** a GPU is present: the no-GPU refusal case is not run ***\n");
  } else {
    rid = s.client->BeginUpdateWeightsNccl(id, 3, real.tensors, 6, false);
    ASSERT_TRUE(rid.ok());
    v = s.client->WaitUpdateReply(*rid, kTimeoutMs);
    ASSERT_FALSE(v.ok());
    EXPECT_TRUE(v.status().code() == ErrorCode::kUnavailable ||
                v.status().code() == ErrorCode::kUnsupported)
        << v.status().ToString();
  }
  EXPECT_EQ(LiveVersion(*s.client), 0u);
}

}  // namespace
}  // namespace bitroll::rollout
