// Internal to sandbox/: Sandbox::Impl, shared by sandbox.cc (API, function, process and
// container tiers), warm_pool.cc (pre-warmed helpers) and vm_runner.cc (the VM tier).
//
// Thread-safety: as Sandbox; the fields say which lock guards them.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "sandbox/cgroup.h"
#include "sandbox/sandbox.h"
#include "sandbox/spawn.h"
#include "sandbox/workdir.h"

namespace bitroll::sandbox {

using Clock = std::chrono::steady_clock;
// PATH of every tool (process, container and VM tiers).
inline constexpr const char* kToolPath = "/usr/local/bin:/usr/bin:/bin";

// Sets r->error and r->status ("<tier> tier: <msg>", with the matching ErrorCode).
void SetError(RunResult* r, SandboxError e, const std::string& msg);
// "%g" of v.
std::string Num(double v);
// A cgroup name unique in this process (two Sandbox objects may use the same slot numbers).
std::string RunName();

struct Registered {
  Function fn;
  FunctionOptions options;
};
struct FnPool;  // sandbox.cc: the function tier's worker threads

// What one process/container run holds: its slot (uid), workdir and cgroup. Destruction kills
// the cgroup's members, removes the cgroup and the workdir, and frees the slot.
struct RunSlot {
  std::function<void(uint32_t)> release;  // frees the slot; empty: no slot held
  uint32_t slot = 0;
  uint32_t uid = 0;
  std::unique_ptr<Workdir> wd;
  std::unique_ptr<RunCgroup> cgroup;
  RunSlot() = default;
  RunSlot(const RunSlot&) = delete;
  RunSlot& operator=(const RunSlot&) = delete;
  ~RunSlot();
};

// A pre-warmed helper and the slot it was made for.
struct Parked {
  RunSlot rs;
  ParkedHelper helper;
  ~Parked() { CloseParked(&helper); }
};

// The pre-warmed pools of the process (0) and container (1) tiers, and their refill thread.
struct WarmPool {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::unique_ptr<Parked>> parked[2];  // GUARDED_BY(mu)
  bool started[2] = {false, false};               // GUARDED_BY(mu): the tier has been used
  bool stop = false;                              // GUARDED_BY(mu)
  PoolStats stats[2];                             // GUARDED_BY(mu)
  std::thread thread;                             // the refill thread, once a tier started
};

struct Sandbox::Impl {
  SandboxOptions opt;
  CgroupSupport cg;
  std::string helper;
  std::string work_root;
  std::string bwrap;
  std::string qemu;

  std::mutex fn_mu;
  std::map<std::string, Registered> fns;  // GUARDED_BY(fn_mu)
  std::shared_ptr<FnPool> pool;           // set by the constructor

  std::mutex slot_mu;
  std::condition_variable slot_cv;
  std::vector<bool> slot_used;  // GUARDED_BY(slot_mu)

  std::mutex vm_mu;
  std::condition_variable vm_cv;
  uint32_t vm_running = 0;  // GUARDED_BY(vm_mu)
  uint32_t vm_cap = 1;
  std::once_flag probe_once[4];
  Status probe_status[4];  // written once under probe_once
  std::once_flag kvm_once;
  bool kvm_ok = false;
  std::string tsc_args;

  uint32_t slot_waiters = 0;  // GUARDED_BY(slot_mu): cold runs waiting for a slot
  WarmPool warm;

  // A free slot, for a cold run: waits, evicting parked helpers when every slot is parked.
  uint32_t AcquireSlot();
  // A free slot for the refill thread, only when no cold run waits for one.
  bool TryAcquireSlotForPool(uint32_t* slot);
  void ReleaseSlot(uint32_t s);

  // warm_pool.cc. PoolStart: from now on keep `tier` pre-warmed (no-op when its count is 0).
  void PoolStart(Tier tier);
  // A parked helper able to serve `req`, or null (pool empty, off, or unsuitable request).
  std::unique_ptr<Parked> PoolTake(const Request& req);
  // Kills one parked helper to free its slot; false when none is parked.
  bool PoolEvictOne();
  void PoolLoop();
  std::unique_ptr<Parked> MakeParked(int tier_index, uint32_t slot);
  void PoolShutdown();
  void PoolCount(Tier tier, uint64_t PoolStats::*counter);

  // The helper options fixed before the request (uid, gid, cgroups, workdir, netns) and the
  // rest, ending with "--" and the command.
  std::vector<std::string> SlotArgs(const RunSlot& rs, bool netns) const;
  std::vector<std::string> RequestArgs(const Request& req, const std::string& dir) const;

  void RunFunction(const Request& req, RunResult* r);
  void FinishFunction(const Request& req, FunctionOutput& out, const std::string& exception,
                      RunResult* r);
  void RunProcessOrContainer(const Request& req, RunResult* r);
  // One attempt; false when the parked helper it took was gone (nothing ran).
  bool RunCommandOnce(const Request& req, RunResult* r);
  void RunVm(const Request& req, RunResult* r);
  void RunQemu(const Request& req, bool kvm, double boot_seconds, RunResult* r);
  std::string base_initramfs;  // GUARDED_BY(vm_mu)
  void Classify(const SpawnOutcome& o, RunCgroup* cgroup, const Request& req, RunResult* r);
};

}  // namespace bitroll::sandbox
