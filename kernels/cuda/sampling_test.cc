// GPU tests of the sampler: Philox / Gumbel noise bit-identical to kernels/cpu/philox.h, greedy
// ties, temperature sampling giving the CPU semantics' token, 1000 identical rows -> 1 unique
// output, and batch invariance. Each test skips loudly without a CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/philox.h"  // header-only: the CPU definition the GPU must match bit for bit
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/test_util.h"

namespace bitroll::kernels::cuda {
namespace {

using testing::DeviceBuffer;

struct Sampled {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
};

Sampled Sample(const std::vector<float>& logits, int32_t vocab,
               const std::vector<CudaSampleRow>& rows) {
  DeviceBuffer<float> ld(logits), lp(rows.size());
  DeviceBuffer<CudaSampleRow> rd(rows);
  DeviceBuffer<int32_t> td(rows.size());
  td.Fill(0xFF);
  EXPECT_EQ(CudaSample(ld.get(), static_cast<int64_t>(rows.size()), vocab, rd.get(), td.get(),
                       lp.get(), nullptr),
            cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return {td.Download(), lp.Download()};
}

// The CPU sampler's semantics with no filters (engine/sampler.h steps 1 and 6).
int32_t CpuToken(const float* logits, int32_t vocab, const CudaSampleRow& r) {
  int32_t best_id = 0;
  if (!(r.temperature > 0.0f)) {
    for (int32_t i = 1; i < vocab; ++i) {
      if (logits[i] > logits[best_id]) best_id = i;
    }
    return best_id;
  }
  double best = -INFINITY;
  for (int32_t i = 0; i < vocab; ++i) {
    const double s = double(logits[i] / r.temperature) +
                     kernels::GumbelNoise(r.seed, r.sample_index, r.position, i);
    if (s > best) {
      best = s;
      best_id = i;
    }
  }
  return best_id;
}

float CpuLogProb(const float* logits, int32_t vocab, float temperature, int32_t id) {
  std::vector<float> scaled(logits, logits + vocab);
  if (temperature > 0.0f) {
    for (auto& v : scaled) v = v / temperature;
  }
  std::vector<float> out(scaled.size());
  LogSoftmax(Isa::kScalar, scaled.data(), vocab, out.data());
  return out[id];
}

TEST(CudaSamplingTest, PhiloxAndGumbelBitIdenticalToCpu) {
  BR_REQUIRE_CUDA_DEVICE();
  std::mt19937_64 rng(1);
  std::vector<CudaPhiloxQuery> qs;
  for (int i = 0; i < 20000; ++i) {
    CudaPhiloxQuery q;
    q.seed = rng();
    q.sample_index = static_cast<uint32_t>(rng() % 64);
    q.position =
        i % 7 == 0 ? static_cast<int64_t>(rng() >> 20) : static_cast<int64_t>(rng() % 4096);
    q.token = static_cast<int32_t>(rng() % 200000);
    qs.push_back(q);
  }
  qs[0] = CudaPhiloxQuery{};  // all zero
  DeviceBuffer<CudaPhiloxQuery> qd(qs);
  DeviceBuffer<double> ud(qs.size()), gd(qs.size());
  BR_CUDA_OK(
      CudaPhiloxNoise(qd.get(), static_cast<int64_t>(qs.size()), ud.get(), gd.get(), nullptr));
  BR_CUDA_OK(cudaDeviceSynchronize());
  const auto u = ud.Download();
  const auto g = gd.Download();
  for (size_t i = 0; i < qs.size(); ++i) {
    const double cu =
        kernels::UniformOpen(qs[i].seed, qs[i].sample_index, qs[i].position, qs[i].token);
    const double cg =
        kernels::GumbelNoise(qs[i].seed, qs[i].sample_index, qs[i].position, qs[i].token);
    ASSERT_EQ(std::memcmp(&u[i], &cu, sizeof(double)), 0) << "uniform " << i;
    ASSERT_EQ(std::memcmp(&g[i], &cg, sizeof(double)), 0) << "gumbel " << i;
  }
}

TEST(CudaSamplingTest, GreedyTiesGoToTheLowestId) {
  BR_REQUIRE_CUDA_DEVICE();
  const int32_t vocab = 5000;
  std::vector<float> logits(vocab, 0.0f);
  logits[4000] = 3.0f;
  logits[17] = 3.0f;
  logits[5] = 3.0f;
  CudaSampleRow r;
  r.temperature = 0.0f;
  const Sampled s = Sample(logits, vocab, {r});
  EXPECT_EQ(s.tokens[0], 5);
  EXPECT_NEAR(s.logprobs[0], CpuLogProb(logits.data(), vocab, 0.0f, 5), 1e-5f);
}

TEST(CudaSamplingTest, TemperatureGivesTheCpuToken) {
  BR_REQUIRE_CUDA_DEVICE();
  const int32_t vocab = 32000;
  const int rows = 48;
  std::mt19937 rng(2);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> logits(static_cast<size_t>(rows) * vocab);
  for (auto& x : logits) x = dist(rng);
  std::vector<CudaSampleRow> rp(rows);
  for (int i = 0; i < rows; ++i) {
    rp[i].temperature = i % 4 == 0 ? 0.0f : (i % 4 == 1 ? 1.0f : (i % 4 == 2 ? 0.7f : 1.3f));
    rp[i].seed = 1000 + i / 3;
    rp[i].sample_index = static_cast<uint32_t>(i % 5);
    rp[i].position = 17 + i;
  }
  const Sampled s = Sample(logits, vocab, rp);
  for (int i = 0; i < rows; ++i) {
    const float* row = logits.data() + static_cast<size_t>(i) * vocab;
    ASSERT_EQ(s.tokens[i], CpuToken(row, vocab, rp[i])) << "row " << i;
    ASSERT_NEAR(s.logprobs[i], CpuLogProb(row, vocab, rp[i].temperature, s.tokens[i]), 2e-5f)
        << "row " << i;
  }
}

TEST(CudaSamplingTest, ThousandIdenticalRowsGiveOneOutput) {
  BR_REQUIRE_CUDA_DEVICE();
  const int32_t vocab = 32000;
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<float> row(vocab);
  for (auto& x : row) x = dist(rng);
  std::vector<float> logits;
  for (int i = 0; i < 1000; ++i) logits.insert(logits.end(), row.begin(), row.end());
  CudaSampleRow r;
  r.temperature = 0.9f;
  r.seed = 77;
  r.sample_index = 3;
  r.position = 123;
  const Sampled s = Sample(logits, vocab, std::vector<CudaSampleRow>(1000, r));
  std::set<std::pair<int32_t, uint32_t>> unique;
  for (int i = 0; i < 1000; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &s.logprobs[i], sizeof(bits));
    unique.insert({s.tokens[i], bits});
  }
  EXPECT_EQ(unique.size(), 1u);
  // And one row alone gives the same bits.
  const Sampled one = Sample(row, vocab, {r});
  EXPECT_EQ(one.tokens[0], s.tokens[0]);
  EXPECT_EQ(std::memcmp(&one.logprobs[0], &s.logprobs[0], sizeof(float)), 0);
}

}  // namespace
}  // namespace bitroll::kernels::cuda
