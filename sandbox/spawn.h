// Internal to sandbox/: starts bitroll-sandbox-helper with posix_spawn (never fork) and runs it
// to completion: feeds stdin, reads stdout/stderr through pipes + poll with byte caps, enforces
// the wall-time limit, kills every process of the run when it ends, and reaps.
//
// Thread-safety: SpawnAndWait may run concurrently on distinct threads. It blocks SIGPIPE on the
// calling thread while it runs (and restores the mask).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace bitroll::sandbox {

class RunCgroup;

struct SpawnSpec {
  std::vector<std::string> argv;  // argv[0] is the helper's path
  std::string stdin_data;
  double wall_seconds = 10;
  uint64_t max_stdout = 1 << 20;
  uint64_t max_stderr = 1 << 20;
  RunCgroup* cgroup = nullptr;  // killed and read when set (not owned)
  // When non-zero (no pids cgroup): stopping the run (timeout, output limit) runs
  // `helper killuid sweep_uid`, which kills every process under that uid. The helper itself
  // (root) then reaps and exits. REQUIRES: the uid is private to this run.
  uint32_t sweep_uid = 0;
  // When >= 0, a pipe is given to the child at this fd number; its contents come back in
  // SpawnOutcome::extra (used for bwrap --json-status-fd).
  int extra_fd = -1;
};

struct SpawnOutcome {
  bool started = false;     // the helper was spawned and exec'd the command
  std::string start_error;  // why not (posix_spawn errno or the helper's status-pipe message)
  bool timed_out = false;
  bool output_overflow = false;
  bool exited = false;
  int exit_code = -1;
  int term_signal = 0;
  std::string out, err, extra;
  bool out_truncated = false, err_truncated = false;
  double wall_seconds = 0, cpu_seconds = 0;
  uint64_t max_rss_bytes = 0;
};

SpawnOutcome SpawnAndWait(const SpawnSpec& spec);

}  // namespace bitroll::sandbox
