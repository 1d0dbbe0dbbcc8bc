#include "kernels/cpu/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace bitroll::kernels {
namespace {

TEST(ThreadPoolTest, EveryTaskRunsExactlyOnce) {
  for (int threads : {1, 2, 3, 4}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (int64_t n_tasks : {0, 1, 2, 3, 7, 64, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n_tasks));
      std::atomic<int> bad_worker{0};
      pool.Run(n_tasks, [&](int worker, int64_t task) {
        if (worker < 0 || worker >= threads) bad_worker.fetch_add(1);
        hits[static_cast<size_t>(task)].fetch_add(1);
      });
      for (int64_t t = 0; t < n_tasks; ++t) {
        ASSERT_EQ(hits[static_cast<size_t>(t)].load(), 1) << "threads " << threads << " task " << t;
      }
      EXPECT_EQ(bad_worker.load(), 0);
    }
  }
}

// Many back-to-back Runs (the decode pattern) must neither lose nor duplicate tasks, and Run must
// not return before every task's side effect is visible.
TEST(ThreadPoolTest, BackToBackRunsAreComplete) {
  ThreadPool pool(3);
  std::vector<int64_t> out(16);
  for (int iter = 0; iter < 3000; ++iter) {
    pool.Run(16, [&](int, int64_t task) { out[static_cast<size_t>(task)] = iter * 100 + task; });
    for (int64_t t = 0; t < 16; ++t) ASSERT_EQ(out[static_cast<size_t>(t)], iter * 100 + t);
  }
}

// Workers that fall asleep (spin_us = 0) are woken for the next Run.
TEST(ThreadPoolTest, SleepingWorkersWake) {
  ThreadPool::Options options;
  options.spin_us = 0;
  ThreadPool pool(2, options);
  std::atomic<int> worker1_tasks{0};
  for (int iter = 0; iter < 200; ++iter) {
    std::atomic<int> count{0};
    pool.Run(8, [&](int worker, int64_t) {
      if (worker == 1) worker1_tasks.fetch_add(1);
      count.fetch_add(1);
    });
    ASSERT_EQ(count.load(), 8);
  }
  // Not a correctness requirement, but shows the second worker really participates.
  std::printf("worker 1 ran %d of 1600 tasks\n", worker1_tasks.load());
}

// A pool destroyed right after a Run whose tasks the caller finished alone: a worker that wakes
// for that Run late must still see the destructor's stop (it once took the stop's generation bump
// for a job's and waited forever: a hang in ~ThreadPool's join, caught here by the ctest timeout).
TEST(ThreadPoolTest, DestroyedRightAfterARunNeverHangs) {
  for (int iter = 0; iter < 20000; ++iter) {
    ThreadPool pool(3);
    std::atomic<int> count{0};
    pool.Run(2, [&](int, int64_t) { count.fetch_add(1); });  // 2: a Run that wakes workers
    ASSERT_EQ(count.load(), 2);
  }
}

TEST(ThreadPoolTest, NonPositiveThreadCountMeansOne) {
  ThreadPool pool(0);
  EXPECT_EQ(pool.size(), 1);
  int count = 0;
  pool.Run(5, [&](int worker, int64_t) { count += worker == 0; });
  EXPECT_EQ(count, 5);
}

}  // namespace
}  // namespace bitroll::kernels
