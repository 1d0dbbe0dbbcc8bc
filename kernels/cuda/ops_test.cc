// GPU tests of the row ops: batch invariance by memcmp (a row alone == the row in any batch),
// bit-identity with the CPU for RoPE and SwiGLU, and CPU agreement within a tolerance for
// RMSNorm and log-softmax (different reduction orders). Each test skips loudly without a device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/math.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/test_util.h"

namespace bitroll::kernels::cuda {
namespace {

using testing::DeviceBuffer;

std::vector<float> Random(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

bool AllFinite(const std::vector<float>& v) {
  for (float x : v) {
    if (!std::isfinite(x)) return false;
  }
  return true;
}

TEST(CudaOpsTest, RmsNormBatchInvariantAndNearCpu) {
  BR_REQUIRE_CUDA_DEVICE();
  for (int64_t dim : {1, 7, 255, 256, 257, 896, 4096}) {
    const int64_t rows = 33;
    const auto x = Random(static_cast<size_t>(rows * dim), 1, -3.0f, 3.0f);
    const auto wt = Random(static_cast<size_t>(dim), 2, 0.5f, 1.5f);
    DeviceBuffer<float> xd(x), wd(wt), out(x.size());
    DeviceBuffer<uint16_t> outb(x.size());
    out.Fill(0xFF);
    BR_CUDA_OK(CudaRmsNorm(xd.get(), wd.get(), rows, dim, 1e-5f, out.get(), outb.get(), nullptr));
    BR_CUDA_OK(cudaDeviceSynchronize());
    const auto all = out.Download();
    const auto allb = outb.Download();
    ASSERT_TRUE(AllFinite(all));
    for (int64_t r = 0; r < rows; ++r) {
      DeviceBuffer<float> one(static_cast<size_t>(dim));
      BR_CUDA_OK(
          CudaRmsNorm(xd.get() + r * dim, wd.get(), 1, dim, 1e-5f, one.get(), nullptr, nullptr));
      BR_CUDA_OK(cudaDeviceSynchronize());
      const auto alone = one.Download();
      ASSERT_EQ(std::memcmp(alone.data(), all.data() + r * dim, dim * sizeof(float)), 0)
          << "dim " << dim << " row " << r;
      std::vector<float> cpu(static_cast<size_t>(dim));
      RmsNorm(Isa::kScalar, x.data() + r * dim, wt.data(), dim, 1e-5f, cpu.data());
      for (int64_t i = 0; i < dim; ++i) {
        ASSERT_NEAR(all[r * dim + i], cpu[i], 1e-5f * std::fabs(cpu[i]) + 1e-7f)
            << "dim " << dim << " row " << r << " i " << i;
        ASSERT_EQ(allb[r * dim + i], F32ToBf16(all[r * dim + i]));
      }
    }
  }
}

TEST(CudaOpsTest, LogSoftmaxBatchInvariantAndNearCpu) {
  BR_REQUIRE_CUDA_DEVICE();
  for (int64_t n : {1, 5, 1000, 32000, 151936}) {
    const int64_t rows = 9;
    const auto x = Random(static_cast<size_t>(rows * n), 3, -12.0f, 12.0f);
    DeviceBuffer<float> xd(x), out(x.size());
    out.Fill(0xFF);
    BR_CUDA_OK(CudaLogSoftmax(xd.get(), rows, n, out.get(), nullptr));
    BR_CUDA_OK(cudaDeviceSynchronize());
    const auto all = out.Download();
    ASSERT_TRUE(AllFinite(all));
    for (int64_t r = 0; r < rows; ++r) {
      DeviceBuffer<float> one(static_cast<size_t>(n));
      BR_CUDA_OK(CudaLogSoftmax(xd.get() + r * n, 1, n, one.get(), nullptr));
      BR_CUDA_OK(cudaDeviceSynchronize());
      const auto alone = one.Download();
      ASSERT_EQ(std::memcmp(alone.data(), all.data() + r * n, n * sizeof(float)), 0)
          << "n " << n << " row " << r;
      std::vector<float> cpu(static_cast<size_t>(n));
      LogSoftmax(Isa::kScalar, x.data() + r * n, n, cpu.data());
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_NEAR(all[r * n + i], cpu[i], 2e-5f + 1e-6f * std::fabs(cpu[i]))
            << "n " << n << " row " << r << " i " << i;
      }
    }
  }
}

TEST(CudaOpsTest, RopeIsBitIdenticalToCpu) {
  BR_REQUIRE_CUDA_DEVICE();
  for (bool half_split : {false, true}) {
    const int64_t tokens = 37, heads = 6, hd = 64, max_pos = 4096;
    std::vector<float> cos(static_cast<size_t>(max_pos * hd / 2)), sin(cos.size());
    RopeTable(10000.0f, hd, max_pos, cos.data(), sin.data());
    auto x = Random(static_cast<size_t>(tokens * heads * hd), 4, -2.0f, 2.0f);
    std::vector<int32_t> pos(static_cast<size_t>(tokens));
    std::mt19937 rng(9);
    for (auto& p : pos) p = static_cast<int32_t>(rng() % max_pos);
    DeviceBuffer<float> xd(x), cd(cos), sd(sin);
    DeviceBuffer<int32_t> pd(pos);
    BR_CUDA_OK(CudaRope(xd.get(), tokens, heads, hd, pd.get(), cd.get(), sd.get(), max_pos,
                        half_split, nullptr));
    BR_CUDA_OK(cudaDeviceSynchronize());
    const auto gpu = xd.Download();
    for (int64_t t = 0; t < tokens; ++t) {
      Rope(Isa::kScalar, x.data() + t * heads * hd, heads, hd, cos.data() + pos[t] * hd / 2,
           sin.data() + pos[t] * hd / 2,
           half_split ? RopeLayout::kHalfSplit : RopeLayout::kInterleaved);
    }
    EXPECT_EQ(std::memcmp(gpu.data(), x.data(), x.size() * sizeof(float)), 0)
        << "half_split " << half_split;
  }
}

TEST(CudaOpsTest, SwiGluIsBitIdenticalToCpu) {
  BR_REQUIRE_CUDA_DEVICE();
  const int64_t n = 100003;
  const auto g = Random(static_cast<size_t>(n), 5, -100.0f, 30.0f);  // Exp's clamps included
  const auto u = Random(static_cast<size_t>(n), 6, -4.0f, 4.0f);
  DeviceBuffer<float> gd(g), ud(u), od(static_cast<size_t>(n));
  BR_CUDA_OK(CudaSwiGlu(gd.get(), ud.get(), n, od.get(), nullptr));
  BR_CUDA_OK(cudaDeviceSynchronize());
  const auto gpu = od.Download();
  std::vector<float> cpu(static_cast<size_t>(n));
  SwiGlu(Isa::kScalar, g.data(), u.data(), n, cpu.data());
  EXPECT_EQ(std::memcmp(gpu.data(), cpu.data(), cpu.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace bitroll::kernels::cuda
