// bench_sandbox: start-to-result time of a trivial call on each sandbox tier.
//
//   bench_sandbox [N] [VM_N] [--no-cgroups]
//     defaults: 200 calls per local tier, 3 VM boots; --no-cgroups measures the rlimit fallback
//
// Prints median and p99 of Sandbox::Run's duration for a trivial call ("echo hi"; the function
// tier calls a registered no-op). Run by hand and briefly: this machine is shared.
// The process and container rows run cold (SandboxOptions::prewarm off: each run spawns its
// helper). Then, in the same run, "-cold-ab" and "-warm-ab" alternate a cold call and a call on
// a second Sandbox with pre-warmed helpers (before each warm call it waits until the pool is
// full again: calls spaced further apart than a refill, the usual case between tool calls of a
// rollout), so both rows see the same load; "-warm-b2b" calls back to back (a call that finds
// the pool empty runs cold; the share that took a parked helper is printed).
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "sandbox/sandbox.h"

using namespace bitroll::sandbox;

namespace {

void Report(const char* name, std::vector<double> us) {
  if (us.empty()) return;
  std::sort(us.begin(), us.end());
  double median = us[us.size() / 2];
  double p99 = us[std::min(us.size() - 1, us.size() * 99 / 100)];
  std::printf("%-22s n=%-5zu median %12.3f us   p99 %12.3f us\n", name, us.size(), median, p99);
}

}  // namespace

int main(int argc, char** argv) {
  int n = argc > 1 ? std::atoi(argv[1]) : 200;
  int vm_n = argc > 2 ? std::atoi(argv[2]) : 3;
  SandboxOptions opt;
  opt.uid_base = 150000 + static_cast<uint32_t>(getpid() % 1000) * 4;
  opt.max_concurrent = 4;
  opt.vm_image_dir = BITROLL_VM_IMAGE_DIR;
  opt.use_cgroups = !(argc > 3 && std::string(argv[3]) == "--no-cgroups");
  opt.prewarm = {0, 0};  // the cold rows
  Sandbox sb(opt);
  std::printf("limits via %s\n", sb.LimitMechanism().c_str());
  if (!sb.Register("noop", [](const Request&, FunctionOutput* out) { out->exit_code = 0; }).ok()) {
    return 1;
  }
  {
    // Baseline: a bare posix_spawn + wait of /bin/echo, no sandbox, to read the rest against
    // (on a loaded machine every figure grows with it).
    std::vector<double> us;
    for (int i = 0; i < n; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      char* args[] = {const_cast<char*>("/bin/echo"), const_cast<char*>("hi"), nullptr};
      char* envp[] = {nullptr};
      posix_spawn_file_actions_t fa;
      posix_spawn_file_actions_init(&fa);
      posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
      pid_t pid;
      if (posix_spawn(&pid, args[0], &fa, nullptr, args, envp) == 0) waitpid(pid, nullptr, 0);
      posix_spawn_file_actions_destroy(&fa);
      us.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() *
                   1e6);
    }
    Report("bare-spawn", us);
  }
  FunctionOptions inline_opts;
  inline_opts.run_inline = true;
  if (!sb.Register(
             "noop-inline", [](const Request&, FunctionOutput* out) { out->exit_code = 0; },
             inline_opts)
           .ok()) {
    return 1;
  }
  {
    Request r;
    r.tier = Tier::kFunction;
    r.function = "noop-inline";
    std::vector<double> us;
    for (int i = 0; i < n * 10; ++i) us.push_back(sb.Run(r).duration_seconds * 1e6);
    Report("fn-inline", us);
  }
  for (Tier tier : {Tier::kFunction, Tier::kProcess, Tier::kContainer, Tier::kVm}) {
    bitroll::Status avail = sb.TierAvailable(tier);
    if (tier == Tier::kVm && vm_n <= 0) continue;
    if (!avail.ok()) {
      std::printf("%-10s unavailable: %s\n", TierName(tier), avail.ToString().c_str());
      continue;
    }
    Request r;
    r.tier = tier;
    r.function = "noop";
    r.argv = {"echo", "hi"};
    int count = tier == Tier::kVm ? vm_n : (tier == Tier::kFunction ? n * 10 : n);
    std::vector<double> us;
    for (int i = 0; i < count + 2; ++i) {
      RunResult res = sb.Run(r);
      if (!res.status.ok()) {
        std::printf("%-10s failed: %s\n", TierName(tier), res.status.ToString().c_str());
        break;
      }
      if (i >= 2 || tier == Tier::kVm) us.push_back(res.duration_seconds * 1e6);  // 2 warm-ups
      if (tier == Tier::kVm && static_cast<int>(us.size()) >= count) break;
    }
    Report(TierName(tier), us);
  }
  // Pre-warmed helpers, on a second Sandbox with its own uid range.
  SandboxOptions wopt = opt;
  wopt.uid_base = opt.uid_base + 4000;
  wopt.prewarm = {2, 2};
  Sandbox warm(wopt);
  for (Tier tier : {Tier::kProcess, Tier::kContainer}) {
    if (!warm.TierAvailable(tier).ok()) continue;  // reported above; also starts the pool
    Request r;
    r.tier = tier;
    r.argv = {"echo", "hi"};
    // A/B: a cold call and a warm call alternate, so both see the same machine load.
    std::vector<double> cold_us, warm_us, b2b_us;
    const PoolStats p0 = warm.Pool(tier);
    for (int i = 0; i < n + 2; ++i) {
      RunResult c = sb.Run(r);
      auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
      while (warm.Pool(tier).parked < 2 && std::chrono::steady_clock::now() < deadline) {
        usleep(200);
      }
      RunResult w = warm.Run(r);
      if (!c.status.ok() || !w.status.ok()) {
        std::printf("%s A/B failed: %s %s\n", TierName(tier), c.status.ToString().c_str(),
                    w.status.ToString().c_str());
        return 1;
      }
      if (i >= 2) {
        cold_us.push_back(c.duration_seconds * 1e6);
        warm_us.push_back(w.duration_seconds * 1e6);
      }
    }
    const PoolStats p1 = warm.Pool(tier);
    for (int i = 0; i < n; ++i) {
      RunResult w = warm.Run(r);
      if (!w.status.ok()) return 1;
      b2b_us.push_back(w.duration_seconds * 1e6);
    }
    const PoolStats p2 = warm.Pool(tier);
    std::string name = TierName(tier);
    Report((name + "-cold-ab").c_str(), cold_us);
    Report((name + "-warm-ab").c_str(), warm_us);
    std::printf("%-22s   %llu of %d warm calls took a parked helper\n", "",
                static_cast<unsigned long long>(p1.warm_runs - p0.warm_runs), n + 2);
    Report((name + "-warm-b2b").c_str(), b2b_us);
    std::printf("%-22s   %llu of %d back-to-back calls took a parked helper\n", "",
                static_cast<unsigned long long>(p2.warm_runs - p1.warm_runs), n);
  }
  return 0;
}
