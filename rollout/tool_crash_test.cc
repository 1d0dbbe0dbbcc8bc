// Crash harness of the tool loop: a `bitroll serve --model stories260K --data-dir` CHILD runs a
// seeded multi-turn rollout whose only tool is the built-in function `append` (it appends
// "GROUP PROMPT SAMPLE CALL INPUT" to --tool-append-file, a file outside any sandbox, after
// sleeping --tool-append-delay-ms, so that kills land inside calls). The child is killed with
// SIGKILL at random points, at least 10 times, restarted on the same data directory, and the
// client re-attaches by re-submitting the group id.
//
// Asserted: the trajectories are memcmp-equal (ids, logprob bits, mask, turns) to an uninterrupted
// run (negative control: another seed differs); after each kill the test reads the WAL itself:
// a call whose ToolResult was durable then is never executed again (its line count in the append
// file never grows afterwards); calls interrupted mid-run (logged call, no durable result) may
// run twice and are counted and printed; at least one kill landed while a call was in flight.
// And: a plain restart (SIGTERM, then serve again) of the finished rollout delivers the same bits
// from the WAL with every result replayed and the append file unchanged. A second test kills one
// of two `bitroll replica` processes while it holds samples of the tool loop: they resume on the
// other one, bit-identical.
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
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <zmq.hpp>

#include "rollout/client.h"
#include "rollout/protocol.h"
#include "rollout/service_test_util.h"
#include "rollout/wal_log.h"
#include "wal/wal.h"

namespace bitroll::rollout {
namespace {

using Clock = std::chrono::steady_clock;
using Key = std::pair<uint32_t, uint32_t>;                 // (prompt, sample)
using CallKey = std::tuple<uint32_t, uint32_t, uint32_t>;  // (prompt, sample, call)

constexpr uint64_t kGroup = 77;
constexpr uint32_t kN = 16;

struct Traj {
  std::vector<int32_t> ids;
  std::vector<float> lps;
  std::vector<uint8_t> mask;
  int32_t turns = 0;
  std::vector<ToolCallResult> calls;
};

SubmitRequest Batch(uint64_t seed, uint64_t gid = kGroup) {
  SubmitRequest r;
  r.group_id = gid;
  r.text_prompts = {"Once upon a time"};
  r.n = kN;
  r.temperature = 0.9f;
  r.seed = seed;
  r.max_tokens = 160;
  r.max_turns = 8;
  ToolSpecInput t;
  t.name = "log";
  t.function = "append";
  r.tools = {t};
  r.tool_open = " was";
  r.tool_close = ".";
  return r;
}

bool Same(const Traj& a, const Traj& b) {
  return a.turns == b.turns && a.ids.size() == b.ids.size() && a.lps.size() == b.lps.size() &&
         a.mask.size() == b.mask.size() &&
         std::memcmp(a.ids.data(), b.ids.data(), a.ids.size() * 4) == 0 &&
         std::memcmp(a.lps.data(), b.lps.data(), a.lps.size() * 4) == 0 &&
         std::memcmp(a.mask.data(), b.mask.data(), a.mask.size()) == 0;
}

// Where two trajectories first differ (for failure messages).
std::string Describe(const Traj& a, const Traj& b) {
  size_t i = 0;
  while (i < a.ids.size() && i < b.ids.size() && a.ids[i] == b.ids[i] &&
         std::memcmp(&a.lps[i], &b.lps[i], 4) == 0 && a.mask[i] == b.mask[i]) {
    ++i;
  }
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "sizes %zu/%zu turns %d/%d calls %zu/%zu, first difference at %zu", a.ids.size(),
                b.ids.size(), a.turns, b.turns, a.calls.size(), b.calls.size(), i);
  return buf;
}

size_t CountDifferent(const std::map<Key, Traj>& got, const std::map<Key, Traj>& want,
                      bool print = false) {
  size_t bad = 0;
  for (const auto& [k, t] : want) {
    auto it = got.find(k);
    if (it == got.end() || !Same(it->second, t)) {
      ++bad;
      if (print && it != got.end()) {
        std::printf("  sample %u differs: %s\n", k.second, Describe(it->second, t).c_str());
      }
    }
  }
  return bad;
}

// Lines of the append file per (prompt, sample, call) of group `gid`.
std::map<CallKey, int> ReadAppends(const std::string& path, uint64_t gid) {
  std::map<CallKey, int> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    uint64_t g;
    uint32_t p, s, c;
    if (ls >> g >> p >> s >> c && g == gid) ++out[{p, s, c}];
  }
  return out;
}

pid_t StartServe(const std::string& dir, const std::string& ep, const std::string& append) {
  std::vector<std::string> args = {BITROLL_EXE,
                                   "serve",
                                   "--model",
                                   std::string(BITROLL_MODELS_DIR) + "/stories260K.bin",
                                   "--data-dir",
                                   dir,
                                   "--bind",
                                   ep,
                                   "--tool-append-file",
                                   append,
                                   "--tool-append-delay-ms",
                                   "150",
                                   "--tool-workers",
                                   "2",
                                   "--log-level",
                                   "warn"};
  return SpawnQuiet(std::move(args));
}

void Stop(pid_t pid, int sig) {
  kill(pid, sig);
  int st = 0;
  waitpid(pid, &st, 0);
}

// Collects group `gid`'s trajectories until GroupDone or `ms`. Returns true on GroupDone.
bool Collect(Client& c, uint64_t gid, int ms, std::map<Key, Traj>* got) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(ms);
  while (Clock::now() < deadline) {
    auto ev = c.Next(10);
    if (!ev.ok()) continue;
    if (ev->kind == Event::Kind::kTrajectory && ev->trajectory.group_id == gid) {
      const auto& t = ev->trajectory;
      EXPECT_TRUE(t.error.ok()) << t.error.ToString();
      (*got)[{t.prompt_index, t.sample_index}] = {t.ids, t.logprobs, t.mask, t.turns, t.tool_calls};
    } else if (ev->kind == Event::Kind::kGroupDone && ev->done.group_id == gid) {
      return true;
    } else if (ev->kind == Event::Kind::kError) {
      ADD_FAILURE() << ev->error.ToString();
    }
  }
  return false;
}

std::string Scratch(const char* what) {
  std::string tmpl =
      std::filesystem::temp_directory_path().string() + "/bitroll_" + what + "_XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  const char* d = mkdtemp(buf.data());
  EXPECT_NE(d, nullptr);
  return d ? d : "";
}

// What the WAL holds after a kill: calls with a durable result, and logged calls without one.
struct WalCalls {
  std::set<CallKey> with_result;
  std::set<CallKey> pending;
};
WalCalls ReadWal(const std::string& dir) {
  WalCalls out;
  wal::WalOptions o;
  o.dir = dir;
  o.background_commit = false;
  auto w = wal::Wal::Open(o);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  if (!w.ok()) return out;
  auto rec = (*w)->Recover();
  EXPECT_TRUE(rec.ok()) << rec.status().ToString();
  if (!rec.ok()) return out;
  EXPECT_TRUE(rec->quarantined.empty());
  for (const auto* list : {&rec->unfinished, &rec->finished}) {
    for (const wal::TrajectoryLog& t : *list) {
      const uint32_t flat = WalFlatOf(t.id);
      for (const wal::ToolCallLog& c : t.tool_calls) {
        const CallKey k{flat / kN, flat % kN, c.call.call_index};
        (c.result ? out.with_result : out.pending).insert(k);
      }
    }
  }
  return out;
}

TEST(ToolCrashTest, KillNineInsideToolCallsIsBitIdenticalAndNeverReExecutesALoggedResult) {
  // 1. The uninterrupted reference (and a second seed for the negative control).
  const std::string ref_dir = Scratch("toolref");
  const std::string ref_append = ref_dir + "/append.txt";
  const std::string ref_ep = FreeLoopbackEndpoint();
  pid_t pid = StartServe(ref_dir + "/data", ref_ep, ref_append);
  ASSERT_GT(pid, 0);
  std::map<Key, Traj> want, other;
  auto t0 = Clock::now();
  {
    ClientOptions co;
    co.client_id = "trainer";  // re-attaching needs the same owner
    co.endpoint = ref_ep;
    auto c = Client::Connect(co);
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE((*c)->Submit(Batch(42)).ok());
    ASSERT_TRUE(Collect(**c, kGroup, 60000, &want));
    ASSERT_TRUE((*c)->Submit(Batch(43, kGroup + 1)).ok());
    ASSERT_TRUE(Collect(**c, kGroup + 1, 60000, &other));
  }
  const double ref_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  Stop(pid, SIGTERM);
  ASSERT_EQ(want.size(), kN);
  size_t ref_calls = 0;
  for (const auto& [k, t] : want) ref_calls += t.calls.size();
  const auto ref_lines = ReadAppends(ref_append, kGroup);
  size_t ref_line_total = 0;
  for (const auto& [k, n] : ref_lines) {
    EXPECT_EQ(n, 1) << "uninterrupted: every call runs exactly once";
    ref_line_total += n;
  }
  EXPECT_EQ(ref_line_total, ref_calls);
  EXPECT_GE(ref_calls, kN) << "the rollout should make several calls per trajectory";
  std::printf("reference: %zu trajectories, %zu calls, %.2f s (two groups)\n", want.size(),
              ref_calls, ref_seconds);

  // 2. Plain restart of the finished rollout: replayed from the WAL, nothing executed.
  {
    pid = StartServe(ref_dir + "/data", ref_ep, ref_append);
    ASSERT_GT(pid, 0);
    ClientOptions co;
    co.client_id = "trainer";  // re-attaching needs the same owner
    co.endpoint = ref_ep;
    auto c = Client::Connect(co);
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE((*c)->Submit(Batch(42)).ok());  // re-attach
    std::map<Key, Traj> again;
    ASSERT_TRUE(Collect(**c, kGroup, 30000, &again));
    Stop(pid, SIGTERM);
    EXPECT_EQ(CountDifferent(again, want), 0u) << "a restart must deliver the same bits";
    for (const auto& [k, t] : again) {
      for (const auto& call : t.calls) EXPECT_TRUE(call.replayed);
    }
    EXPECT_EQ(ReadAppends(ref_append, kGroup), ref_lines) << "a restart executed a tool";
  }

  // 3. Kill -9 at random points, at least 10 times.
  const std::string dir = Scratch("toolcrash");
  const std::string append = dir + "/append.txt";
  const std::string ep = FreeLoopbackEndpoint();
  std::mt19937 rng(1234);
  std::map<Key, Traj> got;
  std::map<CallKey, int> lines_when_durable;  // first kill after which its result was durable
  int kills = 0, kills_in_call = 0;
  bool done = false;
  for (int round = 0; !done && round < 40; ++round) {
    pid = StartServe(dir + "/data", ep, append);
    ASSERT_GT(pid, 0);
    ClientOptions co;
    co.client_id = "trainer";  // re-attaching needs the same owner
    co.endpoint = ep;
    auto c = Client::Connect(co);
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE((*c)->Submit(Batch(42)).ok());  // fresh, or a re-attach to the recovered group
    // The kill window starts once the child serves (model loaded, WAL recovered, replica
    // joined), so that a slow start on a loaded machine does not eat it.
    for (int k = 0; k < 100; ++k) {
      auto st = (*c)->GetStatus(5000);
      if (st.ok() && !st->replicas.empty()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    const int ms = kills < 12 ? 60 + static_cast<int>(rng() % 200) : 60000;
    done = Collect(**c, kGroup, ms, &got);
    c->reset();
    if (done) {
      Stop(pid, SIGTERM);
      break;
    }
    Stop(pid, SIGKILL);
    ++kills;
    const WalCalls wc = ReadWal(dir + "/data");
    const auto lines = ReadAppends(append, kGroup);
    if (!wc.pending.empty()) ++kills_in_call;
    for (const CallKey& k : wc.with_result) {
      if (lines_when_durable.count(k)) continue;
      auto it = lines.find(k);
      EXPECT_TRUE(it != lines.end()) << "a logged result whose call never ran";
      lines_when_durable[k] = it == lines.end() ? 0 : it->second;
    }
  }
  ASSERT_TRUE(done) << "the rollout never finished";
  EXPECT_GE(kills, 10);
  EXPECT_GE(kills_in_call, 1) << "no kill landed while a call was in flight";
  EXPECT_EQ(got.size(), kN);
  EXPECT_EQ(CountDifferent(got, want, true), 0u) << "kill -9 changed a trajectory";
  const auto lines = ReadAppends(append, kGroup);
  int twice = 0, never_again = 0;
  size_t calls = 0;
  for (const auto& [k, t] : got) calls += t.calls.size();
  for (const auto& [k, n] : lines) {
    if (n > 1) {
      ++twice;
      std::printf("  call (prompt %u, sample %u, call %u) ran %d times (interrupted mid-run)\n",
                  std::get<0>(k), std::get<1>(k), std::get<2>(k), n);
    }
  }
  for (const auto& [k, n] : lines_when_durable) {
    auto it = lines.find(k);
    const int now = it == lines.end() ? 0 : it->second;
    EXPECT_EQ(now, n) << "call (" << std::get<0>(k) << "," << std::get<1>(k) << ","
                      << std::get<2>(k) << ") ran again after its result was durable";
    never_again += now == n ? 1 : 0;
  }
  EXPECT_EQ(lines.size(), calls) << "every call of the final trajectories ran at least once";
  std::printf(
      "tool crash test: %d kills (%d inside a call), %zu calls; %zu results durable at a kill, "
      "%d of them never re-executed; %d calls ran twice (at-least-once for interrupted calls)\n",
      kills, kills_in_call, calls, lines_when_durable.size(), never_again, twice);
  // Negative control: the same comparison against another seed must fail.
  EXPECT_GT(CountDifferent(got, other), kN / 2);
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(ref_dir);
}

// Replica failover inside the tool loop: one of two `bitroll replica` processes is killed while
// the batch runs; its trajectories move to the other replica with their earlier turns as context
// and the current turn's logged tokens forced. Same bits as the uninterrupted run.
TEST(ToolCrashTest, ReplicaKilledMidToolLoopResumesOnTheOther) {
  // The uninterrupted reference, in-process replicas.
  const std::string ref_dir = Scratch("toolfo_ref");
  const std::string ref_ep = FreeLoopbackEndpoint();
  pid_t pid = StartServe(ref_dir + "/data", ref_ep, ref_dir + "/append.txt");
  ASSERT_GT(pid, 0);
  std::map<Key, Traj> want;
  {
    ClientOptions co;
    co.client_id = "trainer";  // re-attaching needs the same owner
    co.endpoint = ref_ep;
    auto c = Client::Connect(co);
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE((*c)->Submit(Batch(5)).ok());
    ASSERT_TRUE(Collect(**c, kGroup, 60000, &want));
  }
  Stop(pid, SIGTERM);
  ASSERT_EQ(want.size(), kN);

  const std::string dir = Scratch("toolfo");
  const std::string ep = FreeLoopbackEndpoint();
  const std::string rep_ep = FreeLoopbackEndpoint();
  const std::string model = std::string(BITROLL_MODELS_DIR) + "/stories260K.bin";
  pid_t serve = SpawnQuiet({BITROLL_EXE,
                            "serve",
                            "--engine",
                            "null",
                            "--data-dir",
                            dir + "/data",
                            "--bind",
                            ep,
                            "--replica-bind",
                            rep_ep,
                            "--replicas",
                            "0",
                            "--replica-timeout-ms",
                            "300",
                            "--tool-append-file",
                            dir + "/append.txt",
                            "--tool-append-delay-ms",
                            "150",
                            "--tool-workers",
                            "8",
                            "--log-level",
                            "warn"});
  ASSERT_GT(serve, 0);
  std::vector<pid_t> reps;
  for (int i = 0; i < 2; ++i) {
    reps.push_back(SpawnQuiet({BITROLL_EXE, "replica", "--model", model, "--connect", rep_ep,
                               "--name", "r" + std::to_string(i), "--log-level", "warn"}));
  }
  ClientOptions co;
  co.client_id = "trainer";  // re-attaching needs the same owner
  co.endpoint = ep;
  auto c = Client::Connect(co);
  ASSERT_TRUE(c.ok());
  // Both replicas joined (loading the model takes a moment).
  for (int k = 0; k < 200; ++k) {
    auto st = (*c)->GetStatus(5000);
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    if (st->replicas.size() == 2) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE((*c)->Submit(Batch(5)).ok());
  std::map<Key, Traj> got;
  EXPECT_FALSE(Collect(**c, kGroup, 300, &got)) << "finished before the replica was killed";
  // Kill the replica with work in flight as soon as one has some (most of the time the samples
  // wait for the slow tool; prefix affinity puts one prompt's samples on one replica).
  size_t victim = 0;
  uint32_t most = 0;
  for (int k = 0; k < 2000 && most == 0; ++k) {
    auto st = (*c)->GetStatus(5000);
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    for (const ReplicaInfo& r : st->replicas) {
      if (r.queued > most && (r.name == "r0" || r.name == "r1")) {
        most = r.queued;
        victim = r.name == "r0" ? 0 : 1;
      }
    }
  }
  ASSERT_GT(most, 0u) << "no replica ever had work in flight";
  kill(reps[victim], SIGKILL);
  const bool done = Collect(**c, kGroup, 60000, &got);
  const WalStatus ws = QueryWal(ep);
  EXPECT_TRUE(ws.replied) << "no StatusReply";
  const uint64_t resumed = ws.resumed, mismatches = ws.mismatches;
  for (pid_t p : {serve, reps[1 - victim]}) kill(p, SIGTERM);
  for (pid_t p : {serve, reps[0], reps[1]}) waitpid(p, nullptr, 0);
  EXPECT_TRUE(done);
  EXPECT_EQ(got.size(), kN);
  EXPECT_EQ(CountDifferent(got, want, true), 0u) << "failover changed a multi-turn trajectory";
  int multi = 0;
  for (const auto& [k, t] : got) multi += t.turns > 1 ? 1 : 0;
  EXPECT_GT(multi, 0);
  EXPECT_EQ(mismatches, 0u);
  std::printf(
      "replica failover: %u samples in flight on the killed replica, %llu resumed with "
      "forced tokens of their current turn, %d of %u trajectories multi-turn\n",
      most, static_cast<unsigned long long>(resumed), multi, kN);
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(ref_dir);
}

}  // namespace
}  // namespace bitroll::rollout
