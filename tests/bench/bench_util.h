// tests/bench/bench_util.h: small helpers shared by the benchmark programs. Header-only.
#pragma once

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

namespace bitroll::bench {

// The median of v (the upper of the two middle values for an even count); 0 when v is empty.
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The comma-separated items of a flag's value ("a,b,c"); empty items are dropped.
inline std::vector<std::string> SplitCommas(std::string_view list) {
  std::vector<std::string> items;
  for (size_t at = 0; at < list.size();) {
    const size_t comma = std::min(list.find(',', at), list.size());
    if (comma > at) items.emplace_back(list.substr(at, comma - at));
    at = comma + 1;
  }
  return items;
}

}  // namespace bitroll::bench
