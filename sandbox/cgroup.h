// Internal to sandbox/: per-run cgroups for memory and pids limits, and the kill sweep.
//
// Detection order: cgroup v2 (a unified hierarchy at /sys/fs/cgroup whose own cgroup offers the
// memory and pids controllers), then cgroup v1 (memory and pids hierarchies under
// /sys/fs/cgroup/{memory,pids}). Run cgroups are created under the service's own cgroup, so the
// service's limits still bound its runs. Anything missing falls back to rlimits.
//
// Thread-safety: CgroupSupport is immutable after Detect(); RunCgroup is owned by one run.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "schema/status.h"

namespace bitroll::sandbox {

struct CgroupSupport {
  int version = 0;            // 0: none, 1: v1, 2: v2
  std::string memory_parent;  // folder new memory cgroups go under ("" if none)
  std::string pids_parent;    // folder new pids cgroups go under ("" if none)
  // Probes the machine by creating and removing a test cgroup.
  static CgroupSupport Detect();
  const char* Name() const;
};

class RunCgroup {
 public:
  // Creates bitroll-<name> under each parent and sets the limits. REQUIRES: support.version > 0.
  static Result<std::unique_ptr<RunCgroup>> Create(const CgroupSupport& support,
                                                   const std::string& name, uint64_t memory_bytes,
                                                   uint32_t max_pids);
  // Sets (or changes, before any member joined) the memory and pids limits.
  Status SetLimits(uint64_t memory_bytes, uint32_t max_pids);
  // Kills every member and removes the cgroup folders.
  ~RunCgroup();

  // cgroup.procs files a new process writes its pid to (to join every controller).
  std::vector<std::string> ProcsFiles() const;
  // SIGKILLs every member until none is left (bounded to ~2 s). Returns the members seen.
  int KillAll();
  bool MemoryLimitHit() const;
  bool PidsLimitHit() const;
  uint64_t PeakMemoryBytes() const;

 private:
  RunCgroup() = default;
  int version_ = 0;
  std::string memory_dir_;
  std::string pids_dir_;
};

// Reads a whole small file ("" on error).
std::string ReadSmallFile(const std::string& path);

}  // namespace bitroll::sandbox
