// Row-op tests: scalar == AVX2 == AVX-512 with memcmp for n = 1..70 (and larger), the canonical
// lane order checked against an independent transcription, accuracy vs double, negative controls.

#include "kernels/cpu/ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "kernels/cpu/math.h"

namespace bitroll::kernels {
namespace {

std::vector<float> RandomFloats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

std::vector<Isa> SimdIsas() {
  std::vector<Isa> isas;
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    if (IsaSupported(isa)) {
      isas.push_back(isa);
    } else {
      std::printf("WARNING: CPU lacks %s: that path is NOT TESTED here\n", IsaName(isa));
    }
  }
  return isas;
}

std::vector<int64_t> Sizes() {
  std::vector<int64_t> sizes;
  for (int64_t n = 1; n <= 70; ++n) sizes.push_back(n);
  for (int64_t n : {127, 128, 129, 768, 1000, 2048, 32000}) sizes.push_back(n);
  return sizes;
}

bool SameBits(float a, float b) {
  return std::memcmp(&a, &b, sizeof(float)) == 0;
}
bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(OpsTest, ReductionsEqualAcrossIsas) {
  for (int64_t n : Sizes()) {
    const std::vector<float> x = RandomFloats(static_cast<size_t>(n), 100 + n, 3.0f);
    const float ss = SumSquares(Isa::kScalar, x.data(), n);
    const float mx = MaxValue(Isa::kScalar, x.data(), n);
    const float se = SumExpShifted(Isa::kScalar, x.data(), n, mx);
    const float lse = LogSumExp(Isa::kScalar, x.data(), n);
    for (Isa isa : SimdIsas()) {
      ASSERT_TRUE(SameBits(ss, SumSquares(isa, x.data(), n))) << IsaName(isa) << " n=" << n;
      ASSERT_TRUE(SameBits(mx, MaxValue(isa, x.data(), n))) << IsaName(isa) << " n=" << n;
      ASSERT_TRUE(SameBits(se, SumExpShifted(isa, x.data(), n, mx))) << IsaName(isa) << " n=" << n;
      ASSERT_TRUE(SameBits(lse, LogSumExp(isa, x.data(), n))) << IsaName(isa) << " n=" << n;
    }
  }
}

// An independent transcription of the lane order (no shared helpers) pins the scalar definition.
TEST(OpsTest, ScalarFollowsCanonicalLaneOrder) {
  for (int64_t n : {1, 5, 16, 17, 45, 768}) {
    const std::vector<float> x = RandomFloats(static_cast<size_t>(n), 7 + n);
    float lane[16] = {0};
    for (int64_t i = 0; i < n; ++i) lane[i % 16] = std::fma(x[i], x[i], lane[i % 16]);
    for (int w = 8; w >= 1; w /= 2) {
      for (int j = 0; j < w; ++j) lane[j] = lane[j] + lane[j + w];
    }
    EXPECT_TRUE(SameBits(lane[0], SumSquares(Isa::kScalar, x.data(), n))) << n;
  }
  EXPECT_EQ(SumSquares(Isa::kScalar, nullptr, 0), 0.0f);
}

TEST(OpsTest, MaxValueIsExactAndHandlesSignedZeros) {
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!IsaSupported(isa)) continue;
    const float neg_first[] = {-0.0f, 0.0f, -1.0f};
    const float pos_first[] = {0.0f, -0.0f, -1.0f};
    const float m1 = MaxValue(isa, neg_first, 3), m2 = MaxValue(isa, pos_first, 3);
    EXPECT_TRUE(SameBits(m1, MaxValue(Isa::kScalar, neg_first, 3))) << IsaName(isa);
    EXPECT_TRUE(SameBits(m2, MaxValue(Isa::kScalar, pos_first, 3))) << IsaName(isa);
    const float all_inf[] = {-INFINITY, -INFINITY};
    EXPECT_EQ(MaxValue(isa, all_inf, 2), -INFINITY);
    std::vector<float> x = RandomFloats(1000, 9);
    x[637] = 50.0f;
    EXPECT_EQ(MaxValue(isa, x.data(), 1000), 50.0f) << IsaName(isa);
  }
}

// Element-wise ops, each on every ISA vs scalar, for all sizes.
TEST(OpsTest, ElementwiseOpsEqualAcrossIsas) {
  for (int64_t n : Sizes()) {
    const size_t sz = static_cast<size_t>(n);
    const std::vector<float> x = RandomFloats(sz, 200 + n, 4.0f);
    const std::vector<float> w = RandomFloats(sz, 300 + n);
    auto run = [&](Isa isa) {
      std::vector<std::vector<float>> outs(4, std::vector<float>(sz));
      LogSoftmax(isa, x.data(), n, outs[0].data());
      RmsNorm(isa, x.data(), w.data(), n, 1e-5f, outs[1].data());
      SwiGlu(isa, x.data(), w.data(), n, outs[2].data());
      outs[3] = x;
      Add(isa, outs[3].data(), w.data(), n);
      return outs;
    };
    const auto want = run(Isa::kScalar);
    for (Isa isa : SimdIsas()) {
      const auto got = run(isa);
      for (size_t op = 0; op < want.size(); ++op) {
        ASSERT_TRUE(SameBits(want[op], got[op])) << IsaName(isa) << " op=" << op << " n=" << n;
      }
    }
  }
}

TEST(OpsTest, InPlaceMatchesOutOfPlace) {
  const int64_t n = 45;
  const std::vector<float> x = RandomFloats(n, 61), w = RandomFloats(n, 62);
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!IsaSupported(isa)) continue;
    std::vector<float> out(n), in_place = x;
    RmsNorm(isa, x.data(), w.data(), n, 1e-5f, out.data());
    RmsNorm(isa, in_place.data(), w.data(), n, 1e-5f, in_place.data());
    EXPECT_TRUE(SameBits(out, in_place)) << IsaName(isa);
    in_place = x;
    LogSoftmax(isa, x.data(), n, out.data());
    LogSoftmax(isa, in_place.data(), n, in_place.data());
    EXPECT_TRUE(SameBits(out, in_place)) << IsaName(isa);
  }
}

TEST(OpsTest, RopeEqualsAcrossIsasAndLayouts) {
  for (int64_t head_dim : {2, 4, 6, 8, 10, 16, 30, 32, 34, 64, 128}) {
    const int64_t n_heads = 3, half = head_dim / 2, max_pos = 40;
    std::vector<float> cos(static_cast<size_t>(max_pos * half)), sin(cos.size());
    RopeTable(10000.0f, head_dim, max_pos, cos.data(), sin.data());
    const std::vector<float> x =
        RandomFloats(static_cast<size_t>(n_heads * head_dim), 400 + head_dim);
    for (RopeLayout layout : {RopeLayout::kInterleaved, RopeLayout::kHalfSplit}) {
      for (int64_t pos : {0, 1, 39}) {
        std::vector<float> want = x;
        Rope(Isa::kScalar, want.data(), n_heads, head_dim, &cos[pos * half], &sin[pos * half],
             layout);
        for (Isa isa : SimdIsas()) {
          std::vector<float> got = x;
          Rope(isa, got.data(), n_heads, head_dim, &cos[pos * half], &sin[pos * half], layout);
          ASSERT_TRUE(SameBits(want, got))
              << IsaName(isa) << " hd=" << head_dim << " layout=" << static_cast<int>(layout);
        }
        if (pos == 0) {
          EXPECT_TRUE(SameBits(want, x));  // cos 1, sin 0: identity
        }
      }
    }
  }
}

TEST(OpsTest, RopeMatchesDefinition) {
  const int64_t head_dim = 8, half = 4;
  const std::vector<float> x = RandomFloats(head_dim, 71);
  const std::vector<float> c = {0.5f, -0.25f, 0.75f, 1.0f}, s = {0.1f, 0.9f, -0.3f, 0.0f};
  std::vector<float> inter = x, split = x;
  Rope(Isa::kScalar, inter.data(), 1, head_dim, c.data(), s.data(), RopeLayout::kInterleaved);
  Rope(Isa::kScalar, split.data(), 1, head_dim, c.data(), s.data(), RopeLayout::kHalfSplit);
  for (int64_t i = 0; i < half; ++i) {
    float a = x[2 * i], b = x[2 * i + 1];
    float p = a * c[i], q = b * s[i];
    EXPECT_TRUE(SameBits(inter[2 * i], p - q));
    p = a * s[i];
    q = b * c[i];
    EXPECT_TRUE(SameBits(inter[2 * i + 1], p + q));
    a = x[i];
    b = x[i + half];
    p = a * c[i];
    q = b * s[i];
    EXPECT_TRUE(SameBits(split[i], p - q));
  }
}

TEST(OpsTest, RopeTableFollowsFormula) {
  const int64_t head_dim = 64, max_pos = 100, half = 32;
  std::vector<float> cos(max_pos * half), sin(max_pos * half);
  RopeTable(10000.0f, head_dim, max_pos, cos.data(), sin.data());
  for (int64_t pos : {0, 1, 57, 99}) {
    for (int64_t i : {0, 1, 17, 31}) {
      const float freq =
          1.0f / static_cast<float>(std::pow(10000.0, (float)(2 * i) / (float)head_dim));
      const float val = static_cast<float>(pos) * freq;
      EXPECT_EQ(cos[pos * half + i], static_cast<float>(std::cos(static_cast<double>(val))));
      EXPECT_EQ(sin[pos * half + i], static_cast<float>(std::sin(static_cast<double>(val))));
    }
  }
  EXPECT_EQ(cos[0], 1.0f);
  EXPECT_EQ(sin[0], 0.0f);
}

TEST(OpsTest, AccuracyAgainstDouble) {
  const int64_t n = 32000;
  const std::vector<float> x = RandomFloats(n, 81, 5.0f);
  const std::vector<float> w = RandomFloats(n, 82);
  double m = -INFINITY, ss = 0;
  for (float v : x) m = std::max<double>(m, v), ss += static_cast<double>(v) * v;
  double se = 0;
  for (float v : x) se += std::exp(static_cast<double>(v) - m);
  const double lse = m + std::log(se);
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!IsaSupported(isa)) continue;
    EXPECT_NEAR(SumSquares(isa, x.data(), n), ss, ss * 1e-5) << IsaName(isa);
    EXPECT_NEAR(LogSumExp(isa, x.data(), n), lse, std::fabs(lse) * 1e-6) << IsaName(isa);
    std::vector<float> out(n);
    LogSoftmax(isa, x.data(), n, out.data());
    for (int64_t i = 0; i < n; i += 997) EXPECT_NEAR(out[i], x[i] - lse, 1e-4) << i;
    RmsNorm(isa, x.data(), w.data(), n, 1e-5f, out.data());
    const double inv = 1.0 / std::sqrt(ss / n + 1e-5);
    for (int64_t i = 0; i < n; i += 997) EXPECT_NEAR(out[i], w[i] * inv * x[i], 1e-5) << i;
    SwiGlu(isa, x.data(), w.data(), n, out.data());
    for (int64_t i = 0; i < n; i += 997) {
      const double g = x[i], want = g / (1.0 + std::exp(-g)) * w[i];
      EXPECT_NEAR(out[i], want, 1e-5 * (1 + std::fabs(want))) << i;
    }
  }
}

// Negative control: a sequential (non-lane-order) sum of squares differs in bits from the
// canonical one for some sizes, so the memcmp checks above can fail.
TEST(OpsTest, NegativeControlSequentialSumDiffers) {
  int differ = 0;
  for (int64_t n : Sizes()) {
    const std::vector<float> x = RandomFloats(static_cast<size_t>(n), 100 + n, 3.0f);
    float seq = 0.0f;
    for (float v : x) seq = std::fma(v, v, seq);
    differ += !SameBits(seq, SumSquares(BestIsa(), x.data(), n));
  }
  EXPECT_GT(differ, 0);
}

}  // namespace
}  // namespace bitroll::kernels
