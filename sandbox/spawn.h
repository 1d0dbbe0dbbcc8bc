// Internal to sandbox/: starts bitroll-sandbox-helper with posix_spawn (never fork) and runs it
// to completion: feeds stdin, reads stdout/stderr through pipes + poll with byte caps, enforces
// the wall-time limit, kills every process of the run when it ends, and reaps. A pre-warmed
// (parked) helper is handed its request and the pipes over its socket instead.
//
// Thread-safety: SpawnAndWait may run concurrently on distinct threads. It blocks SIGPIPE on the
// calling thread while it runs (and restores the mask).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace bitroll::sandbox {

class RunCgroup;

// A helper started as `helper park ...`: set up and waiting on `sock` for one request.
struct ParkedHelper {
  pid_t pid = -1;
  int pidfd = -1;  // -1 where the kernel has no pidfd_open
  int sock = -1;   // the service's end of the socketpair (the helper's fd 3)
};

// posix_spawns argv (argv[0] the helper, argv[1] "park") with fds 0-2 on /dev/null and fd 3 on
// a fresh AF_UNIX socketpair. Returns "" or why not.
std::string SpawnParked(const std::vector<std::string>& argv, ParkedHelper* out);
// False once the parked helper has exited (it is then reaped by CloseParked).
bool ParkedAlive(const ParkedHelper& h);
// SIGKILLs (unless already gone), reaps and closes a parked helper that will not be used.
void CloseParked(ParkedHelper* h);

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
  // When set, no helper is spawned: argv[1...] (exec options without the ones the helper got at
  // park time) goes as the request to this parked helper, which SpawnAndWait then owns (it
  // reaps it and closes its fds, whatever happens).
  ParkedHelper* parked = nullptr;
};

struct SpawnOutcome {
  bool started = false;  // the helper was spawned and exec'd the command
  // The parked helper was gone before it took the request (nothing ran; start_error says why):
  // the caller may run the request on another helper.
  bool parked_lost = false;
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
