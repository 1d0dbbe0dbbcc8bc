// tests/bench/bench_roofline.h: the machine limits the benchmarks set their figures against,
// measured in the benchmark's own process: the FMA peak (register-only fma chains) and the read
// bandwidth (a sum over a buffer). bench_kernels prints them; bench_engine --attention-suite
// measures them before its first case and after each case's rep, and reports each rep against
// the two around it (and a decoding case's steps against one-pass probes between its steps).
//
// Thread-safety: FmaPeak and ReadBandwidth start and join their own threads; do not run two at
// once (they share BenchClock's settings and would compete for the cores they measure).
#pragma once

#include <cstdint>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/zero_pages.h"

namespace bitroll::bench {

// The benchmarks' clock: wall time (default), or with `cpu` the process CPU time divided by
// `threads` (on a shared machine, an estimate of the time with the cores to oneself).
struct BenchClock {
  using time_point = double;  // seconds
  static inline bool cpu = false;
  static inline int threads = 1;
  static time_point now();
};

// GFLOP/s (2 flops per fma) of `threads` threads each running 12 independent register-only fma
// chains of `isa`'s widest vectors (kScalar: a multiply and an add, counted as 2 flops), for 24M
// fmas per thread; the median of `reps` runs. Sets BenchClock::threads = threads. `isa` must be
// supported by this CPU.
double FmaPeak(kernels::Isa isa, int threads, int reps);

// The ISAs ReadBandwidth can run: kAvx512 and kAvx2.
bool ReadBandwidthSupported(kernels::Isa isa);

// GB/s of `threads` threads each summing its own contiguous 1/threads of buf[0, n) with 8
// independent accumulators of `isa`'s vectors; the median of `reps` runs. buf must be 64-byte
// aligned and n >= 128 * threads. Sets BenchClock::threads = threads. `isa` must be
// ReadBandwidthSupported and supported by this CPU. Measures DRAM only when the buffer is well
// beyond the last-level cache.
double ReadBandwidth(kernels::Isa isa, int threads, int reps, const float* buf, int64_t n);

// A buffer for ReadBandwidth: `bytes` (rounded down to 4 KiB) of 1.0f, mapped with huge pages as
// the engine's packed weights are (kernels/cpu/zero_pages.h), so that the probe streams memory the
// way the matmuls do. data() is null when the memory is refused.
kernels::ZeroPages ReadBandwidthBuffer(int64_t bytes);

}  // namespace bitroll::bench
