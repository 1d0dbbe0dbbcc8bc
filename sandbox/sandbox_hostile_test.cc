// The hostile suite: each case tries to escape or harm the host and must be contained, answered
// with the right typed error, and leave no process behind. Every case is bounded (pids, memory
// and short wall limits) so that nothing runs away even if a limit failed: this machine is shared.
// The VM tier runs a smaller set (a boot costs seconds).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "sandbox/sandbox.h"
#include "sandbox/sandbox_test_util.h"

namespace bitroll::sandbox {
namespace {

using testing::SandboxProcesses;
using testing::TestOptions;

class Hostile : public ::testing::TestWithParam<Tier> {
 protected:
  Hostile() : sb_(TestOptions()) {}
  void SetUp() override { SKIP_IF_TIER_UNAVAILABLE(sb_, GetParam()); }
  void TearDown() override {
    EXPECT_TRUE(SandboxProcesses(sb_.options()).empty()) << "a sandboxed process survived";
    if (expect_warm_) testing::ExpectWarmRunIfPooled(sb_, GetParam());
  }
  // False for a pooled case that must run cold (a process-tier run with the network on).
  bool expect_warm_ = true;
  // Tight limits for hostile code.
  Request Cmd(std::string script) {
    Request r;
    r.tier = GetParam();
    r.argv = {"sh", "-c", std::move(script)};
    r.limits.wall_seconds = 2;
    r.limits.cpu_seconds = 2;
    r.limits.memory_bytes = 128ull << 20;
    r.limits.max_processes = 32;
    r.limits.max_output_bytes = 64 << 10;
    return r;
  }
  bool IsVm() const { return GetParam() == Tier::kVm; }
  Sandbox sb_;
};

// Cases that only make sense against the host kernel (the VM guest has no host filesystem,
// pids or loopback) run on the process and container tiers only.
class HostileLocal : public Hostile {};

// A private folder of the test, removed at the end.
struct TempDir {
  std::string path;
  explicit TempDir(const std::string& tag) {
    path = std::filesystem::temp_directory_path().string() + "/bitroll-hostile-" + tag + "-" +
           std::to_string(getpid());
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

TEST_P(Hostile, ForkBomb) {
  // The bomb runs in a child (dash exits when a fork of its own fails, which would end the run
  // early), its "cannot fork" messages go nowhere (else they hit the output cap first), and the
  // parent waits with exec, which needs no fork once the bomb has used up the process limit.
  RunResult res = sb_.Run(Cmd("exec 2>/dev/null; f() { f | f & }; (f) & exec sleep 5"));
  ASSERT_NE(res.error, SandboxError::kNone) << "a fork bomb must not look like success";
  if (IsVm()) {
    EXPECT_TRUE(res.error == SandboxError::kTimeout || res.error == SandboxError::kProcessLimit)
        << res.status.ToString();
  } else if (sb_.LimitMechanism() != "rlimits") {
    EXPECT_EQ(res.error, SandboxError::kProcessLimit) << res.status.ToString();
  } else {
    EXPECT_EQ(res.error, SandboxError::kTimeout) << res.status.ToString();
  }
  EXPECT_LT(res.duration_seconds, IsVm() ? 90 : 6);
}

TEST_P(HostileLocal, MemoryBomb) {
  // Grows by 16 MiB steps against a 128 MiB limit.
  RunResult res = sb_.Run(Cmd("python3 -c \"a = []\nwhile True: a.append(bytearray(16 << 20))\""));
  EXPECT_NE(res.error, SandboxError::kNone);
  EXPECT_FALSE(res.exited && res.exit_code == 0);
  if (sb_.LimitMechanism() != "rlimits") {
    EXPECT_EQ(res.error, SandboxError::kMemory) << res.status.ToString();
  }
  EXPECT_LE(res.usage.max_rss_bytes, (128ull << 20) + (8ull << 20));
}

TEST_P(HostileLocal, BusyLoop) {
  Request r = Cmd("while :; do :; done");
  r.limits.cpu_seconds = 1;
  r.limits.wall_seconds = 1.5;
  RunResult res = sb_.Run(r);
  EXPECT_TRUE(res.error == SandboxError::kCpuTime || res.error == SandboxError::kTimeout)
      << res.status.ToString();
  EXPECT_LT(res.duration_seconds, 3.5);
}

TEST_P(Hostile, GigabyteToStdout) {
  RunResult res = sb_.Run(Cmd("head -c 1000000000 /dev/zero"));
  EXPECT_EQ(res.error, SandboxError::kOutputLimit) << res.status.ToString();
  EXPECT_TRUE(res.stdout_truncated);
  EXPECT_EQ(res.stdout_data.size(), 64u << 10);
  EXPECT_LT(res.duration_seconds, IsVm() ? 90 : 3);
}

// A TCP server on the host's loopback; Accepted() says whether anyone connected.
struct LoopbackServer {
  int fd = -1;
  int port = 0;
  LoopbackServer() {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    sockaddr_in a = {};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    listen(fd, 8);
    socklen_t len = sizeof(a);
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  ~LoopbackServer() { close(fd); }
  bool Accepted() {
    int c = accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) return false;
    close(c);
    return true;
  }
};

std::string ConnectScript(int port, bool vm) {
  std::string p = std::to_string(port);
  if (vm) return "echo x | nc -w 1 127.0.0.1 " + p + " && echo CONNECTED";
  return "python3 -c \"import socket; s=socket.create_connection(('127.0.0.1', " + p +
         "), 1); s.sendall(b'x'); print('CONNECTED')\"";
}

TEST_P(Hostile, NoTcpToHostLoopback) {
  LoopbackServer server;
  ASSERT_GT(server.port, 0);
  RunResult res = sb_.Run(Cmd(ConnectScript(server.port, IsVm())));
  EXPECT_EQ(res.stdout_data.find("CONNECTED"), std::string::npos) << res.stdout_data;
  EXPECT_FALSE(res.exited && res.exit_code == 0) << res.stderr_data;
  EXPECT_FALSE(server.Accepted()) << "the sandbox reached the host's loopback";
}

TEST_P(HostileLocal, NegativeControlNetworkAllowedDoesConnect) {
  // Shows the check above can fail: with allow_network the same script reaches the server.
  LoopbackServer server;
  Request r = Cmd(ConnectScript(server.port, false));
  r.limits.allow_network = true;
  expect_warm_ = GetParam() != Tier::kProcess;  // parked process helpers have no network
  RunResult res = sb_.Run(r);
  EXPECT_NE(res.stdout_data.find("CONNECTED"), std::string::npos) << res.stderr_data;
  EXPECT_TRUE(server.Accepted());
}

TEST_P(HostileLocal, WritesOutsideWorkdirAreRefused) {
  TempDir open_dir("open");
  chmod(open_dir.path.c_str(), 0777);  // world-writable: uid checks alone would not stop it
  std::string target = open_dir.path + "/pwned";
  std::string tmp_target = std::filesystem::temp_directory_path().string() + "/bitroll-pwned-" +
                           std::to_string(getpid());
  Request r =
      Cmd("echo x > " + target + "; echo x > " + tmp_target + "; echo inside > ok.txt; echo done");
  r.output_files = {"ok.txt"};
  RunResult res = sb_.Run(r);
  EXPECT_EQ(res.stdout_data, "done\n") << res.stderr_data;
  EXPECT_FALSE(std::filesystem::exists(target)) << "wrote into a world-writable host folder";
  EXPECT_FALSE(std::filesystem::exists(tmp_target)) << "wrote into the host's temp folder";
  std::filesystem::remove(tmp_target);
  // Control: writing inside the workdir works, so the refusals above are the sandbox's doing.
  EXPECT_EQ(res.files["ok.txt"].data, "inside\n");
}

TEST_P(HostileLocal, CannotReadWalDirOrShadow) {
  TempDir wal("wal");
  const std::string secret = "WAL-SECRET-" + std::to_string(getpid());
  std::ofstream(wal.path + "/data.mdb") << secret;
  chmod(wal.path.c_str(), 0755);
  chmod((wal.path + "/data.mdb").c_str(), 0644);  // even world-readable
  std::string shadow_head;
  {
    std::ifstream in("/etc/shadow");
    std::getline(in, shadow_head);
  }
  // /etc/debian_version stands in for the service's own configuration under /etc: only an
  // allowlist of /etc is visible.
  RunResult res =
      sb_.Run(Cmd("cat " + wal.path + "/data.mdb; ls " + wal.path +
                  "; cat /etc/shadow; cat /etc/debian_version && echo ETC-READ; echo end"));
  EXPECT_EQ(res.stdout_data.find("ETC-READ"), std::string::npos) << "read /etc/debian_version";
  EXPECT_EQ(res.stdout_data.find(secret), std::string::npos) << "read the WAL stand-in";
  EXPECT_EQ(res.stdout_data.find("data.mdb"), std::string::npos) << "listed the WAL stand-in";
  if (!shadow_head.empty()) {
    EXPECT_EQ(res.stdout_data.find(shadow_head), std::string::npos) << "read /etc/shadow";
  }
  EXPECT_NE(res.stdout_data.find("end"), std::string::npos) << res.status.ToString();
  // Control: the secret is readable from the host, so the check above can fail.
  std::ifstream in(wal.path + "/data.mdb");
  std::string back;
  std::getline(in, back);
  EXPECT_EQ(back, secret);
}

TEST_P(HostileLocal, SetsidChildDoesNotOutliveTheCall) {
  RunResult res =
      sb_.Run(Cmd("setsid sh -c 'echo $$ > pid.txt; exec sleep 30' </dev/null >/dev/null 2>&1 & "
                  "sleep 0.3; cat pid.txt; exit 0"));
  ASSERT_EQ(res.error, SandboxError::kNone) << res.status.ToString();
  int pid = std::atoi(res.stdout_data.c_str());
  ASSERT_GT(pid, 1) << res.stdout_data << res.stderr_data;
  if (GetParam() == Tier::kProcess) {
    // Host pid: it must be gone (or, after reuse, no longer ours).
    std::ifstream status("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind("Uid:", 0) == 0) {
        unsigned long uid = std::strtoul(line.c_str() + 4, nullptr, 10);
        EXPECT_FALSE(uid >= sb_.options().uid_base &&
                     uid < sb_.options().uid_base + sb_.options().max_concurrent)
            << "setsid survivor " << pid << " still runs";
      }
    }
  }
  // TearDown checks that no process of the sandbox's uids is left (container pids are
  // namespace-local, so that is the check there).
}

std::atomic<int> g_signals{0};
void CountSignal(int) {
  g_signals.fetch_add(1);
}

TEST_P(HostileLocal, CannotSignalTheTestProcess) {
  struct sigaction sa = {}, old_term, old_usr1, old_hup;
  sa.sa_handler = CountSignal;
  sigaction(SIGTERM, &sa, &old_term);
  sigaction(SIGUSR1, &sa, &old_usr1);
  sigaction(SIGHUP, &sa, &old_hup);
  // Negative control: the counter sees a signal that does arrive.
  raise(SIGUSR1);
  EXPECT_EQ(g_signals.load(), 1);
  g_signals = 0;
  std::string me = std::to_string(getpid());
  RunResult res = sb_.Run(Cmd("kill -TERM " + me + "; kill -USR1 " + me + "; kill -HUP " + me +
                              "; kill -USR1 -1; kill -KILL " + me + "; echo tried"));
  usleep(100 * 1000);
  EXPECT_EQ(g_signals.load(), 0) << "the sandbox signalled the test process";
  EXPECT_NE(res.stdout_data.find("tried"), std::string::npos) << res.status.ToString();
  sigaction(SIGTERM, &old_term, nullptr);
  sigaction(SIGUSR1, &old_usr1, nullptr);
  sigaction(SIGHUP, &old_hup, nullptr);
}

// The fallback for machines without cgroups: RLIMIT_NPROC / RLIMIT_AS on the run's private
// uid, and the uid kill sweep instead of the cgroup sweep. Forced here with use_cgroups=false.
class HostileNoCgroup : public ::testing::TestWithParam<Tier> {
 protected:
  static SandboxOptions Options() {
    SandboxOptions o = TestOptions();
    o.use_cgroups = false;
    return o;
  }
  HostileNoCgroup() : sb_(Options()) {}
  void SetUp() override { SKIP_IF_TIER_UNAVAILABLE(sb_, GetParam()); }
  void TearDown() override {
    EXPECT_TRUE(SandboxProcesses(sb_.options()).empty()) << "a sandboxed process survived";
    testing::ExpectWarmRunIfPooled(sb_, GetParam());
  }
  Sandbox sb_;
};

TEST_P(HostileNoCgroup, ForkBombAndSetsidSurvivorAreSwept) {
  ASSERT_EQ(sb_.LimitMechanism(), "rlimits");
  Request r;
  r.tier = GetParam();
  r.argv = {"sh", "-c", "exec 2>/dev/null; f() { f | f & }; (f) & exec sleep 5"};  // see ForkBomb
  r.limits.wall_seconds = 2;
  r.limits.max_processes = 32;
  r.limits.memory_bytes = 256ull << 20;
  RunResult res = sb_.Run(r);
  EXPECT_EQ(res.error, SandboxError::kTimeout) << res.status.ToString();
  EXPECT_LT(res.duration_seconds, 6);
  EXPECT_TRUE(SandboxProcesses(sb_.options()).empty()) << "fork bomb survived the uid sweep";
  r.argv = {
      "sh", "-c",
      "setsid sh -c 'exec sleep 30' </dev/null >/dev/null 2>&1 & sleep 0.2; echo parent-done"};
  res = sb_.Run(r);
  EXPECT_EQ(res.error, SandboxError::kNone) << res.status.ToString();
  EXPECT_EQ(res.stdout_data, "parent-done\n");
}

TEST_P(HostileNoCgroup, MemoryBombIsBoundedByRlimit) {
  Request r;
  r.tier = GetParam();
  r.argv = {"python3", "-c", "a = []\nwhile True: a.append(b'x' * (16 << 20))"};
  r.limits.wall_seconds = 5;
  r.limits.memory_bytes = 128ull << 20;
  RunResult res = sb_.Run(r);
  EXPECT_FALSE(res.exited && res.exit_code == 0);
  EXPECT_NE(res.error, SandboxError::kTimeout) << "the rlimit should stop it before the wall";
  EXPECT_LE(res.usage.max_rss_bytes, (128ull << 20) + (8ull << 20));
}

INSTANTIATE_TEST_SUITE_P(Tiers, HostileNoCgroup,
                         ::testing::Values(Tier::kProcess, Tier::kContainer),
                         testing::TierParamName);

INSTANTIATE_TEST_SUITE_P(Tiers, Hostile,
                         ::testing::Values(Tier::kProcess, Tier::kContainer, Tier::kVm),
                         testing::TierParamName);
INSTANTIATE_TEST_SUITE_P(Tiers, HostileLocal, ::testing::Values(Tier::kProcess, Tier::kContainer),
                         testing::TierParamName);
// The same cases with pre-warmed helpers (SandboxOptions::prewarm on).
INSTANTIATE_TEST_SUITE_P(Pooled, HostileNoCgroup,
                         ::testing::Values(Tier::kProcess, Tier::kContainer),
                         testing::TierParamName);
INSTANTIATE_TEST_SUITE_P(Pooled, Hostile, ::testing::Values(Tier::kProcess, Tier::kContainer),
                         testing::TierParamName);
INSTANTIATE_TEST_SUITE_P(Pooled, HostileLocal, ::testing::Values(Tier::kProcess, Tier::kContainer),
                         testing::TierParamName);

}  // namespace
}  // namespace bitroll::sandbox
