// bitroll-sandbox-helper: the small binary the sandbox posix_spawns (the service never forks).
//
//   bitroll-sandbox-helper exec [options] -- ARGV...
//     Starts a new session and becomes the run's init (a child subreaper), then forks the tool
//     process, which joins the cgroups, sets rlimits, enters a private network namespace, chdirs
//     to the workdir, drops to an unprivileged uid/gid, applies Landlock and seccomp, and execs
//     ARGV with exactly the --env variables. When the tool exits the helper kills whatever is
//     left under the run's uid, reaps every orphan, and exits with the tool's exit status (or
//     dies by the same signal). With --private-root the forked child is first the init (pid 1)
//     of a new pid namespace, in new IPC and mount namespaces whose root is a read-only tmpfs
//     holding only the --landlock-ro/-rw paths (bind mounts; symlinks copied), a fresh /proc
//     and the workdir; it forks the tool, reaps in the namespace, and hands the tool's wait
//     status to the helper over a pipe (pid 1 cannot die by its own signal). Its exit kills
//     whatever is left in the namespace.
//   bitroll-sandbox-helper park [--uid N --gid N --cgroup F --workdir DIR --netns] (pre-warmed)
//     Does what does not depend on the request (closes inherited fds, new session, child
//     subreaper, and with --netns a private network namespace for itself and so for the tool),
//     then waits on fd 3, an AF_UNIX stream socket, for ONE request: a little-endian uint64 byte
//     count sent with SCM_RIGHTS fds [stdin, stdout, stderr, status, extra (optional)], then that
//     many bytes of NUL-terminated exec options (everything but the park options, ending in
//     "--" ARGV). It answers one byte 'A' on the socket once it holds the request, puts the fds
//     at 0, 1, 2, 3 (status) and --keep-fd (extra), and carries on exactly as exec. EOF on the
//     socket (the service evicts it) makes it exit 0 without running anything.
//   bitroll-sandbox-helper killuid UID
//     Becomes UID and SIGKILLs every process of that uid (kill(-1)) until none is left.
//
// Options of exec (each numeric value is decimal):
//   --workdir DIR  --uid N  --gid N  --cgroup PROCS_FILE (repeatable)
//   --cpu SECONDS  --as BYTES  --nproc N  --fsize BYTES  --nofile N
//   --netns                 unshare(CLONE_NEWNET) (requires starting as root)
//   --private-root          pid, IPC and mount namespaces with a minimal root (see exec)
//   --seccomp none|exec|bwrap
//                           exec: load the filter before exec; bwrap: write it to a memfd and
//                           replace the argument "@SECCOMP_FD@" with the memfd's number
//   --allow-sockets         do not refuse non-AF_UNIX sockets in the filter
//   --landlock-ro PATH / --landlock-rw PATH (repeatable; Landlock is applied when any is given)
//   --landlock-scope        (without the above) a Landlock domain with only its scopes (ABI 6:
//                           no abstract unix sockets or signals out of the run), for bwrap
//   --env KEY=VALUE (repeatable)   --keep-fd N (not closed; e.g. bwrap's --json-status-fd)
//
// Contract with the parent: fds 0-2 are the tool's stdio; fd 3 is a close-on-exec status pipe.
// Before exec every failure writes "helper: <what>: <why>" to fd 3 and exits 127; a successful
// exec closes fd 3 with nothing written. Every other fd (but --keep-fd) is closed.
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "sandbox/confine.h"

namespace {

[[noreturn]] void Fail(const std::string& what, int err = 0) {
  std::string msg = "helper: " + what;
  if (err != 0) msg += std::string(": ") + std::strerror(err);
  ssize_t ignored = write(3, msg.data(), msg.size());
  (void)ignored;
  _exit(127);
}

unsigned long long ToU64(const char* s, const char* what) {
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0') Fail(std::string("bad number for ") + what);
  return v;
}

void SetLimit(int resource, rlim_t soft, rlim_t hard, const char* name) {
  struct rlimit rl = {soft, hard};
  if (setrlimit(resource, &rl) != 0) Fail(std::string("setrlimit ") + name, errno);
}

// Kills every process of `uid` (but ourselves), repeatedly, for at most `iterations` rounds.
// kill(-1) returns 0 even when it only met processes it may not signal, so it cannot tell when
// none is left; callers bound it or stop it.
void SweepUidAsSelf(int iterations) {
  for (int i = 0; i < iterations; ++i) {
    if (kill(-1, SIGKILL) != 0 && errno == ESRCH) return;
    usleep(500);
  }
}

// Our live children, from /proc/self/task/<pid>/children (the helper is single-threaded).
std::vector<pid_t> Children() {
  std::vector<pid_t> kids;
  std::string path = "/proc/self/task/" + std::to_string(getpid()) + "/children";
  FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return kids;
  int pid;
  while (std::fscanf(f, "%d", &pid) == 1) kids.push_back(pid);
  std::fclose(f);
  return kids;
}

void ReapAvailable() {
  while (waitpid(-1, nullptr, WNOHANG) > 0) {
  }
}

// The helper's init loop: wait for the tool, then sweep what it left and reap everything.
// Every process of the run is a descendant of the helper (a child subreaper: orphans come back
// to it), so "no child but the sweeper" means nothing of the run is left.
// status_fd >= 0: the child is a pid namespace's init that writes the tool's wait status there.
int Reap(pid_t child, long long uid, int status_fd) {
  int child_status = 0;
  for (;;) {
    int st;
    pid_t p = waitpid(-1, &st, 0);
    if (p < 0 && errno == EINTR) continue;
    if (p < 0) break;
    if (p == child) {
      child_status = st;
      break;
    }
  }
  if (status_fd >= 0) {
    int tool_status = 0;
    if (read(status_fd, &tool_status, sizeof(tool_status)) == sizeof(tool_status)) {
      child_status = tool_status;
    }
    close(status_fd);
  }
  ReapAvailable();
  if (!Children().empty() && uid > 0) {
    pid_t sweeper = fork();
    if (sweeper == 0) {
      if (setgroups(0, nullptr) == 0 && setresgid(uid, uid, uid) == 0 &&
          setresuid(uid, uid, uid) == 0) {
        SweepUidAsSelf(20000);  // ~10 s at most; normally stopped within a millisecond
      }
      _exit(0);
    }
    for (int i = 0; i < 20000; ++i) {
      ReapAvailable();
      std::vector<pid_t> kids = Children();
      if (kids.empty() || (kids.size() == 1 && kids[0] == sweeper)) break;
      usleep(500);
    }
    // Never kill(-1) as root: a failed fork (a dead pid namespace refuses new processes) leaves
    // sweeper at -1.
    if (sweeper > 0) kill(sweeper, SIGKILL);
  }
  // Reap the sweeper and every orphan until none is left.
  for (;;) {
    pid_t p = waitpid(-1, nullptr, 0);
    if (p < 0 && errno == EINTR) continue;
    if (p < 0) break;
  }
  if (WIFEXITED(child_status)) return WEXITSTATUS(child_status);
  if (WIFSIGNALED(child_status)) {
    int sig = WTERMSIG(child_status);
    signal(sig, SIG_DFL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    sigprocmask(SIG_UNBLOCK, &set, nullptr);
    kill(getpid(), sig);
    return 128 + sig;
  }
  return 127;
}

int KillUid(const char* uid_text) {
  uid_t uid = static_cast<uid_t>(ToU64(uid_text, "uid"));
  if (uid == 0) Fail("killuid refuses uid 0");
  if (setgroups(0, nullptr) != 0 || setresgid(uid, uid, uid) != 0 ||
      setresuid(uid, uid, uid) != 0) {
    Fail("killuid setresuid", errno);
  }
  // kill(-1) as `uid` reaches every process of that uid but ourselves. It reports success even
  // when it signalled nobody, so the sweep is bounded (the helper, the run's init, then reaps).
  SweepUidAsSelf(200);
  return 0;
}

// Options of exec (and of park: its own plus the request's).
struct Options {
  std::string workdir, seccomp_mode = "none";
  long long uid = -1, gid = -1, keep_fd = -1;
  long long cpu = -1, as = -1, nproc = -1, fsize = -1, nofile = 256;
  bool netns = false, allow_sockets = false, private_root = false, landlock_scope = false;
  std::vector<std::string> cgroups, env, ro, rw;
  std::vector<std::string> args;  // the command, after "--"
};

// Parses options from args[i...]. With need_command, "--" and a command must follow.
void Parse(const std::vector<std::string>& v, size_t i, bool need_command, Options* o) {
  for (; i < v.size(); ++i) {
    const std::string& a = v[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a == "--netns") {
      o->netns = true;
      continue;
    }
    if (a == "--allow-sockets") {
      o->allow_sockets = true;
      continue;
    }
    if (a == "--private-root") {
      o->private_root = true;
      continue;
    }
    if (a == "--landlock-scope") {
      o->landlock_scope = true;
      continue;
    }
    if (i + 1 >= v.size()) Fail("missing value for " + a);
    const char* val = v[++i].c_str();
    if (a == "--workdir")
      o->workdir = val;
    else if (a == "--uid")
      o->uid = static_cast<long long>(ToU64(val, "uid"));
    else if (a == "--gid")
      o->gid = static_cast<long long>(ToU64(val, "gid"));
    else if (a == "--cgroup")
      o->cgroups.push_back(val);
    else if (a == "--cpu")
      o->cpu = static_cast<long long>(ToU64(val, "cpu"));
    else if (a == "--as")
      o->as = static_cast<long long>(ToU64(val, "as"));
    else if (a == "--nproc")
      o->nproc = static_cast<long long>(ToU64(val, "nproc"));
    else if (a == "--fsize")
      o->fsize = static_cast<long long>(ToU64(val, "fsize"));
    else if (a == "--nofile")
      o->nofile = static_cast<long long>(ToU64(val, "nofile"));
    else if (a == "--seccomp")
      o->seccomp_mode = val;
    else if (a == "--landlock-ro")
      o->ro.push_back(val);
    else if (a == "--landlock-rw")
      o->rw.push_back(val);
    else if (a == "--env")
      o->env.push_back(val);
    else if (a == "--keep-fd")
      o->keep_fd = static_cast<long long>(ToU64(val, "keep-fd"));
    else
      Fail("unknown option " + a);
  }
  if (need_command) {
    if (i >= v.size()) Fail("no command after --");
    o->args.assign(v.begin() + static_cast<long>(i), v.end());
  } else if (i < v.size()) {
    Fail("park takes no command");
  }
}

// Closes every fd above 3 but keep_fd.
void CloseOtherFds(long long keep_fd) {
  if (keep_fd >= 4) {
    if (keep_fd > 4) syscall(SYS_close_range, 4u, static_cast<unsigned>(keep_fd - 1), 0u);
    syscall(SYS_close_range, static_cast<unsigned>(keep_fd + 1), ~0u, 0u);
  } else {
    syscall(SYS_close_range, 4u, ~0u, 0u);
  }
}

// New session, no core files, child subreaper, dies with the service.
void BecomeRunInit(pid_t parent) {
  if (setsid() < 0) Fail("setsid", errno);
  SetLimit(RLIMIT_CORE, 0, 0, "core");
  prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  if (getppid() != parent) Fail("the service died");
}

bool ReadFull(int fd, char* p, size_t n) {
  while (n > 0) {
    ssize_t r = read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// park: waits on fd 3 for one request; returns its options (the fds are in place).
// Exits 0 on EOF (evicted before any request).
std::vector<std::string> AwaitRequest() {
  uint64_t len = 0;
  char cbuf[CMSG_SPACE(sizeof(int) * 5)];
  struct iovec iov = {&len, sizeof(len)};
  struct msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = cbuf;
  msg.msg_controllen = sizeof(cbuf);
  ssize_t r;
  do {
    r = recvmsg(3, &msg, MSG_CMSG_CLOEXEC | MSG_WAITALL);
  } while (r < 0 && errno == EINTR);
  if (r == 0) _exit(0);
  if (r != static_cast<ssize_t>(sizeof(len))) _exit(126);  // no status pipe yet to report on
  std::vector<int> fds;
  for (struct cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      const int* p = reinterpret_cast<const int*>(CMSG_DATA(c));
      fds.assign(p, p + n);
    }
  }
  if (fds.size() < 4 || len > (64ull << 20)) _exit(126);
  std::string body(len, '\0');
  if (!ReadFull(3, body.data(), body.size())) _exit(126);
  const char ack = 'A';
  if (write(3, &ack, 1) != 1) _exit(126);
  // The received fds are all >= 4 (0-3 are taken), so these dup2s clobber none of them.
  for (int fd = 0; fd < 4; ++fd) {
    if (dup2(fds[static_cast<size_t>(fd)], fd) < 0) _exit(126);  // dup2 onto 3 closes the socket
  }
  fcntl(3, F_SETFD, FD_CLOEXEC);  // the status pipe closes on exec, as in exec mode
  std::vector<std::string> args;
  size_t start = 0;
  while (start < body.size()) {
    size_t end = body.find('\0', start);
    if (end == std::string::npos) end = body.size();
    args.push_back(body.substr(start, end - start));
    start = end + 1;
  }
  // The extra pipe goes to the --keep-fd number the request names.
  Options probe;
  for (size_t i = 0; i + 1 < args.size() && args[i] != "--"; ++i) {
    if (args[i] == "--keep-fd")
      probe.keep_fd = static_cast<long long>(ToU64(args[i + 1].c_str(), "keep-fd"));
  }
  if (fds.size() >= 5 && probe.keep_fd >= 4) {
    if (dup2(fds[4], static_cast<int>(probe.keep_fd)) < 0) Fail("dup2 extra fd", errno);
    fcntl(static_cast<int>(probe.keep_fd), F_SETFD, 0);  // kept across exec (bwrap reads it)
  }
  return args;
}

// mkdir -p of an absolute path (mode 0755).
void MakeDirs(const std::string& path) {
  for (size_t i = 1; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      std::string p = path.substr(0, i);
      if (mkdir(p.c_str(), 0755) != 0 && errno != EEXIST) Fail("mkdir " + p, errno);
    }
  }
}

// Makes the mount at `target` and every mount beneath it read-only and nosuid with one
// mount_setattr. False where the kernel lacks it (before 5.12).
bool MakeTreeReadOnly(const std::string& target) {
  struct {
    uint64_t attr_set, attr_clr, propagation, userns_fd;
  } attr = {0x1 | 0x2, 0, 0, 0};  // MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID
  if (syscall(SYS_mount_setattr, AT_FDCWD, target.c_str(), 0x8000 /* AT_RECURSIVE */, &attr,
              sizeof(attr)) == 0) {
    return true;
  }
  if (errno != ENOSYS) Fail("mount_setattr " + target, errno);
  return false;
}

void RemountReadOnly(const std::string& target, unsigned long extra) {
  if (mount(nullptr, target.c_str(), nullptr, MS_REMOUNT | MS_RDONLY | MS_NOSUID | extra,
            nullptr) != 0) {
    Fail("remount read-only " + target, errno);
  }
}

// Makes the place of host path `src` under `root`: the folder or an empty file to mount on, or a
// copy of a symlink. False when there is nothing to mount (missing, or a symlink).
bool MakeMountPoint(const std::string& root, const std::string& src) {
  struct stat st;
  if (lstat(src.c_str(), &st) != 0) return false;
  const std::string dst = root + src;
  MakeDirs(dst.substr(0, dst.rfind('/')));
  if (S_ISLNK(st.st_mode)) {
    char target[4096];
    ssize_t n = readlink(src.c_str(), target, sizeof(target) - 1);
    if (n < 0) Fail("readlink " + src, errno);
    target[n] = '\0';
    if (symlink(target, dst.c_str()) != 0 && errno != EEXIST) Fail("symlink " + dst, errno);
    return false;
  }
  if (S_ISDIR(st.st_mode)) {
    MakeDirs(dst);
  } else {
    int fd = open(dst.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) Fail("create " + dst, errno);
    close(fd);
  }
  return true;
}

void Bind(const std::string& src, const std::string& dst) {
  if (mount(src.c_str(), dst.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0) {
    Fail("bind " + src, errno);
  }
}

// In the run's init, root, single-threaded, already pid 1 of a new pid namespace: new mount and
// IPC namespaces whose root holds only what the tool may use, so that nothing else of the host
// (pathname unix sockets included) can even be named. /proc is a fresh mount of the new pid
// namespace (hiding other uids' processes); everything is read-only and nosuid but the workdir
// and the --landlock-rw devices.
void EnterPrivateRoot(const Options& o) {
  if (o.workdir.empty() || o.workdir[0] != '/') Fail("--private-root needs an absolute --workdir");
  if (unshare(CLONE_NEWNS | CLONE_NEWIPC) != 0) Fail("unshare(CLONE_NEWNS | CLONE_NEWIPC)", errno);
  // Nothing done here propagates back to the host (its mounts may be shared).
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
    Fail("make / private", errno);
  // The new root is built on a tmpfs over /tmp (of this namespace only); the workdir, which may
  // lie under /tmp, is reached through a descriptor opened before.
  int wd = open(o.workdir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (wd < 0) Fail("open " + o.workdir, errno);
  const std::string root = "/tmp";
  if (mount("bitroll-root", root.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755") !=
      0) {
    Fail("mount the root tmpfs", errno);
  }
  // 1. Read-only binds, and every mount point needed later (the root turns read-only at 2).
  std::vector<std::string> ro_targets;
  for (const std::string& p : o.ro) {
    if (p == "/proc" || !MakeMountPoint(root, p)) continue;
    Bind(p, root + p);
    ro_targets.push_back(root + p);
  }
  std::vector<std::string> rw;
  for (const std::string& p : o.rw) {
    if (p != o.workdir && MakeMountPoint(root, p)) rw.push_back(p);
  }
  MakeDirs(root + o.workdir);
  MakeDirs(root + "/proc");
  MakeDirs(root + "/dev");
  for (const char* l : {"fd", "stdin", "stdout", "stderr"}) {
    std::string target = std::string("/proc/self/fd") + (std::strcmp(l, "fd") == 0       ? ""
                                                         : std::strcmp(l, "stdin") == 0  ? "/0"
                                                         : std::strcmp(l, "stdout") == 0 ? "/1"
                                                                                         : "/2");
    if (symlink(target.c_str(), (root + "/dev/" + l).c_str()) != 0 && errno != EEXIST) {
      Fail(std::string("symlink /dev/") + l, errno);
    }
  }
  // 2. The root and the binds so far: read-only, nosuid (one call, or a remount each).
  const bool tree_read_only = MakeTreeReadOnly(root);
  if (!tree_read_only) {
    for (const std::string& t : ro_targets) RemountReadOnly(t, MS_BIND);
  }
  // 3. What stays writable, and a /proc of the new pid namespace. hidepid=2: the tool sees only
  // its own uid's processes, not this init (root, whose command line is the helper's: cgroups,
  // workdir, limits).
  for (const std::string& p : rw) Bind(p, root + p);
  const std::string wd_path = "/proc/self/fd/" + std::to_string(wd);
  if (mount(wd_path.c_str(), (root + o.workdir).c_str(), nullptr, MS_BIND, nullptr) != 0) {
    Fail("bind the workdir", errno);
  }
  close(wd);
  if (mount("proc", (root + "/proc").c_str(), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC,
            "hidepid=2") != 0) {
    Fail("mount /proc", errno);
  }
  // 4. Swap roots and drop the host's tree from this namespace.
  if (chdir(root.c_str()) != 0) Fail("chdir new root", errno);
  if (syscall(SYS_pivot_root, ".", ".") != 0) Fail("pivot_root", errno);
  if (umount2(".", MNT_DETACH) != 0) Fail("detach the host root", errno);
  if (chdir("/") != 0) Fail("chdir /", errno);
  if (!tree_read_only) RemountReadOnly("/", MS_NODEV);
}

// The pid namespace's init: reaps until the tool exits, then hands its wait status to the
// helper and exits (which kills whatever is left in the namespace).
[[noreturn]] void RunNamespaceInit(pid_t tool, int status_fd, long long keep_fd) {
  int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
  for (int fd = 0; fd <= 2; ++fd) {
    if (devnull >= 0) dup2(devnull, fd);
  }
  close(3);
  if (keep_fd >= 0) close(static_cast<int>(keep_fd));
  int tool_status = 0;
  for (;;) {
    int st;
    pid_t p = waitpid(-1, &st, 0);
    if (p < 0 && errno == EINTR) continue;
    if (p < 0) break;
    if (p == tool) {
      tool_status = st;
      break;
    }
  }
  ssize_t ignored = write(status_fd, &tool_status, sizeof(tool_status));
  (void)ignored;
  _exit(0);
}

}  // namespace

int main(int argc, char** argv) {
  if (fcntl(3, F_SETFD, FD_CLOEXEC) != 0) {
    // No status pipe: run by hand. Keep going; failures then only show in the exit code.
  }
  const pid_t parent = getppid();
  if (argc >= 3 && std::strcmp(argv[1], "killuid") == 0) return KillUid(argv[2]);
  const bool park = argc >= 2 && std::strcmp(argv[1], "park") == 0;
  if (argc < 2 || (!park && std::strcmp(argv[1], "exec") != 0)) {
    Fail("usage: exec [options] -- ARGV | park [options]");
  }
  std::vector<std::string> cli(argv, argv + argc);
  Options o;
  if (park) {
    Parse(cli, 2, false, &o);
    // Everything that does not depend on the request, then wait for it.
    CloseOtherFds(-1);
    BecomeRunInit(parent);
    if (o.netns && unshare(CLONE_NEWNET) != 0) _exit(126);
    o.netns = false;  // done: the tool inherits the namespace
    const Options parked = o;
    std::vector<std::string> req = AwaitRequest();
    Parse(req, 0, true, &o);
    // The slot was fixed at park time: a request may not move it.
    if (o.netns || o.uid != parked.uid || o.gid != parked.gid || o.workdir != parked.workdir ||
        o.cgroups != parked.cgroups) {
      Fail("--netns, --uid, --gid, --workdir and --cgroup come with park, not with the request");
    }
    CloseOtherFds(o.keep_fd);
  } else {
    Parse(cli, 2, true, &o);
    // Nothing the service had open leaks into the sandbox.
    CloseOtherFds(o.keep_fd);
    BecomeRunInit(parent);
  }
  const std::string& workdir = o.workdir;
  const std::string& seccomp_mode = o.seccomp_mode;
  const long long uid = o.uid, gid = o.gid, keep_fd = o.keep_fd;
  const long long cpu = o.cpu, as = o.as, nproc = o.nproc, fsize = o.fsize, nofile = o.nofile;
  const bool netns = o.netns, allow_sockets = o.allow_sockets;
  const std::vector<std::string>& cgroups = o.cgroups;
  std::vector<std::string>& env = o.env;
  const std::vector<std::string>& ro = o.ro;
  const std::vector<std::string>& rw = o.rw;
  std::vector<std::string>& args = o.args;

  // The helper stays as the run's init: a child subreaper that reaps every orphan of the tool
  // (so no zombie is left to a pid 1 that may not reap), sweeps survivors once the tool has
  // exited, and exits with the tool's status. Only the child joins the cgroups and drops
  // privileges, so a cgroup or uid sweep never hits the helper itself.
  const pid_t helper_pid = getpid();
  int status_pipe[2] = {-1, -1};  // --private-root: the namespace init -> the helper
  if (o.private_root) {
    if (unshare(CLONE_NEWPID) != 0) Fail("unshare(CLONE_NEWPID)", errno);
    if (pipe2(status_pipe, O_CLOEXEC) != 0) Fail("pipe2", errno);
  }
  pid_t child = fork();
  if (child < 0) Fail("fork", errno);
  if (child > 0) {
    int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
    for (int fd = 0; fd <= 2; ++fd) dup2(devnull, fd);
    close(3);
    if (keep_fd >= 0) close(static_cast<int>(keep_fd));
    if (status_pipe[1] >= 0) close(status_pipe[1]);
    return Reap(child, static_cast<long long>(uid), status_pipe[0]);
  }
  prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  // Opened now: a private root has no /sys (only the tool joins them, below).
  std::vector<int> cgroup_fds;
  for (const std::string& f : cgroups) {
    int fd = open(f.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) Fail("open " + f, errno);
    cgroup_fds.push_back(fd);
  }
  if (o.private_root) {
    // pid 1 of the new namespace: its parent, the helper, is outside it (getppid() is 0, so
    // the death check is left to PR_SET_PDEATHSIG; the service's sweep kills the tool anyway).
    close(status_pipe[0]);
    EnterPrivateRoot(o);
    pid_t tool = fork();
    if (tool < 0) Fail("fork", errno);
    if (tool > 0) RunNamespaceInit(tool, status_pipe[1], keep_fd);
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    if (getppid() != 1) Fail("the namespace init died");
  } else if (getppid() != helper_pid) {
    Fail("the helper died");
  }
  // 1. cgroups (before dropping privileges: the files belong to root). The pid is read in the
  // writer's pid namespace.
  std::string pid = std::to_string(getpid());
  for (size_t i = 0; i < cgroups.size(); ++i) {
    if (write(cgroup_fds[i], pid.data(), pid.size()) != static_cast<ssize_t>(pid.size())) {
      Fail("join cgroup " + cgroups[i], errno);
    }
    close(cgroup_fds[i]);
  }
  // 3. rlimits (hard limits too, so the tool cannot raise them back).
  if (nofile >= 0) SetLimit(RLIMIT_NOFILE, nofile, nofile, "nofile");
  if (cpu >= 0) SetLimit(RLIMIT_CPU, cpu, cpu + 1, "cpu");
  if (as >= 0) SetLimit(RLIMIT_AS, as, as, "as");
  if (nproc >= 0) SetLimit(RLIMIT_NPROC, nproc, nproc, "nproc");
  if (fsize >= 0) SetLimit(RLIMIT_FSIZE, fsize, fsize, "fsize");
  // 4. No network: a fresh network namespace has only a down loopback.
  if (netns && unshare(CLONE_NEWNET) != 0) Fail("unshare(CLONE_NEWNET)", errno);
  if (!workdir.empty() && chdir(workdir.c_str()) != 0) Fail("chdir " + workdir, errno);
  // 5. Unprivileged uid/gid (RLIMIT_NPROC is ignored for root).
  if (gid >= 0) {
    if (setgroups(0, nullptr) != 0) Fail("setgroups", errno);
    if (setresgid(gid, gid, gid) != 0) Fail("setresgid", errno);
  }
  if (uid >= 0 && setresuid(uid, uid, uid) != 0) Fail("setresuid", errno);
  // Dies with the helper (set again after the uid change, which clears it).
  prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) Fail("no_new_privs", errno);
  // 6. Landlock.
  if (!ro.empty() || !rw.empty()) {
    bitroll::sandbox::LandlockPolicy lp;
    lp.read_only = ro;
    lp.read_write = rw;
    lp.deny_tcp = !allow_sockets;
    std::string err = bitroll::sandbox::ApplyLandlock(lp);
    if (!err.empty()) Fail("landlock: " + err);
  } else if (o.landlock_scope) {
    bitroll::sandbox::LandlockPolicy lp;
    lp.handle_fs = false;
    std::string err = bitroll::sandbox::ApplyLandlock(lp);
    if (!err.empty() && err != "unsupported") Fail("landlock: " + err);
  }
  // 7. seccomp: last, because it refuses calls the steps above make.
  bitroll::sandbox::SeccompPolicy sp;
  sp.deny_network_sockets = !allow_sockets;
  if (seccomp_mode == "exec") {
    std::string err = bitroll::sandbox::LoadSeccomp(sp);
    if (!err.empty()) Fail(err);
  } else if (seccomp_mode == "bwrap") {
    int fd = static_cast<int>(syscall(SYS_memfd_create, "bitroll-seccomp", 0u));
    if (fd < 0) Fail("memfd_create", errno);
    std::string err = bitroll::sandbox::ExportSeccomp(sp, fd);
    if (!err.empty()) Fail(err);
    for (std::string& a : args) {
      if (a == "@SECCOMP_FD@") a = std::to_string(fd);
    }
  } else if (seccomp_mode != "none") {
    Fail("unknown --seccomp mode " + seccomp_mode);
  }

  std::vector<char*> cargv, cenv;
  for (std::string& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  std::string path = "/usr/local/bin:/usr/bin:/bin";
  for (std::string& e : env) {
    cenv.push_back(e.data());
    if (e.rfind("PATH=", 0) == 0) path = e.substr(5);
  }
  cenv.push_back(nullptr);
  // execvpe searches the PATH of *our* environment; point it at the tool's PATH.
  setenv("PATH", path.c_str(), 1);
  execvpe(cargv[0], cargv.data(), cenv.data());
  Fail("exec " + args[0], errno);
}
