// kernels/cpu/philox.h: the sampling noise. Counter-based and stateless: every random number is a
// pure function of (seed, sample_index, position, token), so replay and resume need no RNG state
// and the noise never depends on batch composition or arrival order. The CUDA twin is
// kernels/cuda/philox.cuh (the same bits, checked by kernels_cuda_sampling_test).
//
//   Philox4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3",
//   SC'11; Random123): 10 rounds of
//     (hi0, lo0) = M0 * c0;  (hi1, lo1) = M1 * c2           (32x32 -> 64-bit products)
//     c = { hi1 ^ c1 ^ k0,  lo1,  hi0 ^ c3 ^ k1,  lo0 }
//   with the key bumped by (W0, W1) between rounds.
//
//   UniformOpen(seed, sample_index, position, token):
//     counter = { uint32(position), uint32(token), sample_index, uint32(uint64(position) >> 32) }
//     key     = { uint32(seed), uint32(seed >> 32) }
//     (x0, x1, x2, x3) = Philox4x32_10(counter, key)
//     m = (uint64(x0) << 20) | (x1 >> 12)                      52 random bits
//     u = (double(m) + 0.5) * 2^-52                            exact; u in [2^-53, 1 - 2^-53]
//   so u is never 0 or 1 and the Gumbel noise -Log64(-Log64(u)) is always finite, in
//   [-3.6, 36.8]. (The fourth counter word is 0 for positions below 2^32.)
//
//   Log64(x): the project's own fp64 natural log (never libm), so the noise is the same on every
//   machine and compiler: x = 2^e * m with m in [sqrt(1/2), sqrt(2)), s = (m - 1) / (m + 1),
//   log(m) = 2 * (s + s^3/3 + ... + s^25/25) (Horner in s^2), log(x) = e * ln2_hi +
//   (log(m) + e * ln2_lo). Plain multiplies and adds, no fma, no contraction (-ffp-contract=off).
//   Relative error < 1e-15 over (0, inf).
//
// UniformOpenBatch draws the uniforms of many tokens at once (bit-identical to UniformOpen);
// kernels/cpu/philox_simd.h has its AVX2 / AVX-512 twins.
//
// Thread-safety: pure functions.
#pragma once

#include <array>
#include <bit>
#include <cstdint>
#include <limits>

namespace bitroll::kernels {

inline constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
inline constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
inline constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;
inline constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

// Philox4x32 with 10 rounds: the Random123 philox4x32 (R=10) bijection of `ctr` under `key`.
inline PhiloxCounter Philox4x32_10(PhiloxCounter ctr, PhiloxKey key) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key[0] += kPhiloxW0;
      key[1] += kPhiloxW1;
    }
    const uint64_t p0 = uint64_t(kPhiloxM0) * ctr[0];
    const uint64_t p1 = uint64_t(kPhiloxM1) * ctr[2];
    ctr = {uint32_t(p1 >> 32) ^ ctr[1] ^ key[0], uint32_t(p1), uint32_t(p0 >> 32) ^ ctr[3] ^ key[1],
           uint32_t(p0)};
  }
  return ctr;
}

// The uniform in (0, 1) for (seed, sample_index, position, token); see the header comment.
inline double UniformOpen(uint64_t seed, uint32_t sample_index, int64_t position, int32_t token) {
  const uint64_t pos = static_cast<uint64_t>(position);
  const PhiloxCounter x = Philox4x32_10(
      {uint32_t(pos), static_cast<uint32_t>(token), sample_index, uint32_t(pos >> 32)},
      {uint32_t(seed), uint32_t(seed >> 32)});
  const uint64_t m = (uint64_t(x[0]) << 20) | (x[1] >> 12);
  return (double(m) + 0.5) * 0x1p-52;
}

// UniformOpen for n tokens at once: out[j] = UniformOpen(seed, sample_index, position,
// tokens[j]), bit for bit. Runs four Philox streams side by side so their multiply chains
// overlap (Philox is latency bound); plain C++, the same result on every ISA.
inline void UniformOpenBatch(uint64_t seed, uint32_t sample_index, int64_t position,
                             const int32_t* tokens, int64_t n, double* out) {
  const uint64_t pos = static_cast<uint64_t>(position);
  const uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
  const int64_t n4 = n < 0 ? 0 : n - n % 4;
  for (int64_t j = 0; j < n4; j += 4) {
    uint32_t c0[4], c1[4], c2[4], c3[4];
    for (int l = 0; l < 4; ++l) {
      c0[l] = uint32_t(pos);
      c1[l] = static_cast<uint32_t>(tokens[j + l]);
      c2[l] = sample_index;
      c3[l] = uint32_t(pos >> 32);
    }
    uint32_t key0 = k0, key1 = k1;
    for (int round = 0; round < 10; ++round) {
      if (round > 0) {
        key0 += kPhiloxW0;
        key1 += kPhiloxW1;
      }
      for (int l = 0; l < 4; ++l) {
        const uint64_t p0 = uint64_t(kPhiloxM0) * c0[l];
        const uint64_t p1 = uint64_t(kPhiloxM1) * c2[l];
        const uint32_t n0 = uint32_t(p1 >> 32) ^ c1[l] ^ key0;
        const uint32_t n2 = uint32_t(p0 >> 32) ^ c3[l] ^ key1;
        c1[l] = uint32_t(p1);
        c3[l] = uint32_t(p0);
        c0[l] = n0;
        c2[l] = n2;
      }
    }
    for (int l = 0; l < 4; ++l) {
      const uint64_t m = (uint64_t(c0[l]) << 20) | (c1[l] >> 12);
      out[j + l] = (double(m) + 0.5) * 0x1p-52;
    }
  }
  for (int64_t j = n4; j < n; ++j) out[j] = UniformOpen(seed, sample_index, position, tokens[j]);
}

// Natural log in fp64 (see the header comment). Log64(0) = -inf, Log64(+inf) = +inf,
// Log64(x < 0) = Log64(NaN) = NaN; subnormals are handled.
inline double Log64(double x) {
  if (!(x > 0.0)) {
    if (x == 0.0) return -std::numeric_limits<double>::infinity();
    return std::numeric_limits<double>::quiet_NaN();
  }
  if (x == std::numeric_limits<double>::infinity()) return x;
  uint64_t bits = std::bit_cast<uint64_t>(x);
  int e = 0;
  if (bits < (uint64_t(1) << 52)) {  // subnormal: scale by 2^54 (exact)
    bits = std::bit_cast<uint64_t>(x * 0x1p54);
    e = -54;
  }
  e += int(bits >> 52) - 1023;
  double m = std::bit_cast<double>((bits & ((uint64_t(1) << 52) - 1)) | (uint64_t(1023) << 52));
  if (m >= 1.4142135623730951) {  // m in [1, 2) -> [sqrt(1/2), sqrt(2))
    m *= 0.5;                     // exact
    e += 1;
  }
  const double s = (m - 1.0) / (m + 1.0);  // m - 1 is exact (Sterbenz); |s| <= 0.1716
  const double z = s * s;
  double p = 1.0 / 25;
  p = p * z + 1.0 / 23;
  p = p * z + 1.0 / 21;
  p = p * z + 1.0 / 19;
  p = p * z + 1.0 / 17;
  p = p * z + 1.0 / 15;
  p = p * z + 1.0 / 13;
  p = p * z + 1.0 / 11;
  p = p * z + 1.0 / 9;
  p = p * z + 1.0 / 7;
  p = p * z + 1.0 / 5;
  p = p * z + 1.0 / 3;
  const double log_m = 2.0 * s + 2.0 * s * (z * p);      // 2*atanh(s) = log(m)
  constexpr double kLn2Hi = 6.93147180369123816490e-01;  // ln2 with the low 32 bits cleared
  constexpr double kLn2Lo = 1.90821492927058770002e-10;  // ln2 - kLn2Hi
  const double fe = double(e);
  return fe * kLn2Hi + (log_m + fe * kLn2Lo);
}

// Gumbel(0, 1) noise from a uniform u in (0, 1): -Log64(-Log64(u)).
inline double GumbelFromUniform(double u) {
  return -Log64(-Log64(u));
}

// Gumbel(0, 1) noise for (seed, sample_index, position, token).
inline double GumbelNoise(uint64_t seed, uint32_t sample_index, int64_t position, int32_t token) {
  return GumbelFromUniform(UniformOpen(seed, sample_index, position, token));
}

// An upper bound on GumbelNoise (its true maximum is -log(-log(1 - 2^-53)) = 36.74): a candidate
// whose logit + kMaxGumbel is below the best score so far cannot win Gumbel-max.
inline constexpr double kMaxGumbel = 40.0;

// A cheap upper bound on GumbelFromUniform(u), without a logarithm, for pruning Gumbel-max:
// -log(-log u) <= -log(1 - u) (since -log u >= 1 - u) <= ln2 * -e, where 1 - u = f * 2^e with
// f in [1, 2) (1 - u is exact for UniformOpen's u). The 1e-9 slack covers Log64's rounding.
// REQUIRES: u in (0, 1).
inline double GumbelUpperBound(double u) {
  const double w = 1.0 - u;
  const int e = int((std::bit_cast<uint64_t>(w) >> 52) & 0x7ff) - 1023;
  return 0.6931471805599453 * double(-e) + 1e-9;
}

}  // namespace bitroll::kernels
