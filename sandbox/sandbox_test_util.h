// Shared by the sandbox tests: options, skips, the pre-warmed pool, and the "no survivor" check.
//
// The tier suites are instantiated twice: "Tiers/..." runs cold (SandboxOptions::prewarm off,
// every run spawns its helper) and "Pooled/..." runs with pre-warmed helpers. TestOptions()
// picks by the running test's suite name, and SKIP_IF_TIER_UNAVAILABLE then waits for a parked
// helper, so a pooled test's first run is served warm.
#pragma once

#include <dirent.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "sandbox/sandbox.h"

namespace bitroll::sandbox::testing {

constexpr uint32_t kTestSlots = 4;

// True inside a test of a "Pooled/..." instantiation.
inline bool PooledTest() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return info != nullptr && std::string(info->test_suite_name()).rfind("Pooled/", 0) == 0;
}

// ctest runs every test case as its own process, several at once: each process gets its own
// uid range so that one case's kill sweep or RLIMIT_NPROC never touches another's.
inline SandboxOptions TestOptions() {
  SandboxOptions o;
  o.uid_base = 200000 + static_cast<uint32_t>(getpid() % 50000) * kTestSlots;
  o.max_concurrent = kTestSlots;
  o.vm_image_dir = BITROLL_VM_IMAGE_DIR;
  o.max_concurrent_vms = 2;
  if (!PooledTest()) o.prewarm = {0, 0};
  return o;
}

// Waits (at most 20 s) until `tier` has at least `n` parked helpers; false if it never does.
inline bool AwaitParked(Sandbox& sb, Tier tier, uint32_t n) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (sb.Pool(tier).parked < n) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

// With the pool on for `tier`, waits for a parked helper (the tier's pool starts with its first
// use, which TierAvailable is).
inline void AwaitPoolIfOn(Sandbox& sb, Tier tier) {
  const SandboxOptions& o = sb.options();
  uint32_t target = tier == Tier::kProcess     ? o.prewarm.process
                    : tier == Tier::kContainer ? o.prewarm.container
                                               : 0;
  if (target > 0) {
    ASSERT_TRUE(AwaitParked(sb, tier, 1)) << "no pre-warmed " << TierName(tier) << " helper";
  }
}

// Pooled tests: at least one run of the test was served by a parked helper.
inline void ExpectWarmRunIfPooled(Sandbox& sb, Tier tier) {
  if (!PooledTest() || ::testing::Test::IsSkipped()) return;
  EXPECT_GT(sb.Pool(tier).warm_runs, 0u) << "no run of this pooled test took a parked helper";
}

// Every process whose real uid is in the sandbox's range.
inline std::vector<int> SandboxProcesses(const SandboxOptions& o) {
  std::vector<int> pids;
  DIR* d = opendir("/proc");
  if (d == nullptr) return pids;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::ifstream in(std::string("/proc/") + e->d_name + "/status");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("Uid:", 0) == 0) {
        unsigned long uid = std::strtoul(line.c_str() + 4, nullptr, 10);
        if (uid >= o.uid_base && uid < o.uid_base + o.max_concurrent) {
          pids.push_back(std::atoi(e->d_name));
        }
        break;
      }
    }
  }
  closedir(d);
  return pids;
}

inline std::string TierParamName(const ::testing::TestParamInfo<Tier>& info) {
  return TierName(info.param);
}

}  // namespace bitroll::sandbox::testing

// Skips loudly when the tier cannot run on this machine; the code path is still compiled.
#define SKIP_IF_TIER_UNAVAILABLE(sb, tier)                                    \
  do {                                                                        \
    ::bitroll::Status avail_ = (sb).TierAvailable(tier);                      \
    if (!avail_.ok()) {                                                       \
      GTEST_SKIP() << "SANDBOX TIER '" << ::bitroll::sandbox::TierName(tier)  \
                   << "' UNAVAILABLE ON THIS MACHINE: " << avail_.ToString(); \
    }                                                                         \
    ::bitroll::sandbox::testing::AwaitPoolIfOn(sb, tier);                     \
  } while (0)
