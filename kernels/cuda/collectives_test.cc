// GPU tests of the fixed-order collectives: the rank-ordered sum is bitwise the CPU's; single-rank
// all-reduce and broadcast (NCCL) leave the bits unchanged; with >= 2 GPUs every rank ends with
// the same bits. Each test skips loudly without what it needs.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "kernels/cuda/collectives.h"
#include "kernels/cuda/test_util.h"

namespace bitroll::kernels::cuda {
namespace {

using testing::DeviceBuffer;

std::vector<float> Wide(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exp(-20, 20);
  std::vector<float> v(n);
  for (auto& x : v) x = std::ldexp(mant(rng), exp(rng));
  return v;
}

std::vector<float> CpuRankOrderSum(const std::vector<float>& g, int ranks, size_t count) {
  std::vector<float> out(count);
  for (size_t i = 0; i < count; ++i) {
    float s = g[i];
    for (int r = 1; r < ranks; ++r) s = s + g[r * count + i];
    out[i] = s;
  }
  return out;
}

TEST(CudaCollectivesTest, FixedOrderSumIsTheRankOrderSumBitwise) {
  BR_REQUIRE_CUDA_DEVICE();
  const int ranks = 5;
  const size_t count = 100003;
  const auto g = Wide(ranks * count, 1);
  DeviceBuffer<float> gd(g), out(count);
  BR_CUDA_OK(FixedOrderSumF32(gd.get(), ranks, count, out.get(), nullptr));
  BR_CUDA_OK(cudaDeviceSynchronize());
  const auto gpu = out.Download();
  const auto cpu = CpuRankOrderSum(g, ranks, count);
  EXPECT_EQ(std::memcmp(gpu.data(), cpu.data(), count * sizeof(float)), 0);
  // Order matters on these data (so the check above is not vacuous): the reverse order differs.
  std::vector<float> rev(count);
  for (size_t i = 0; i < count; ++i) {
    float s = g[(ranks - 1) * count + i];
    for (int r = ranks - 2; r >= 0; --r) s = s + g[r * count + i];
    rev[i] = s;
  }
  EXPECT_NE(std::memcmp(rev.data(), cpu.data(), count * sizeof(float)), 0);
}

#if defined(BITROLL_HAVE_NCCL)
TEST(CudaCollectivesTest, SingleRankAllReduceAndBroadcastKeepTheBits) {
  BR_REQUIRE_CUDA_DEVICE();
  ncclComm_t comm;
  int dev = 0;
  ASSERT_EQ(ncclCommInitAll(&comm, 1, &dev), ncclSuccess);
  const size_t count = 4099;
  const auto h = Wide(count, 2);
  DeviceBuffer<float> data(h), scratch(count);
  ASSERT_EQ(FixedOrderAllReduceF32(data.get(), count, scratch.get(), count * sizeof(float), comm,
                                   nullptr),
            ncclSuccess);
  ASSERT_EQ(BroadcastWeights(data.get(), count * sizeof(float), 0, comm, nullptr), ncclSuccess);
  BR_CUDA_OK(cudaDeviceSynchronize());
  const auto got = data.Download();
  EXPECT_EQ(std::memcmp(got.data(), h.data(), count * sizeof(float)), 0);
  EXPECT_EQ(FixedOrderAllReduceF32(data.get(), count, scratch.get(), 4, comm, nullptr),
            ncclInvalidArgument);
  ncclCommDestroy(comm);
}

TEST(CudaCollectivesTest, MultiRankAllReduceGivesEveryRankTheSameBits) {
  BR_REQUIRE_CUDA_DEVICE();
  int n = 0;
  BR_CUDA_OK(cudaGetDeviceCount(&n));
  if (n < 2) {
    std::fprintf(stderr, "[  SKIPPED ] needs >= 2 CUDA devices, found %d\n", n);
    GTEST_SKIP() << "needs >= 2 CUDA devices, found " << n;
  }
  std::vector<int> devs(n);
  for (int i = 0; i < n; ++i) devs[i] = i;
  std::vector<ncclComm_t> comms(n);
  ASSERT_EQ(ncclCommInitAll(comms.data(), n, devs.data()), ncclSuccess);
  const size_t count = 1 << 16;
  std::vector<float> all;
  std::vector<float*> data(n), scratch(n);
  for (int r = 0; r < n; ++r) {
    const auto h = Wide(count, 10 + r);
    all.insert(all.end(), h.begin(), h.end());
    BR_CUDA_OK(cudaSetDevice(r));
    BR_CUDA_OK(cudaMalloc(&data[r], count * sizeof(float)));
    BR_CUDA_OK(cudaMalloc(&scratch[r], n * count * sizeof(float)));
    BR_CUDA_OK(cudaMemcpy(data[r], h.data(), count * sizeof(float), cudaMemcpyHostToDevice));
  }
  // One thread drives every rank: group the all-gathers, then sum per rank (collectives.h).
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(ncclAllGather(data[r], scratch[r], count, ncclFloat32, comms[r], nullptr),
              ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  const auto cpu = CpuRankOrderSum(all, n, count);
  for (int r = 0; r < n; ++r) {
    BR_CUDA_OK(cudaSetDevice(r));
    BR_CUDA_OK(FixedOrderSumF32(scratch[r], n, count, data[r], nullptr));
    BR_CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> got(count);
    BR_CUDA_OK(cudaMemcpy(got.data(), data[r], count * sizeof(float), cudaMemcpyDeviceToHost));
    EXPECT_EQ(std::memcmp(got.data(), cpu.data(), count * sizeof(float)), 0) << "rank " << r;
    cudaFree(data[r]);
    cudaFree(scratch[r]);
    ncclCommDestroy(comms[r]);
  }
  BR_CUDA_OK(cudaSetDevice(0));
}
#else
TEST(CudaCollectivesTest, NcclNotBuilt) {
  std::fprintf(stderr,
               "[  SKIPPED ] NCCL was not found at configure time: the NCCL tests are "
               "not built\n");
  GTEST_SKIP() << "NCCL not found at configure time";
}
#endif

}  // namespace
}  // namespace bitroll::kernels::cuda
