// rollout/tool_runner.h: the coordinator's pool of tool worker threads.
//
// The coordinator thread never runs a tool: it Submit()s a job and goes on (decoding of other
// trajectories continues on the replicas). Each of `workers` threads takes jobs in submission
// order and runs them on one shared sandbox::Sandbox (thread-safe; process/container runs are
// further capped by SandboxOptions::max_concurrent). A finished job is queued for TakeDone() and
// the eventfd wake_fd() becomes readable, so the coordinator's zmq::poll wakes at once.
//
// Ownership: owns the sandbox and the threads. The destructor drops queued jobs, waits for the
// running ones (each bounded by its wall limit; abandoned function handlers excepted, see
// sandbox.h) and joins the threads.
// Thread-safety: Submit/TakeDone/wake_fd from one thread (the coordinator's).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "rollout/tool_functions.h"
#include "sandbox/sandbox.h"
#include "schema/status.h"

namespace bitroll::rollout {

struct ToolRunnerOptions {
  int workers = 8;  // `bitroll serve --tool-workers N`: calls run at once (function tier too)
  sandbox::SandboxOptions sandbox;
  ToolFunctionOptions functions;
};

struct ToolJob {
  uint64_t work_id = 0;
  uint32_t call_index = 0;
  sandbox::Request request;
};

struct ToolDone {
  uint64_t work_id = 0;
  uint32_t call_index = 0;
  sandbox::RunResult result;
};

class ToolRunner {
 public:
  // Checks the options and makes the eventfd. The sandbox (with the built-in functions of
  // tool_functions.h) and the workers start with the first Submit(), so a service that never
  // runs a tool never probes the sandbox. Errors: kInvalidArgument (workers outside
  // [1, 4096]), kIoError (eventfd).
  static Result<std::unique_ptr<ToolRunner>> Start(const ToolRunnerOptions& options);
  ~ToolRunner();

  void Submit(ToolJob job);
  // Finished jobs since the last call (clears the eventfd).
  std::vector<ToolDone> TakeDone();
  int wake_fd() const { return efd_; }
  // Jobs submitted and not yet taken back.
  size_t pending() const { return pending_; }

  ToolRunner(const ToolRunner&) = delete;
  ToolRunner& operator=(const ToolRunner&) = delete;

 private:
  ToolRunner() = default;
  void StartWorkers();
  void Worker();

  ToolRunnerOptions options_;
  std::unique_ptr<sandbox::Sandbox> sandbox_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<ToolJob> jobs_;
  std::vector<ToolDone> done_;
  bool stop_ = false;
  int efd_ = -1;
  size_t pending_ = 0;  // coordinator thread only
};

}  // namespace bitroll::rollout
