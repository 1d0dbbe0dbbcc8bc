#include "sandbox/sandbox.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <mutex>
#include <thread>

#include "sandbox/sandbox_internal.h"
#include "sandbox/workdir.h"

#ifndef BITROLL_SANDBOX_HELPER_BUILD_PATH
#define BITROLL_SANDBOX_HELPER_BUILD_PATH ""
#endif

namespace bitroll::sandbox {

const char* SandboxErrorName(SandboxError error) {
  switch (error) {
    case SandboxError::kNone:
      return "none";
    case SandboxError::kTimeout:
      return "timeout";
    case SandboxError::kCpuTime:
      return "cpu_time";
    case SandboxError::kMemory:
      return "memory";
    case SandboxError::kOutputLimit:
      return "output_limit";
    case SandboxError::kProcessLimit:
      return "process_limit";
    case SandboxError::kSpawnFailure:
      return "spawn_failure";
    case SandboxError::kUnavailable:
      return "unavailable";
    case SandboxError::kInvalidArgument:
      return "invalid_argument";
    case SandboxError::kInternal:
      return "internal";
    case SandboxError::kDiskLimit:
      return "disk_limit";
  }
  return "unknown";
}

namespace {

constexpr double kMaxSeconds = 86400;  // a day: longer limits are a caller bug
// The parts of /etc a tool may read (both local tiers): never shadow, never the service's
// configuration or data. python3* holds Debian's sitecustomize.
constexpr const char* kEtcAllowlist[] = {
    "/etc/passwd",       "/etc/group",      "/etc/hosts",        "/etc/nsswitch.conf",
    "/etc/ld.so.cache",  "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime",
    "/etc/alternatives", "/etc/ssl",        "/etc/python3",      "/etc/python3.11",
    "/etc/mime.types",   "/etc/protocols",  "/etc/services"};

Status ToStatus(SandboxError e, const std::string& msg) {
  switch (e) {
    case SandboxError::kNone:
      return Status::Ok();
    case SandboxError::kTimeout:
      return Status::Timeout(msg);
    case SandboxError::kCpuTime:
    case SandboxError::kMemory:
    case SandboxError::kOutputLimit:
    case SandboxError::kProcessLimit:
    case SandboxError::kDiskLimit:
      return Status::ResourceExhausted(msg);
    case SandboxError::kSpawnFailure:
      return Status::IoError(msg);
    case SandboxError::kUnavailable:
      return Status::Unavailable(msg);
    case SandboxError::kInvalidArgument:
      return Status::InvalidArgument(msg);
    case SandboxError::kInternal:
      return Status::Internal(msg);
  }
  return Status::Internal(msg);
}

uint64_t InputBytes(const Request& req) {
  uint64_t n = 0;
  for (const auto& [name, data] : req.files) n += data.size() + 4096;  // a block at least
  return n;
}

bool IsExecutable(const std::string& p) {
  return !p.empty() && access(p.c_str(), X_OK) == 0;
}

std::string FindInPath(const std::string& name) {
  if (name.find('/') != std::string::npos) return IsExecutable(name) ? name : "";
  std::string path = kToolPath;
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find(':', start);
    if (end == std::string::npos) end = path.size();
    std::string cand = path.substr(start, end - start) + "/" + name;
    if (IsExecutable(cand)) return cand;
    start = end + 1;
  }
  return "";
}

double ThreadCpuSeconds() {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Calls fn, turning an exception into a message.
void CallHandler(const Function& fn, const Request& req, FunctionOutput* out,
                 std::string* exception) {
  try {
    fn(req, out);
  } catch (const std::exception& e) {
    *exception = e.what();
  } catch (...) {
    *exception = "unknown exception";
  }
}

}  // namespace

// One call handed to a function-tier worker; shared with the caller, which may abandon it.
struct FnTask {
  Function fn;
  Request request;
  FunctionOutput out;
  std::string exception;
  double cpu_seconds = 0;
  bool done = false;
  std::mutex mu;
  std::condition_variable cv;
};

// Pre-warmed threads for the function tier. Shared with its (possibly abandoned) workers, so it
// outlives the Sandbox while any worker still runs a handler.
struct FnPool : std::enable_shared_from_this<FnPool> {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<FnTask>> queue;
  uint32_t idle = 0;
  uint32_t abandoned = 0;
  bool stop = false;

  void StartWorker() {
    std::thread([self = shared_from_this()] { self->Loop(); }).detach();
  }
  void Loop() {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      ++idle;
      cv.wait(lock, [&] { return stop || !queue.empty(); });
      --idle;
      if (queue.empty()) return;  // stop
      std::shared_ptr<FnTask> t = std::move(queue.front());
      queue.pop_front();
      lock.unlock();
      const double c0 = ThreadCpuSeconds();
      CallHandler(t->fn, t->request, &t->out, &t->exception);
      t->cpu_seconds = ThreadCpuSeconds() - c0;
      {
        std::lock_guard<std::mutex> tl(t->mu);
        t->done = true;
      }
      t->cv.notify_all();
      lock.lock();
    }
  }
};

void SetError(RunResult* r, SandboxError e, const std::string& msg) {
  r->error = e;
  r->status = ToStatus(e, std::string(TierName(r->tier)) + " tier: " + msg);
}

// A cgroup name unique in this process (two Sandbox objects may use the same slot numbers).
std::string RunName() {
  static std::atomic<uint64_t> seq{0};
  return std::to_string(getpid()) + "-" + std::to_string(seq.fetch_add(1));
}

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

Sandbox::Sandbox(SandboxOptions options) : impl_(new Impl) {
  Impl& m = *impl_;
  m.pool = std::make_shared<FnPool>();
  m.opt = std::move(options);
  m.helper = m.opt.helper_path.empty() ? BITROLL_SANDBOX_HELPER_BUILD_PATH : m.opt.helper_path;
  std::error_code ec;
  m.work_root =
      m.opt.work_root.empty() ? std::filesystem::temp_directory_path(ec).string() : m.opt.work_root;
  if (m.opt.use_cgroups) m.cg = CgroupSupport::Detect();
  m.bwrap = FindInPath(m.opt.bwrap_path);
  m.qemu = FindInPath(m.opt.qemu_path);
  m.slot_used.assign(std::max<uint32_t>(1, m.opt.max_concurrent), false);
  m.vm_cap = m.opt.max_concurrent_vms;
  if (m.vm_cap == 0) m.vm_cap = std::max(1u, std::thread::hardware_concurrency());
  // Under load an emulated guest mis-calibrates its TSC and can hang at boot: pass the host's.
  std::string cpuinfo = ReadSmallFile("/proc/cpuinfo");
  size_t p = cpuinfo.find("cpu MHz");
  if (p != std::string::npos && (p = cpuinfo.find(':', p)) != std::string::npos) {
    double mhz = std::atof(cpuinfo.c_str() + p + 1);
    if (mhz > 100) {
      long long khz = std::llround(mhz * 1000);
      m.tsc_args = " tsc_early_khz=" + std::to_string(khz) + " lpj=" + std::to_string(khz * 4);
    }
  }
  for (uint32_t i = 0; i < m.opt.function_workers; ++i) m.pool->StartWorker();
}

Sandbox::~Sandbox() {
  impl_->PoolShutdown();
  {
    std::lock_guard<std::mutex> lock(impl_->pool->mu);
    impl_->pool->stop = true;
  }
  impl_->pool->cv.notify_all();
}

PoolStats Sandbox::Pool(Tier tier) const {
  if (tier != Tier::kProcess && tier != Tier::kContainer) return PoolStats{};
  std::lock_guard<std::mutex> lock(impl_->warm.mu);
  return impl_->warm.stats[tier == Tier::kContainer ? 1 : 0];
}

const SandboxOptions& Sandbox::options() const {
  return impl_->opt;
}
std::string Sandbox::LimitMechanism() const {
  return impl_->cg.Name();
}

Status Sandbox::Register(const std::string& name, Function fn, FunctionOptions function_options) {
  if (name.empty()) return Status::InvalidArgument("function name is empty");
  if (!fn) return Status::InvalidArgument("function '" + name + "' is null");
  std::lock_guard<std::mutex> lock(impl_->fn_mu);
  impl_->fns[name] = Registered{std::move(fn), function_options};
  return Status::Ok();
}

Status Sandbox::TierAvailable(Tier tier) {
  Impl& m = *impl_;
  if (tier == Tier::kFunction) return Status::Ok();
  if (tier == Tier::kVm) {
    if (m.opt.vm_image_dir.empty()) {
      return Status::Unavailable(
          "no VM image: set SandboxOptions::vm_image_dir and run scripts/vm-image.sh DIR");
    }
    for (const char* f : {"vmlinuz", "initramfs.cpio.gz"}) {
      std::string path = m.opt.vm_image_dir + "/" + f;
      if (access(path.c_str(), R_OK) != 0) {
        return Status::Unavailable("VM image incomplete (" + path +
                                   " missing): run scripts/vm-image.sh " + m.opt.vm_image_dir);
      }
    }
    if (m.qemu.empty()) {
      return Status::Unavailable("'" + m.opt.qemu_path +
                                 "' not found; install the Debian package qemu-system-x86");
    }
  }
  if (!IsExecutable(m.helper)) {
    return Status::Unavailable("sandbox helper not found at '" + m.helper +
                               "' (build target bitroll-sandbox-helper)");
  }
  if (geteuid() != 0) {
    return Status::Unavailable("the sandbox must run as root to drop to per-run uids");
  }
  if (tier == Tier::kContainer && m.bwrap.empty()) {
    return Status::Unavailable("bubblewrap ('" + m.opt.bwrap_path +
                               "') not found; install the Debian package bubblewrap");
  }
  if (tier == Tier::kProcess || tier == Tier::kContainer) {
    // One trivial run, once: it fails here when the kernel lacks what the tier needs (Landlock,
    // unprivileged user namespaces for bwrap, ...), and the tier is then unavailable.
    const int t = static_cast<int>(tier);
    std::call_once(m.probe_once[t], [&] {
      Request probe;
      probe.tier = tier;
      probe.argv = {"true"};
      RunResult pr;
      pr.tier = tier;
      m.RunProcessOrContainer(probe, &pr);
      if (pr.error != SandboxError::kNone || !pr.exited || pr.exit_code != 0) {
        m.probe_status[t] = Status::Unavailable(
            std::string("probe run failed on this machine: ") +
            (pr.status.ok() ? "exit " + std::to_string(pr.exit_code) + " " + pr.stderr_data
                            : pr.status.ToString()));
      }
    });
    if (m.probe_status[t].ok()) m.PoolStart(tier);
    return m.probe_status[t];
  }
  return Status::Ok();
}

RunResult Sandbox::Run(const Request& request) {
  const auto t0 = Clock::now();
  RunResult r;
  r.tier = request.tier;
  r.limits = request.limits;
  const Limits& l = request.limits;
  Status valid = ValidateFileNames(request);
  if (!valid.ok()) {
    SetError(&r, SandboxError::kInvalidArgument, valid.message());
  } else if (!(l.wall_seconds > 0 && l.wall_seconds <= kMaxSeconds) ||
             !(l.cpu_seconds > 0 && l.cpu_seconds <= kMaxSeconds) || l.memory_bytes < (1u << 20) ||
             l.max_processes == 0) {
    SetError(&r, SandboxError::kInvalidArgument,
             "limits out of range (wall, cpu in (0, 86400] s; memory >= 1 MiB; processes >= 1)");
  } else if (request.tier != Tier::kFunction && request.argv.empty()) {
    SetError(&r, SandboxError::kInvalidArgument, "argv is empty");
  } else if ((request.tier == Tier::kProcess || request.tier == Tier::kContainer) &&
             impl_->opt.work_disk_bytes > 0 && InputBytes(request) > impl_->opt.work_disk_bytes) {
    SetError(&r, SandboxError::kInvalidArgument,
             "input files take " + std::to_string(InputBytes(request)) +
                 " bytes, over the workdir's " + std::to_string(impl_->opt.work_disk_bytes) +
                 " (SandboxOptions::work_disk_bytes)");
  } else if (Status avail = TierAvailable(request.tier); !avail.ok()) {
    SetError(&r, SandboxError::kUnavailable, avail.message());
  } else {
    switch (request.tier) {
      case Tier::kFunction:
        impl_->RunFunction(request, &r);
        break;
      case Tier::kProcess:
      case Tier::kContainer:
        impl_->RunProcessOrContainer(request, &r);
        break;
      case Tier::kVm:
        impl_->RunVm(request, &r);
        break;
    }
  }
  if (r.error == SandboxError::kNone) r.status = Status::Ok();
  r.duration_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

void Sandbox::Impl::RunFunction(const Request& req, RunResult* r) {
  Registered reg;
  {
    std::lock_guard<std::mutex> lock(fn_mu);
    auto it = fns.find(req.function);
    if (it == fns.end()) {
      SetError(r, SandboxError::kInvalidArgument,
               "no function registered as '" + req.function + "'");
      return;
    }
    reg = it->second;
  }
  const auto t0 = Clock::now();
  if (reg.options.run_inline) {
    // Inline: no hand-off, no watchdog; an overrun is reported after the fact.
    FunctionOutput out;
    std::string exception;
    CallHandler(reg.fn, req, &out, &exception);
    r->usage.wall_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    r->usage.cpu_seconds = r->usage.wall_seconds;  // charged as wall: a thread clock costs more
    if (r->usage.wall_seconds > req.limits.wall_seconds) {
      return SetError(r, SandboxError::kTimeout,
                      "inline handler '" + req.function + "' took " + Num(r->usage.wall_seconds) +
                          " s, over its " + Num(req.limits.wall_seconds) +
                          " s wall limit; output dropped");
    }
    return FinishFunction(req, out, exception, r);
  }
  auto task = std::make_shared<FnTask>();
  task->fn = std::move(reg.fn);
  task->request = req;
  {
    std::lock_guard<std::mutex> lock(pool->mu);
    if (pool->abandoned >= opt.max_abandoned_functions) {
      SetError(r, SandboxError::kUnavailable,
               std::to_string(pool->abandoned) + " abandoned handlers still running");
      return;
    }
    pool->queue.push_back(task);
    if (pool->idle == 0) pool->StartWorker();
  }
  pool->cv.notify_one();
  const auto wall = std::chrono::duration<double>(req.limits.wall_seconds);
  std::unique_lock<std::mutex> tl(task->mu);
  if (!task->cv.wait_for(tl, wall, [&] { return task->done; })) {
    tl.unlock();
    r->usage.wall_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    {
      std::lock_guard<std::mutex> lock(pool->mu);
      ++pool->abandoned;
    }
    // When the handler finally returns, the worker is no longer abandoned. The check runs in a
    // watcher thread so this call returns now.
    std::thread([pool = pool, task] {
      std::unique_lock<std::mutex> l2(task->mu);
      task->cv.wait(l2, [&] { return task->done; });
      std::lock_guard<std::mutex> lock(pool->mu);
      --pool->abandoned;
    }).detach();
    SetError(r, SandboxError::kTimeout,
             "handler '" + req.function + "' overran its " + Num(req.limits.wall_seconds) +
                 " s wall limit; a C++ function cannot be killed, so its thread was abandoned");
    return;
  }
  r->usage.wall_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  r->usage.cpu_seconds = task->cpu_seconds;
  FinishFunction(req, task->out, task->exception, r);
}

void Sandbox::Impl::FinishFunction(const Request& req, FunctionOutput& out,
                                   const std::string& exception, RunResult* r) {
  if (!exception.empty()) {
    SetError(r, SandboxError::kInternal, "handler threw: " + exception);
    return;
  }
  r->exited = true;
  r->exit_code = out.exit_code;
  const uint64_t cap = req.limits.max_output_bytes;
  r->stdout_truncated = out.stdout_data.size() > cap;
  r->stderr_truncated = out.stderr_data.size() > cap;
  if (r->stdout_truncated) out.stdout_data.resize(cap);
  if (r->stderr_truncated) out.stderr_data.resize(cap);
  r->stdout_data = std::move(out.stdout_data);
  r->stderr_data = std::move(out.stderr_data);
  for (const std::string& name : req.output_files) {
    auto it = out.files.find(name);
    if (it == out.files.end()) continue;
    OutputFile f{std::move(it->second), false};
    if (f.data.size() > req.limits.max_file_bytes) {
      f.data.resize(req.limits.max_file_bytes);
      f.truncated = true;
    }
    r->files[name] = std::move(f);
  }
  if (r->stdout_truncated || r->stderr_truncated) {
    SetError(r, SandboxError::kOutputLimit,
             "output passed " + std::to_string(cap) + " bytes; kept the first bytes");
  }
}

void Sandbox::Impl::Classify(const SpawnOutcome& o, RunCgroup* cgroup, const Request& req,
                             RunResult* r) {
  const Limits& l = req.limits;
  r->exited = o.exited;
  r->exit_code = o.exit_code;
  r->term_signal = o.term_signal;
  const bool clean = o.exited && o.exit_code == 0;
  if (o.output_overflow) {
    SetError(r, SandboxError::kOutputLimit,
             "output passed " + std::to_string(l.max_output_bytes) +
                 " bytes; the run was killed and the stream marked truncated");
  } else if (cgroup != nullptr && !clean && cgroup->MemoryLimitHit()) {
    SetError(r, SandboxError::kMemory,
             "memory limit of " + std::to_string(l.memory_bytes) + " bytes reached");
  } else if (cg.memory_parent.empty() && !clean && o.max_rss_bytes >= l.memory_bytes / 10 * 9) {
    SetError(r, SandboxError::kMemory, "peak RSS reached the memory limit (RLIMIT_AS)");
  } else if (cgroup != nullptr && !clean && cgroup->PidsLimitHit()) {
    SetError(r, SandboxError::kProcessLimit,
             "process limit of " + std::to_string(l.max_processes) + " reached" +
                 (o.timed_out ? " (then the wall limit)" : ""));
  } else if (!o.exited &&
             (o.term_signal == SIGXCPU || (o.term_signal == SIGKILL && !o.timed_out &&
                                           o.cpu_seconds >= std::ceil(l.cpu_seconds)))) {
    SetError(r, SandboxError::kCpuTime, "CPU-time limit of " + Num(l.cpu_seconds) + " s reached");
  } else if (o.timed_out) {
    SetError(r, SandboxError::kTimeout,
             "wall-time limit of " + Num(l.wall_seconds) + " s passed; every process was killed");
  }
}

void Sandbox::Impl::RunProcessOrContainer(const Request& req, RunResult* r) {
  // A parked helper found dead costs nothing but the retry: the next one, or a cold start.
  while (!RunCommandOnce(req, r)) {
    *r = RunResult{};
    r->tier = req.tier;
    r->limits = req.limits;
  }
}

std::vector<std::string> Sandbox::Impl::SlotArgs(const RunSlot& rs, bool netns) const {
  std::vector<std::string> a = {
      "--uid", std::to_string(rs.uid), "--gid", std::to_string(rs.uid), "--workdir", rs.wd->path()};
  if (rs.cgroup) {
    for (const std::string& f : rs.cgroup->ProcsFiles()) a.insert(a.end(), {"--cgroup", f});
  }
  if (netns) a.push_back("--netns");
  return a;
}

std::vector<std::string> Sandbox::Impl::RequestArgs(const Request& req,
                                                    const std::string& dir) const {
  const Limits& l = req.limits;
  const bool container = req.tier == Tier::kContainer;
  std::vector<std::string> a;
  auto add = [&a](const char* k, uint64_t v) { a.insert(a.end(), {k, std::to_string(v)}); };
  add("--cpu", static_cast<uint64_t>(std::ceil(l.cpu_seconds)));
  // With a pids cgroup RLIMIT_NPROC is only a backstop, so the cgroup (which reports hits)
  // is the limit that trips.
  add("--nproc", cg.pids_parent.empty() ? l.max_processes : 2 * l.max_processes + 8);
  add("--fsize", l.max_file_bytes);
  if (cg.memory_parent.empty()) add("--as", l.memory_bytes);
  if (l.allow_network) a.push_back("--allow-sockets");
  std::vector<std::string> env = {std::string("PATH=") + kToolPath, "LANG=C.UTF-8"};
  if (!container) {
    // Process tier: new pid, IPC and mount namespaces with a minimal read-only root (the
    // Landlock folders below, a fresh /proc, the workdir), and Landlock keeps the tool to
    // read-only system folders and its workdir.
    a.insert(a.end(), {"--private-root", "--seccomp", "exec"});
    for (const char* p : {"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/opt", "/proc",
                          "/dev/urandom", "/dev/random"}) {
      a.insert(a.end(), {"--landlock-ro", p});
    }
    for (const char* p : kEtcAllowlist) a.insert(a.end(), {"--landlock-ro", p});
    for (const std::string& p : {dir, std::string("/dev/null"), std::string("/dev/zero")}) {
      a.insert(a.end(), {"--landlock-rw", p});
    }
    env.push_back("HOME=" + dir);
    env.push_back("TMPDIR=" + dir);
    env.insert(env.end(), req.env.begin(), req.env.end());
    for (const std::string& e : env) a.insert(a.end(), {"--env", e});
    a.push_back("--");
  } else {
    // Landlock scopes bwrap and the tool: no abstract unix socket of the host even with the
    // network on (--share-net), no signal out.
    a.insert(a.end(), {"--landlock-scope", "--seccomp", "bwrap", "--keep-fd", "4", "--env", env[0],
                       "--", bwrap, "--unshare-all"});
    if (l.allow_network) a.push_back("--share-net");
    a.insert(a.end(),
             {"--die-with-parent", "--cap-drop", "ALL", "--clearenv", "--new-session",
              "--json-status-fd", "4", "--seccomp", "@SECCOMP_FD@", "--ro-bind", "/usr", "/usr"});
    // Merged-/usr systems have /bin etc. as links into /usr; mirror them as links.
    for (const char* p : {"/bin", "/sbin", "/lib", "/lib32", "/lib64"}) {
      std::error_code ec;
      if (std::filesystem::is_symlink(p, ec)) {
        a.insert(a.end(), {"--symlink", std::filesystem::read_symlink(p, ec).string(), p});
      } else if (std::filesystem::exists(p, ec)) {
        a.insert(a.end(), {"--ro-bind", p, p});
      }
    }
    // An allowlist of /etc: never shadow, never the service's configuration or data.
    for (const char* p : kEtcAllowlist) a.insert(a.end(), {"--ro-bind-try", p, p});
    a.insert(
        a.end(),
        {"--proc",   "/proc",      "--dev",
         "/dev",     "--size",     std::to_string(std::min<uint64_t>(l.memory_bytes, 256ull << 20)),
         "--tmpfs",  "/tmp",       "--bind",
         dir,        "/work",      "--chdir",
         "/work",    "--hostname", "bitroll-sandbox",
         "--setenv", "PATH",       kToolPath,
         "--setenv", "HOME",       "/work",
         "--setenv", "TMPDIR",     "/tmp",
         "--setenv", "LANG",       "C.UTF-8"});
    for (const std::string& e : req.env) {
      size_t eq = e.find('=');
      if (eq == std::string::npos || eq == 0) continue;
      a.insert(a.end(), {"--setenv", e.substr(0, eq), e.substr(eq + 1)});
    }
    a.push_back("--");
  }
  a.insert(a.end(), req.argv.begin(), req.argv.end());
  return a;
}

bool Sandbox::Impl::RunCommandOnce(const Request& req, RunResult* r) {
  const Limits& l = req.limits;
  const bool container = req.tier == Tier::kContainer;
  std::unique_ptr<Parked> warm_helper = PoolTake(req);
  RunSlot cold;
  RunSlot& rs = warm_helper ? warm_helper->rs : cold;
  SpawnSpec spec;
  if (warm_helper) {
    // The slot, workdir and cgroup were made at park time: add the request's files and limits.
    Status s = rs.wd->AddFiles(req.files, rs.uid, rs.uid);
    if (s.ok() && rs.cgroup) s = rs.cgroup->SetLimits(l.memory_bytes, l.max_processes);
    if (!s.ok()) {
      SetError(r, SandboxError::kInternal, s.message());
      return true;
    }
    spec.argv = {helper};
    std::vector<std::string> ra = RequestArgs(req, rs.wd->path());
    spec.argv.insert(spec.argv.end(), ra.begin(), ra.end());
    spec.parked = &warm_helper->helper;
  } else {
    PoolCount(req.tier, &PoolStats::cold_runs);
    cold.slot = AcquireSlot();
    cold.release = [this](uint32_t s) { ReleaseSlot(s); };
    cold.uid = opt.uid_base + cold.slot;
    auto wd = Workdir::Create(work_root, cold.uid, cold.uid, req.files, opt.work_disk_bytes);
    if (!wd.ok()) {
      SetError(r, SandboxError::kInternal, wd.status().message());
      return true;
    }
    cold.wd = std::move(wd).value();
    if (cg.version > 0) {
      auto c = RunCgroup::Create(cg, RunName(), l.memory_bytes, l.max_processes);
      if (!c.ok()) {
        SetError(r, SandboxError::kInternal, c.status().message());
        return true;
      }
      cold.cgroup = std::move(c).value();
    }
    spec.argv = {helper, "exec"};
    std::vector<std::string> sa = SlotArgs(cold, !container && !l.allow_network);
    std::vector<std::string> ra = RequestArgs(req, cold.wd->path());
    spec.argv.insert(spec.argv.end(), sa.begin(), sa.end());
    spec.argv.insert(spec.argv.end(), ra.begin(), ra.end());
  }
  RunCgroup* cgroup = rs.cgroup.get();
  spec.stdin_data = req.stdin_data;
  spec.wall_seconds = l.wall_seconds;
  spec.max_stdout = l.max_output_bytes;
  spec.max_stderr = l.max_output_bytes;
  spec.cgroup = cgroup;
  spec.sweep_uid = cgroup && !cg.pids_parent.empty() ? 0 : rs.uid;
  if (container) spec.extra_fd = 4;
  SpawnOutcome o = SpawnAndWait(spec);
  if (o.parked_lost) {
    PoolCount(req.tier, &PoolStats::lost);
    return false;
  }
  if (warm_helper) PoolCount(req.tier, &PoolStats::warm_runs);
  r->usage.wall_seconds = o.wall_seconds;
  r->usage.cpu_seconds = o.cpu_seconds;
  r->usage.max_rss_bytes = std::max(o.max_rss_bytes, cgroup ? cgroup->PeakMemoryBytes() : 0);
  r->stdout_data = std::move(o.out);
  r->stderr_data = std::move(o.err);
  r->stdout_truncated = o.out_truncated;
  r->stderr_truncated = o.err_truncated;
  if (!o.started) {
    SetError(r, SandboxError::kSpawnFailure, o.start_error);
    return true;
  }
  if (container) {
    // bwrap reports {"child-pid": N} once the sandbox is up; without it bwrap itself failed.
    bool up = o.extra.find("child-pid") != std::string::npos;
    bool exec_failed =
        o.exited && o.exit_code == 1 && r->stderr_data.rfind("bwrap: execvp ", 0) == 0;
    if ((!up || exec_failed) && !o.timed_out && !o.output_overflow) {
      SetError(r, SandboxError::kSpawnFailure, "bubblewrap: " + r->stderr_data);
      return true;
    }
    // bwrap exits with 128 + N when its child dies by signal N (the shell convention).
    if (o.exited && o.exit_code > 128 && o.exit_code <= 128 + 64) {
      o.exited = false;
      o.term_signal = o.exit_code - 128;
      o.exit_code = -1;
    }
  }
  Classify(o, cgroup, req, r);
  if (r->error == SandboxError::kNone && rs.wd->Full()) {
    SetError(r, SandboxError::kDiskLimit,
             "the workdir is full: the run's files reached " + std::to_string(opt.work_disk_bytes) +
                 " bytes (or their inode count)");
  }
  r->files = rs.wd->Collect(req.output_files, l.max_file_bytes);
  return true;
}

}  // namespace bitroll::sandbox
