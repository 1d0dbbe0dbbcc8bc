// bitroll-sandbox-helper: the small binary the sandbox posix_spawns (the service never forks).
//
//   bitroll-sandbox-helper exec [options] -- ARGV...
//     Starts a new session and becomes the run's init (a child subreaper), then forks the tool
//     process, which joins the cgroups, sets rlimits, enters a private network namespace, chdirs
//     to the workdir, drops to an unprivileged uid/gid, applies Landlock and seccomp, and execs
//     ARGV with exactly the --env variables. When the tool exits the helper kills whatever is
//     left under the run's uid, reaps every orphan, and exits with the tool's exit status (or
//     dies by the same signal).
//   bitroll-sandbox-helper killuid UID
//     Becomes UID and SIGKILLs every process of that uid (kill(-1)) until none is left.
//
// Options of exec (each numeric value is decimal):
//   --workdir DIR  --uid N  --gid N  --cgroup PROCS_FILE (repeatable)
//   --cpu SECONDS  --as BYTES  --nproc N  --fsize BYTES  --nofile N
//   --netns                 unshare(CLONE_NEWNET) (requires starting as root)
//   --seccomp none|exec|bwrap
//                           exec: load the filter before exec; bwrap: write it to a memfd and
//                           replace the argument "@SECCOMP_FD@" with the memfd's number
//   --allow-sockets         do not refuse non-AF_UNIX sockets in the filter
//   --landlock-ro PATH / --landlock-rw PATH (repeatable; Landlock is applied when any is given)
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
#include <sys/prctl.h>
#include <sys/resource.h>
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
int Reap(pid_t child, long long uid) {
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
    kill(sweeper, SIGKILL);
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

}  // namespace

int main(int argc, char** argv) {
  if (fcntl(3, F_SETFD, FD_CLOEXEC) != 0) {
    // No status pipe: run by hand. Keep going; failures then only show in the exit code.
  }
  const pid_t parent = getppid();
  if (argc >= 3 && std::strcmp(argv[1], "killuid") == 0) return KillUid(argv[2]);
  if (argc < 2 || std::strcmp(argv[1], "exec") != 0) Fail("usage: exec [options] -- ARGV");

  std::string workdir, seccomp_mode = "none";
  long long uid = -1, gid = -1, keep_fd = -1;
  long long cpu = -1, as = -1, nproc = -1, fsize = -1, nofile = 256;
  bool netns = false, allow_sockets = false;
  std::vector<std::string> cgroups, env, ro, rw;
  int i = 2;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a == "--netns") {
      netns = true;
      continue;
    }
    if (a == "--allow-sockets") {
      allow_sockets = true;
      continue;
    }
    if (i + 1 >= argc) Fail("missing value for " + a);
    const char* v = argv[++i];
    if (a == "--workdir")
      workdir = v;
    else if (a == "--uid")
      uid = static_cast<long long>(ToU64(v, "uid"));
    else if (a == "--gid")
      gid = static_cast<long long>(ToU64(v, "gid"));
    else if (a == "--cgroup")
      cgroups.push_back(v);
    else if (a == "--cpu")
      cpu = static_cast<long long>(ToU64(v, "cpu"));
    else if (a == "--as")
      as = static_cast<long long>(ToU64(v, "as"));
    else if (a == "--nproc")
      nproc = static_cast<long long>(ToU64(v, "nproc"));
    else if (a == "--fsize")
      fsize = static_cast<long long>(ToU64(v, "fsize"));
    else if (a == "--nofile")
      nofile = static_cast<long long>(ToU64(v, "nofile"));
    else if (a == "--seccomp")
      seccomp_mode = v;
    else if (a == "--landlock-ro")
      ro.push_back(v);
    else if (a == "--landlock-rw")
      rw.push_back(v);
    else if (a == "--env")
      env.push_back(v);
    else if (a == "--keep-fd")
      keep_fd = static_cast<long long>(ToU64(v, "keep-fd"));
    else
      Fail("unknown option " + a);
  }
  if (i >= argc) Fail("no command after --");
  std::vector<std::string> args(argv + i, argv + argc);

  // Nothing the service had open leaks into the sandbox.
  if (keep_fd >= 4) {
    if (keep_fd > 4) syscall(SYS_close_range, 4u, static_cast<unsigned>(keep_fd - 1), 0u);
    syscall(SYS_close_range, static_cast<unsigned>(keep_fd + 1), ~0u, 0u);
  } else {
    syscall(SYS_close_range, 4u, ~0u, 0u);
  }

  // The helper stays as the run's init: a child subreaper that reaps every orphan of the tool
  // (so no zombie is left to a pid 1 that may not reap), sweeps survivors once the tool has
  // exited, and exits with the tool's status. Only the child joins the cgroups and drops
  // privileges, so a cgroup or uid sweep never hits the helper itself.
  if (setsid() < 0) Fail("setsid", errno);
  SetLimit(RLIMIT_CORE, 0, 0, "core");
  prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  if (getppid() != parent) Fail("the service died");
  const pid_t helper_pid = getpid();
  pid_t child = fork();
  if (child < 0) Fail("fork", errno);
  if (child > 0) {
    int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
    for (int fd = 0; fd <= 2; ++fd) dup2(devnull, fd);
    close(3);
    if (keep_fd >= 0) close(static_cast<int>(keep_fd));
    return Reap(child, static_cast<long long>(uid));
  }
  prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  if (getppid() != helper_pid) Fail("the helper died");
  // 1. cgroups (before dropping privileges: the files belong to root).
  std::string pid = std::to_string(getpid());
  for (const std::string& f : cgroups) {
    int fd = open(f.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) Fail("open " + f, errno);
    if (write(fd, pid.data(), pid.size()) != static_cast<ssize_t>(pid.size())) {
      Fail("join cgroup " + f, errno);
    }
    close(fd);
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
