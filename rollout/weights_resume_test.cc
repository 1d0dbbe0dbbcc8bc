// Weights and the WAL across kill -9: `bitroll serve --data-dir` serving random weights of
// stories260K's shape gets stories260K as version 5 (from its path, or streamed from the client),
// starts a sampled batch and is killed mid-generation. After the restart:
//   - a path update is re-applied from <data dir>/weights.json before any work: the batch
//     finishes bit-identical (ids and logprob bits) to stories260K run directly, every token
//     labelled version 5;
//   - streamed weights cannot be reloaded: the recovered trajectories wait (Status
//     waiting_for_weights) instead of continuing on the random weights, and finish bit-identical
//     once the client streams version 5 again.
// Negative control: the same batch on the random weights differs in every trajectory (so a
// resume on the weights the replicas start with would be caught). Disabling the restore and the
// wait (Journal::RestoreLiveWeights, WeightsGate::Admit) makes both kill tests fail (checked by
// hand before they moved out of coordinator_weights.cc).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/make_model.h"
#include "engine/model_loader.h"
#include "engine/weight_update.h"
#include "rollout/client.h"
#include "rollout/service_test_util.h"

namespace bitroll::rollout {
namespace {

namespace fs = std::filesystem;
constexpr int kTimeoutMs = 60000;

std::string RealModel() {
  return std::string(BITROLL_MODELS_DIR) + "/stories260K.bin";
}

SubmitRequest Batch() {
  SubmitRequest q;
  q.group_id = 77;
  for (int p = 0; p < 4; ++p) q.prompts.push_back({1, 300 + p * 17, 40 + p});
  q.n = 4;
  q.seed = 2024;
  q.max_tokens = 200;
  q.stop_at_eos = false;
  q.stream_tokens = true;
  return q;
}

std::map<SampleKey, SampleOutput> Reference() {
  engine::EngineOptions o;
  o.model_path = RealModel();
  auto e = engine::OpenEngine(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return RunDirect(**e, Batch());
}

struct Fixture {
  fs::path dir;
  std::string model, data, ep;
  Fixture() {
    dir = fs::path(BITROLL_BINARY_DIR) / ("weights_resume_" + std::to_string(getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    model = (dir / "random.bin").string();
    auto shape = engine::NamedShape("stories260k");
    EXPECT_TRUE(shape.ok());
    EXPECT_TRUE(engine::WriteRandomModel(*shape, 1, model, (dir / "tokenizer.bin").string()).ok());
    data = (dir / "data").string();
    ep = FreeLoopbackEndpoint();
  }
  ~Fixture() { fs::remove_all(dir); }

  pid_t Serve() const {
    return SpawnQuiet({BITROLL_EXE, "serve", "--data-dir", data, "--model", model, "--replicas",
                       "2", "--bind", ep, "--log-level", "warn"});
  }
};

std::unique_ptr<Client> ConnectTo(const std::string& ep) {
  ClientOptions co;
  co.client_id = "trainer";  // re-attaching needs the same owner
  co.endpoint = ep;
  auto c = Client::Connect(co);
  EXPECT_TRUE(c.ok());
  return c.ok() ? std::move(c).value() : nullptr;
}

std::vector<WeightTensor> RealTensors(std::shared_ptr<const engine::ModelWeights>* keep) {
  auto w = engine::LoadModelWeights(RealModel());
  EXPECT_TRUE(w.ok());
  *keep = std::make_shared<const engine::ModelWeights>(std::move(*w));
  std::vector<WeightTensor> out;
  for (const auto& t : engine::TensorManifest(**keep)) {
    out.push_back({t.name, std::string(DTypeName(t.tensor.dtype)), t.tensor.shape, t.tensor.data});
  }
  return out;
}

// Submits the batch and kills the server after `progress` streamed tokens, once some of them
// are durable: the WAL has logged tokens and committed twice since (a commit that began after
// they were appended has ended). Streamed tokens are not held for durability, so on a loaded
// machine the kill could otherwise land before the first commit and interrupt nothing. The
// client reads behind the server, so some trajectories may have finished (and been logged
// finished) before the kill; the checks after the restart allow for them.
void RunUntilKill(pid_t pid, Client& c, int64_t progress, const std::string& ep) {
  ASSERT_TRUE(c.Submit(Batch()).ok());
  int64_t seen = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  auto drain = [&](int timeout_ms) {
    auto e = c.Next(timeout_ms);
    if (e.ok() && e->kind == Event::Kind::kTokenChunk) {
      seen += static_cast<int64_t>(e->chunk.ids.size());
    }
  };
  while (seen < progress && std::chrono::steady_clock::now() < deadline) drain(100);
  ASSERT_GE(seen, progress);
  uint64_t bytes = 0;
  int commits = -1;  // -1: no logged token seen yet
  while (commits < 2 && std::chrono::steady_clock::now() < deadline) {
    const WalStatus ws = QueryWal(ep);
    if (commits < 0 && ws.logged > 0) {
      commits = 0;
      bytes = ws.bytes;
    } else if (commits >= 0 && ws.bytes > bytes) {
      ++commits;
      bytes = ws.bytes;
    }
    drain(0);
  }
  ASSERT_EQ(commits, 2) << "the WAL committed nothing within the deadline";
  kill(pid, SIGKILL);
  int st = 0;
  waitpid(pid, &st, 0);
}

// Adds the batch's trajectories to *got, with every version span's version, until its GroupDone
// or, with `quiet_ms` > 0, until no event came for quiet_ms.
void Collect(Client& c, std::map<SampleKey, SampleOutput>* got, std::vector<uint64_t>* versions,
             int quiet_ms = 0) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    auto e = c.Next(quiet_ms > 0 ? quiet_ms : 100);
    if (!e.ok()) {
      if (quiet_ms > 0) return;
      continue;
    }
    if (e->kind == Event::Kind::kTrajectory) {
      const auto& t = e->trajectory;
      EXPECT_TRUE(t.error.ok()) << t.error.ToString();
      (*got)[{t.prompt_index, t.sample_index}] = {t.ids, t.logprobs};
      for (const auto& v : t.versions) versions->push_back(v.second);
    } else if (e->kind == Event::Kind::kGroupDone) {
      return;
    }
  }
}

size_t Differences(const std::map<SampleKey, SampleOutput>& got,
                   const std::map<SampleKey, SampleOutput>& want) {
  size_t bad = got.size() == want.size() ? 0 : 1;
  for (const auto& [k, v] : want) {
    auto it = got.find(k);
    bad += it == got.end() || !(it->second == v) ? 1 : 0;
  }
  return bad;
}

// Collects the re-attached batch (after `early`, those already delivered) and checks it: the WAL
// resumed logged tokens (the kill interrupted work), re-scored them to the same bits, and every
// trajectory equals the reference with every token labelled version 5. Then stops the server.
void ExpectResumedAsReference(const Fixture& f, pid_t pid, Client& c,
                              const std::map<SampleKey, SampleOutput>& want,
                              std::map<SampleKey, SampleOutput> got = {},
                              std::vector<uint64_t> versions = {}) {
  Collect(c, &got, &versions);
  const WalStatus ws = QueryWal(f.ep);
  EXPECT_GT(ws.recovered, 0u) << "the kill interrupted nothing";
  EXPECT_EQ(ws.mismatches, 0u);
  EXPECT_EQ(Differences(got, want), 0u);
  for (uint64_t v : versions) EXPECT_EQ(v, 5u);
  kill(pid, SIGTERM);
  waitpid(pid, nullptr, 0);
}

TEST(WeightsResumeTest, PathUpdateIsReappliedAfterKill9) {
  const auto want = Reference();
  ASSERT_EQ(want.size(), 16u);
  Fixture f;
  pid_t pid = f.Serve();
  ASSERT_GT(pid, 0);
  {
    auto c = ConnectTo(f.ep);
    auto v = c->UpdateWeights(RealModel(), 5, false, kTimeoutMs);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    RunUntilKill(pid, *c, 600, f.ep);
  }
  pid = f.Serve();
  auto c = ConnectTo(f.ep);
  auto st = c->GetStatus(kTimeoutMs);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->weight_version, 5u) << "the path update was not restored";
  ASSERT_TRUE(c->Submit(Batch()).ok());  // re-attach
  ExpectResumedAsReference(f, pid, *c, want);
}

TEST(WeightsResumeTest, StreamedWeightsWaitForTheTrainerAfterKill9) {
  const auto want = Reference();
  std::shared_ptr<const engine::ModelWeights> keep;
  const std::vector<WeightTensor> tensors = RealTensors(&keep);
  Fixture f;
  pid_t pid = f.Serve();
  ASSERT_GT(pid, 0);
  {
    auto c = ConnectTo(f.ep);
    ASSERT_TRUE(c->UpdateWeightsStreamed(tensors, 5, false, true, kTimeoutMs).ok());
    RunUntilKill(pid, *c, 600, f.ep);
  }
  pid = f.Serve();
  auto c = ConnectTo(f.ep);
  ASSERT_TRUE(c->Submit(Batch()).ok());  // re-attach
  // Nothing runs on the random weights: the recovered unfinished trajectories wait for version 5.
  // Those logged finished before the kill come back from the WAL as they were, before the
  // StatusReply (the coordinator answers one client's messages in order).
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  auto st = c->GetStatus(kTimeoutMs);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->weight_version, 0u);
  EXPECT_EQ(st->inflight, 0u);
  std::map<SampleKey, SampleOutput> early;
  std::vector<uint64_t> versions;
  Collect(*c, &early, &versions, 300);
  EXPECT_GT(st->waiting_for_weights, 0u) << "the kill interrupted nothing";
  EXPECT_EQ(st->waiting_for_weights + early.size(), want.size())
      << early.size() << " delivered before the update";
  // One run on the random weights would differ (RandomWeightsGiveOtherTrajectories).
  for (const auto& [k, v] : early) {
    auto it = want.find(k);
    EXPECT_TRUE(it != want.end() && it->second == v) << "finished on the wrong weights";
  }
  // The trainer sends version 5 again: the batch resumes and finishes as if never interrupted.
  ASSERT_TRUE(c->UpdateWeightsStreamed(tensors, 5, false, true, kTimeoutMs).ok());
  ExpectResumedAsReference(f, pid, *c, want, std::move(early), std::move(versions));
}

// Negative control: the same batch finished on the served random weights differs everywhere.
TEST(WeightsResumeTest, RandomWeightsGiveOtherTrajectories) {
  Fixture f;
  engine::EngineOptions o;
  o.model_path = f.model;
  auto e = engine::OpenEngine(o);
  ASSERT_TRUE(e.ok());
  const auto random = RunDirect(**e, Batch());
  const auto want = Reference();
  EXPECT_EQ(Differences(random, want), want.size());
}

}  // namespace
}  // namespace bitroll::rollout
