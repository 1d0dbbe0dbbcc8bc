// tests/bench/bench_roofline.cc: FMA peak and read bandwidth (see bench_roofline.h).

// GCC 12 false positives inside the AVX-512 intrinsic headers (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "tests/bench/bench_roofline.h"

#include <immintrin.h>
#include <time.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "tests/bench/bench_util.h"

namespace bitroll::bench {

namespace bk = bitroll::kernels;

BenchClock::time_point BenchClock::now() {
  timespec ts;
  clock_gettime(cpu ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
  const double t = static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  return cpu ? t / threads : t;
}

namespace {

volatile float g_sink;

// ---- FMA peak: 12 independent register-only fma chains ----

__attribute__((target("avx512f"))) float FmaLoopAvx512(int64_t iters) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  __m512 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) float FmaLoopAvx2(int64_t iters) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  __m256 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, acc[i]);
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0];
}

float FmaLoopScalar(int64_t iters) {
  float acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = static_cast<float>(i);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < 12; ++i)
      acc[i] = acc[i] * 0.999999f + 1e-7f;  // mul + add (no fma in base ISA)
  }
  float s = 0;
  for (float a : acc) s += a;
  return s;
}

int Lanes(bk::Isa isa) {
  return isa == bk::Isa::kAvx512 ? 16 : isa == bk::Isa::kAvx2 ? 8 : 1;
}

// ---- Read bandwidth: sum a buffer with 8 independent accumulators ----

__attribute__((target("avx512f"))) float SumAvx512(const float* p, int64_t n) {
  __m512 acc[8];
  for (auto& a : acc) a = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 128) {
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) acc[j] = _mm512_add_ps(acc[j], _mm512_load_ps(p + i + 16 * j));
  }
  for (int j = 1; j < 8; ++j) acc[0] = _mm512_add_ps(acc[0], acc[j]);
  return _mm512_reduce_add_ps(acc[0]);
}

// 8 accumulators of 8 lanes, two 64-byte lines per iteration (n a multiple of 128 as above).
__attribute__((target("avx2"))) float SumAvx2(const float* p, int64_t n) {
  __m256 acc[8];
  for (auto& a : acc) a = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 64) {
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) acc[j] = _mm256_add_ps(acc[j], _mm256_load_ps(p + i + 8 * j));
  }
  for (int j = 1; j < 8; ++j) acc[0] = _mm256_add_ps(acc[0], acc[j]);
  float out[8];
  _mm256_storeu_ps(out, acc[0]);
  return out[0];
}

}  // namespace

double FmaPeak(bk::Isa isa, int threads, int reps) {
  BenchClock::threads = threads;
  const int64_t iters = 2'000'000;
  auto body = [&] {
    float r = isa == bk::Isa::kAvx512 ? FmaLoopAvx512(iters)
              : isa == bk::Isa::kAvx2 ? FmaLoopAvx2(iters)
                                      : FmaLoopScalar(iters / 8);
    g_sink = r;
  };
  const double flops_per_thread =
      static_cast<double>(isa == bk::Isa::kScalar ? iters / 8 : iters) * 12 * Lanes(isa) * 2;
  std::vector<double> rates;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = BenchClock::now();
    std::vector<std::thread> ts;
    for (int t = 1; t < threads; ++t) ts.emplace_back(body);
    body();
    for (auto& t : ts) t.join();
    rates.push_back(flops_per_thread * threads / (BenchClock::now() - t0) / 1e9);
  }
  return Median(rates);
}

bool ReadBandwidthSupported(bk::Isa isa) {
  return isa == bk::Isa::kAvx512 || isa == bk::Isa::kAvx2;
}

double ReadBandwidth(bk::Isa isa, int threads, int reps, const float* buf, int64_t n) {
  BenchClock::threads = threads;
  auto sum = isa == bk::Isa::kAvx512 ? SumAvx512 : SumAvx2;
  std::vector<double> rates;
  for (int r = 0; r < reps; ++r) {
    const int64_t per = n / threads / 128 * 128;
    const auto t0 = BenchClock::now();
    std::vector<std::thread> ts;
    for (int t = 1; t < threads; ++t) {
      ts.emplace_back([=] { g_sink = sum(buf + t * per, per); });
    }
    g_sink = sum(buf, per);
    for (auto& t : ts) t.join();
    rates.push_back(static_cast<double>(per) * threads * 4 / (BenchClock::now() - t0) / 1e9);
  }
  return Median(rates);
}

kernels::ZeroPages ReadBandwidthBuffer(int64_t bytes) {
  kernels::ZeroPages z;
  const int64_t n = bytes / 4096 * 4096 / static_cast<int64_t>(sizeof(float));
  if (n <= 0 || !z.Map(static_cast<size_t>(n) * sizeof(float), /*huge_pages=*/true)) return {};
  std::fill_n(reinterpret_cast<float*>(z.data()), n, 1.0f);
  return z;
}

}  // namespace bitroll::bench
