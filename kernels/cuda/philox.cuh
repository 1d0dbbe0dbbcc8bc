// Philox4x32-10 and the fp64 Gumbel noise on the GPU: the SAME functions as kernels/cpu/philox.h
// (UniformOpen, Log64, GumbelNoise), bit for bit. Plain IEEE fp64 operations written as _rn
// intrinsics (never contracted into an FMA), exactly the operation sequence of
// kernels/cpu/philox.h. The tests compare every output with kernels/cpu/philox.h on the host with
// memcmp.
#pragma once

#include <cstdint>

namespace bitroll::kernels::cuda {

__device__ __forceinline__ void DevPhilox4x32_10(uint32_t c[4], uint32_t k0, uint32_t k1) {
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const uint32_t hi0 = __umulhi(0xD2511F53u, c[0]);
    const uint32_t lo0 = 0xD2511F53u * c[0];
    const uint32_t hi1 = __umulhi(0xCD9E8D57u, c[2]);
    const uint32_t lo1 = 0xCD9E8D57u * c[2];
    const uint32_t n0 = hi1 ^ c[1] ^ k0;
    const uint32_t n2 = hi0 ^ c[3] ^ k1;
    c[0] = n0;
    c[1] = lo1;
    c[2] = n2;
    c[3] = lo0;
  }
}

// kernels/cpu/philox.h UniformOpen: u in [2^-53, 1 - 2^-53].
__device__ __forceinline__ double DevUniformOpen(uint64_t seed, uint32_t sample_index,
                                                 int64_t position, int32_t token) {
  const uint64_t pos = static_cast<uint64_t>(position);
  uint32_t c[4] = {static_cast<uint32_t>(pos), static_cast<uint32_t>(token), sample_index,
                   static_cast<uint32_t>(pos >> 32)};
  DevPhilox4x32_10(c, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  const uint64_t m = (static_cast<uint64_t>(c[0]) << 20) | (c[1] >> 12);
  return __dmul_rn(__dadd_rn(static_cast<double>(m), 0.5), 0x1p-52);
}

// kernels/cpu/philox.h Log64.
__device__ __forceinline__ double DevLog64(double x) {
  if (!(x > 0.0)) {
    if (x == 0.0) return __longlong_as_double(static_cast<long long>(0xFFF0000000000000ull));
    return __longlong_as_double(0x7FF8000000000000ll);
  }
  if (x == __longlong_as_double(0x7FF0000000000000ll)) return x;
  uint64_t bits = static_cast<uint64_t>(__double_as_longlong(x));
  int e = 0;
  if (bits < (uint64_t{1} << 52)) {
    bits = static_cast<uint64_t>(__double_as_longlong(__dmul_rn(x, 0x1p54)));
    e = -54;
  }
  e += static_cast<int>(bits >> 52) - 1023;
  double m = __longlong_as_double(
      static_cast<long long>((bits & ((uint64_t{1} << 52) - 1)) | (uint64_t{1023} << 52)));
  if (m >= 1.4142135623730951) {
    m = __dmul_rn(m, 0.5);
    e += 1;
  }
  const double s = __ddiv_rn(__dsub_rn(m, 1.0), __dadd_rn(m, 1.0));
  const double z = __dmul_rn(s, s);
  double p = 1.0 / 25;
  p = __dadd_rn(__dmul_rn(p, z), 1.0 / 23);
  p = __dadd_rn(__dmul_rn(p, z), 1.0 / 21);
  p = __dadd_rn(__dmul_rn(p, z), 1.0 / 19);
  p = __dadd_rn(__dmul_rn(p, z), 1.0 / 17);
  p = __dadd_rn(__dmul_rn(p, z), 1.0 / 15);
  p = __dadd_rn(__dmul_rn(p, z), 1.0 / 13);
  p = __dadd_rn(__dmul_rn(p, z), 1.0 / 11);
  p = __dadd_rn(__dmul_rn(p, z), 1.0 / 9);
  p = __dadd_rn(__dmul_rn(p, z), 1.0 / 7);
  p = __dadd_rn(__dmul_rn(p, z), 1.0 / 5);
  p = __dadd_rn(__dmul_rn(p, z), 1.0 / 3);
  const double two_s = __dmul_rn(2.0, s);
  const double log_m = __dadd_rn(two_s, __dmul_rn(two_s, __dmul_rn(z, p)));
  constexpr double kLn2Hi = 6.93147180369123816490e-01;
  constexpr double kLn2Lo = 1.90821492927058770002e-10;
  const double fe = static_cast<double>(e);
  return __dadd_rn(__dmul_rn(fe, kLn2Hi), __dadd_rn(log_m, __dmul_rn(fe, kLn2Lo)));
}

__device__ __forceinline__ double DevGumbelNoise(uint64_t seed, uint32_t sample_index,
                                                 int64_t position, int32_t token) {
  const double u = DevUniformOpen(seed, sample_index, position, token);
  return -DevLog64(-DevLog64(u));
}

}  // namespace bitroll::kernels::cuda
