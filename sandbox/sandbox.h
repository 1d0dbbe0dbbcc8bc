// bitroll::sandbox: tiered tool execution behind one interface.
//
// One call, Sandbox::Run(request), runs a registered C++ function or a command with stdin, files
// and limits, and returns a RunResult: exit status, stdout/stderr (truncated and marked so), output
// files, resource usage and a typed error. The tier is a field of the request; nothing else
// changes between tiers.
//
//   Tier        mechanism                                                    for
//   kFunction   registered in-process handler on a pre-warmed worker thread  trusted code:
//               with a watchdog (or inline on the caller's thread)           graders, calculators
//   kProcess    posix_spawn of bitroll-sandbox-helper, which forks the tool:  short scripts
//               rlimits, private network namespace, new session, new
//               pid, IPC and mount namespaces whose root holds only the
//               read-only system folders, the /etc allowlist, a fresh
//               /proc (hidepid=2) and the workdir (so no host pathname
//               socket can be named), unprivileged per-run uid, Landlock
//               (the same folders; no signals or abstract unix sockets
//               out), seccomp denylist, then exec
//   kContainer  the helper's child drops to the per-run uid and execs        untrusted code
//               bubblewrap: --unshare-all --die-with-parent --cap-drop ALL
//               --clearenv --new-session, read-only /usr (+ /bin, /lib
//               links), an /etc allowlist, fresh /proc and /dev, a tmpfs
//               /tmp, seccomp via --seccomp. The workdir /work is a bind of
//               the run's private host folder, so output files can be
//               collected after the container is gone. Landlock scopes
//               bwrap (no abstract unix sockets or signals out).
//   kVm         QEMU microvm (TCG unless a real KVM probe boot succeeds),     strongest isolation
//               Debian kernel + busybox initramfs from scripts/vm-image.sh;
//               the task travels as a cpio archive appended to the
//               initramfs, the result as framed base64 on the serial console
//
// Process and container runs get a per-run cgroup (v2, else v1 memory + pids, under the
// service's own cgroup) when the machine allows one, and fall back to rlimits otherwise. The
// helper stays as the run's init (a child subreaper): when the tool exits it kills what is left
// under the run's uid and reaps every orphan, so every process a run started is dead, and
// reaped, when Run() returns. On a wall timeout or output overflow the service kills the
// cgroup (or sweeps the uid).
//
// Pre-warmed helpers (SandboxOptions::prewarm): from a tier's first use on, a background thread
// keeps that many helpers already spawned per tier, each with its run slot (uid, cgroup,
// workdir) reserved and everything that does not depend on the request done (new session,
// subreaper; process tier: a private network namespace), parked on a socket. Run() hands one
// the request and the stdio pipes (SCM_RIGHTS) instead of spawning; a helper serves exactly one
// run, so isolation is the same as a cold run's. A request a parked helper cannot serve
// (process tier with allow_network) or a parked helper found dead runs cold. A cold run that
// finds every slot parked evicts a parked helper.
//
// Requires root (the helper switches to the per-run uids and joins cgroups); otherwise the
// command tiers report kUnavailable. Disk use of the workdir is capped per file
// (Limits::max_file_bytes) and in total (SandboxOptions::work_disk_bytes: the workdir is a tmpfs
// of that size). Whatever a run leaves in its workdir (a tree of any depth included) is gone
// when Run() returns, without costing the service more than a few descriptors.
//
// Thread-safety: Sandbox is thread-safe. Register() and Run() may be called concurrently from
// any thread. Concurrent process/container runs each get their own uid from
// [uid_base, uid_base + max_concurrent), so one run can neither signal nor read another's files.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "schema/status.h"
#include "schema/vocab.h"

namespace bitroll::sandbox {

using Tier = ::bitroll::ToolTier;  // schema/vocab.h
// Stable lower-case name: "function", "process", "container", "vm".
inline const char* TierName(Tier tier) {
  return ToolTierName(tier);
}

// What stopped a run, beyond the tool's own exit status. The numbering is stored in the WAL:
// append only, never renumber.
enum class SandboxError : uint8_t {
  kNone = 0,             // the tool ran to completion (any exit code or signal of its own)
  kTimeout = 1,          // wall-time limit; the run was killed (function tier: abandoned)
  kCpuTime = 2,          // CPU-time limit (SIGXCPU / SIGKILL from RLIMIT_CPU)
  kMemory = 3,           // memory limit (cgroup OOM / failcnt, or rlimit heuristics)
  kOutputLimit = 4,      // stdout or stderr passed max_output_bytes; the run was killed
  kProcessLimit = 5,     // the pids limit was hit (only detectable with a pids cgroup)
  kSpawnFailure = 6,     // the helper, bwrap, qemu or the command itself could not be started
  kUnavailable = 7,      // the tier cannot run here (no bwrap, no VM image, no qemu, no helper)
  kInvalidArgument = 8,  // malformed request (empty argv, bad file name, unknown function)
  kInternal = 9,         // a bug or an unexpected OS failure; the status says where
  kDiskLimit = 10,  // the workdir was full (SandboxOptions::work_disk_bytes) when the run ended
};
const char* SandboxErrorName(SandboxError error);

// Limits of one run. Every tier honours every field unless noted. Run() refuses (kInvalidArgument)
// wall or CPU limits outside (0, 86400] s, memory under 1 MiB and max_processes of 0.
struct Limits {
  // Wall-clock seconds from start to the tool's exit. The VM tier adds boot time on top
  // (SandboxOptions::vm_boot_seconds) for the qemu process.
  double wall_seconds = 10.0;
  // CPU seconds (user + system). Enforced with RLIMIT_CPU, so granularity is 1 s (rounded up).
  // Not enforced on the function tier.
  double cpu_seconds = 10.0;
  // Memory of all the run's processes. cgroup memory limit where available, else RLIMIT_AS.
  // VM tier: guest RAM is this plus 128 MiB for the guest kernel; ulimit -v inside.
  uint64_t memory_bytes = 512ull << 20;
  // Processes (and threads) the run may have at once: pids cgroup + RLIMIT_NPROC on the
  // call's private uid.
  uint32_t max_processes = 64;
  // Bytes kept of stdout and of stderr, each. Going past it marks the stream truncated, stops
  // the run and reports kOutputLimit.
  uint64_t max_output_bytes = 1ull << 20;
  // Largest file the tool may write (RLIMIT_FSIZE) and largest output file collected; a bigger
  // collected file is cut and marked truncated.
  uint64_t max_file_bytes = 16ull << 20;
  // Network: off means a private network namespace (no interfaces but a down loopback) and a
  // seccomp rule that refuses every socket family but AF_UNIX. VM tier: no network device.
  bool allow_network = false;
};

struct Request {
  Tier tier = Tier::kProcess;
  // kFunction: the registered name. Ignored by other tiers.
  std::string function;
  // Other tiers: the command. argv[0] is looked up in PATH (/usr/local/bin:/usr/bin:/bin).
  // kFunction handlers also receive it as their arguments.
  std::vector<std::string> argv;
  // Extra environment "KEY=VALUE" for the command (it otherwise gets only PATH, HOME, TMPDIR,
  // LANG).
  std::vector<std::string> env;
  std::string stdin_data;
  // Files placed in the workdir before the run: name -> bytes. A name is one path component
  // ([A-Za-z0-9._-], not "." or "..", at most 255 bytes).
  std::map<std::string, std::string> files;
  // Names (same rules) of files to collect from the workdir after the run. Missing files and
  // anything that is not a regular file (symlinks included) are skipped.
  std::vector<std::string> output_files;
  Limits limits;
};

struct OutputFile {
  std::string data;
  bool truncated = false;  // the file was larger than Limits::max_file_bytes
};

struct Usage {
  double wall_seconds = 0;  // start of the tool to its end (VM: qemu start to exit)
  // User + system of the run's processes (the helper reaps them all, so all are counted).
  // Function tier: the worker thread's CPU time; inline handlers are charged their wall time.
  double cpu_seconds = 0;
  uint64_t max_rss_bytes = 0;
};

struct RunResult {
  Tier tier = Tier::kFunction;
  Limits limits;  // the limits the run had (for the WAL and cost accounting)
  SandboxError error = SandboxError::kNone;
  Status status;        // OK iff error == kNone; otherwise the typed error and its message
  bool exited = false;  // the tool exited by itself with exit_code
  int exit_code = -1;
  // The signal that ended it, when !exited (0 if unknown). Container and VM tiers learn it
  // from the shell convention (bwrap / the guest shell exit with 128 + N), so there a tool that
  // calls exit(128 + N) itself is reported as killed by signal N.
  int term_signal = 0;
  std::string stdout_data;
  std::string stderr_data;
  bool stdout_truncated = false;
  bool stderr_truncated = false;
  std::map<std::string, OutputFile> files;
  Usage usage;
  double duration_seconds = 0;  // Run() entry to return, including setup (cost accounting)
};

// What a registered function hands back.
struct FunctionOutput {
  int exit_code = 0;
  std::string stdout_data;
  std::string stderr_data;
  std::map<std::string, std::string> files;  // collected subject to Request::output_files
};

// A registered function. It receives the request (argv, stdin_data, files) and fills `out`.
// It runs in this process with no isolation: register only trusted code. A C++ function cannot
// be killed: if it overruns Limits::wall_seconds the watchdog stops waiting, reports kTimeout
// and abandons the worker thread, which keeps running until the handler returns (its output is
// then dropped). Handlers must be thread-safe and must not throw (an exception is caught and
// reported as kInternal).
using Function = std::function<void(const Request& request, FunctionOutput* out)>;

struct FunctionOptions {
  // false: the handler runs on a pre-warmed worker thread and the caller stops waiting at the
  // wall limit (kTimeout; the worker is abandoned). true: the handler runs on the caller's
  // thread with no hand-off (nanoseconds instead of microseconds); an overrun cannot be cut
  // short, it is only reported as kTimeout (output dropped) once the handler returns. For
  // handlers known to be fast.
  bool run_inline = false;
};

struct SandboxOptions {
  // Path of bitroll-sandbox-helper. Empty: the helper built with this library (its build path,
  // compiled in). Process, container and VM tiers report kUnavailable when it does not exist.
  std::string helper_path;
  // Folder under which each run gets a private workdir (mode 0700, owned by the run's uid).
  // Empty: std::filesystem::temp_directory_path().
  std::string work_root;
  // Total bytes a process or container run may keep in its workdir (all files together; each
  // file is further capped by Limits::max_file_bytes). The workdir is a tmpfs of this size (and
  // one inode per 4 KiB, at least 1024) that the service mounts on the folder under work_root:
  // a write past it fails with ENOSPC, and a run whose workdir is full when it ends reports
  // kDiskLimit. tmpfs lives in RAM (and swap): its pages are charged to the run's memory cgroup
  // where there is one. 0: no total cap, a plain folder (per-file cap only); for machines that
  // refuse the mount. `bitroll serve --tool-disk-bytes N`.
  uint64_t work_disk_bytes = 256ull << 20;
  // Unprivileged uid/gid range for runs: run slot i uses uid_base + i (gid the same). The range
  // must be unused by other software on the machine, and two Sandbox objects alive at once (in
  // one process or several) need disjoint ranges: a run's kill sweep covers its whole uid.
  uint32_t uid_base = 61000;
  // Process/container runs at once; a further Run() waits for a free slot.
  uint32_t max_concurrent = 16;
  // Per-run cgroups (v2, else v1 memory + pids under the service's own cgroup). Off: rlimits.
  bool use_cgroups = true;
  // Pre-warmed worker threads for the function tier (more are started on demand).
  uint32_t function_workers = 2;
  // Abandoned function workers (overran their wall limit and are still running) tolerated
  // before the function tier refuses new calls with kUnavailable.
  uint32_t max_abandoned_functions = 16;
  // bubblewrap binary for the container tier (looked up in PATH when not absolute).
  std::string bwrap_path = "bwrap";
  // VM tier: folder written by `scripts/vm-image.sh DIR` (vmlinuz, initramfs.cpio.gz).
  // Empty: the VM tier is unavailable.
  std::string vm_image_dir;
  std::string qemu_path = "qemu-system-x86_64";
  // Concurrent VMs; 0 means the number of online cores.
  uint32_t max_concurrent_vms = 0;
  // Seconds the VM gets for boot and shutdown, on top of the task's wall limit.
  double vm_boot_seconds = 60.0;
  // Probe /dev/kvm with a real boot before using it; off means always TCG.
  bool vm_try_kvm = true;
  // Pre-warmed helpers kept parked per tier (0: off, every run spawns its helper). They hold
  // run slots (max_concurrent), root-owned helper processes and empty workdirs while parked.
  struct Prewarm {
    uint32_t process = 2;
    uint32_t container = 2;
  };
  Prewarm prewarm;
};

// Counters of the pre-warmed pool of one tier.
struct PoolStats {
  uint32_t parked = 0;     // helpers parked now
  uint64_t warm_runs = 0;  // runs served by a parked helper
  uint64_t cold_runs = 0;  // runs that spawned their own helper (pool empty, off, or unsuitable)
  uint64_t lost = 0;       // parked helpers found dead (and replaced)
  uint64_t evicted = 0;    // parked helpers killed to free a slot for a cold run
};

class Sandbox {
 public:
  // Never fails: tiers that cannot run here report kUnavailable from Run(). Probing (cgroups,
  // helper, bwrap) happens here; the KVM probe boot happens on the first VM run.
  explicit Sandbox(SandboxOptions options = {});
  // REQUIRES: no Run() in flight. Abandoned function handlers keep running on their own.
  // Kills and reaps every parked helper and removes their workdirs and cgroups.
  ~Sandbox();
  Sandbox(const Sandbox&) = delete;
  Sandbox& operator=(const Sandbox&) = delete;

  // Registers `fn` under `name` for Tier::kFunction. A second registration replaces the first.
  // REQUIRES: name non-empty, fn non-null.
  Status Register(const std::string& name, Function fn, FunctionOptions function_options = {});

  // Runs one request. Blocks until it finishes or its limits stop it. Every process the run
  // started is dead when this returns. Never throws.
  RunResult Run(const Request& request);

  // OK when `tier` can run here, else kUnavailable with the reason (e.g. the script to run).
  Status TierAvailable(Tier tier);

  // The pre-warmed pool of a process or container tier (zeros for the others).
  PoolStats Pool(Tier tier) const;

  const SandboxOptions& options() const;
  // "cgroup-v2", "cgroup-v1" or "rlimits": how process/container memory and pids are limited.
  std::string LimitMechanism() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bitroll::sandbox
