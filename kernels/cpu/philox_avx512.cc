// kernels/cpu/philox_avx512.cc: UniformOpenBatch, 8 tokens per 512-bit vector (see philox_simd.h).
// Compiled with the AVX-512 flags; entered only when IsaSupported(Isa::kAvx512).
// GCC 12 emits false -Wmaybe-uninitialized warnings from inside its own intrinsic headers
// (the _mm*_undefined_* idiom); silence them for this file only.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include "kernels/cpu/philox.h"
#include "kernels/cpu/philox_simd.h"

namespace bitroll::kernels {

void UniformOpenBatchAvx512(uint64_t seed, uint32_t sample_index, int64_t position,
                            const int32_t* tokens, int64_t n, double* out) {
  const uint64_t pos = static_cast<uint64_t>(position);
  const __m512i lo32 = _mm512_set1_epi64(0xFFFFFFFFll);
  const __m512i m0 = _mm512_set1_epi64(kPhiloxM0);
  const __m512i m1 = _mm512_set1_epi64(kPhiloxM1);
  const __m512i ctr0 = _mm512_set1_epi64(int64_t(uint32_t(pos)));
  const __m512i ctr2 = _mm512_set1_epi64(int64_t(sample_index));
  const __m512i ctr3 = _mm512_set1_epi64(int64_t(uint32_t(pos >> 32)));
  const __m512i magic_bits = _mm512_set1_epi64(0x4330000000000000ll);
  const __m512d magic = _mm512_set1_pd(0x1p52);
  const __m512d half = _mm512_set1_pd(0.5);
  const __m512d scale = _mm512_set1_pd(0x1p-52);
  const int64_t n8 = n < 0 ? 0 : n - n % 8;
  for (int64_t j = 0; j < n8; j += 8) {
    __m512i c0 = ctr0, c2 = ctr2, c3 = ctr3;
    __m512i c1 =
        _mm512_cvtepu32_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tokens + j)));
    uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
    for (int round = 0; round < 10; ++round) {
      if (round > 0) {
        k0 += kPhiloxW0;
        k1 += kPhiloxW1;
      }
      const __m512i p0 = _mm512_mul_epu32(m0, c0);
      const __m512i p1 = _mm512_mul_epu32(m1, c2);
      const __m512i n0 = _mm512_xor_si512(_mm512_xor_si512(_mm512_srli_epi64(p1, 32), c1),
                                          _mm512_set1_epi64(int64_t(k0)));
      const __m512i n2 = _mm512_xor_si512(_mm512_xor_si512(_mm512_srli_epi64(p0, 32), c3),
                                          _mm512_set1_epi64(int64_t(k1)));
      c1 = _mm512_and_si512(p1, lo32);
      c3 = _mm512_and_si512(p0, lo32);
      c0 = n0;
      c2 = n2;
    }
    const __m512i m = _mm512_or_si512(_mm512_slli_epi64(c0, 20), _mm512_srli_epi64(c1, 12));
    const __m512d md = _mm512_sub_pd(_mm512_castsi512_pd(_mm512_or_si512(m, magic_bits)), magic);
    _mm512_storeu_pd(out + j, _mm512_mul_pd(_mm512_add_pd(md, half), scale));
  }
  for (int64_t j = n8; j < n; ++j) out[j] = UniformOpen(seed, sample_index, position, tokens[j]);
}

}  // namespace bitroll::kernels
