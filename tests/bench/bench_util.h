// tests/bench/bench_util.h: small helpers shared by the benchmark programs. Header-only.
#pragma once

#include <algorithm>
#include <vector>

namespace bitroll::bench {

// The median of v (the upper of the two middle values for an even count); 0 when v is empty.
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace bitroll::bench
