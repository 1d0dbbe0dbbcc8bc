// kernels/cpu/lanes.h: vector lanes gathered from scattered scalars, in registers (SSE4.1), for
// the AVX2 and AVX-512 code that runs several independent merges as the lanes of one register.
//
// Why not an array: filling one with scalar stores and loading it as a vector makes the load wait
// until those stores reach the cache (a load over several smaller stores in flight is not
// forwarded from them); inserting each scalar into its lane has no such wait.
//
// Include only from sources compiled for AVX2 or AVX-512 (bitroll_isa_sources).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace bitroll::kernels::internal {

// Lanes 4 * b .. 4 * b + 3 of a vector whose lane i holds *get(i) for i < n, 0 beyond.
template <typename Get>
inline __m128 LaneQuad(int32_t n, int b, Get get) {
  __m128 v = _mm_setzero_ps();
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    if (4 * b + i < n) v = _mm_insert_ps(v, _mm_load_ss(get(4 * b + i)), i << 4);
  }
  return v;
}

// Lanes 8 * h .. 8 * h + 7 of that vector.
template <typename Get>
inline __m256 Lanes8(int32_t n, Get get, int h = 0) {
  return _mm256_insertf128_ps(_mm256_castps128_ps256(LaneQuad(n, 2 * h, get)),
                              LaneQuad(n, 2 * h + 1, get), 1);
}

}  // namespace bitroll::kernels::internal
