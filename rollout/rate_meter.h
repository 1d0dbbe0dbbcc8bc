// rollout/rate_meter.h: events per second over a sliding window of one-second buckets (the
// coordinator's decode-token rates, per replica and in all).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <utility>

namespace bitroll::rollout {

using Clock = std::chrono::steady_clock;

inline double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// Counts over the last five one-second buckets; PerSecond divides by their span (at least 1 s).
class RateMeter {
 public:
  void Add(int64_t n, Clock::time_point now) {
    Roll(now);
    buckets_.back().second += n;
  }
  double PerSecond(Clock::time_point now) {
    Roll(now);
    int64_t sum = 0;
    for (const auto& b : buckets_) sum += b.second;
    const double span = std::max(1.0, Seconds(now - buckets_.front().first));
    return static_cast<double>(sum) / span;
  }

 private:
  void Roll(Clock::time_point now) {
    if (buckets_.empty() || now - buckets_.back().first >= std::chrono::seconds(1)) {
      buckets_.emplace_back(now, 0);
    }
    while (buckets_.size() > 1 && now - buckets_.front().first > std::chrono::seconds(5)) {
      buckets_.pop_front();
    }
  }
  std::deque<std::pair<Clock::time_point, int64_t>> buckets_;
};

}  // namespace bitroll::rollout
