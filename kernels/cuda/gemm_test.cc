// GPU tests of the bf16 GEMM: batch invariance by memcmp (every M in 1..256, random row
// positions, both tile configurations, fp32 and bf16 output), agreement with a CPU reference, and
// the split-K-by-M negative control. Each test skips loudly without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/math.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/test_util.h"

namespace bitroll::kernels::cuda {
namespace {

using testing::DeviceBuffer;

std::vector<uint16_t> RandomBf16(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = F32ToBf16(dist(rng));
  return v;
}

struct Shape {
  int64_t n, k;
};

// Computes y = x * w^T for `m` rows of `x` (device) into a fresh host vector of raw output words.
template <typename Out>
std::vector<Out> RunGemm(const DeviceBuffer<uint16_t>& x, int64_t m,
                         const DeviceBuffer<uint16_t>& w, Shape s, int config, cudaError_t* err) {
  DeviceBuffer<Out> y(static_cast<size_t>(std::max<int64_t>(m, 1) * s.n));
  y.Fill(0xFF);  // poison: NaN / 0xFFFF, so an unwritten element can't pass as a value
  CudaGemmParams p;
  p.x = x.get();
  p.m = m;
  p.ldx = s.k;
  p.w = w.get();
  p.n = s.n;
  p.k = s.k;
  p.y = y.get();
  p.ldy = s.n;
  p.out = sizeof(Out) == 4 ? GemmOut::kF32 : GemmOut::kBF16;
  *err = config < 0 ? CudaGemm(p, nullptr) : CudaGemmWithConfig(p, config, nullptr);
  if (*err == cudaSuccess) *err = cudaDeviceSynchronize();
  std::vector<Out> out = y.Download();
  out.resize(static_cast<size_t>(m * s.n));
  // Every element written: none keeps the all-ones poison.
  const size_t unwritten = static_cast<size_t>(std::count_if(out.begin(), out.end(), [](Out v) {
    Out poison;
    std::memset(&poison, 0xFF, sizeof(poison));
    return std::memcmp(&v, &poison, sizeof(v)) == 0;
  }));
  if (*err == cudaSuccess && unwritten > 0) {
    ADD_FAILURE() << unwritten << " output elements were never written (m=" << m << ")";
  }
  return out;
}

template <typename Out>
void CheckBatchInvariance(Shape s, int config) {
  constexpr int64_t kMaxM = 256;
  const auto xh = RandomBf16(static_cast<size_t>(kMaxM * s.k), 11);
  const auto wh = RandomBf16(static_cast<size_t>(s.n * s.k), 12);
  DeviceBuffer<uint16_t> x(xh), w(wh);
  ASSERT_TRUE(x.ok() && w.ok());
  cudaError_t err;
  // Each row alone (M = 1) is the reference.
  std::vector<std::vector<Out>> alone(kMaxM);
  for (int64_t r = 0; r < kMaxM; ++r) {
    std::vector<uint16_t> row(xh.begin() + r * s.k, xh.begin() + (r + 1) * s.k);
    DeviceBuffer<uint16_t> xr(row);
    alone[r] = RunGemm<Out>(xr, 1, w, s, config, &err);
    ASSERT_EQ(err, cudaSuccess) << cudaGetErrorName(err);
  }
  // Every batch size 1..256: each row equals the row computed alone.
  for (int64_t m = 1; m <= kMaxM; ++m) {
    const std::vector<Out> y = RunGemm<Out>(x, m, w, s, config, &err);
    ASSERT_EQ(err, cudaSuccess) << cudaGetErrorName(err);
    for (int64_t r = 0; r < m; ++r) {
      ASSERT_EQ(std::memcmp(y.data() + r * s.n, alone[r].data(), s.n * sizeof(Out)), 0)
          << "row " << r << " of M=" << m << " differs from the row alone (n=" << s.n
          << " k=" << s.k << " config " << config << ")";
    }
  }
  // Random row positions: permute the batch, each row must still equal its row alone.
  std::mt19937 rng(5);
  for (int trial = 0; trial < 4; ++trial) {
    std::vector<int64_t> perm(kMaxM);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    const int64_t m = 1 + static_cast<int64_t>(rng() % kMaxM);
    std::vector<uint16_t> xp(static_cast<size_t>(m * s.k));
    for (int64_t i = 0; i < m; ++i) {
      std::copy(xh.begin() + perm[i] * s.k, xh.begin() + (perm[i] + 1) * s.k, xp.begin() + i * s.k);
    }
    DeviceBuffer<uint16_t> xd(xp);
    const std::vector<Out> y = RunGemm<Out>(xd, m, w, s, config, &err);
    ASSERT_EQ(err, cudaSuccess);
    for (int64_t i = 0; i < m; ++i) {
      ASSERT_EQ(std::memcmp(y.data() + i * s.n, alone[perm[i]].data(), s.n * sizeof(Out)), 0)
          << "row " << perm[i] << " at position " << i << " of M=" << m;
    }
  }
}

// Ragged shapes: N not a multiple of any tile, K % 32 != 0 and K % 16 != 0 (zero-padded k).
TEST(CudaGemmTest, EveryRowEqualsTheRowAloneF32) {
  BR_REQUIRE_CUDA_DEVICE();
  CheckBatchInvariance<float>({200, 264}, -1);
  CheckBatchInvariance<float>({130, 40}, 0);
}

TEST(CudaGemmTest, EveryRowEqualsTheRowAloneBf16) {
  BR_REQUIRE_CUDA_DEVICE();
  CheckBatchInvariance<uint16_t>({200, 264}, -1);
}

TEST(CudaGemmTest, ModelShapeRowsInvariant) {
  BR_REQUIRE_CUDA_DEVICE();
  CheckBatchInvariance<float>({896, 896}, -1);  // Qwen2.5-0.5B attention projection
}

TEST(CudaGemmTest, TileConfigurationsGiveTheSameBits) {
  BR_REQUIRE_CUDA_DEVICE();
  const Shape s{384, 1000};
  for (int64_t m : {1, 7, 64, 200}) {
    const auto xh = RandomBf16(static_cast<size_t>(m * s.k), 21);
    const auto wh = RandomBf16(static_cast<size_t>(s.n * s.k), 22);
    DeviceBuffer<uint16_t> x(xh), w(wh);
    cudaError_t err;
    const auto a = RunGemm<float>(x, m, w, s, 0, &err);
    ASSERT_EQ(err, cudaSuccess);
    const auto b = RunGemm<float>(x, m, w, s, 1, &err);
    ASSERT_EQ(err, cudaSuccess);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "m=" << m;
  }
}

TEST(CudaGemmTest, AgreesWithCpuReference) {
  BR_REQUIRE_CUDA_DEVICE();
  // bf16 x bf16 products are exact in fp32/fp64; the reference sums them in fp64. The GPU sums
  // in fp32 on the tensor cores: bound |y - ref| <= 1e-4 * sum_k |x_k w_k| (+ bf16 rounding of
  // the output for the bf16 variant: 2^-8 relative).
  for (const Shape s : {Shape{200, 264}, Shape{896, 896}, Shape{64, 4864}}) {
    const int64_t m = 37;
    const auto xh = RandomBf16(static_cast<size_t>(m * s.k), 31);
    const auto wh = RandomBf16(static_cast<size_t>(s.n * s.k), 32);
    DeviceBuffer<uint16_t> x(xh), w(wh);
    cudaError_t err;
    const auto y = RunGemm<float>(x, m, w, s, -1, &err);
    ASSERT_EQ(err, cudaSuccess);
    const auto yb = RunGemm<uint16_t>(x, m, w, s, -1, &err);
    ASSERT_EQ(err, cudaSuccess);
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t c = 0; c < s.n; ++c) {
        double ref = 0.0, mag = 0.0;
        for (int64_t k = 0; k < s.k; ++k) {
          const double prod = double(Bf16ToF32(xh[r * s.k + k])) * Bf16ToF32(wh[c * s.k + k]);
          ref += prod;
          mag += std::fabs(prod);
        }
        const float got = y[r * s.n + c];
        ASSERT_LE(std::fabs(got - ref), 1e-4 * mag + 1e-30)
            << "y[" << r << "][" << c << "] n=" << s.n << " k=" << s.k;
        // bf16 output: the fp32 result rounded once to nearest even.
        ASSERT_EQ(yb[r * s.n + c], F32ToBf16(got));
      }
    }
  }
}

TEST(CudaGemmTest, ZeroRowsIsANoOp) {
  BR_REQUIRE_CUDA_DEVICE();
  DeviceBuffer<uint16_t> w(RandomBf16(64 * 64, 1));
  CudaGemmParams p;
  p.w = w.get();
  p.n = 64;
  p.k = 64;
  p.m = 0;
  EXPECT_EQ(CudaGemm(p, nullptr), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// NEGATIVE CONTROL: the split-K variant whose split count follows M must break the memcmp check
// that the invariant kernel passes on the same data. If this test fails, the suite could not
// catch a batch-variant GEMM.
TEST(CudaGemmTest, NegativeControlSplitKByMBreaksInvariance) {
  BR_REQUIRE_CUDA_DEVICE();
  const Shape s{256, 4096};
  const int64_t big_m = 256;
  const auto xh = RandomBf16(static_cast<size_t>(big_m * s.k), 41);
  const auto wh = RandomBf16(static_cast<size_t>(s.n * s.k), 42);
  DeviceBuffer<uint16_t> x(xh), w(wh);
  auto run_split = [&](int64_t m) {
    DeviceBuffer<float> y(static_cast<size_t>(m * s.n));
    DeviceBuffer<float> ws(CudaGemmSplitKWorkspaceBytes(m, s.n) / sizeof(float));
    CudaGemmParams p;
    p.x = x.get();
    p.m = m;
    p.ldx = s.k;
    p.w = w.get();
    p.n = s.n;
    p.k = s.k;
    p.y = y.get();
    p.ldy = s.n;
    EXPECT_EQ(CudaGemmSplitKByM(p, ws.get(), ws.size() * sizeof(float), nullptr), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return y.Download();
  };
  cudaError_t err;
  const auto inv_1 = RunGemm<float>(x, 1, w, s, -1, &err);
  const auto inv_big = RunGemm<float>(x, big_m, w, s, -1, &err);
  ASSERT_EQ(err, cudaSuccess);
  // The invariant kernel: row 0 identical at M = 1 and M = 256.
  ASSERT_EQ(std::memcmp(inv_1.data(), inv_big.data(), s.n * sizeof(float)), 0);
  // The variant: 4 splits at M = 1, 1 split at M = 256; the check must see a difference.
  const auto var_1 = run_split(1);
  const auto var_big = run_split(big_m);
  EXPECT_NE(std::memcmp(var_1.data(), var_big.data(), s.n * sizeof(float)), 0)
      << "negative control: the split-K-by-M GEMM was not caught by memcmp";
  // ... while still being a correct GEMM (same numbers within rounding).
  for (int64_t c = 0; c < s.n; ++c) EXPECT_NEAR(var_1[c], inv_1[c], 1e-3f);
}

}  // namespace
}  // namespace bitroll::kernels::cuda
