// Shared by the sandbox tests: options, skips, and the "no survivor" check.
#pragma once

#include <dirent.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "sandbox/sandbox.h"

namespace bitroll::sandbox::testing {

constexpr uint32_t kTestSlots = 4;

// ctest runs every test case as its own process, several at once: each process gets its own
// uid range so that one case's kill sweep or RLIMIT_NPROC never touches another's.
inline SandboxOptions TestOptions() {
  SandboxOptions o;
  o.uid_base = 200000 + static_cast<uint32_t>(getpid() % 50000) * kTestSlots;
  o.max_concurrent = kTestSlots;
  o.vm_image_dir = BITROLL_VM_IMAGE_DIR;
  o.max_concurrent_vms = 2;
  return o;
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
  } while (0)
