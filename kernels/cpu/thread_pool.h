// ThreadPool: persistent workers for the CPU kernels.
//
// The calling thread is worker 0; n_threads - 1 background threads are started by the constructor
// and joined by the destructor. Run() hands out tasks [0, n_tasks) dynamically from an atomic
// counter, so which worker runs which task is unspecified. Kernels therefore split only
// independent work (rows, output columns) into tasks, never a reduction: numerics never depend on
// the thread count or on scheduling.
//
// Latency: a decode step calls Run ~60-100 times, so idle workers spin on an atomic for
// Options::spin_us before sleeping on a condition variable. The caller does tasks too and, once all
// tasks are done, waits only for workers that are still inside the job (never for sleeping ones).
//
// Thread-safety: thread-compatible. One thread at a time may call Run (it is not reentrant: do not
// call Run from inside fn). size() is thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace bitroll::kernels {

class ThreadPool {
 public:
  struct Options {
    // How long an idle worker spins on the job counter before sleeping. Longer: lower latency for
    // back-to-back Run calls; shorter: less CPU burnt when the pool is idle (the machines are
    // shared, so keep this small).
    int spin_us = 50;
  };

  // REQUIRES: n_threads >= 1 (values < 1 are treated as 1).
  explicit ThreadPool(int n_threads) : ThreadPool(n_threads, Options()) {}
  ThreadPool(int n_threads, const Options& options);
  ~ThreadPool();

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Number of workers, including the calling thread.
  int size() const { return n_threads_; }

  // Calls fn(worker, task) for each task in [0, n_tasks) exactly once; returns when all are done.
  // worker is in [0, size()). Task-to-worker assignment is dynamic and unspecified: numerics must
  // never depend on it. n_tasks <= 0 returns at once. fn must not throw.
  void Run(int64_t n_tasks, const std::function<void(int worker, int64_t task)>& fn);

 private:
  void WorkerLoop(int worker);
  // Takes tasks from next_ until none are left; returns how many this call completed.
  int64_t DrainTasks(int worker);

  const int n_threads_;
  const Options options_;
  std::vector<std::thread> threads_;

  // The current job. Written by Run only while accepting_ is false and in_job_ is 0.
  const std::function<void(int, int64_t)>* fn_ = nullptr;
  int64_t n_tasks_ = 0;

  alignas(64) std::atomic<uint64_t> generation_{0};  // bumped once per Run that uses workers
  alignas(64) std::atomic<int64_t> next_{0};         // next task index to hand out
  alignas(64) std::atomic<int64_t> done_{0};         // tasks completed
  alignas(64) std::atomic<int> in_job_{0};           // workers (other than the caller) in the job
  std::atomic<bool> accepting_{false};               // workers may join the current job
  std::atomic<bool> stop_{false};

  std::mutex mu_;  // guards sleeping on cv_
  std::condition_variable cv_;
  std::atomic<int> sleepers_{0};
};

}  // namespace bitroll::kernels
