// The pre-warmed helper pool (SandboxOptions::prewarm): one helper per run, distinct uids,
// dead parked helpers replaced, nothing left after the Sandbox, network-on fallback.
// (The tier and hostile suites also run whole with the pool on: their "Pooled/" instances.)
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "sandbox/sandbox.h"
#include "sandbox/sandbox_test_util.h"

namespace bitroll::sandbox {
namespace {

using testing::AwaitParked;
using testing::SandboxProcesses;
using testing::TestOptions;

SandboxOptions PoolOptions() {
  SandboxOptions o = TestOptions();
  o.prewarm.process = 2;
  o.prewarm.container = 1;
  return o;
}

Request Cmd(Tier tier, std::vector<std::string> argv) {
  Request r;
  r.tier = tier;
  r.argv = std::move(argv);
  r.limits.wall_seconds = 10;
  return r;
}

std::string ProcField(int pid, const std::string& key) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) == 0) return line.substr(key.size() + 1);
  }
  return "";
}

// Our children that are parked helpers ("bitroll-sandbox-helper park ..."), alive or zombie.
std::vector<int> ScanParkedHelpers() {
  std::vector<int> pids;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name[0] < '0' || name[0] > '9') continue;
    int pid = std::atoi(name.c_str());
    std::string ppid = ProcField(pid, "PPid");
    if (std::atoi(ppid.c_str()) != getpid()) continue;
    std::ifstream in("/proc/" + name + "/cmdline");
    std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (cmdline.find(std::string("park") + '\0') != std::string::npos) pids.push_back(pid);
  }
  return pids;
}

// As above, waiting (at most 2 s) until `expected` are seen: a just-spawned helper's cmdline
// reads empty for a moment after posix_spawn returns (the kernel sets it up after releasing the
// vfork'ed parent).
std::vector<int> ParkedHelperPids(size_t expected) {
  std::vector<int> pids = ScanParkedHelpers();
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (pids.size() != expected && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    pids = ScanParkedHelpers();
  }
  return pids;
}

bool ProcessExists(int pid) {
  return std::filesystem::exists("/proc/" + std::to_string(pid));
}

TEST(SandboxPool, ConsecutiveRunsGetDistinctUidsAndOneHelperEach) {
  Sandbox sb(PoolOptions());
  SKIP_IF_TIER_UNAVAILABLE(sb, Tier::kProcess);
  const uint64_t warm0 = sb.Pool(Tier::kProcess).warm_runs;
  std::set<int> helpers;
  unsigned long last_uid = 0;
  constexpr int kRuns = 6;
  for (int i = 0; i < kRuns; ++i) {
    ASSERT_TRUE(AwaitParked(sb, Tier::kProcess, 2));
    const std::vector<int> parked = ParkedHelperPids(2);
    ASSERT_EQ(parked.size(), 2u);
    // The tool runs in a pid namespace of its own (its $PPID is the namespace's init): its
    // helper is the parked one that is gone (ended and reaped) after the run.
    RunResult res = sb.Run(Cmd(Tier::kProcess, {"sh", "-c", "id -u"}));
    ASSERT_EQ(res.error, SandboxError::kNone) << res.status.ToString() << res.stderr_data;
    unsigned long uid = std::strtoul(res.stdout_data.c_str(), nullptr, 10);
    int helper = 0;
    for (int p : parked) {
      if (ProcessExists(p) && std::atoi(ProcField(p, "PPid").c_str()) == getpid()) continue;
      EXPECT_EQ(helper, 0) << "two parked helpers ended for one run";
      helper = p;
    }
    EXPECT_GE(uid, sb.options().uid_base);
    EXPECT_LT(uid, sb.options().uid_base + sb.options().max_concurrent);
    if (i > 0) {
      EXPECT_NE(uid, last_uid) << "run " << i << " reused the previous run's uid";
    }
    last_uid = uid;
    ASSERT_GT(helper, 1) << res.stdout_data;
    EXPECT_TRUE(helpers.insert(helper).second) << "helper " << helper << " served two runs";
    // The helper ended (and was reaped) with its run: it can serve no other.
    EXPECT_FALSE(ProcessExists(helper) && std::atoi(ProcField(helper, "PPid").c_str()) == getpid())
        << "helper " << helper << " outlived its run";
  }
  EXPECT_EQ(sb.Pool(Tier::kProcess).warm_runs - warm0, static_cast<uint64_t>(kRuns))
      << "every run above had a parked helper waiting";
  EXPECT_TRUE(SandboxProcesses(sb.options()).empty());
}

TEST(SandboxPool, KilledParkedHelperIsDetectedAndReplaced) {
  Sandbox sb(PoolOptions());
  SKIP_IF_TIER_UNAVAILABLE(sb, Tier::kProcess);
  ASSERT_TRUE(AwaitParked(sb, Tier::kProcess, 2));
  std::vector<int> parked = ParkedHelperPids(2);
  ASSERT_EQ(parked.size(), 2u) << "expected the two parked process helpers";
  // Both die at once; the run right after must not notice (it may even pick one of them before
  // its death shows: the missing acknowledgement then sends it on).
  for (int pid : parked) ASSERT_EQ(kill(pid, SIGKILL), 0);
  RunResult res = sb.Run(Cmd(Tier::kProcess, {"echo", "still works"}));
  ASSERT_EQ(res.error, SandboxError::kNone) << res.status.ToString();
  EXPECT_EQ(res.stdout_data, "still works\n");
  // Detected (reaped, counted) and replaced by fresh helpers.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while ((sb.Pool(Tier::kProcess).lost < 2 || sb.Pool(Tier::kProcess).parked < 2) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  PoolStats st = sb.Pool(Tier::kProcess);
  EXPECT_EQ(st.lost, 2u);
  EXPECT_EQ(st.parked, 2u);
  for (int pid : parked)
    EXPECT_FALSE(ProcessExists(pid)) << "killed helper " << pid << " not reaped";
  std::vector<int> now = ParkedHelperPids(2);
  for (int pid : now) {
    EXPECT_EQ(std::count(parked.begin(), parked.end(), pid), 0) << "a dead helper still listed";
  }
  // And the replacements serve runs.
  const uint64_t warm = st.warm_runs;
  res = sb.Run(Cmd(Tier::kProcess, {"echo", "replacement"}));
  ASSERT_EQ(res.error, SandboxError::kNone) << res.status.ToString();
  EXPECT_EQ(sb.Pool(Tier::kProcess).warm_runs, warm + 1);
}

TEST(SandboxPool, DestroyingTheSandboxLeavesNoHelperAndNoWorkdir) {
  std::string tmpl = std::filesystem::temp_directory_path().string() + "/bitroll-pool-root-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
  const std::string root = tmpl;
  ASSERT_EQ(chmod(root.c_str(), 0711), 0);  // run uids must traverse it (bwrap binds below it)
  std::vector<int> parked;
  {
    SandboxOptions o = PoolOptions();
    o.work_root = root;
    Sandbox sb(o);
    SKIP_IF_TIER_UNAVAILABLE(sb, Tier::kProcess);
    SKIP_IF_TIER_UNAVAILABLE(sb, Tier::kContainer);
    ASSERT_TRUE(AwaitParked(sb, Tier::kProcess, 2));
    ASSERT_TRUE(AwaitParked(sb, Tier::kContainer, 1));
    EXPECT_EQ(sb.Run(Cmd(Tier::kContainer, {"true"})).error, SandboxError::kNone);
    ASSERT_TRUE(AwaitParked(sb, Tier::kContainer, 1));
    parked = ParkedHelperPids(3);
    EXPECT_EQ(parked.size(), 3u);
    EXPECT_FALSE(std::filesystem::is_empty(root)) << "parked helpers hold their workdirs";
  }
  for (int pid : parked) EXPECT_FALSE(ProcessExists(pid)) << "parked helper " << pid << " alive";
  EXPECT_TRUE(ScanParkedHelpers().empty());
  EXPECT_TRUE(std::filesystem::is_empty(root)) << "a parked helper's workdir was left";
  std::filesystem::remove_all(root);
}

TEST(SandboxPool, NetworkOnFallsBackToAColdProcessHelper) {
  Sandbox sb(PoolOptions());
  SKIP_IF_TIER_UNAVAILABLE(sb, Tier::kProcess);
  ASSERT_TRUE(AwaitParked(sb, Tier::kProcess, 2));
  char host_ns[64] = {};
  ASSERT_GT(readlink("/proc/self/ns/net", host_ns, sizeof(host_ns) - 1), 0);
  Request r = Cmd(Tier::kProcess, {"readlink", "/proc/self/ns/net"});
  // Network off: a parked helper (in its own namespace) serves it.
  PoolStats before = sb.Pool(Tier::kProcess);
  RunResult res = sb.Run(r);
  ASSERT_EQ(res.error, SandboxError::kNone) << res.status.ToString() << res.stderr_data;
  EXPECT_NE(res.stdout_data, std::string(host_ns) + "\n") << "network off shares the host's";
  EXPECT_EQ(sb.Pool(Tier::kProcess).warm_runs, before.warm_runs + 1);
  // Network on: the parked helpers cannot serve it; a cold one does, in the host's namespace.
  ASSERT_TRUE(AwaitParked(sb, Tier::kProcess, 2));
  before = sb.Pool(Tier::kProcess);
  r.limits.allow_network = true;
  res = sb.Run(r);
  ASSERT_EQ(res.error, SandboxError::kNone) << res.status.ToString() << res.stderr_data;
  EXPECT_EQ(res.stdout_data, std::string(host_ns) + "\n") << "network on must be the host's";
  PoolStats after = sb.Pool(Tier::kProcess);
  EXPECT_EQ(after.warm_runs, before.warm_runs);
  EXPECT_EQ(after.cold_runs, before.cold_runs + 1);
  EXPECT_EQ(after.lost, before.lost);
  EXPECT_TRUE(SandboxProcesses(sb.options()).empty());
}

TEST(SandboxPool, ContainerHelpersServeNetworkOnRequests) {
  Sandbox sb(PoolOptions());
  SKIP_IF_TIER_UNAVAILABLE(sb, Tier::kContainer);
  char host_ns[64] = {};
  ASSERT_GT(readlink("/proc/self/ns/net", host_ns, sizeof(host_ns) - 1), 0);
  Request r = Cmd(Tier::kContainer, {"readlink", "/proc/self/ns/net"});
  r.limits.allow_network = true;
  const uint64_t warm = sb.Pool(Tier::kContainer).warm_runs;
  RunResult res = sb.Run(r);
  ASSERT_EQ(res.error, SandboxError::kNone) << res.status.ToString() << res.stderr_data;
  EXPECT_EQ(res.stdout_data, std::string(host_ns) + "\n");
  EXPECT_EQ(sb.Pool(Tier::kContainer).warm_runs, warm + 1);
  ASSERT_TRUE(AwaitParked(sb, Tier::kContainer, 1));
  r.limits.allow_network = false;
  res = sb.Run(r);
  ASSERT_EQ(res.error, SandboxError::kNone) << res.status.ToString() << res.stderr_data;
  EXPECT_NE(res.stdout_data, std::string(host_ns) + "\n");
  EXPECT_EQ(sb.Pool(Tier::kContainer).warm_runs, warm + 2);
}

TEST(SandboxPool, ColdRunsEvictParkedHelpersWhenEverySlotIsParked) {
  // 4 slots, all parked: cold runs (network on) must still get slots, in parallel too.
  SandboxOptions o = PoolOptions();
  o.prewarm.process = 4;
  Sandbox sb(o);
  SKIP_IF_TIER_UNAVAILABLE(sb, Tier::kProcess);
  ASSERT_TRUE(AwaitParked(sb, Tier::kProcess, 4));
  std::vector<std::thread> threads;
  std::vector<RunResult> results(6);
  for (int i = 0; i < 6; ++i) {
    threads.emplace_back([&, i] {
      Request r = Cmd(Tier::kProcess, {"id", "-u"});
      r.limits.allow_network = i % 2 == 0;
      results[i] = sb.Run(r);
    });
  }
  for (auto& t : threads) t.join();
  for (const RunResult& res : results) {
    ASSERT_EQ(res.error, SandboxError::kNone) << res.status.ToString();
    unsigned long uid = std::strtoul(res.stdout_data.c_str(), nullptr, 10);
    EXPECT_GE(uid, sb.options().uid_base);
    EXPECT_LT(uid, sb.options().uid_base + sb.options().max_concurrent);
  }
  EXPECT_GE(sb.Pool(Tier::kProcess).evicted, 1u);
  EXPECT_TRUE(SandboxProcesses(sb.options()).empty());
}

}  // namespace
}  // namespace bitroll::sandbox
