// Crash harness: a `bitroll serve --data-dir` CHILD process is killed with SIGKILL at random points
// (20 times) while a 64-trajectory sampled batch runs; each time it restarts on the same data
// directory, the client re-attaches by re-submitting the same group id, and in the end every
// trajectory must be bit-identical (ids + logprob bits, memcmp) to an uninterrupted reference
// computed directly from the NullEngine. A negative control shows the comparison detects a
// perturbed seed.
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

extern char** environ;

namespace bitroll::rollout {
namespace {

using Key = std::pair<uint32_t, uint32_t>;
struct Traj {
  std::vector<int32_t> ids;
  std::vector<float> lps;
};

SubmitRequest Batch(uint64_t seed) {
  SubmitRequest r;
  r.group_id = 77;
  for (int p = 0; p < 8; ++p) r.prompts.push_back({1, 10 + p, 20 + p, 30});
  r.n = 8;
  r.temperature = 0.8f;
  r.seed = seed;
  r.max_tokens = 200;
  return r;
}

// The uninterrupted run: the NullEngine driven directly (no coordinator, no WAL).
std::map<Key, Traj> Reference(const SubmitRequest& r) {
  NullEngineOptions o;
  NullEngine e(o);
  uint64_t id = 1;
  std::map<uint64_t, Key> keys;
  for (uint32_t p = 0; p < r.prompts.size(); ++p) {
    for (uint32_t j = 0; j < r.n; ++j) {
      engine::SequenceRequest q;
      q.id = id;
      q.prompt = r.prompts[p];
      q.sample_index = j;
      q.sampling.temperature = r.temperature;
      q.sampling.seed = r.seed;
      q.stop.max_tokens = r.max_tokens;
      EXPECT_TRUE(e.Add(q).ok());
      keys[id++] = {p, j};
    }
  }
  std::map<Key, Traj> out;
  while (e.HasWork()) {
    auto s = e.Step();
    EXPECT_TRUE(s.ok());
    for (auto& f : s->finished) out[keys[f.id]] = {f.tokens, f.logprobs};
  }
  return out;
}

bool BitIdentical(const Traj& a, const Traj& b) {
  return a.ids.size() == b.ids.size() && a.lps.size() == b.lps.size() &&
         std::memcmp(a.ids.data(), b.ids.data(), a.ids.size() * 4) == 0 &&
         std::memcmp(a.lps.data(), b.lps.data(), a.lps.size() * 4) == 0;
}

size_t CountDifferent(const std::map<Key, Traj>& got, const std::map<Key, Traj>& want) {
  size_t bad = 0;
  for (const auto& [k, t] : want) {
    auto it = got.find(k);
    if (it == got.end() || !BitIdentical(it->second, t)) ++bad;
  }
  return bad + (got.size() > want.size() ? got.size() - want.size() : 0);
}

// Asks the serve child for its StatusReply (raw DEALER: the WAL counters are not in StatusInfo).
struct WalStatus {
  bool ok = false;
  uint64_t recovered = 0, forced = 0, mismatches = 0, resumed = 0;
};
WalStatus QueryWal(const std::string& ep) {
  WalStatus w;
  zmq::context_t ctx(1);
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::rcvtimeo, 2000);
  s.connect(ep);
  flatbuffers::FlatBufferBuilder fbb(64);
  auto m = wire::CreateStatus(fbb);
  FinishEnvelope(fbb, 99, wire::Message_Status, m.Union());
  s.send(zmq::buffer(fbb.GetBufferPointer(), fbb.GetSize()), zmq::send_flags::none);
  zmq::message_t msg;
  while (s.recv(msg, zmq::recv_flags::none)) {
    std::vector<uint64_t> align;
    auto env = DecodeEnvelope(AlignForRead(msg.data(), msg.size(), &align), msg.size(), {});
    if (!env.ok() || (*env)->msg_type() != wire::Message_StatusReply) continue;
    const auto* r = (*env)->msg_as_StatusReply();
    w.ok = r->wal_enabled();
    w.recovered = r->wal_recovered_tokens();
    w.forced = r->wal_forced_tokens();
    w.mismatches = r->wal_forced_mismatches();
    w.resumed = r->wal_resumed();
    break;
  }
  return w;
}

pid_t StartServe(const std::string& dir, const std::string& ep, const std::string& durability) {
  std::vector<std::string> args = {BITROLL_EXE,   "serve", "--engine",        "null",
                                   "--data-dir",  dir,     "--durability",    durability,
                                   "--bind",      ep,      "--null-delay-us", "20000",
                                   "--log-level", "warn",  "--replicas",      "2"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : -1;
}

// Runs the batch against serve children, killing each after a random time, `kills` times; the
// last child runs to completion. Returns what the client collected.
std::map<Key, Traj> RunWithKills(const SubmitRequest& req, int kills, const std::string& dur,
                                 int64_t* wal_bytes, int* kills_done, uint64_t* recovered_total) {
  const std::string dir =
      std::string(BITROLL_BINARY_DIR) + "/crash_test_data_" + std::to_string(getpid()) + "_" + dur;
  std::filesystem::remove_all(dir);
  const std::string ep = "tcp://127.0.0.1:" + std::to_string(21000 + getpid() % 20000);
  std::mt19937 rng(1234);
  std::map<Key, Traj> got;
  bool done = false;
  for (int round = 0; round <= kills && !done; ++round) {
    pid_t pid = StartServe(dir, ep, dur);
    EXPECT_GT(pid, 0);
    ClientOptions co;
    co.endpoint = ep;
    auto c = Client::Connect(co);
    EXPECT_TRUE(c.ok());
    EXPECT_TRUE((*c)->Submit(req).ok());  // fresh, or a re-attach to the recovered group
    const auto deadline =
        std::chrono::steady_clock::now() +
        std::chrono::milliseconds(round < kills ? 60 + static_cast<int>(rng() % 140) : 30000);
    while (std::chrono::steady_clock::now() < deadline) {
      auto ev = (*c)->Next(20);
      if (!ev.ok()) continue;
      if (ev->kind == Event::Kind::kTrajectory) {
        const auto& t = ev->trajectory;
        EXPECT_TRUE(t.error.ok()) << t.error.ToString();
        *wal_bytes += t.cost.wal_bytes;
        got[{t.prompt_index, t.sample_index}] = {t.ids, t.logprobs};
      } else if (ev->kind == Event::Kind::kGroupDone) {
        done = true;
        break;
      } else if (ev->kind == Event::Kind::kError) {
        ADD_FAILURE() << ev->error.ToString();
      }
    }
    c->reset();
    if (!done) {
      // Zero regeneration of logged work: every logged token of every recovered trajectory was
      // re-dispatched as forced (and re-scored to the same bits).
      const WalStatus ws = QueryWal(ep);
      EXPECT_TRUE(ws.ok);
      EXPECT_EQ(ws.forced, ws.recovered) << "round " << round;
      EXPECT_EQ(ws.mismatches, 0u);
      *recovered_total += ws.recovered;
      ++*kills_done;
    }
    kill(pid, done ? SIGTERM : SIGKILL);
    int st = 0;
    waitpid(pid, &st, 0);
  }
  EXPECT_TRUE(done) << "the batch never finished";
  std::filesystem::remove_all(dir);
  return got;
}

TEST(CrashTest, KillNineTwentyTimesIsBitIdentical) {
  const SubmitRequest req = Batch(42);
  const auto want = Reference(req);
  ASSERT_EQ(want.size(), 64u);
  int64_t wal_bytes = 0;
  int kills = 0;
  uint64_t recovered = 0;
  const auto got = RunWithKills(req, 20, "sync", &wal_bytes, &kills, &recovered);
  EXPECT_GT(recovered, 0u) << "no restart resumed any logged token";
  std::printf("crash test: 20 kills, %llu logged tokens resumed as forced\n",
              static_cast<unsigned long long>(recovered));
  EXPECT_EQ(kills, 20) << "the batch finished before every kill happened";
  EXPECT_EQ(got.size(), 64u);
  EXPECT_EQ(CountDifferent(got, want), 0u);
  EXPECT_GT(wal_bytes, 0) << "cost.wal_bytes must be reported";
  // Negative control: the same comparison against a perturbed seed must fail.
  const auto other = Reference(Batch(43));
  EXPECT_GT(CountDifferent(got, other), 32u);
}

TEST(CrashTest, WindowDurabilityIsBitIdentical) {
  const SubmitRequest req = Batch(7);
  const auto want = Reference(req);
  int64_t wal_bytes = 0;
  int kills = 0;
  uint64_t recovered = 0;
  const auto got = RunWithKills(req, 5, "window", &wal_bytes, &kills, &recovered);
  EXPECT_EQ(kills, 5);
  EXPECT_EQ(CountDifferent(got, want), 0u);
}

}  // namespace
}  // namespace bitroll::rollout

namespace bitroll::rollout {
namespace {

pid_t SpawnArgs(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : -1;
}

// Replica failover: one of two `bitroll replica` processes is killed mid-batch; its trajectories
// move to the other one, which resumes them from the WAL (forced = logged tokens).
TEST(CrashTest, ReplicaKilledMidBatchResumesFromWal) {
  const SubmitRequest req = Batch(99);
  const auto want = Reference(req);
  const std::string dir =
      std::string(BITROLL_BINARY_DIR) + "/crash_test_failover_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  const int port = 23000 + getpid() % 20000;
  const std::string ep = "tcp://127.0.0.1:" + std::to_string(port);
  const std::string rep_ep = "tcp://127.0.0.1:" + std::to_string(port + 1);
  pid_t serve = SpawnArgs({BITROLL_EXE, "serve", "--engine", "null", "--data-dir", dir, "--bind",
                           ep, "--replica-bind", rep_ep, "--replicas", "0", "--replica-timeout-ms",
                           "300", "--log-level", "warn"});
  ASSERT_GT(serve, 0);
  std::vector<pid_t> reps;
  for (int i = 0; i < 2; ++i) {
    reps.push_back(SpawnArgs({BITROLL_EXE, "replica", "--engine", "null", "--connect", rep_ep,
                              "--null-delay-us", "20000", "--name", "r" + std::to_string(i),
                              "--log-level", "warn"}));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  ClientOptions co;
  co.endpoint = ep;
  auto c = Client::Connect(co);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->Submit(req).ok());
  std::map<Key, Traj> got;
  bool done = false, killed = false;
  const auto start = std::chrono::steady_clock::now();
  while (!done && std::chrono::steady_clock::now() - start < std::chrono::seconds(30)) {
    if (!killed && std::chrono::steady_clock::now() - start > std::chrono::milliseconds(400)) {
      kill(reps[0], SIGKILL);
      killed = true;
    }
    auto ev = (*c)->Next(20);
    if (!ev.ok()) continue;
    if (ev->kind == Event::Kind::kTrajectory) {
      got[{ev->trajectory.prompt_index, ev->trajectory.sample_index}] = {ev->trajectory.ids,
                                                                         ev->trajectory.logprobs};
    } else if (ev->kind == Event::Kind::kGroupDone) {
      done = true;
    }
  }
  const WalStatus ws = QueryWal(ep);
  for (pid_t p : {serve, reps[1]}) kill(p, SIGTERM);
  for (pid_t p : {serve, reps[0], reps[1]}) waitpid(p, nullptr, 0);
  std::filesystem::remove_all(dir);
  EXPECT_TRUE(done);
  EXPECT_EQ(CountDifferent(got, want), 0u);
  EXPECT_GT(ws.resumed, 0u) << "the dead replica's trajectories were not resumed";
  EXPECT_GT(ws.forced, 0u) << "failover regenerated instead of forcing the logged tokens";
  EXPECT_EQ(ws.mismatches, 0u);
}

}  // namespace
}  // namespace bitroll::rollout
