// Tests for math.h and its SIMD twins: accuracy against double-precision libm (tolerances are fine
// for ACCURACY) and scalar == AVX2 == AVX-512 bit equality (memcmp) over millions of values.

#include "kernels/cpu/math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/math_test_simd.h"

namespace bitroll::kernels {
namespace {

// Distance in ulps between a float result and the exact (double) value.
double UlpError(float got, double want) {
  const double w = static_cast<double>(static_cast<float>(want));
  float next = std::nextafter(static_cast<float>(w), INFINITY);
  double ulp = static_cast<double>(next) - w;
  if (ulp == 0 || !std::isfinite(ulp))
    ulp = w - static_cast<double>(std::nextafter(static_cast<float>(w), 0.0f));
  return std::fabs(static_cast<double>(got) - want) / ulp;
}

// Every 2^10-th float bit pattern (4M values: all signs, exponents, and edge cases) plus
// hand-picked edges, padded to a multiple of 16.
std::vector<float> ExpInputs() {
  std::vector<float> v;
  for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 1024 + 7) {
    v.push_back(std::bit_cast<float>(static_cast<uint32_t>(bits)));
  }
  const float edges[] = {0.0f,
                         -0.0f,
                         INFINITY,
                         -INFINITY,
                         NAN,
                         -NAN,
                         -87.0f,
                         std::nextafter(-87.0f, -INFINITY),
                         std::nextafter(-87.0f, 0.0f),
                         88.0f,
                         std::nextafter(88.0f, INFINITY),
                         std::nextafter(88.0f, 0.0f),
                         1e-45f,
                         -1e-45f,
                         1e-38f,
                         0.34657359f,
                         -0.34657359f,
                         0.5f,
                         -0.5f,
                         1.0f,
                         -1.0f,
                         -103.0f,
                         100.0f,
                         1e30f,
                         -1e30f,
                         3.4e38f,
                         -3.4e38f};
  v.insert(v.end(), std::begin(edges), std::end(edges));
  // Dense coverage of the active range.
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> dist(-90.0f, 90.0f);
  for (int i = 0; i < 1000000; ++i) v.push_back(dist(rng));
  while (v.size() % 16 != 0) v.push_back(1.0f);
  return v;
}

TEST(MathTest, ExpAccuracyWithin2Ulp) {
  double worst = 0;
  float worst_x = 0;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-87.0f, 88.0f);
  for (int i = 0; i < 2000000; ++i) {
    const float x = i < 1000000 ? dist(rng) : std::uniform_real_distribution<float>(-1, 1)(rng);
    const double want = std::exp(static_cast<double>(x));
    const double err = UlpError(Exp(x), want);
    if (err > worst) worst = err, worst_x = x;
  }
  EXPECT_LE(worst, 2.0) << "worst x = " << worst_x;
  std::printf("Exp max error %.3f ulp (x = %.9g)\n", worst, worst_x);
}

TEST(MathTest, ExpClampsAndSpecials) {
  EXPECT_EQ(std::bit_cast<uint32_t>(Exp(std::nextafter(-87.0f, -INFINITY))), 0u);  // +0 exactly
  EXPECT_EQ(std::bit_cast<uint32_t>(Exp(-1000.0f)), 0u);
  EXPECT_EQ(std::bit_cast<uint32_t>(Exp(-INFINITY)), 0u);
  EXPECT_EQ(Exp(std::nextafter(88.0f, INFINITY)), INFINITY);
  EXPECT_EQ(Exp(INFINITY), INFINITY);
  EXPECT_TRUE(std::isnan(Exp(NAN)));
  EXPECT_EQ(Exp(0.0f), 1.0f);
  EXPECT_EQ(Exp(-0.0f), 1.0f);
  EXPECT_GT(Exp(-87.0f), 0.0f);  // the boundary itself is still computed (a normal float)
  EXPECT_TRUE(std::isnormal(Exp(-87.0f)));
  EXPECT_TRUE(std::isfinite(Exp(88.0f)));
  EXPECT_LE(UlpError(Exp(-87.0f), std::exp(-87.0)), 2.0);
  EXPECT_LE(UlpError(Exp(88.0f), std::exp(88.0)), 2.0);
}

TEST(MathTest, LogAccuracyWithin2Ulp) {
  double worst = 0;
  float worst_x = 0;
  std::mt19937 rng(2);
  for (int i = 0; i < 2000000; ++i) {
    // Positive floats spread over all exponents, subnormals included.
    const uint32_t bits = std::uniform_int_distribution<uint32_t>(1, 0x7F7FFFFFu)(rng);
    const float x = i % 2 == 0 ? std::bit_cast<float>(bits)
                               : std::uniform_real_distribution<float>(0.5f, 2.0f)(rng);
    const double err = UlpError(Log(x), std::log(static_cast<double>(x)));
    if (err > worst) worst = err, worst_x = x;
  }
  EXPECT_LE(worst, 2.0) << "worst x = " << worst_x;
  std::printf("Log max error %.3f ulp (x = %.9g)\n", worst, worst_x);
}

TEST(MathTest, LogSpecials) {
  EXPECT_EQ(Log(1.0f), 0.0f);
  EXPECT_EQ(Log(0.0f), -INFINITY);
  EXPECT_EQ(Log(-0.0f), -INFINITY);
  EXPECT_EQ(Log(INFINITY), INFINITY);
  EXPECT_TRUE(std::isnan(Log(-1.0f)));
  EXPECT_TRUE(std::isnan(Log(NAN)));
  const float tiny = std::bit_cast<float>(1u);  // smallest subnormal
  EXPECT_LE(UlpError(Log(tiny), std::log(static_cast<double>(tiny))), 2.0);
}

TEST(MathTest, Exp8EqualsScalarBitwise) {
  if (!IsaSupported(Isa::kAvx2)) GTEST_SKIP() << "CPU lacks AVX2+FMA+F16C: AVX2 path NOT TESTED";
  const std::vector<float> x = ExpInputs();
  std::vector<float> want(x.size()), got(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = Exp(x[i]);
  testing::Exp8Array(x.data(), static_cast<int64_t>(x.size()), got.data());
  EXPECT_EQ(std::memcmp(want.data(), got.data(), x.size() * sizeof(float)), 0);
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::bit_cast<uint32_t>(want[i]) != std::bit_cast<uint32_t>(got[i])) {
      ADD_FAILURE() << "x=" << x[i] << " scalar=" << want[i] << " avx2=" << got[i];
      break;
    }
  }
}

TEST(MathTest, Exp16EqualsScalarBitwise) {
  if (!IsaSupported(Isa::kAvx512)) {
    GTEST_SKIP() << "CPU lacks AVX-512 F/BW/VL/DQ: AVX-512 path NOT TESTED";
  }
  const std::vector<float> x = ExpInputs();
  std::vector<float> want(x.size()), got(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = Exp(x[i]);
  testing::Exp16Array(x.data(), static_cast<int64_t>(x.size()), got.data());
  EXPECT_EQ(std::memcmp(want.data(), got.data(), x.size() * sizeof(float)), 0);
}

// Negative control: the memcmp above can fail. A libm-based exp differs from Exp somewhere.
TEST(MathTest, NegativeControlLibmExpDiffers) {
  const std::vector<float> x = ExpInputs();
  std::vector<float> a(x.size()), b(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    a[i] = Exp(x[i]);
    b[i] = std::isnan(x[i]) ? a[i] : std::exp(x[i]);
  }
  EXPECT_NE(std::memcmp(a.data(), b.data(), x.size() * sizeof(float)), 0);
}

TEST(MathTest, ReductionTreesMatchScalar) {
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 100.0f);
  int differs_from_sequential = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    float lanes[16];
    for (float& l : lanes) l = trial % 7 == 0 ? (trial % 2 ? 0.0f : -0.0f) : dist(rng);
    float seq = 0;
    for (float l : lanes) seq += l;
    float a[16], m[16];
    std::memcpy(a, lanes, sizeof a);
    std::memcpy(m, lanes, sizeof m);
    const float sum = ReduceSum16(a);
    const float max = ReduceMax16(m);
    differs_from_sequential += std::bit_cast<uint32_t>(sum) != std::bit_cast<uint32_t>(seq);
    if (IsaSupported(Isa::kAvx2)) {
      const float s2 = testing::ReduceSum16Avx2(lanes), m2 = testing::ReduceMax16Avx2(lanes);
      ASSERT_EQ(std::memcmp(&sum, &s2, 4), 0);
      ASSERT_EQ(std::memcmp(&max, &m2, 4), 0);
    }
    if (IsaSupported(Isa::kAvx512)) {
      const float s5 = testing::ReduceSum16Avx512(lanes), m5 = testing::ReduceMax16Avx512(lanes);
      ASSERT_EQ(std::memcmp(&sum, &s5, 4), 0);
      ASSERT_EQ(std::memcmp(&max, &m5, 4), 0);
    }
  }
  // Negative control: the tree is a different order from a sequential sum.
  EXPECT_GT(differs_from_sequential, 0);
}

TEST(MathTest, F16ToF32IsExactForAllHalves) {
  if (!IsaSupported(Isa::kAvx2)) GTEST_SKIP() << "CPU lacks F16C: no hardware reference";
  for (uint32_t h = 0; h < 65536; ++h) {
    const float want = testing::HardwareF16ToF32(static_cast<uint16_t>(h));
    const float got = F16ToF32(static_cast<uint16_t>(h));
    ASSERT_EQ(std::bit_cast<uint32_t>(want), std::bit_cast<uint32_t>(got)) << "half " << h;
  }
}

TEST(MathTest, F32ToF16MatchesHardwareRounding) {
  if (!IsaSupported(Isa::kAvx2)) GTEST_SKIP() << "CPU lacks F16C: no hardware reference";
  for (uint32_t h = 0; h < 65536; ++h) {  // every half survives the round trip
    const float f = F16ToF32(static_cast<uint16_t>(h));
    ASSERT_EQ(F32ToF16(f), testing::HardwareF32ToF16(f)) << "half " << h;
    if (!std::isnan(f)) {
      ASSERT_EQ(F32ToF16(f), h);
    }
  }
  // Every float whose exponent a half can reach or round to, plus random bit patterns: ties,
  // subnormal results, overflow to infinity, NaNs.
  std::mt19937 rng(11);
  int checked = 0;
  for (uint32_t top = 0; top < 0x10000u; ++top) {
    for (uint32_t low : {0u, 0x1000u, 0x0FFFu, 0x1001u, 0x2000u, 0x3000u, 0xFFFFu}) {
      const float f = std::bit_cast<float>((top << 16) | low);
      ASSERT_EQ(F32ToF16(f), testing::HardwareF32ToF16(f)) << std::hex << (top << 16 | low);
      ++checked;
    }
  }
  for (int i = 0; i < 1000000; ++i) {
    const float f = std::bit_cast<float>(static_cast<uint32_t>(rng()));
    ASSERT_EQ(F32ToF16(f), testing::HardwareF32ToF16(f)) << std::hex << std::bit_cast<uint32_t>(f);
  }
  EXPECT_EQ(checked, 0x10000 * 7);
  // Negative control: truncation instead of rounding differs from the hardware somewhere.
  int truncation_differs = 0;
  for (uint32_t m = 0; m < 0x2000u; ++m) {
    const float f = std::bit_cast<float>(0x3F800000u | m);
    const uint16_t truncated = static_cast<uint16_t>(((0x3F800000u | m) - 0x38000000u) >> 13);
    truncation_differs += truncated != testing::HardwareF32ToF16(f);
  }
  EXPECT_GT(truncation_differs, 0);
}

TEST(MathTest, Bf16RoundTripAndRounding) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = Bf16ToF32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(f))));
    } else {
      ASSERT_EQ(F32ToBf16(f), h);  // exact values survive
    }
  }
  // Ties go to even; above/below the midpoint go to nearest.
  EXPECT_EQ(F32ToBf16(std::bit_cast<float>(0x3F808000u)), 0x3F80);  // tie, even stays
  EXPECT_EQ(F32ToBf16(std::bit_cast<float>(0x3F818000u)), 0x3F82);  // tie, odd rounds up
  EXPECT_EQ(F32ToBf16(std::bit_cast<float>(0x3F808001u)), 0x3F81);
  EXPECT_EQ(F32ToBf16(std::bit_cast<float>(0x3F807FFFu)), 0x3F80);
  EXPECT_EQ(F32ToBf16(std::bit_cast<float>(0x7F7FFFFFu)), 0x7F80);  // FLT_MAX -> inf
  std::mt19937 rng(4);
  for (int i = 0; i < 100000; ++i) {
    const float f = std::bit_cast<float>(
        std::uniform_int_distribution<uint32_t>(0, 0x7F7EFFFFu)(rng));  // below bf16 max
    const float r = Bf16ToF32(F32ToBf16(f));
    const uint32_t lo = std::bit_cast<uint32_t>(f) & 0xFFFF0000u;
    const double d_lo = std::fabs(f - std::bit_cast<float>(lo));
    const double d_hi = std::fabs(static_cast<double>(std::bit_cast<float>(lo + 0x10000u)) - f);
    ASSERT_LE(std::fabs(static_cast<double>(r) - f), std::min(d_lo, d_hi)) << f;
  }
}

}  // namespace
}  // namespace bitroll::kernels
