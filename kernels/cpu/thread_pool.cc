#include "kernels/cpu/thread_pool.h"

#include <emmintrin.h>

#include <chrono>

namespace bitroll::kernels {
namespace {

// Spin politely; after a while yield the core (the worker we wait for may be descheduled).
void Backoff(int* spins) {
  if (++*spins < 4096) {
    _mm_pause();
  } else {
    std::this_thread::yield();
  }
}

}  // namespace

ThreadPool::ThreadPool(int n_threads, const Options& options)
    : n_threads_(n_threads < 1 ? 1 : n_threads), options_(options) {
  threads_.reserve(n_threads_ - 1);
  for (int w = 1; w < n_threads_; ++w) threads_.emplace_back([this, w] { WorkerLoop(w); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

int64_t ThreadPool::DrainTasks(int worker) {
  int64_t completed = 0;
  for (;;) {
    const int64_t task = next_.fetch_add(1, std::memory_order_relaxed);
    if (task >= n_tasks_) break;
    (*fn_)(worker, task);
    ++completed;
  }
  return completed;
}

void ThreadPool::WorkerLoop(int worker) {
  using Clock = std::chrono::steady_clock;
  uint64_t seen = 0;
  for (;;) {
    // Wait for a new generation: spin first, then sleep.
    if (generation_.load(std::memory_order_acquire) == seen) {
      const auto deadline = Clock::now() + std::chrono::microseconds(options_.spin_us);
      int spins = 0;
      while (generation_.load(std::memory_order_acquire) == seen) {
        _mm_pause();
        if (++spins % 64 == 0 && Clock::now() > deadline) break;
      }
      if (generation_.load(std::memory_order_acquire) == seen) {
        std::unique_lock<std::mutex> lock(mu_);
        sleepers_.fetch_add(1);  // seq_cst: pairs with Run's generation bump + sleepers_ load
        while (generation_.load() == seen) cv_.wait(lock);
        sleepers_.fetch_sub(1);
      }
    }
    // The generation first, then stop_: the destructor sets stop_ before it bumps the generation
    // (both under mu_), so a worker that reads the bumped generation also sees stop_. In the
    // other order a bump between the two reads was taken as a job's and the worker then waited
    // for a generation that never came (a hang in the destructor's join).
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load()) return;

    // Join the job only while the caller still accepts helpers (seq_cst pairs with Run's
    // accepting_.store(false) followed by its in_job_ load).
    in_job_.fetch_add(1);
    if (accepting_.load()) {
      const int64_t completed = DrainTasks(worker);
      if (completed > 0) done_.fetch_add(completed, std::memory_order_release);
    }
    in_job_.fetch_sub(1, std::memory_order_release);
  }
}

void ThreadPool::Run(int64_t n_tasks, const std::function<void(int worker, int64_t task)>& fn) {
  if (n_tasks <= 0) return;
  if (n_threads_ == 1 || n_tasks == 1) {
    for (int64_t t = 0; t < n_tasks; ++t) fn(0, t);
    return;
  }
  fn_ = &fn;
  n_tasks_ = n_tasks;
  next_.store(0, std::memory_order_relaxed);
  done_.store(0, std::memory_order_relaxed);
  accepting_.store(true);  // seq_cst: publishes fn_/n_tasks_ to workers that then join
  generation_.fetch_add(1);
  if (sleepers_.load() > 0) {
    // Taking the mutex orders us after any worker that is between its check and cv_.wait.
    { std::lock_guard<std::mutex> lock(mu_); }
    cv_.notify_all();
  }

  const int64_t completed = DrainTasks(0);
  int spins = 0;
  while (done_.load(std::memory_order_acquire) + completed < n_tasks) Backoff(&spins);
  accepting_.store(false);
  while (in_job_.load(std::memory_order_acquire) != 0) Backoff(&spins);
  fn_ = nullptr;
}

}  // namespace bitroll::kernels
