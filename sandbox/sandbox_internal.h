// Internal to sandbox/: Sandbox::Impl, shared by sandbox.cc (API, function, process and
// container tiers) and vm_runner.cc (the VM tier).
//
// Thread-safety: as Sandbox; the fields say which lock guards them.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "sandbox/cgroup.h"
#include "sandbox/sandbox.h"
#include "sandbox/spawn.h"

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

  uint32_t AcquireSlot() {
    std::unique_lock<std::mutex> lock(slot_mu);
    for (;;) {
      for (size_t i = 0; i < slot_used.size(); ++i) {
        if (!slot_used[i]) {
          slot_used[i] = true;
          return static_cast<uint32_t>(i);
        }
      }
      slot_cv.wait(lock);
    }
  }
  void ReleaseSlot(uint32_t s) {
    {
      std::lock_guard<std::mutex> lock(slot_mu);
      slot_used[s] = false;
    }
    slot_cv.notify_one();
  }

  void RunFunction(const Request& req, RunResult* r);
  void FinishFunction(const Request& req, FunctionOutput& out, const std::string& exception,
                      RunResult* r);
  void RunProcessOrContainer(const Request& req, RunResult* r);
  void RunVm(const Request& req, RunResult* r);
  void RunQemu(const Request& req, bool kvm, double boot_seconds, RunResult* r);
  std::string base_initramfs;  // GUARDED_BY(vm_mu)
  void Classify(const SpawnOutcome& o, RunCgroup* cgroup, const Request& req, RunResult* r);
};

}  // namespace bitroll::sandbox
