// Tests for the counter-based sampling noise: Philox known answers, UniformOpen, Log64.
#include "kernels/cpu/philox.h"

#include <cstdio>

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/philox_simd.h"

namespace bitroll::kernels {
namespace {

// Known-answer vectors from Random123's kat_vectors (the three "philox4x32 10" lines):
// counter (4 words), key (2 words) -> output (4 words).
TEST(PhiloxTest, Random123KnownAnswers) {
  struct Kat {
    PhiloxCounter ctr;
    PhiloxKey key;
    PhiloxCounter want;
  };
  const Kat kats[] = {
      {{0x00000000, 0x00000000, 0x00000000, 0x00000000},
       {0x00000000, 0x00000000},
       {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& k : kats) EXPECT_EQ(Philox4x32_10(k.ctr, k.key), k.want);
}

// Negative control: a 7-round Philox (one changed constant away) does not match the vectors,
// so the KAT comparison can fail.
TEST(PhiloxTest, KnownAnswerCheckCanFail) {
  PhiloxCounter c = {0, 0, 0, 0};
  PhiloxKey k = {0, 0};
  for (int round = 0; round < 7; ++round) {
    if (round > 0) {
      k[0] += kPhiloxW0;
      k[1] += kPhiloxW1;
    }
    const uint64_t p0 = uint64_t(kPhiloxM0) * c[0];
    const uint64_t p1 = uint64_t(kPhiloxM1) * c[2];
    c = {uint32_t(p1 >> 32) ^ c[1] ^ k[0], uint32_t(p1), uint32_t(p0 >> 32) ^ c[3] ^ k[1],
         uint32_t(p0)};
  }
  EXPECT_NE(c, (PhiloxCounter{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
}

// UniformOpen is documented as a specific function of the Philox output; recompute it here.
TEST(PhiloxTest, UniformOpenLayout) {
  const uint64_t seed = 0x0123456789ABCDEFull;
  const int64_t position = (int64_t(5) << 32) | 77;
  const PhiloxCounter x = Philox4x32_10({77, 1234, 3, 5}, {0x89ABCDEF, 0x01234567});
  const uint64_t m = (uint64_t(x[0]) << 20) | (x[1] >> 12);
  const double want = (double(m) + 0.5) / 4503599627370496.0;  // 2^52
  const double got = UniformOpen(seed, 3, position, 1234);
  EXPECT_EQ(std::memcmp(&got, &want, sizeof(double)), 0);
}

TEST(PhiloxTest, NoiseDependsOnEveryKeyAndNothingElse) {
  const double base = UniformOpen(42, 1, 100, 7);
  const double again = UniformOpen(42, 1, 100, 7);
  EXPECT_EQ(std::memcmp(&base, &again, sizeof(double)), 0);
  EXPECT_NE(base, UniformOpen(43, 1, 100, 7));                        // seed, low word
  EXPECT_NE(base, UniformOpen(42 + (uint64_t(1) << 32), 1, 100, 7));  // seed, high word
  EXPECT_NE(base, UniformOpen(42, 2, 100, 7));                        // sample index
  EXPECT_NE(base, UniformOpen(42, 1, 101, 7));                        // position
  EXPECT_NE(base, UniformOpen(42, 1, 100 + (int64_t(1) << 32), 7));   // position, high word
  EXPECT_NE(base, UniformOpen(42, 1, 100, 8));                        // token
}

TEST(PhiloxTest, UniformIsOpenAndUniform) {
  const int n = 200000;
  double sum = 0, gsum = 0;
  int buckets[10] = {};
  for (int i = 0; i < n; ++i) {
    const double u = UniformOpen(7, 0, i / 1000, i % 1000);
    ASSERT_GT(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    buckets[int(u * 10)]++;
    gsum += GumbelNoise(7, 0, i / 1000, i % 1000);
  }
  EXPECT_NEAR(sum / n, 0.5, 0.005);
  for (int b : buckets) EXPECT_NEAR(b, n / 10, 600);  // ~4.5 sigma
  EXPECT_NEAR(gsum / n, 0.5772156649, 0.01);          // the Gumbel mean is Euler's gamma
  // The extremes of u give finite noise within the documented bound.
  const double umin = 0.5 / 4503599627370496.0, umax = 1.0 - umin;
  EXPECT_TRUE(std::isfinite(-Log64(-Log64(umin))));
  EXPECT_LT(-Log64(-Log64(umax)), kMaxGumbel);
  EXPECT_GT(-Log64(-Log64(umax)), 36.0);
}

TEST(Log64Test, AccurateAgainstLibm) {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  double worst = 0;
  for (int i = 0; i < 200000; ++i) {
    // log-uniform over [2^-1074, 2^1000] plus a dense sample near 1 and of (0, 1).
    double x;
    if (i % 3 == 0) {
      x = std::ldexp(1.0 + unit(rng), int(unit(rng) * 2070) - 1070);
    } else if (i % 3 == 1) {
      x = 1.0 + (unit(rng) - 0.5) * 1e-3;
    } else {
      x = unit(rng);
    }
    if (!(x > 0)) continue;
    const double want = std::log(x);
    const double got = Log64(x);
    if (want == 0.0) {
      EXPECT_EQ(got, 0.0);
      continue;
    }
    worst = std::max(worst, std::fabs(got - want) / std::fabs(want));
  }
  EXPECT_LT(worst, 1e-15);
  EXPECT_EQ(Log64(1.0), 0.0);
  EXPECT_EQ(Log64(0.0), -INFINITY);
  EXPECT_EQ(Log64(INFINITY), INFINITY);
  EXPECT_TRUE(std::isnan(Log64(-1.0)));
  EXPECT_TRUE(std::isnan(Log64(NAN)));
  EXPECT_NEAR(Log64(4.9406564584124654e-324), -744.44007192138126, 1e-12);  // smallest subnormal
}

TEST(Log64Test, Deterministic) {
  std::mt19937_64 rng(11);
  for (int i = 0; i < 1000; ++i) {
    volatile double x = std::ldexp(1.0 + double(rng() >> 11) * 0x1p-53, int(rng() % 200) - 100);
    const double a = Log64(x);
    const double b = Log64(x);
    ASSERT_EQ(std::memcmp(&a, &b, sizeof(double)), 0);
  }
}

// GumbelUpperBound really bounds the noise (it prunes Gumbel-max, so a violation would change
// samples): checked on many draws and on the extremes of u.
TEST(PhiloxTest, GumbelUpperBoundHolds) {
  int tight = 0;
  for (int i = 0; i < 200000; ++i) {
    const double u = UniformOpen(3, 1, i, i * 7);
    const double g = GumbelFromUniform(u);
    ASSERT_LE(g, GumbelUpperBound(u)) << "u=" << u;
    tight += GumbelUpperBound(u) - g < 1.0;
  }
  EXPECT_GT(tight, 100000);  // useful: usually within 1 of the noise
  const double umin = 0.5 / 4503599627370496.0;
  for (double u : {umin, 1.0 - umin, 0.5, 0.75, 0.5 + umin, 1.0 / 3.0}) {
    EXPECT_LE(GumbelFromUniform(u), GumbelUpperBound(u)) << u;
  }
  EXPECT_LE(GumbelUpperBound(1.0 - umin), kMaxGumbel);
}

TEST(PhiloxTest, BatchEqualsScalar) {
  std::vector<int32_t> tokens;
  for (int32_t t = 0; t < 1003; ++t) tokens.push_back(t * 31 - 500);
  std::vector<double> batch(tokens.size());
  const int64_t position = (int64_t(3) << 32) + 12345;
  UniformOpenBatch(0xFEEDFACE12345678ull, 9, position, tokens.data(), int64_t(tokens.size()),
                   batch.data());
  for (size_t j = 0; j < tokens.size(); ++j) {
    const double want = UniformOpen(0xFEEDFACE12345678ull, 9, position, tokens[j]);
    ASSERT_EQ(std::memcmp(&batch[j], &want, sizeof(double)), 0) << j;
  }
}

// The SIMD twins return UniformOpenBatch's bits on every ISA this CPU has.
TEST(PhiloxTest, SimdBatchEqualsScalarOnEveryIsa) {
  std::vector<int32_t> tokens;
  for (int32_t t = 0; t < 1003; ++t) tokens.push_back(t * 977 - 3000);
  tokens.push_back(INT32_MAX);
  tokens.push_back(INT32_MIN);
  const int64_t n = int64_t(tokens.size());
  std::vector<double> want(tokens.size());
  UniformOpenBatch(0x0123456789ABCDEFull, 77, (int64_t(9) << 32) + 5, tokens.data(), n,
                   want.data());
  int tested = 0;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!IsaSupported(isa)) {
      std::printf("note: %s not supported here; its path is compiled but not run\n", IsaName(isa));
      continue;
    }
    for (int64_t len : {n, n - 1, int64_t(7), int64_t(3), int64_t(0)}) {
      std::vector<double> got(tokens.size(), -1.0);
      UniformOpenBatchIsa(isa, 0x0123456789ABCDEFull, 77, (int64_t(9) << 32) + 5, tokens.data(),
                          len, got.data());
      ASSERT_EQ(std::memcmp(got.data(), want.data(), size_t(len) * sizeof(double)), 0)
          << IsaName(isa) << " len " << len;
      if (len < n) {
        EXPECT_EQ(got[size_t(len)], -1.0);  // writes nothing past n
      }
    }
    ++tested;
  }
  EXPECT_GE(tested, 1);
}

}  // namespace
}  // namespace bitroll::kernels
