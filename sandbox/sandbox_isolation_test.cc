// The isolation suite: what one run can learn about, or leave for, the host and other runs.
// Regression tests for an outside review that used only sandbox/sandbox.h as a hostile tenant:
// IPC objects that outlive a run, the host's and a concurrent run's command lines, the host's
// pathname unix sockets, a run's total disk use, and a directory tree deeper than the
// descriptor limit surviving cleanup. Each case has a control showing that its check can fail.
//
// Process and container tiers. The VM tier is not instantiated: every VM run boots its own
// kernel in its own QEMU process, so it shares no IPC, pid or filesystem namespace with the host
// or with other runs, and its files live in guest RAM bounded by Limits::memory_bytes.
#include <dirent.h>
#include <fcntl.h>
#include <sys/ipc.h>
#include <sys/msg.h>
#include <sys/resource.h>
#include <sys/sem.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "sandbox/sandbox.h"
#include "sandbox/sandbox_test_util.h"

namespace bitroll::sandbox {
namespace {

using testing::SandboxProcesses;
using testing::TestOptions;

// A private folder of the test (world-traversable), removed at the end.
struct TempDir {
  std::string path;
  explicit TempDir(const std::string& tag) {
    path = std::filesystem::temp_directory_path().string() + "/bitroll-iso-" + tag + "-" +
           std::to_string(getpid());
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
    chmod(path.c_str(), 0755);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

constexpr uint64_t kDiskCap = 8ull << 20;

class Isolation : public ::testing::TestWithParam<Tier> {
 protected:
  Isolation() : root_("root"), sb_(Options(root_.path, kDiskCap)) {}
  static SandboxOptions Options(const std::string& work_root, uint64_t disk_bytes) {
    SandboxOptions o = TestOptions();
    o.work_root = work_root;
    o.work_disk_bytes = disk_bytes;
    return o;
  }
  void SetUp() override { SKIP_IF_TIER_UNAVAILABLE(sb_, GetParam()); }
  void TearDown() override {
    EXPECT_TRUE(SandboxProcesses(sb_.options()).empty()) << "a sandboxed process survived";
    testing::ExpectWarmRunIfPooled(sb_, GetParam());
  }
  Request Cmd(std::string script) {
    Request r;
    r.tier = GetParam();
    r.argv = {"sh", "-c", std::move(script)};
    r.limits.wall_seconds = 10;
    r.limits.cpu_seconds = 10;
    r.limits.memory_bytes = 256ull << 20;
    r.limits.max_processes = 32;
    r.limits.max_output_bytes = 1 << 20;
    return r;
  }
  Request Python(const std::string& program, std::vector<std::string> args = {}) {
    Request r = Cmd("");
    r.argv = {"python3", "-c", program};
    r.argv.insert(r.argv.end(), args.begin(), args.end());
    return r;
  }
  TempDir root_;
  Sandbox sb_;
};

// Item 10: SysV shm / message queue / semaphore, POSIX shm (/dev/shm) and a POSIX message
// queue made by one run, world-accessible, looked for by the next run and by the host.
constexpr const char* kIpcProgram = R"(
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
key, secret, mode = int(sys.argv[1]), sys.argv[2].encode(), sys.argv[3]
name = '/bitroll-iso-%d' % key
class Msg(ctypes.Structure):
    _fields_ = [('mtype', ctypes.c_long), ('text', ctypes.c_char * 64)]
def step(label, fn):
    try:
        print(label, fn(), flush=True)
    except Exception as e:
        print(label, 'ERR', e, flush=True)
if mode == 'put':
    def shm():
        i = libc.shmget(key, 4096, 0o1666)
        if i < 0: return 'FAIL errno %d' % ctypes.get_errno()
        p = libc.shmat(i, None, 0)
        ctypes.memmove(p, secret, len(secret))
        return 'PUT ' + ctypes.string_at(p, len(secret)).decode()
    def msg():
        q = libc.msgget(key, 0o1666)
        if q < 0: return 'FAIL errno %d' % ctypes.get_errno()
        m = Msg(1, secret)
        return 'PUT' if libc.msgsnd(q, ctypes.byref(m), 64, 0o4000) == 0 else 'FAIL'
    def sem():
        s = libc.semget(key, 1, 0o1666)
        if s < 0: return 'FAIL errno %d' % ctypes.get_errno()
        return 'PUT' if libc.semctl(s, 0, 16, 4242) == 0 else 'FAIL'  # SETVAL
    def pshm():
        fd = os.open('/dev/shm' + name, os.O_CREAT | os.O_RDWR, 0o666)
        os.write(fd, secret)
        return 'PUT'
    def mq():
        q = libc.mq_open(name.encode(), os.O_CREAT | os.O_WRONLY, 0o666, None)
        if q < 0: return 'FAIL errno %d' % ctypes.get_errno()
        return 'PUT' if libc.mq_send(q, secret, len(secret), 0) == 0 else 'FAIL'
else:
    def shm():
        i = libc.shmget(key, 0, 0)
        if i < 0: return 'none'
        p = libc.shmat(i, None, 0o10000)  # SHM_RDONLY
        return 'GOT ' + ctypes.string_at(p, len(secret)).decode(errors='replace')
    def msg():
        q = libc.msgget(key, 0)
        if q < 0: return 'none'
        m = Msg()
        n = libc.msgrcv(q, ctypes.byref(m), 64, 0, 0o4000)
        return 'GOT ' + (m.text.decode(errors='replace') if n > 0 else 'id only')
    def sem():
        s = libc.semget(key, 0, 0)
        if s < 0: return 'none'
        return 'GOT value %d' % libc.semctl(s, 0, 12)  # GETVAL
    def pshm():
        return 'GOT ' + open('/dev/shm' + name).read()
    def mq():
        q = libc.mq_open(name.encode(), os.O_RDONLY | os.O_NONBLOCK, 0, None)
        if q < 0: return 'none'
        buf = ctypes.create_string_buffer(8192)
        n = libc.mq_receive(q, buf, 8192, None)
        return 'GOT ' + (buf.raw[:n].decode(errors='replace') if n > 0 else 'queue only')
step('sysv-shm', shm)
step('sysv-msg', msg)
step('sysv-sem', sem)
step('posix-shm', pshm)
step('posix-mq', mq)
)";

// Removes (and reports) what a run left in the host's IPC namespace and /dev/shm.
std::string HostIpcLeftovers(int key) {
  std::string left;
  if (int id = shmget(key, 0, 0); id >= 0) {
    left += " sysv-shm";
    shmctl(id, IPC_RMID, nullptr);
  }
  if (int id = msgget(key, 0); id >= 0) {
    left += " sysv-msg";
    msgctl(id, IPC_RMID, nullptr);
  }
  if (int id = semget(key, 0, 0); id >= 0) {
    left += " sysv-sem";
    semctl(id, 0, IPC_RMID);
  }
  std::string name = "/bitroll-iso-" + std::to_string(key);
  if (unlink(("/dev/shm" + name).c_str()) == 0) left += " posix-shm";
  if (unlink(("/dev/mqueue" + name).c_str()) == 0) left += " posix-mq";
  return left;
}

TEST_P(Isolation, IpcObjectsDoNotOutliveTheRun) {
  const int key = 0x62720000 + (getpid() & 0xffff);
  const std::string secret = "IPC-SECRET-" + std::to_string(getpid());
  HostIpcLeftovers(key);
  RunResult put = sb_.Run(Python(kIpcProgram, {std::to_string(key), secret, "put"}));
  ASSERT_EQ(put.error, SandboxError::kNone) << put.status.ToString() << put.stderr_data;
  // Control: the objects could be made and used inside the run, so their absence below is
  // isolation, not a failure to create them.
  EXPECT_NE(put.stdout_data.find("sysv-shm PUT " + secret), std::string::npos) << put.stdout_data;
  EXPECT_NE(put.stdout_data.find("sysv-msg PUT"), std::string::npos) << put.stdout_data;
  RunResult get = sb_.Run(Python(kIpcProgram, {std::to_string(key), secret, "get"}));
  ASSERT_EQ(get.error, SandboxError::kNone) << get.status.ToString() << get.stderr_data;
  EXPECT_EQ(get.stdout_data.find("GOT"), std::string::npos)
      << "the next run found the previous run's IPC objects:\n"
      << get.stdout_data;
  EXPECT_EQ(get.stdout_data.find(secret), std::string::npos) << get.stdout_data;
  EXPECT_EQ(HostIpcLeftovers(key), "") << "IPC objects of the run are left in the host's namespace";
}

// Item 11: a run reads every /proc/*/cmdline, looking for a concurrent run's input, its helper
// and the host's processes.
TEST_P(Isolation, CannotSeeHostOrConcurrentRunProcesses) {
  const std::string secret = "CONCURRENT-SECRET-" + std::to_string(getpid());
  RunResult other;
  std::thread t([&] {
    Request r = Cmd("sleep 3");
    r.argv.push_back(secret);  // $0 of the shell: in its command line
    other = sb_.Run(r);
  });
  // Wait until the concurrent run is up (the host sees it).
  bool seen = false;
  for (int i = 0; i < 400 && !seen; ++i) {
    for (const auto& e : std::filesystem::directory_iterator("/proc")) {
      std::ifstream in(e.path() / "cmdline");
      std::string cmd((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (cmd.find(secret) != std::string::npos && cmd.find("sleep 3") != std::string::npos) {
        seen = true;
        break;
      }
    }
    if (!seen) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(seen) << "control: the concurrent run never showed up on the host";
  RunResult res = sb_.Run(Cmd("for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done"));
  t.join();
  ASSERT_EQ(res.error, SandboxError::kNone) << res.status.ToString() << res.stderr_data;
  // Control: it did read command lines (its own).
  EXPECT_NE(res.stdout_data.find("/proc/[0-9]*/cmdline"), std::string::npos) << res.stdout_data;
  EXPECT_EQ(res.stdout_data.find(secret), std::string::npos)
      << "read a concurrent run's command line:\n"
      << res.stdout_data;
  EXPECT_EQ(res.stdout_data.find("bitroll-sandbox-helper"), std::string::npos)
      << "read a helper's command line (cgroups, workdir, limits):\n"
      << res.stdout_data;
  EXPECT_EQ(res.stdout_data.find("sandbox_isolation_test"), std::string::npos)
      << "read the host's (this test's) command line:\n"
      << res.stdout_data;
  EXPECT_EQ(other.error, SandboxError::kNone) << other.status.ToString();
}

// Item 12: a world-writable pathname unix socket of the host (stream, like D-Bus or an ipc://
// endpoint; datagram, like syslog's /dev/log).
struct UnixServer {
  int stream = -1, dgram = -1;
  std::string stream_path, dgram_path;
  explicit UnixServer(const std::string& dir) {
    stream_path = dir + "/stream.sock";
    dgram_path = dir + "/dgram.sock";
    stream = Bind(SOCK_STREAM, stream_path);
    dgram = Bind(SOCK_DGRAM, dgram_path);
    listen(stream, 8);
  }
  static int Bind(int type, const std::string& path) {
    int fd = socket(AF_UNIX, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    sockaddr_un a = {};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof(a.sun_path), "%s", path.c_str());
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return -1;
    chmod(path.c_str(), 0777);
    return fd;
  }
  ~UnixServer() {
    close(stream);
    close(dgram);
  }
  bool Accepted() {
    int c = accept4(stream, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) return false;
    close(c);
    return true;
  }
  bool Received() {
    char buf[64];
    return recv(dgram, buf, sizeof(buf), 0) > 0;
  }
};

TEST_P(Isolation, HostPathnameUnixSocketsAreUnreachable) {
  TempDir dir("sock");
  chmod(dir.path.c_str(), 0777);
  UnixServer server(dir.path);
  ASSERT_GE(server.stream, 0);
  ASSERT_GE(server.dgram, 0);
  const std::string program =
      "import socket, sys\n"
      "print('tried')\n"
      "try:\n"
      "  s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.connect(sys.argv[1]);"
      " s.sendall(b'x'); print('STREAM-CONNECTED')\n"
      "except Exception as e: print('stream', e)\n"
      "try:\n"
      "  d = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); d.sendto(b'x', sys.argv[2]);"
      " print('DGRAM-SENT')\n"
      "except Exception as e: print('dgram', e)\n";
  for (bool network : {false, true}) {
    Request r = Python(program, {server.stream_path, server.dgram_path});
    r.limits.allow_network = network;
    RunResult res = sb_.Run(r);
    EXPECT_EQ(res.error, SandboxError::kNone) << res.status.ToString() << res.stderr_data;
    EXPECT_EQ(res.stdout_data.find("CONNECTED"), std::string::npos)
        << "network=" << network << ": " << res.stdout_data;
    EXPECT_EQ(res.stdout_data.find("SENT"), std::string::npos)
        << "network=" << network << ": " << res.stdout_data;
    EXPECT_FALSE(server.Accepted()) << "network=" << network << ": reached the host's socket";
    EXPECT_FALSE(server.Received()) << "network=" << network << ": reached the host's socket";
    // Control: the program ran and tried.
    EXPECT_NE(res.stdout_data.find("tried"), std::string::npos) << res.stdout_data;
  }
  // Control: the sockets do accept from the host.
  int c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a = {};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof(a.sun_path), "%s", server.stream_path.c_str());
  EXPECT_EQ(connect(c, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  close(c);
  EXPECT_TRUE(server.Accepted());
}

// The same for an abstract unix socket of the host (no path: a private network namespace hides
// it, so the case that matters is a run with the network on, which shares the host's).
TEST_P(Isolation, HostAbstractUnixSocketsAreUnreachable) {
  const std::string name = "bitroll-iso-abstract-" + std::to_string(getpid());
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  sockaddr_un a = {};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), len), 0) << std::strerror(errno);
  ASSERT_EQ(listen(fd, 8), 0);
  auto accepted = [fd] {
    int c = accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (c >= 0) close(c);
    return c >= 0;
  };
  const std::string program =
      "import socket, sys\n"
      "print('tried')\n"
      "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
      "s.connect('\\0' + sys.argv[1]); s.sendall(b'x'); print('ABSTRACT-CONNECTED')\n";
  for (bool network : {false, true}) {
    Request r = Python(program, {name});
    r.limits.allow_network = network;
    RunResult res = sb_.Run(r);
    EXPECT_NE(res.stdout_data.find("tried"), std::string::npos) << res.stderr_data;
    EXPECT_EQ(res.stdout_data.find("CONNECTED"), std::string::npos)
        << "network=" << network << ": " << res.stdout_data;
    EXPECT_FALSE(accepted()) << "network=" << network << ": reached the host's abstract socket";
  }
  // Control: the host can connect.
  int c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  EXPECT_EQ(connect(c, reinterpret_cast<sockaddr*>(&a), len), 0);
  close(c);
  EXPECT_TRUE(accepted());
  close(fd);
}

// Item 13: files each under the per-file cap (Limits::max_file_bytes) summing past the total
// cap (SandboxOptions::work_disk_bytes, 8 MiB here).
TEST_P(Isolation, TotalDiskUseIsCapped) {
  Request r =
      Cmd("for i in 1 2 3 4 5 6; do head -c 3145728 /dev/zero > f$i || echo WRITE-FAILED; done; "
          "cat f* | wc -c");
  r.limits.max_file_bytes = 4ull << 20;
  RunResult res = sb_.Run(r);
  EXPECT_EQ(res.error, SandboxError::kDiskLimit) << res.status.ToString() << res.stdout_data;
  EXPECT_EQ(res.status.code(), ErrorCode::kResourceExhausted) << res.status.ToString();
  EXPECT_NE(res.stdout_data.find("WRITE-FAILED"), std::string::npos) << res.stdout_data;
  EXPECT_LE(std::strtoull(res.stdout_data.substr(res.stdout_data.rfind("FAILED") + 6).c_str(),
                          nullptr, 10),
            kDiskCap)
      << res.stdout_data;
  // Control: the same files under the cap are fine.
  r = Cmd("for i in 1 2; do head -c 3145728 /dev/zero > f$i || echo WRITE-FAILED; done; echo ok");
  r.limits.max_file_bytes = 4ull << 20;
  res = sb_.Run(r);
  EXPECT_EQ(res.error, SandboxError::kNone) << res.status.ToString();
  EXPECT_EQ(res.stdout_data, "ok\n") << res.stderr_data;
}

int OpenFds() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

// Entries under the work root holding anything (parked helpers keep empty workdirs there).
std::vector<std::string> NonEmptyWorkdirs(const std::string& root) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(root)) {
    std::error_code ec;
    if (!std::filesystem::is_empty(e.path(), ec) || ec) out.push_back(e.path().string());
  }
  return out;
}

// Item 14: a tree deeper than the service's descriptor limit must not survive cleanup, nor
// cost the service descriptors.
void CheckDeepTreeRemoved(Sandbox& sb, Request r, const std::string& root, int depth) {
  // Pre-warmed helpers hold descriptors of the service: count with the pool full.
  const uint32_t pool =
      r.tier == Tier::kProcess ? sb.options().prewarm.process : sb.options().prewarm.container;
  ASSERT_TRUE(testing::AwaitParked(sb, r.tier, pool));
  struct rlimit old;
  getrlimit(RLIMIT_NOFILE, &old);
  struct rlimit low = {128, old.rlim_max};
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  const int fds_before = OpenFds();
  RunResult res = sb.Run(r);
  EXPECT_TRUE(testing::AwaitParked(sb, r.tier, pool));
  const int fds_after = OpenFds();
  setrlimit(RLIMIT_NOFILE, &old);
  EXPECT_EQ(res.error, SandboxError::kNone) << res.status.ToString() << res.stderr_data;
  // Control: the tree was built.
  EXPECT_EQ(res.stdout_data, "depth " + std::to_string(depth) + "\n") << res.stderr_data;
  EXPECT_EQ(fds_after, fds_before) << "the service lost descriptors";
  std::vector<std::string> left = NonEmptyWorkdirs(root);
  EXPECT_TRUE(left.empty()) << "a workdir survived: " << (left.empty() ? "" : left[0]);
  for (const std::string& p : left) {
    std::error_code ec;
    std::filesystem::remove_all(p, ec);  // best effort (deep trees may defeat it)
  }
}

// A chain of `depth` folders "d", each holding a file.
std::string DeepTree(int depth) {
  return "import os\n"
         "n = 0\n"
         "for i in range(" +
         std::to_string(depth) +
         "):\n"
         "  os.mkdir('d'); os.chdir('d'); open('f', 'w').write('x'); n += 1\n"
         "print('depth', n)\n";
}

TEST_P(Isolation, DeepTreeIsRemoved) {
  // 1200 inodes: within the 8 MiB tmpfs's 2048.
  CheckDeepTreeRemoved(sb_, Python(DeepTree(600)), root_.path, 600);
}

TEST_P(Isolation, DeepTreeIsRemovedWithoutTmpfs) {
  // work_disk_bytes = 0: a plain folder, removed by walking the tree. 2500 levels: its paths are
  // longer than PATH_MAX, so removal by path would fail too.
  TempDir root("plain");
  SandboxOptions o = Options(root.path, 0);
  o.prewarm = {0, 0};
  Sandbox sb(o);
  SKIP_IF_TIER_UNAVAILABLE(sb, GetParam());
  Request r = Python(DeepTree(2500));
  r.tier = GetParam();
  CheckDeepTreeRemoved(sb, r, root.path, 2500);
  EXPECT_TRUE(SandboxProcesses(sb.options()).empty());
  Request warm = Cmd("true");  // the pooled check wants one warm run on sb_
  EXPECT_EQ(sb_.Run(warm).error, SandboxError::kNone);
}

INSTANTIATE_TEST_SUITE_P(Tiers, Isolation, ::testing::Values(Tier::kProcess, Tier::kContainer),
                         testing::TierParamName);
// The same cases with pre-warmed helpers (SandboxOptions::prewarm on).
INSTANTIATE_TEST_SUITE_P(Pooled, Isolation, ::testing::Values(Tier::kProcess, Tier::kContainer),
                         testing::TierParamName);

}  // namespace
}  // namespace bitroll::sandbox
