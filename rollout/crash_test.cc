// Crash harness: a `bitroll serve --data-dir` CHILD process is killed with SIGKILL at random points
// (20 times) while a 64-trajectory x 200-token sampled batch runs; each time it restarts on the
// same data directory, the client re-attaches by re-submitting the same group id, and in the end
// every trajectory must be bit-identical (ids + logprob bits, memcmp) to an uninterrupted reference
// computed directly from an engine (no coordinator, no WAL). It runs twice: on the real engine
// (the trained stories260K model; kills land after a random amount of streamed progress, since a
// batch takes well under a second) and on the NullEngine test double (kills at random times).
// A negative control shows the comparison detects a perturbed seed.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "rollout/client.h"
#include "rollout/null_engine.h"
#include "rollout/protocol.h"
#include "rollout/service_test_util.h"

#ifdef BITROLL_HAVE_ENGINE
#include "engine/engine.h"
#include "engine/make_model_hf.h"
#endif

namespace bitroll::rollout {
namespace {

using Key = SampleKey;
using Traj = SampleOutput;

// long_run: 64 trajectories of 480 tokens that do not stop at EOS (30,720 tokens), so that 20
// kills after 100-500 tokens of streamed progress each land before the batch ends even when the
// engine runs well ahead of what the client has read by the time it decides to kill.
SubmitRequest Batch(uint64_t seed, bool long_run = false) {
  SubmitRequest r;
  r.group_id = 77;
  for (int p = 0; p < 8; ++p) r.prompts.push_back({1, 10 + p, 20 + p, 30});
  r.n = 8;
  r.temperature = 0.8f;
  r.seed = seed;
  r.max_tokens = long_run ? 480 : 200;
  r.stop_at_eos = !long_run;
  r.stream_tokens = true;  // the real-engine harness kills after streamed progress
  return r;
}

// Which engine the serve children run. `real` is the trained stories260K model.
struct EngineKind {
  bool real = false;
  std::string model{};  // real: a model path other than stories260K.bin (the MoE case)
  std::vector<std::string> serve_extra{};  // real: more serve flags (e.g. --swa-cache)
  std::string Model() const {
    return model.empty() ? std::string(BITROLL_MODELS_DIR) + "/stories260K.bin" : model;
  }
  std::vector<std::string> ServeArgs() const {
    if (!real) return {"--engine", "null", "--null-delay-us", "20000"};
    std::vector<std::string> a = {"--model", Model(), "--threads", "1"};
    a.insert(a.end(), serve_extra.begin(), serve_extra.end());
    return a;
  }
};

// The uninterrupted run: the engine driven directly (no coordinator, no WAL).
std::map<Key, Traj> Reference(const SubmitRequest& r, EngineKind kind = {}) {
  if (!kind.real) {
    NullEngine e(NullEngineOptions{});
    return RunDirect(e, r);
  }
#ifdef BITROLL_HAVE_ENGINE
  engine::EngineOptions o;
  o.model_path = kind.Model();
  auto e = engine::OpenEngine(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  if (!e.ok()) return {};
  return RunDirect(**e, r);
#else
  ADD_FAILURE() << "this build has no model engine";
  return {};
#endif
}

size_t CountDifferent(const std::map<Key, Traj>& got, const std::map<Key, Traj>& want) {
  size_t bad = 0;
  for (const auto& [k, t] : want) {
    auto it = got.find(k);
    if (it == got.end() || !(it->second == t)) ++bad;
  }
  return bad + (got.size() > want.size() ? got.size() - want.size() : 0);
}

pid_t StartServe(const std::string& dir, const std::string& ep, const std::string& durability,
                 EngineKind kind) {
  std::vector<std::string> args = {BITROLL_EXE,    "serve",    "--data-dir", dir,
                                   "--durability", durability, "--bind",     ep,
                                   "--log-level",  "warn",     "--replicas", "2"};
  for (auto& a : kind.ServeArgs()) args.push_back(a);
  return SpawnQuiet(std::move(args));
}

// Runs the batch against serve children, killing each one `kills` times; the last child runs to
// completion. The NullEngine child is killed after a random 60-200 ms; the real engine is so fast
// that it is killed after a random 100-500 generated tokens of new progress (streamed chunks past
// the furthest position seen so far). Returns what the client collected.
struct CrashStats {
  int64_t wal_bytes = 0;
  int kills = 0;
  uint64_t recovered = 0;  // logged tokens found unfinished on restarts
};
std::map<Key, Traj> RunWithKills(const SubmitRequest& req, int kills, const std::string& dur,
                                 EngineKind kind, CrashStats* stats) {
  const std::string dir = std::string(BITROLL_BINARY_DIR) + "/crash_test_data_" +
                          std::to_string(getpid()) + "_" + dur + (kind.real ? "_real" : "_null");
  std::filesystem::remove_all(dir);
  const std::string ep = FreeLoopbackEndpoint();
  std::mt19937 rng(1234);
  std::map<Key, Traj> got;
  std::map<Key, int32_t> furthest;  // streamed progress per trajectory
  bool done = false;
  for (int round = 0; round <= kills && !done; ++round) {
    pid_t pid = StartServe(dir, ep, dur, kind);
    EXPECT_GT(pid, 0);
    ClientOptions co;
    co.client_id = "trainer";  // re-attaching needs the same owner
    co.endpoint = ep;
    auto c = Client::Connect(co);
    EXPECT_TRUE(c.ok());
    EXPECT_TRUE((*c)->Submit(req).ok());  // fresh, or a re-attach to the recovered group
    const bool last = round == kills;
    const auto start = std::chrono::steady_clock::now();
    const auto deadline =
        start +
        std::chrono::milliseconds(last || kind.real ? 60000 : 60 + static_cast<int>(rng() % 140));
    const int64_t progress_goal = 100 + static_cast<int64_t>(rng() % 400);
    int64_t progress = 0;
    // Trajectory (prompt, sample) has been seen up to token index `end`: count what is new.
    auto advance = [&](const Key& key, int32_t end) {
      int32_t& f = furthest[key];
      if (end > f) {
        progress += end - f;
        f = end;
      }
    };
    while (std::chrono::steady_clock::now() < deadline) {
      if (kind.real && !last && progress >= progress_goal) break;
      auto ev = (*c)->Next(5);
      if (!ev.ok()) continue;
      if (ev->kind == Event::Kind::kTrajectory) {
        const auto& t = ev->trajectory;
        EXPECT_TRUE(t.error.ok()) << t.error.ToString();
        stats->wal_bytes += t.cost.wal_bytes;
        got[{t.prompt_index, t.sample_index}] = {t.ids, t.logprobs, t.routing};
        // Its tokens count as progress too: a fast engine finishes trajectories whose last
        // tokens were never streamed as chunks, and the kills must still come before the end.
        advance({t.prompt_index, t.sample_index}, static_cast<int32_t>(t.ids.size()));
      } else if (ev->kind == Event::Kind::kTokenChunk) {
        const auto& ch = ev->chunk;
        advance({ch.prompt_index, ch.sample_index},
                ch.position_begin + static_cast<int32_t>(ch.ids.size()));
      } else if (ev->kind == Event::Kind::kGroupDone) {
        done = true;
        break;
      } else if (ev->kind == Event::Kind::kError) {
        ADD_FAILURE() << ev->error.ToString();
      }
    }
    c->reset();
    if (!done) {
      // Zero regeneration of logged work: every logged token of every recovered trajectory is
      // re-dispatched as forced (and re-scored to the same bits). On a loaded machine the kill
      // may come before the child has re-dispatched what it recovered; the kill then waits for
      // the re-dispatch (at most 10 s), so the check covers every recovered token.
      WalStatus ws = QueryWal(ep);
      for (const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
           ws.replied && ws.forced < ws.recovered && std::chrono::steady_clock::now() < until;
           ws = QueryWal(ep)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      EXPECT_TRUE(ws.ok);
      EXPECT_EQ(ws.forced, ws.recovered) << "round " << round;
      EXPECT_EQ(ws.mismatches, 0u);
      stats->recovered += ws.recovered;
      ++stats->kills;
    }
    kill(pid, done ? SIGTERM : SIGKILL);
    int st = 0;
    waitpid(pid, &st, 0);
  }
  EXPECT_TRUE(done) << "the batch never finished";
  std::filesystem::remove_all(dir);
  return got;
}

// 20 kill -9s with fsync per commit: bit-identical, and nothing logged is regenerated.
void KillTwentyTimes(EngineKind kind) {
  const SubmitRequest req = Batch(42, kind.real);
  const auto want = Reference(req, kind);
  ASSERT_EQ(want.size(), 64u);
  CrashStats st;
  const auto got = RunWithKills(req, 20, "sync", kind, &st);
  EXPECT_GT(st.recovered, 0u) << "no restart resumed any logged token";
  std::printf("crash test (%s engine): %d kills, %llu logged tokens resumed as forced\n",
              kind.real ? "real" : "null", st.kills, static_cast<unsigned long long>(st.recovered));
  EXPECT_EQ(st.kills, 20) << "the batch finished before every kill happened";
  EXPECT_EQ(got.size(), 64u);
  EXPECT_EQ(CountDifferent(got, want), 0u);
  EXPECT_GT(st.wal_bytes, 0) << "cost.wal_bytes must be reported";
  // Negative control: the same comparison against a perturbed seed must fail.
  const auto other = Reference(Batch(43, kind.real), kind);
  EXPECT_GT(CountDifferent(got, other), 32u);
}

TEST(CrashTest, RealEngineKillNineTwentyTimesIsBitIdentical) {
  KillTwentyTimes(EngineKind{true});
}

TEST(CrashTest, RealEngineWindowDurabilityIsBitIdentical) {
  const EngineKind kind{true};
  const SubmitRequest req = Batch(7);
  const auto want = Reference(req, kind);
  CrashStats st;
  const auto got = RunWithKills(req, 5, "window", kind, &st);
  EXPECT_EQ(st.kills, 5);
  EXPECT_EQ(CountDifferent(got, want), 0u);
}

#ifdef BITROLL_HAVE_ENGINE
// A mixture-of-experts model (make-model's qwen3-moe-tiny) with routing records: 5 kill -9s, and
// every trajectory's ids, logprobs and routing record (ids and weight bits) equal the
// uninterrupted engine run's. Resumed trajectories re-prefill their logged tokens, finished ones
// come back from the WAL's Finished record. Negative control: the routes of another seed differ.
TEST(CrashTest, MoeRoutingRecordsSurviveKillNine) {
  const std::string dir =
      std::string(BITROLL_BINARY_DIR) + "/crash_test_moe_" + std::to_string(getpid());
  auto shape = engine::NamedHfShape("qwen3-moe-tiny");
  ASSERT_TRUE(shape.ok());
  ASSERT_TRUE(engine::WriteRandomHfModel(*shape, 7, dir).ok());
  EngineKind kind{true, dir};
  SubmitRequest req = Batch(42, true);
  req.return_routing = true;
  const auto want = Reference(req, kind);
  ASSERT_EQ(want.size(), 64u);
  for (const auto& [k, t] : want) {
    ASSERT_EQ(t.routing.positions(), int64_t(4 + t.ids.size() - 1)) << "no routing reference";
  }
  CrashStats st;
  const auto got = RunWithKills(req, 5, "sync", kind, &st);
  EXPECT_EQ(st.kills, 5);
  EXPECT_GT(st.recovered, 0u);
  ASSERT_EQ(got.size(), 64u);
  EXPECT_EQ(CountDifferent(got, want), 0u);
  size_t routed = 0;
  for (const auto& [k, t] : got) routed += t.routing.empty() ? 0 : 1;
  EXPECT_EQ(routed, 64u);
  // Negative control: equal tokens with other routes are caught by the same comparison.
  auto other = want;
  other.begin()->second.routing.weights[3] += 1.0f;
  EXPECT_EQ(CountDifferent(got, other), 1u);
  std::filesystem::remove_all(dir);
}

// A hybrid sliding-window model (make-model's swa-5to1-tiny, W = 8) served with the recompute
// SWA cache policy: prompts share 48 tokens (three full blocks), so group siblings and resumed
// trajectories hit cached blocks whose sliding state is rebuilt. 5 kill -9s, and every
// trajectory equals the uninterrupted run of an engine with the default (full store) policy.
TEST(CrashTest, HybridModelWithSwaRecomputeSurvivesKillNine) {
  const std::string dir =
      std::string(BITROLL_BINARY_DIR) + "/crash_test_swa_" + std::to_string(getpid());
  auto shape = engine::NamedHfShape("swa-5to1-tiny");
  ASSERT_TRUE(shape.ok());
  ASSERT_TRUE(engine::WriteRandomHfModel(*shape, 5, dir).ok());
  EngineKind kind{true, dir, {"--swa-cache", "recompute"}};
  SubmitRequest req = Batch(43, true);
  std::vector<int32_t> shared = {1};
  for (int i = 1; i < 48; ++i) shared.push_back(3 + (i * 37) % 500);
  for (size_t p = 0; p < req.prompts.size(); ++p) {
    std::vector<int32_t> prompt = shared;
    prompt.insert(prompt.end(), req.prompts[p].begin() + 1, req.prompts[p].end());
    req.prompts[p] = prompt;
  }
  const auto want = Reference(req, EngineKind{true, dir});
  ASSERT_EQ(want.size(), 64u);
  CrashStats st;
  const auto got = RunWithKills(req, 5, "sync", kind, &st);
  EXPECT_EQ(st.kills, 5);
  EXPECT_GT(st.recovered, 0u);
  EXPECT_EQ(CountDifferent(got, want), 0u);
  // Negative control: another seed's trajectories differ under the same comparison.
  req.seed = 44;
  EXPECT_GT(CountDifferent(got, Reference(req, EngineKind{true, dir})), 0u);
  std::filesystem::remove_all(dir);
}
#endif

TEST(CrashTest, NullEngineKillNineTwentyTimesIsBitIdentical) {
  KillTwentyTimes(EngineKind{false});
}

TEST(CrashTest, NullEngineWindowDurabilityIsBitIdentical) {
  const SubmitRequest req = Batch(7);
  const auto want = Reference(req);
  CrashStats st;
  const auto got = RunWithKills(req, 5, "window", EngineKind{false}, &st);
  EXPECT_EQ(st.kills, 5);
  EXPECT_EQ(CountDifferent(got, want), 0u);
}

}  // namespace
}  // namespace bitroll::rollout

namespace bitroll::rollout {
namespace {

// Replica failover: a `bitroll replica` process is killed mid-batch; its trajectories move to
// another one, which resumes them from the WAL (forced = logged tokens). The NullEngine replica is
// killed after 400 ms; the real one after 300 tokens of streamed progress. Replica 0 takes the
// whole group alone and replica 1 starts at the kill: with both live from the start, a loaded
// machine let the client read so far behind the replicas that replica 0 had finished its share
// before the kill (nothing to resume), or had not logged a token of it yet (nothing to force).
void ReplicaFailover(EngineKind kind) {
  const SubmitRequest req = Batch(99);
  const auto want = Reference(req, kind);
  const std::string dir = std::string(BITROLL_BINARY_DIR) + "/crash_test_failover_" +
                          std::to_string(getpid()) + (kind.real ? "_real" : "_null");
  std::filesystem::remove_all(dir);
  const std::string ep = FreeLoopbackEndpoint();
  const std::string rep_ep = FreeLoopbackEndpoint();
  pid_t serve = SpawnQuiet({BITROLL_EXE, "serve", "--engine", "null", "--data-dir", dir, "--bind",
                            ep, "--replica-bind", rep_ep, "--replicas", "0", "--replica-timeout-ms",
                            "1000", "--log-level", "warn"});
  ASSERT_GT(serve, 0);
  auto spawn_replica = [&](int i) {
    std::vector<std::string> args = {BITROLL_EXE,   "replica", "--connect",
                                     rep_ep,        "--name",  "r" + std::to_string(i),
                                     "--log-level", "warn"};
    for (auto& a : kind.ServeArgs()) args.push_back(a);
    return SpawnQuiet(args);
  };
  std::vector<pid_t> reps = {spawn_replica(0)};
  // Replica 0 joined before the group goes in (a fixed sleep is too short on a loaded machine).
  for (const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
       QueryWal(ep, 500).live_replicas < 1 && std::chrono::steady_clock::now() < until;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ClientOptions co;
  co.client_id = "trainer";  // re-attaching needs the same owner
  co.endpoint = ep;
  auto c = Client::Connect(co);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->Submit(req).ok());
  std::map<Key, Traj> got;
  bool done = false, killed = false;
  int64_t progress = 0;
  const auto start = std::chrono::steady_clock::now();
  while (!done && std::chrono::steady_clock::now() - start < std::chrono::seconds(60)) {
    // Late enough that some of replica 0's work is logged, early enough that most of it is not
    // done (64 trajectories of up to 200 tokens, all of them on replica 0).
    const bool due =
        kind.real ? progress >= 300
                  : std::chrono::steady_clock::now() - start > std::chrono::milliseconds(400);
    if (!killed && due) {
      kill(reps[0], SIGKILL);
      killed = true;
      reps.push_back(spawn_replica(1));
    }
    auto ev = (*c)->Next(5);
    if (!ev.ok()) continue;
    if (ev->kind == Event::Kind::kTrajectory) {
      got[{ev->trajectory.prompt_index, ev->trajectory.sample_index}] = {ev->trajectory.ids,
                                                                         ev->trajectory.logprobs};
    } else if (ev->kind == Event::Kind::kTokenChunk) {
      progress += static_cast<int64_t>(ev->chunk.ids.size());
    } else if (ev->kind == Event::Kind::kGroupDone) {
      done = true;
    }
  }
  const WalStatus ws = QueryWal(ep);
  // Every child ends, whether the kill happened or not (a test that fails must not hang).
  reps.push_back(serve);
  for (pid_t p : reps) kill(p, SIGTERM);
  for (pid_t p : reps) waitpid(p, nullptr, 0);
  std::filesystem::remove_all(dir);
  EXPECT_TRUE(done);
  EXPECT_TRUE(killed);
  EXPECT_EQ(CountDifferent(got, want), 0u);
  EXPECT_GT(ws.resumed, 0u) << "the dead replica's trajectories were not resumed";
  EXPECT_GT(ws.forced, 0u) << "failover regenerated instead of forcing the logged tokens";
  EXPECT_EQ(ws.mismatches, 0u);
}

TEST(CrashTest, NullReplicaKilledMidBatchResumesFromWal) {
  ReplicaFailover(EngineKind{false});
}

TEST(CrashTest, RealReplicaKilledMidBatchResumesFromWal) {
  ReplicaFailover(EngineKind{true});
}

}  // namespace
}  // namespace bitroll::rollout
