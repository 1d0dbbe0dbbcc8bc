// The project's own transcendentals and canonical reductions (scalar, header-only).
//
// Results never depend on libm: Exp and Log are fixed polynomials evaluated with explicit fma, and
// the SIMD twins in math_avx2.h (Exp8) and math_avx512.h (Exp16) perform the SAME operation
// sequence, so every lane equals Exp() bit for bit. (std::fma is correctly rounded by IEEE 754, so
// it is as deterministic as the hardware instruction.)
//
// deterministic: every function here is a pure function of its arguments; no state, no rounding
// mode changes (the default round-to-nearest-even MXCSR is assumed, as everywhere in bitroll).
//
// Thread-safety: pure functions.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace bitroll::kernels {

// Constants shared by Exp, Exp8 and Exp16 (any change changes the numerics: bump kernel version).
namespace exp_detail {
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23: (t + magic) - magic = rint(t)
inline constexpr uint32_t kRoundMagicBits = 0x4B400000u;
inline constexpr float kLn2Hi = 0.693359375f;  // Cody-Waite: ln2 = kLn2Hi + kLn2Lo
inline constexpr float kLn2Lo = -2.12194440e-4f;
inline constexpr float kC7 = 1.9875691500e-4f;  // e^r ~ 1 + r + r^2 (0.5 + r (1/6 + ...))
inline constexpr float kC6 = 1.3981999507e-3f;
inline constexpr float kC5 = 8.3334519073e-3f;
inline constexpr float kC4 = 4.1665795894e-2f;
inline constexpr float kC3 = 1.6666665459e-1f;
inline constexpr float kC2 = 5.0000001201e-1f;
inline constexpr float kMinX = -87.0f;  // x < kMinX returns exactly 0.0f
inline constexpr float kMaxX = 88.0f;   // x > kMaxX returns +inf
}  // namespace exp_detail

// e^x with <= 2 ulp error (tested against double-precision std::exp).
// x < -87 returns exactly 0.0f; x > 88 returns +inf; NaN propagates.
// Operation sequence (mirrored exactly by Exp8/Exp16):
//   t = x * log2e; kd = t + 1.5*2^23; n = kd - 1.5*2^23       (n = rint(t), ties to even)
//   r = fma(n, -ln2_hi, x); r = fma(n, -ln2_lo, r)            (two-constant Cody-Waite)
//   p = kC7; p = fma(p, r, kC6) ... fma(p, r, kC2); p = fma(p, r, 1); p = fma(p, r, 1)
//   result = p * 2^n, with 2^n built from the low bits of kd shifted into the exponent field.
inline float Exp(float x) {
  using namespace exp_detail;
  if (x < kMinX) return 0.0f;
  if (x > kMaxX) return std::numeric_limits<float>::infinity();
  const float t = x * kLog2e;
  const float kd = t + kRoundMagic;
  const float n = kd - kRoundMagic;
  float r = std::fma(n, -kLn2Hi, x);
  r = std::fma(n, -kLn2Lo, r);
  float p = kC7;
  p = std::fma(p, r, kC6);
  p = std::fma(p, r, kC5);
  p = std::fma(p, r, kC4);
  p = std::fma(p, r, kC3);
  p = std::fma(p, r, kC2);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  const uint32_t scale_bits = (std::bit_cast<uint32_t>(kd) - kRoundMagicBits + 127u) << 23;
  return p * std::bit_cast<float>(scale_bits);
}

// Natural logarithm, <= 2 ulp for normal and subnormal x > 0 (tested against std::log).
// Log(0) = -inf, Log(+inf) = +inf, Log(x < 0) and Log(NaN) = NaN. Scalar only: it is used once per
// row (log-softmax), so there is no SIMD twin to keep in step.
inline float Log(float x) {
  if (!(x > 0.0f)) {
    if (x == 0.0f) return -std::numeric_limits<float>::infinity();
    return std::numeric_limits<float>::quiet_NaN();  // x < 0 or NaN
  }
  if (x == std::numeric_limits<float>::infinity()) return x;
  uint32_t bits = std::bit_cast<uint32_t>(x);
  int e = 0;
  if (bits < 0x00800000u) {  // subnormal: scale by 2^23 (exact)
    bits = std::bit_cast<uint32_t>(x * 8388608.0f);
    e = -23;
  }
  // x = m * 2^e with m in [0.5, 1).
  e += static_cast<int>(bits >> 23) - 126;
  float m = std::bit_cast<float>((bits & 0x007FFFFFu) | 0x3F000000u);
  float f;
  if (m < 0.707106781186547524f) {  // keep f in [sqrt(1/2) - 1, sqrt(2) - 1)
    e -= 1;
    f = (m + m) - 1.0f;
  } else {
    f = m - 1.0f;
  }
  const float z = f * f;
  float y = 7.0376836292e-2f;
  y = std::fma(y, f, -1.1514610310e-1f);
  y = std::fma(y, f, 1.1676998740e-1f);
  y = std::fma(y, f, -1.2420140846e-1f);
  y = std::fma(y, f, 1.4249322787e-1f);
  y = std::fma(y, f, -1.6668057665e-1f);
  y = std::fma(y, f, 2.0000714765e-1f);
  y = std::fma(y, f, -2.4999993993e-1f);
  y = std::fma(y, f, 3.3333331174e-1f);
  y = (y * f) * z;
  const float fe = static_cast<float>(e);
  y = std::fma(fe, -2.12194440e-4f, y);
  y = std::fma(z, -0.5f, y);
  float result = f + y;
  result = std::fma(fe, 0.693359375f, result);
  return result;
}

// The canonical 16-lane reduction used by every row op ("lane order"): element i goes to lane
// i % 16, each lane accumulates its elements in increasing i, then lanes combine by the fixed tree
//   for w in 8, 4, 2, 1: lane[j] = lane[j] + lane[j + w]  (j < w);  result = lane[0].
// The SIMD twins are ReduceSum16 in math_avx2.h / math_avx512.h.
inline constexpr int kLanes = 16;

// Combines 16 lane partial sums by the fixed tree. `lane` is clobbered.
inline float ReduceSum16(float* lane) {
  for (int w = 8; w >= 1; w /= 2) {
    for (int j = 0; j < w; ++j) lane[j] = lane[j] + lane[j + w];
  }
  return lane[0];
}

// The canonical max step: keeps `acc` unless `x` is strictly greater (so -0/+0 ties resolve the
// same way as the x86 max instruction `max(x, acc)`).
inline float MaxKeep(float acc, float x) {
  return x > acc ? x : acc;
}

// Combines 16 lane maxima by the same tree: lane[j] = MaxKeep(lane[j], lane[j + w]).
inline float ReduceMax16(float* lane) {
  for (int w = 8; w >= 1; w /= 2) {
    for (int j = 0; j < w; ++j) lane[j] = MaxKeep(lane[j], lane[j + w]);
  }
  return lane[0];
}

// ---- 16-bit float conversions (exact widening; round-to-nearest-even narrowing) ----

// bf16 -> fp32, exact.
inline float Bf16ToF32(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

// fp32 -> bf16, round to nearest even; NaN stays NaN (quiet), infinities stay infinite.
inline uint16_t F32ToBf16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  const uint32_t rounded = bits + 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

// fp32 -> IEEE binary16, round to nearest even (subnormal results included, overflow to
// infinity); a NaN stays a quiet NaN with the top payload bits, as the F16C instruction
// vcvtps2ph with rounding mode 0 does.
inline uint16_t F32ToF16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((abs >> 13) & 0x3FFu));
  if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds past 65504
  if (abs < 0x38800000u) {  // below the smallest normal half (2^-14): a subnormal or zero
    if (abs < 0x33000000u) return sign;  // below half the smallest subnormal (2^-25): zero
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126u - exp;  // 14..24: value = mant * 2^(exp-150) in units of 2^-24
    const uint32_t q = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    const uint32_t r = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
    return static_cast<uint16_t>(sign | r);
  }
  const uint32_t rounded = abs + 0xFFFu + ((abs >> 13) & 1u);  // nearest even at bit 13
  return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
}

// IEEE binary16 -> fp32, exact (subnormals and infinities included); a NaN keeps its payload and
// is made quiet, bit-identical to the F16C instruction vcvtph2ps.
inline float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0x1F) {  // inf, or NaN made quiet (as the F16C instruction does)
    bits = sign | 0x7F800000u | (mant << 13) | (mant != 0 ? 0x00400000u : 0u);
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int e = 113;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --e;
    }
    bits = sign | (static_cast<uint32_t>(e) << 23) | ((mant & 0x3FFu) << 13);
  }
  return std::bit_cast<float>(bits);
}

}  // namespace bitroll::kernels
