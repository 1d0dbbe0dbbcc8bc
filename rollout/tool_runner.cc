#include "rollout/tool_runner.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <spdlog/spdlog.h>

namespace bitroll::rollout {

Result<std::unique_ptr<ToolRunner>> ToolRunner::Start(const ToolRunnerOptions& options) {
  if (options.workers < 1 || options.workers > 4096) {
    return Status::InvalidArgument("--tool-workers must be in [1, 4096]");
  }
  std::unique_ptr<ToolRunner> r(new ToolRunner());
  r->options_ = options;
  r->efd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (r->efd_ < 0) return Status::IoError(std::string("eventfd: ") + std::strerror(errno));
  return r;
}

void ToolRunner::StartWorkers() {
  sandbox_ = std::make_unique<sandbox::Sandbox>(options_.sandbox);
  Status s = RegisterToolFunctions(*sandbox_, options_.functions);
  if (!s.ok()) spdlog::error("tool runner: {}", s.ToString());  // only on a programming error
  for (int i = 0; i < options_.workers; ++i) threads_.emplace_back([this] { Worker(); });
}

ToolRunner::~ToolRunner() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
    jobs_.clear();
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
  if (efd_ >= 0) ::close(efd_);
}

void ToolRunner::Submit(ToolJob job) {
  if (threads_.empty()) StartWorkers();
  ++pending_;
  {
    std::lock_guard<std::mutex> l(mu_);
    jobs_.push_back(std::move(job));
  }
  cv_.notify_one();
}

std::vector<ToolDone> ToolRunner::TakeDone() {
  uint64_t v = 0;
  (void)!::read(efd_, &v, sizeof(v));
  std::vector<ToolDone> out;
  {
    std::lock_guard<std::mutex> l(mu_);
    out.swap(done_);
  }
  pending_ -= std::min(pending_, out.size());
  return out;
}

void ToolRunner::Worker() {
  while (true) {
    ToolJob job;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stop_ || !jobs_.empty(); });
      if (stop_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    ToolDone d;
    d.work_id = job.work_id;
    d.call_index = job.call_index;
    d.result = sandbox_->Run(job.request);
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stop_) return;
      done_.push_back(std::move(d));
    }
    const uint64_t one = 1;
    (void)!::write(efd_, &one, sizeof(one));
  }
}

}  // namespace bitroll::rollout
