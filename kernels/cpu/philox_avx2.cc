// kernels/cpu/philox_avx2.cc: UniformOpenBatch, 4 tokens per 256-bit vector (see philox_simd.h).
// Compiled with -mavx2 -mfma; entered only when IsaSupported(Isa::kAvx2).
// GCC 12 emits false -Wmaybe-uninitialized warnings from inside its own intrinsic headers
// (the _mm*_undefined_* idiom); silence them for this file only.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include "kernels/cpu/philox.h"
#include "kernels/cpu/philox_simd.h"

namespace bitroll::kernels {

void UniformOpenBatchAvx2(uint64_t seed, uint32_t sample_index, int64_t position,
                          const int32_t* tokens, int64_t n, double* out) {
  const uint64_t pos = static_cast<uint64_t>(position);
  const __m256i lo32 = _mm256_set1_epi64x(0xFFFFFFFFll);
  const __m256i m0 = _mm256_set1_epi64x(kPhiloxM0);
  const __m256i m1 = _mm256_set1_epi64x(kPhiloxM1);
  const __m256i ctr0 = _mm256_set1_epi64x(int64_t(uint32_t(pos)));
  const __m256i ctr2 = _mm256_set1_epi64x(int64_t(sample_index));
  const __m256i ctr3 = _mm256_set1_epi64x(int64_t(uint32_t(pos >> 32)));
  // double(m) for m < 2^52: the bits of 2^52 + m, minus 2^52 (exact).
  const __m256i magic_bits = _mm256_set1_epi64x(0x4330000000000000ll);
  const __m256d magic = _mm256_set1_pd(0x1p52);
  const __m256d half = _mm256_set1_pd(0.5);
  const __m256d scale = _mm256_set1_pd(0x1p-52);
  const int64_t n4 = n < 0 ? 0 : n - n % 4;
  for (int64_t j = 0; j < n4; j += 4) {
    // One 64-bit lane per token; every value is a zero-extended 32-bit word.
    __m256i c0 = ctr0, c2 = ctr2, c3 = ctr3;
    __m256i c1 =
        _mm256_cvtepu32_epi64(_mm_loadu_si128(reinterpret_cast<const __m128i*>(tokens + j)));
    uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
    for (int round = 0; round < 10; ++round) {
      if (round > 0) {
        k0 += kPhiloxW0;
        k1 += kPhiloxW1;
      }
      const __m256i p0 = _mm256_mul_epu32(m0, c0);
      const __m256i p1 = _mm256_mul_epu32(m1, c2);
      const __m256i n0 = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p1, 32), c1),
                                          _mm256_set1_epi64x(int64_t(k0)));
      const __m256i n2 = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p0, 32), c3),
                                          _mm256_set1_epi64x(int64_t(k1)));
      c1 = _mm256_and_si256(p1, lo32);
      c3 = _mm256_and_si256(p0, lo32);
      c0 = n0;
      c2 = n2;
    }
    const __m256i m = _mm256_or_si256(_mm256_slli_epi64(c0, 20), _mm256_srli_epi64(c1, 12));
    const __m256d md = _mm256_sub_pd(_mm256_castsi256_pd(_mm256_or_si256(m, magic_bits)), magic);
    _mm256_storeu_pd(out + j, _mm256_mul_pd(_mm256_add_pd(md, half), scale));
  }
  for (int64_t j = n4; j < n; ++j) out[j] = UniformOpen(seed, sample_index, position, tokens[j]);
}

}  // namespace bitroll::kernels
