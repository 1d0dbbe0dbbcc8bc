#include "sandbox/spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "sandbox/cgroup.h"

namespace bitroll::sandbox {
namespace {

using Clock = std::chrono::steady_clock;

struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { Close(); }
  void Close() {
    if (fd >= 0) close(fd);
    fd = -1;
  }
};

bool MakePipe(Fd* r, Fd* w) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) return false;
  r->fd = p[0];
  w->fd = p[1];
  return true;
}

double Seconds(const struct timeval& tv) {
  return tv.tv_sec + tv.tv_usec * 1e-6;
}

// Blocks SIGPIPE on this thread for the scope; a SIGPIPE raised by our own writes is discarded.
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, &old_);
  }
  ~SigpipeGuard() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    struct timespec zero = {0, 0};
    while (sigtimedwait(&set, nullptr, &zero) > 0) {
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }

 private:
  sigset_t old_;
};

// Runs `helper killuid uid` and waits for it.
void SweepUid(const std::string& helper, uint32_t uid) {
  std::string uid_text = std::to_string(uid);
  char* argv[] = {const_cast<char*>(helper.c_str()), const_cast<char*>("killuid"), uid_text.data(),
                  nullptr};
  char* envp[] = {nullptr};
  pid_t pid;
  if (posix_spawn(&pid, helper.c_str(), nullptr, nullptr, argv, envp) != 0) return;
  int status;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
}

// Reads what is available from fd into buf, up to cap bytes kept. Returns false at EOF/error.
bool Drain(int fd, std::string* buf, uint64_t cap, bool* truncated, bool* overflow) {
  char chunk[65536];
  for (;;) {
    ssize_t n = read(fd, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return true;
    if (n <= 0) return false;
    uint64_t room = cap > buf->size() ? cap - buf->size() : 0;
    if (static_cast<uint64_t>(n) > room) {
      buf->append(chunk, room);
      *truncated = true;
      *overflow = true;
      return false;  // stop reading: the run is being killed
    }
    buf->append(chunk, static_cast<size_t>(n));
  }
}

// Hands the request (argv[1...]) and the child's pipe ends to a parked helper and waits for its
// one-byte acknowledgement. Returns "" or why the helper did not take it.
std::string SendRequest(const ParkedHelper& h, const std::vector<std::string>& argv,
                        const std::vector<int>& fds) {
  std::string body;
  for (size_t i = 1; i < argv.size(); ++i) {
    body += argv[i];
    body.push_back('\0');
  }
  uint64_t len = body.size();
  char cbuf[CMSG_SPACE(sizeof(int) * 5)] = {};
  struct iovec iov = {&len, sizeof(len)};
  struct msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = cbuf;
  msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
  struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
  std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  ssize_t n;
  do {
    n = sendmsg(h.sock, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(sizeof(len))) {
    return std::string("parked helper: send: ") + (n < 0 ? std::strerror(errno) : "short write");
  }
  size_t off = 0;
  while (off < body.size()) {
    n = send(h.sock, body.data() + off, body.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return std::string("parked helper: send: ") + std::strerror(errno);
    off += static_cast<size_t>(n);
  }
  // The acknowledgement, or EOF when the helper died first. Bounded: a parked helper answers
  // at once unless the machine is stalled.
  struct pollfd p = {h.sock, POLLIN, 0};
  int pr;
  do {
    pr = poll(&p, 1, 10000);
  } while (pr < 0 && errno == EINTR);
  char ack = 0;
  if (pr <= 0 || read(h.sock, &ack, 1) != 1 || ack != 'A') {
    return "parked helper: no acknowledgement (it died or stalled before the request)";
  }
  return "";
}

// The helper starts with every signal at its default disposition and none blocked, whatever the
// spawning thread had.
void InitHelperSpawnAttr(posix_spawnattr_t* attr) {
  posix_spawnattr_init(attr);
  sigset_t empty, all;
  sigemptyset(&empty);
  sigfillset(&all);
  posix_spawnattr_setsigmask(attr, &empty);
  posix_spawnattr_setsigdefault(attr, &all);
  posix_spawnattr_setflags(attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
}

// argv for posix_spawn: pointers into `args` (which must outlive them), null-terminated.
std::vector<char*> ArgvPointers(const std::vector<std::string>& args) {
  std::vector<char*> out;
  for (const std::string& a : args) out.push_back(const_cast<char*>(a.c_str()));
  out.push_back(nullptr);
  return out;
}

}  // namespace

std::string SpawnParked(const std::vector<std::string>& argv, ParkedHelper* out) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return std::string("socketpair: ") + std::strerror(errno);
  }
  Fd mine(sv[0]), theirs(sv[1]);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  for (int fd = 0; fd <= 2; ++fd) {
    posix_spawn_file_actions_addopen(&fa, fd, "/dev/null", fd == 0 ? O_RDONLY : O_WRONLY, 0);
  }
  posix_spawn_file_actions_adddup2(&fa, theirs.fd, 3);
  posix_spawnattr_t attr;
  InitHelperSpawnAttr(&attr);
  std::vector<char*> args = ArgvPointers(argv);
  char* envp[] = {nullptr};
  pid_t pid = -1;
  int rc = posix_spawn(&pid, args[0], &fa, &attr, args.data(), envp);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return "posix_spawn " + argv[0] + ": " + std::strerror(rc);
  out->pid = pid;
  out->pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  out->sock = mine.fd;
  mine.fd = -1;
  return "";
}

bool ParkedAlive(const ParkedHelper& h) {
  if (h.pid <= 0) return false;
  if (h.pidfd >= 0) {
    struct pollfd p = {h.pidfd, POLLIN, 0};
    return poll(&p, 1, 0) == 0;
  }
  siginfo_t si = {};
  return !(waitid(P_PID, h.pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == h.pid);
}

void CloseParked(ParkedHelper* h) {
  if (h->pid > 0) {
    kill(h->pid, SIGKILL);  // still our unreaped child: the pid cannot have been reused
    int status;
    while (waitpid(h->pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  if (h->pidfd >= 0) close(h->pidfd);
  if (h->sock >= 0) close(h->sock);
  *h = ParkedHelper{};
}

namespace {

// The pipes of one run: the child's stdin, stdout, stderr, the helper's status pipe (fd 3) and
// the optional extra pipe (SpawnSpec::extra_fd). *_r is the read end, *_w the write end.
struct RunPipes {
  Fd in_r, in_w, out_r, out_w, err_r, err_w, st_r, st_w, ex_r, ex_w;

  bool Open(bool extra) {
    return MakePipe(&in_r, &in_w) && MakePipe(&out_r, &out_w) && MakePipe(&err_r, &err_w) &&
           MakePipe(&st_r, &st_w) && (!extra || MakePipe(&ex_r, &ex_w));
  }
};

// Starts the helper (posix_spawn, or the request handed to spec.parked) on the child ends of
// `pp`, then closes those ends here, sets *pid and *pidfd (-1 without pidfd_open) and makes the
// parent ends non-blocking. *start is the run's start time. Returns false with o->start_error
// (and o->parked_lost for a parked helper that did not take the request) when nothing started.
bool StartHelper(const SpawnSpec& spec, RunPipes* pp, Clock::time_point* start, pid_t* pid,
                 Fd* pidfd, SpawnOutcome* o) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, pp->in_r.fd, 0);
  posix_spawn_file_actions_adddup2(&fa, pp->out_w.fd, 1);
  posix_spawn_file_actions_adddup2(&fa, pp->err_w.fd, 2);
  posix_spawn_file_actions_adddup2(&fa, pp->st_w.fd, 3);
  if (spec.extra_fd >= 0) posix_spawn_file_actions_adddup2(&fa, pp->ex_w.fd, spec.extra_fd);
  posix_spawnattr_t attr;
  InitHelperSpawnAttr(&attr);

  std::vector<char*> argv = ArgvPointers(spec.argv);
  char* envp[] = {nullptr};
  *start = Clock::now();
  int rc = 0;
  if (spec.parked != nullptr) {
    ParkedHelper* h = spec.parked;
    std::vector<int> fds = {pp->in_r.fd, pp->out_w.fd, pp->err_w.fd, pp->st_w.fd};
    if (spec.extra_fd >= 0) fds.push_back(pp->ex_w.fd);
    std::string err = SendRequest(*h, spec.argv, fds);
    close(h->sock);
    h->sock = -1;
    if (!err.empty()) {
      CloseParked(h);
      posix_spawn_file_actions_destroy(&fa);
      posix_spawnattr_destroy(&attr);
      o->start_error = err;
      o->parked_lost = true;
      return false;
    }
    *pid = h->pid;
    pidfd->fd = h->pidfd;
    *h = ParkedHelper{};  // ours now: reaped by the caller
  } else {
    rc = posix_spawn(pid, argv[0], &fa, &attr, argv.data(), envp);
  }
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  pp->in_r.Close();
  pp->out_w.Close();
  pp->err_w.Close();
  pp->st_w.Close();
  pp->ex_w.Close();
  if (rc != 0) {
    o->start_error = "posix_spawn " + spec.argv[0] + ": " + std::strerror(rc);
    return false;
  }
  if (spec.parked == nullptr) pidfd->fd = static_cast<int>(syscall(SYS_pidfd_open, *pid, 0));
  for (int fd : {pp->in_w.fd, pp->out_r.fd, pp->err_r.fd, pp->ex_r.fd}) {
    if (fd >= 0) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  }
  if (spec.stdin_data.empty()) pp->in_w.Close();
  return true;
}

// Feeds stdin and reads the outputs until the helper has exited and its pipes are closed (or a
// 200 ms grace after its exit), enforcing the wall-time and output limits. Returns whether the run
// was killed (timeout or output overflow).
bool WatchRun(const SpawnSpec& spec, RunPipes* pp, pid_t pid, int pidfd, Clock::time_point start,
              SpawnOutcome* o) {
  // Kills the tool and everything it started, but not the helper: the helper reaps them and
  // then exits. If it has not within 3 s, it is killed too.
  auto helper_deadline = Clock::time_point::max();
  auto kill_all = [&]() {
    if (spec.cgroup != nullptr) spec.cgroup->KillAll();
    if (spec.sweep_uid != 0) SweepUid(spec.argv[0], spec.sweep_uid);
    helper_deadline = Clock::now() + std::chrono::seconds(3);
  };
  const auto deadline =
      start + std::chrono::microseconds(static_cast<int64_t>(spec.wall_seconds * 1e6));
  Fd& in_w = pp->in_w;
  const int out_r = pp->out_r.fd, err_r = pp->err_r.fd, ex_r = pp->ex_r.fd;
  size_t stdin_off = 0;
  bool child_done = false;
  bool killed = false;
  bool out_open = true, err_open = true, ex_open = ex_r >= 0;
  auto grace_end = Clock::time_point::max();
  while (true) {
    if (child_done && ((!out_open && !err_open && !ex_open) || Clock::now() >= grace_end)) break;
    struct pollfd p[5];
    int n = 0;
    int i_in = -1, i_out = -1, i_err = -1, i_ex = -1, i_pid = -1;
    if (in_w.fd >= 0 && !child_done) p[i_in = n++] = {in_w.fd, POLLOUT, 0};
    if (out_open) p[i_out = n++] = {out_r, POLLIN, 0};
    if (err_open) p[i_err = n++] = {err_r, POLLIN, 0};
    if (ex_open) p[i_ex = n++] = {ex_r, POLLIN, 0};
    if (!child_done && pidfd >= 0) p[i_pid = n++] = {pidfd, POLLIN, 0};
    auto now = Clock::now();
    auto until = child_done ? grace_end : (killed ? helper_deadline : deadline);
    int timeout_ms;
    if (!child_done && pidfd < 0) {
      timeout_ms = 2;  // no pidfd: poll the child with waitid
    } else {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - now).count() + 1;
      timeout_ms = static_cast<int>(std::clamp<int64_t>(left, 0, 1000));
    }
    int pr = poll(p, n, timeout_ms);
    if (pr < 0 && errno != EINTR) {
      // Cannot watch the run any more: end it so the wait4 of the caller returns.
      if (!child_done) {
        kill_all();
        kill(pid, SIGKILL);
      }
      break;
    }
    if (i_in >= 0 && (p[i_in].revents & (POLLOUT | POLLERR | POLLHUP))) {
      ssize_t w = write(in_w.fd, spec.stdin_data.data() + stdin_off,
                        std::min<size_t>(spec.stdin_data.size() - stdin_off, 65536));
      if (w > 0) stdin_off += static_cast<size_t>(w);
      if ((w < 0 && errno != EAGAIN && errno != EINTR) || stdin_off == spec.stdin_data.size()) {
        in_w.Close();
      }
    }
    if (i_out >= 0 && p[i_out].revents) {
      out_open = Drain(out_r, &o->out, spec.max_stdout, &o->out_truncated, &o->output_overflow);
    }
    if (i_err >= 0 && p[i_err].revents) {
      err_open = Drain(err_r, &o->err, spec.max_stderr, &o->err_truncated, &o->output_overflow);
    }
    if (i_ex >= 0 && p[i_ex].revents) {
      bool t = false, f = false;
      ex_open = Drain(ex_r, &o->extra, 1 << 16, &t, &f);
    }
    if (o->output_overflow && !killed) {
      killed = true;
      kill_all();
    }
    bool exited_now = false;
    if (!child_done) {
      if (pidfd >= 0) {
        exited_now = i_pid >= 0 && (p[i_pid].revents & POLLIN);
      } else {
        siginfo_t si = {};
        exited_now = waitid(P_PID, pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == pid;
      }
    }
    if (exited_now) {
      // The helper swept and reaped the run; the cgroup sweep is a second line.
      child_done = true;
      if (spec.cgroup != nullptr) spec.cgroup->KillAll();
      grace_end = Clock::now() + std::chrono::milliseconds(200);
      in_w.Close();
    } else if (!child_done && Clock::now() >= deadline && !killed) {
      o->timed_out = true;
      killed = true;
      kill_all();
    } else if (!child_done && Clock::now() >= helper_deadline) {
      kill(pid, SIGKILL);  // last resort: the helper did not finish its sweep
      helper_deadline = Clock::time_point::max();
    }
  }
  return killed;
}

// Reaps the helper and fills the outcome: exit status, resource usage, and the status pipe
// (`st_r`), which is empty when the helper exec'd the command.
void ReapHelper(const SpawnSpec& spec, pid_t pid, bool killed, Clock::time_point start, int st_r,
                SpawnOutcome* o) {
  struct rusage ru = {};
  int status = 0;
  while (wait4(pid, &status, 0, &ru) < 0 && errno == EINTR) {
  }
  o->wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (spec.sweep_uid != 0 && !WIFEXITED(status) && WTERMSIG(status) == SIGKILL && killed) {
    SweepUid(spec.argv[0], spec.sweep_uid);  // the helper may have died before its sweep
  }
  if (WIFEXITED(status)) {
    o->exited = true;
    o->exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    o->term_signal = WTERMSIG(status);
  }
  o->cpu_seconds = Seconds(ru.ru_utime) + Seconds(ru.ru_stime);
  o->max_rss_bytes = static_cast<uint64_t>(ru.ru_maxrss) * 1024;
  std::string st;
  char buf[1024];
  for (;;) {
    ssize_t r = read(st_r, buf, sizeof(buf));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    st.append(buf, static_cast<size_t>(r));
  }
  if (!st.empty()) {
    o->start_error = st;
    return;
  }
  o->started = true;
}

}  // namespace

SpawnOutcome SpawnAndWait(const SpawnSpec& spec) {
  SpawnOutcome o;
  SigpipeGuard sigpipe_guard;
  RunPipes pp;
  if (!pp.Open(spec.extra_fd >= 0)) {
    o.start_error = std::string("pipe2: ") + std::strerror(errno);
    if (spec.parked != nullptr) CloseParked(spec.parked);
    return o;
  }
  Clock::time_point start;
  pid_t pid = -1;
  Fd pidfd;
  if (!StartHelper(spec, &pp, &start, &pid, &pidfd, &o)) return o;
  const bool killed = WatchRun(spec, &pp, pid, pidfd.fd, start, &o);
  ReapHelper(spec, pid, killed, start, pp.st_r.fd, &o);
  return o;
}

}  // namespace bitroll::sandbox
