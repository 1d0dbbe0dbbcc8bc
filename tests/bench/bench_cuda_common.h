// tests/bench/bench_cuda_common.h: what the CUDA benchmarks share: CHECK_CUDA (a benchmark exits
// with status 2 on a CUDA error), their flags (--quick, --reps=N, --csv=PATH), the device check
// (no device: a loud SKIPPED line and exit 0) and the median. Header-only; benchmarks only.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define CHECK_CUDA(expr)                                                   \
  do {                                                                     \
    cudaError_t e_ = (expr);                                               \
    if (e_ != cudaSuccess) {                                               \
      std::fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #expr, \
                   cudaGetErrorString(e_));                                \
      std::exit(2);                                                        \
    }                                                                      \
  } while (0)

namespace bitroll::bench {

struct CudaBenchArgs {
  bool quick = false;  // at most 5 repetitions
  int reps = 10;
  std::string csv_path;  // empty: no CSV
};

inline CudaBenchArgs ParseCudaBenchArgs(int argc, char** argv, int default_reps) {
  CudaBenchArgs a;
  a.reps = default_reps;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) a.quick = true;
    if (std::strncmp(argv[i], "--reps=", 7) == 0) a.reps = std::max(1, std::atoi(argv[i] + 7));
    if (std::strncmp(argv[i], "--csv=", 6) == 0) a.csv_path = argv[i] + 6;
  }
  if (a.quick) a.reps = std::min(a.reps, 5);
  return a;
}

// False, after printing "<program>: SKIPPED: no CUDA device", when no device is usable.
inline bool HaveCudaDevice(const char* program) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count < 1) {
    std::printf("%s: SKIPPED: no CUDA device\n", program);
    return false;
  }
  return true;
}

inline double Median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace bitroll::bench
