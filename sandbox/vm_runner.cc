// The VM tier of Sandbox: QEMU microvm with the image of scripts/vm-image.sh.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "sandbox/sandbox_internal.h"
#include "sandbox/vm_task.h"
#include "sandbox/workdir.h"

namespace bitroll::sandbox {

namespace {

// Serial console only; a panic or `reboot -f` ends qemu (-no-reboot). no_timer_check and
// tsc=reliable skip the timer checks that crawl or hang under TCG on a loaded host; the host's
// TSC rate (tsc_early_khz, lpj) is appended by the Sandbox.
constexpr const char* kCmdline =
    "console=ttyS0 quiet loglevel=1 panic=-1 reboot=t no_timer_check tsc=reliable";

std::string ReadWholeFile(const std::string& path) {
  std::string out;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return out;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  std::fclose(f);
  return out;
}
}  // namespace

void Sandbox::Impl::RunVm(const Request& req, RunResult* r) {
  {
    std::lock_guard<std::mutex> lock(vm_mu);
    if (base_initramfs.empty())
      base_initramfs = ReadWholeFile(opt.vm_image_dir + "/initramfs.cpio.gz");
  }
  if (base_initramfs.empty()) {
    return SetError(
        r, SandboxError::kUnavailable,
        "cannot read " + opt.vm_image_dir + "/initramfs.cpio.gz: run scripts/vm-image.sh");
  }
  // KVM only after a real boot succeeds (nested setups expose /dev/kvm but cannot boot).
  std::call_once(kvm_once, [&] {
    if (!opt.vm_try_kvm || access("/dev/kvm", R_OK | W_OK) != 0) return;
    Request probe;
    probe.tier = Tier::kVm;
    probe.argv = {"true"};
    probe.limits.wall_seconds = 5;
    RunResult pr;
    pr.tier = Tier::kVm;
    RunQemu(probe, /*kvm=*/true, /*boot_seconds=*/20, &pr);
    kvm_ok = pr.error == SandboxError::kNone && pr.exited && pr.exit_code == 0;
  });
  {
    std::unique_lock<std::mutex> lock(vm_mu);
    vm_cv.wait(lock, [&] { return vm_running < vm_cap; });
    ++vm_running;
  }
  RunQemu(req, kvm_ok, opt.vm_boot_seconds, r);
  {
    std::lock_guard<std::mutex> lock(vm_mu);
    --vm_running;
  }
  vm_cv.notify_one();
}

void Sandbox::Impl::RunQemu(const Request& req, bool kvm, double boot_seconds, RunResult* r) {
  const Limits& l = req.limits;
  const uint32_t slot = AcquireSlot();
  struct SlotGuard {
    Impl* m;
    uint32_t s;
    ~SlotGuard() { m->ReleaseSlot(s); }
  } slot_guard{this, slot};
  const uint32_t uid = opt.uid_base + slot;
  std::string initrd;
  {
    std::lock_guard<std::mutex> lock(vm_mu);
    initrd = BuildVmInitrd(base_initramfs, req);
  }
  auto wd = Workdir::Create(work_root, uid, uid, {{"initrd", std::move(initrd)}});
  if (!wd.ok()) return SetError(r, SandboxError::kInternal, wd.status().message());
  const uint64_t guest_mib = std::clamp<uint64_t>((l.memory_bytes >> 20) + 128, 192, 16384);
  std::unique_ptr<RunCgroup> cgroup;
  if (cg.version > 0) {
    auto c = RunCgroup::Create(cg, RunName(), (guest_mib + 512) << 20, 64);
    if (!c.ok()) return SetError(r, SandboxError::kInternal, c.status().message());
    cgroup = std::move(c).value();
  }
  const std::string& dir = (*wd)->path();
  std::vector<std::string> a = {
      helper, "exec", "--uid", std::to_string(uid), "--gid", std::to_string(uid)};
  if (cgroup) {
    for (const std::string& f : cgroup->ProcsFiles()) a.insert(a.end(), {"--cgroup", f});
  }
  a.insert(a.end(),
           {"--cpu", std::to_string(static_cast<uint64_t>(std::ceil(l.cpu_seconds + boot_seconds))),
            "--nproc", "64", "--fsize", "1048576", "--netns", "--seccomp", "exec", "--workdir", dir,
            "--env", std::string("PATH=") + kToolPath});
  for (const std::string& p :
       {std::string("/usr"), std::string("/lib"), std::string("/lib64"), std::string("/bin"),
        std::string("/etc"), std::string("/proc"), std::string("/sys"), std::string("/dev/urandom"),
        opt.vm_image_dir}) {
    a.insert(a.end(), {"--landlock-ro", p});
  }
  for (const std::string& p : {dir, std::string("/dev/null"), std::string("/dev/kvm")}) {
    a.insert(a.end(), {"--landlock-rw", p});
  }
  // vmlinux boots through the PVH entry, skipping the kernel's self-decompression (seconds
  // under TCG); vmlinuz is the fallback.
  std::string kernel = opt.vm_image_dir + "/vmlinux";
  if (access(kernel.c_str(), R_OK) != 0) kernel = opt.vm_image_dir + "/vmlinuz";
  a.insert(a.end(), {"--",          qemu,
                     "-accel",      kvm ? "kvm" : "tcg",
                     "-M",          "microvm",
                     "-m",          std::to_string(guest_mib),
                     "-smp",        "1",
                     "-nodefaults", "-no-user-config",
                     "-nographic",  "-serial",
                     "stdio",       "-no-reboot",
                     "-nic",        "none",
                     "-kernel",     kernel,
                     "-initrd",     dir + "/initrd",
                     "-append",     kCmdline + tsc_args});
  SpawnSpec spec;
  spec.argv = std::move(a);
  spec.wall_seconds = l.wall_seconds + boot_seconds;
  uint64_t payload = 2 * l.max_output_bytes + req.output_files.size() * l.max_file_bytes;
  spec.max_stdout = std::min<uint64_t>(payload / 3 * 4 + payload / 40 + (1 << 20), 1ull << 30);
  spec.max_stderr = 1 << 16;
  spec.cgroup = cgroup.get();
  spec.sweep_uid = cgroup && !cg.pids_parent.empty() ? 0 : uid;
  SpawnOutcome o = SpawnAndWait(spec);
  r->usage.wall_seconds = o.wall_seconds;
  r->usage.cpu_seconds = o.cpu_seconds;
  r->usage.max_rss_bytes = o.max_rss_bytes;
  if (!o.started) return SetError(r, SandboxError::kSpawnFailure, o.start_error);
  if (!ParseVmConsole(o.out, req, r)) {
    auto tail = [](const std::string& s) { return s.size() > 400 ? s.substr(s.size() - 400) : s; };
    r->stdout_data.clear();
    if (o.timed_out) {
      return SetError(
          r, SandboxError::kTimeout,
          "the VM gave no result within " + Num(spec.wall_seconds) +
              " s (boot allowance + wall limit); qemu was killed. Console tail: " + tail(o.out));
    }
    return SetError(r, SandboxError::kSpawnFailure,
                    std::string("qemu (") + (kvm ? "kvm" : "tcg") + ") exited without a result: " +
                        tail(o.err) + " Console tail: " + tail(o.out));
  }
  switch (r->error) {
    case SandboxError::kTimeout:
      SetError(r, r->error, "wall-time limit of " + Num(l.wall_seconds) + " s passed in the VM");
      break;
    case SandboxError::kOutputLimit:
      SetError(r, r->error, "output passed " + std::to_string(l.max_output_bytes) + " bytes");
      break;
    case SandboxError::kCpuTime:
      SetError(r, r->error, "CPU-time limit of " + Num(l.cpu_seconds) + " s reached in the VM");
      break;
    default:
      break;
  }
}

}  // namespace bitroll::sandbox
