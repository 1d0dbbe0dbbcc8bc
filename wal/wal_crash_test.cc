// Crash test: kill -9 a writer process (wal_crash_writer) at random moments, >= 20 times, then
// recover and let it finish. Asserts that every record reported durable before each kill is
// present and bit-exact, that nothing is ever corrupt, and that the final log is bit-identical
// (every LMDB key and value, memcmp) to an uninterrupted run's.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <lmdb.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "wal/wal.h"
#include "wal/wal_test_util.h"

extern char** environ;

namespace bitroll::wal {
namespace {

using Dump = std::map<std::string, std::string>;  // raw traj-db key -> value

constexpr int kTrajs = 8, kTokens = 1024, kBatch = 8;

// Raw LMDB dump of the trajectory database.
Dump RawDump(const std::string& dir) {
  Dump out;
  MDB_env* env;
  EXPECT_EQ(mdb_env_create(&env), 0);
  mdb_env_set_maxdbs(env, format::kMaxDbs);
  EXPECT_EQ(mdb_env_open(env, dir.c_str(), MDB_RDONLY, 0644), 0);
  MDB_txn* txn;
  MDB_dbi dbi;
  EXPECT_EQ(mdb_txn_begin(env, nullptr, MDB_RDONLY, &txn), 0);
  if (mdb_dbi_open(txn, format::kTrajDbName, 0, &dbi) == 0) {
    MDB_cursor* cur;
    EXPECT_EQ(mdb_cursor_open(txn, dbi, &cur), 0);
    MDB_val k, v;
    while (mdb_cursor_get(cur, &k, &v, MDB_NEXT) == 0) {
      out.emplace(std::string(static_cast<char*>(k.mv_data), k.mv_size),
                  std::string(static_cast<char*>(v.mv_data), v.mv_size));
    }
    mdb_cursor_close(cur);
  }
  mdb_txn_abort(txn);
  mdb_env_close(env);
  return out;
}

struct RunResult {
  std::string output;
  bool killed = false;
  int status = 0;
  std::chrono::nanoseconds work_time{0};  // from the writer's R line to its exit
};

// How a run ends: never killed (kill_after null), or SIGKILL `kill_after` after the writer
// printed R and then `after_lines` durable points (or after it started, if `from_start`).
struct KillPlan {
  std::optional<std::chrono::microseconds> kill_after;
  bool from_start = false;
  int after_lines = 0;
};

size_t CountAfterR(const std::string& out) {
  const size_t r = out.find("R\n");
  return r == std::string::npos ? 0 : std::count(out.begin() + r + 2, out.end(), '\n');
}

RunResult RunWriter(const std::string& dir, const KillPlan& plan, int tokens = kTokens) {
  RunResult r;
  int fds[2];
  EXPECT_EQ(pipe2(fds, O_CLOEXEC), 0);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  const std::string k = std::to_string(kTrajs), n = std::to_string(tokens),
                    b = std::to_string(kBatch);
  const char* argv[] = {WAL_CRASH_WRITER, dir.c_str(), k.c_str(), n.c_str(), b.c_str(), nullptr};
  pid_t pid;
  const int rc =
      posix_spawn(&pid, WAL_CRASH_WRITER, &fa, nullptr, const_cast<char**>(argv), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  EXPECT_EQ(rc, 0) << "cannot spawn " << WAL_CRASH_WRITER;
  if (rc != 0) {
    close(fds[0]);
    return r;
  }
  char buf[4096];
  ssize_t got = 1;
  if (!plan.from_start) {  // wait for "R\n" and then after_lines lines (or the writer's exit)
    while ((r.output.find("R\n") == std::string::npos ||
            CountAfterR(r.output) < static_cast<size_t>(plan.after_lines)) &&
           (got = read(fds[0], buf, sizeof(buf))) > 0) {
      r.output.append(buf, got);
    }
  }
  const auto started = std::chrono::steady_clock::now();
  if (plan.kill_after) {
    std::this_thread::sleep_for(*plan.kill_after);
    r.killed = kill(pid, SIGKILL) == 0;
  }
  while (got > 0 && (got = read(fds[0], buf, sizeof(buf))) > 0) r.output.append(buf, got);
  close(fds[0]);
  waitpid(pid, &r.status, 0);
  r.work_time = std::chrono::steady_clock::now() - started;
  r.killed = r.killed && WIFSIGNALED(r.status);
  return r;
}

// The last complete "D ..." line: next durable seq per trajectory (all zero if none).
std::vector<uint64_t> LastDurablePoint(const std::string& out) {
  std::vector<uint64_t> next(kTrajs, 0);
  std::istringstream in(out);
  std::string line, last;
  while (std::getline(in, line)) {
    if (in.eof()) break;  // a line cut by the kill has no '\n'
    if (line.rfind("D ", 0) == 0) last = line;
  }
  if (last.empty()) return next;
  std::istringstream f(last.substr(2));
  for (auto& v : next) f >> v;
  return next;
}

TEST(WalCrash, KillNineAtRandomMomentsLosesNothingDurableAndResumesBitIdentical) {
  testing::TempDir ref_dir("walc_ref"), dir("walc_crash");
  // The uninterrupted reference run.
  RunResult ref = RunWriter(ref_dir.path(), KillPlan{});
  ASSERT_TRUE(WIFEXITED(ref.status) && WEXITSTATUS(ref.status) == 0) << ref.output;
  ASSERT_NE(ref.output.find("DONE"), std::string::npos);
  const Dump ref_dump = RawDump(ref_dir.path());
  const size_t records_per_traj = 1 + kTokens / kBatch + 3 + 1;
  ASSERT_EQ(ref_dump.size(), kTrajs * records_per_traj);

  // Kill at random moments: three runs in four after 1-3 durable points of progress plus a uniform
  // random part of one round (one round = one commit + fsync, measured on the reference run), so
  // kills land anywhere inside a commit; one in four at a random moment of the writer's start-up
  // (Open/Recover). Progress per kill is bounded in rounds, not time, so >= 20 kills land before
  // the work (133 rounds) is done however fast or slow fsync is today. A run that finishes
  // before its kill simply does not count.
  std::mt19937 rng(20261129);
  const int64_t rounds = 1 + kTokens / kBatch + 3 + 1;
  const int64_t round_us = std::max<int64_t>(
      200, std::chrono::duration_cast<std::chrono::microseconds>(ref.work_time).count() / rounds);
  std::uniform_int_distribution<int64_t> delay(0, round_us), lines(1, 3);
  int kills = 0, runs = 0, mid_progress = 0;  // mid_progress: kills after some, not all, work
  size_t records_before = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  bool done = false;
  while (kills < 20 && std::chrono::steady_clock::now() < deadline) {
    KillPlan plan;
    plan.kill_after = std::chrono::microseconds(delay(rng));
    plan.from_start = runs % 4 == 3;
    plan.after_lines = static_cast<int>(lines(rng));
    RunResult r = RunWriter(dir.path(), plan);
    ++runs;
    if (!r.killed) {
      ASSERT_TRUE(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0) << r.output;
      done = r.output.find("DONE") != std::string::npos;
      if (done) break;
      continue;
    }
    ++kills;
    const std::vector<uint64_t> durable = LastDurablePoint(r.output);
    // Nothing corrupt: the WAL recovers with no quarantine...
    {
      WalOptions o;
      o.dir = dir.path();
      o.background_commit = false;
      auto w = Wal::Open(o);
      ASSERT_TRUE(w.ok()) << w.status().ToString();
      auto rec = (*w)->Recover();
      ASSERT_TRUE(rec.ok()) << rec.status().ToString();
      ASSERT_TRUE(rec->quarantined.empty()) << rec->quarantined[0].error.ToString();
    }
    // ...every record present equals the reference's bytes, and every record reported durable
    // is present.
    const Dump now = RawDump(dir.path());
    for (const auto& [key, value] : now) {
      auto it = ref_dump.find(key);
      ASSERT_NE(it, ref_dump.end()) << "unexpected key after kill " << kills;
      ASSERT_EQ(it->second.size(), value.size());
      ASSERT_EQ(std::memcmp(it->second.data(), value.data(), value.size()), 0)
          << "record differs after kill " << kills;
    }
    std::vector<uint64_t> present(kTrajs, 0);
    for (const auto& [key, value] : now) {
      present[format::GetBigEndian64(reinterpret_cast<const uint8_t*>(key.data()))]++;
    }
    for (int t = 0; t < kTrajs; ++t) {
      ASSERT_GE(present[t], durable[t])
          << "traj " << t << " lost durable records at kill " << kills;
    }
    if (now.size() > records_before && now.size() < ref_dump.size()) ++mid_progress;
    records_before = now.size();
  }
  std::printf("runs %d, kills %d (%d mid-work), round %lld us\n", runs, kills, mid_progress,
              static_cast<long long>(round_us));
  EXPECT_GE(kills, 20);
  EXPECT_GE(mid_progress, 8);  // the kills really landed in the middle of the work
  if (!done) {
    RunResult last = RunWriter(dir.path(), KillPlan{});
    ASSERT_TRUE(WIFEXITED(last.status) && WEXITSTATUS(last.status) == 0) << last.output;
  }
  const Dump final_dump = RawDump(dir.path());
  ASSERT_EQ(final_dump.size(), ref_dump.size());
  for (auto a = final_dump.begin(), b = ref_dump.begin(); a != final_dump.end(); ++a, ++b) {
    ASSERT_EQ(a->first, b->first);
    ASSERT_EQ(a->second.size(), b->second.size());
    ASSERT_EQ(std::memcmp(a->second.data(), b->second.data(), a->second.size()), 0);
  }
}

// Negative control for the comparison above: a run with different content is caught.
TEST(WalCrash, DumpComparisonDetectsADifferentRun) {
  testing::TempDir a("walc_a"), b("walc_b");
  constexpr int kSmall = 64;  // tokens per trajectory: a short run is enough here
  ASSERT_TRUE(WIFEXITED(RunWriter(a.path(), KillPlan{}, kSmall).status));
  WalOptions o;
  o.dir = b.path();
  o.durability = Durability::kNone;
  o.background_commit = false;
  {
    auto w = Wal::Open(o);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->Recover().ok());
    TrajectoryHeader h = testing::MakeHeader(0);
    h.sampling.seed ^= 1;  // one bit
    ASSERT_TRUE((*w)->AppendHeader(0, h).ok());
    ASSERT_TRUE((*w)->Flush().ok());
  }
  RunResult r = RunWriter(b.path(), KillPlan{}, kSmall);
  ASSERT_TRUE(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0) << r.output;
  const Dump da = RawDump(a.path()), db = RawDump(b.path());
  ASSERT_EQ(da.size(), db.size());
  int differing = 0;
  for (auto x = da.begin(), y = db.begin(); x != da.end(); ++x, ++y) {
    differing += x->second.size() != y->second.size() ||
                 std::memcmp(x->second.data(), y->second.data(), x->second.size()) != 0;
  }
  EXPECT_EQ(differing, 1);  // exactly the header of trajectory 0
}

}  // namespace
}  // namespace bitroll::wal
