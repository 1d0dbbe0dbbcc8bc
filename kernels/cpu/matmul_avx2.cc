// AVX2 matmul tile. Register tile: up to kMr rows x one 16-column block held as two 8-wide halves
// (12 independent fma chains); single-row calls use 1 row x up to kWideNb blocks (8 chains).
// Each lane runs the canonical chain of matmul.h, so the bits equal the scalar and AVX-512 paths
// whatever the tile shape.

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <utility>

#include "kernels/cpu/math_avx2.h"
#include "kernels/cpu/matmul_internal.h"

namespace bitroll::kernels::internal {
namespace {

constexpr int kMr = 6;      // rows per register tile (one block wide)
constexpr int kWideNb = 4;  // blocks per tile for single-row calls

struct TileArgs {
  const float* x;  // x [MR][ldx], first row of the tile
  int64_t ldx;
  const void* w;  // packed blocks: [NB][K][16], block stride K*16 elements
  int64_t k;
  const float* bias;  // bias + b*16, or nullptr
  float* y;           // y + row*ldy + b*16
  int64_t ldy;
  int64_t n_valid;  // columns of this tile that exist (may be < NB*16 at the right edge)
};

// Software prefetch of the weight streams kPrefetchK k-steps ahead (see matmul_avx512.cc). Never
// faults, so the address is formed as an integer and may run past the buffer.
constexpr int64_t kPrefetchK = 8;

template <bool kBf16>
inline void Prefetch(const void* w, int64_t idx) {
  const uintptr_t addr =
      reinterpret_cast<uintptr_t>(w) + static_cast<uintptr_t>(idx) * (kBf16 ? 2 : 4);
  _mm_prefetch(reinterpret_cast<const char*>(addr), _MM_HINT_T0);
}

template <bool kBf16>
inline __m256 LoadW(const void* w, int64_t idx) {
  if constexpr (kBf16) {
    return LoadBf16x8(static_cast<const uint16_t*>(w) + idx);
  } else {
    return _mm256_load_ps(static_cast<const float*>(w) + idx);
  }
}

// Writes the valid columns of one 8-wide half (valid may be <= 0: nothing is written).
inline void StoreHalf(float* y, __m256 v, int64_t valid) {
  if (valid >= 8) {
    _mm256_storeu_ps(y, v);
  } else if (valid > 0) {
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(valid)), iota);
    _mm256_maskstore_ps(y, mask, v);
  }
}

inline __m256 LoadHalf(const float* p, int64_t valid) {
  if (valid >= 8) return _mm256_loadu_ps(p);
  if (valid <= 0) return _mm256_setzero_ps();
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(valid)), iota);
  return _mm256_maskload_ps(p, mask);
}

// deterministic: acc lo/hi lane j is the chain acc = fma(x[r][k], W[col][k], acc) over k in order.
template <int MR, int NB, bool kBf16>
void Tile(const TileArgs& a) {
  __m256 lo[MR][NB], hi[MR][NB];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < NB; ++c) lo[r][c] = hi[r][c] = _mm256_setzero_ps();
  }
  const int64_t block_stride = a.k * 16;
  for (int64_t kk = 0; kk < a.k; ++kk) {
#pragma GCC unroll 4
    for (int c = 0; c < NB; ++c) {
      const __m256 w_lo = LoadW<kBf16>(a.w, c * block_stride + kk * 16);
      const __m256 w_hi = LoadW<kBf16>(a.w, c * block_stride + kk * 16 + 8);
      Prefetch<kBf16>(a.w, c * block_stride + (kk + kPrefetchK) * 16);
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        const __m256 xv = _mm256_broadcast_ss(a.x + r * a.ldx + kk);
        lo[r][c] = _mm256_fmadd_ps(xv, w_lo, lo[r][c]);
        hi[r][c] = _mm256_fmadd_ps(xv, w_hi, hi[r][c]);
      }
    }
  }
#pragma GCC unroll 4
  for (int c = 0; c < NB; ++c) {
    const int64_t valid = a.n_valid - c * 16;
    const bool has_bias = a.bias != nullptr;
    const __m256 b_lo = has_bias ? LoadHalf(a.bias + c * 16, valid) : _mm256_setzero_ps();
    const __m256 b_hi = has_bias ? LoadHalf(a.bias + c * 16 + 8, valid - 8) : _mm256_setzero_ps();
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      __m256 v_lo = lo[r][c], v_hi = hi[r][c];
      if (has_bias) {
        v_lo = _mm256_add_ps(v_lo, b_lo);
        v_hi = _mm256_add_ps(v_hi, b_hi);
      }
      StoreHalf(a.y + r * a.ldy + c * 16, v_lo, valid);
      StoreHalf(a.y + r * a.ldy + c * 16 + 8, v_hi, valid - 8);
    }
  }
}

using TileFn = void (*)(const TileArgs&);

// table[(mr - 1) * kMaxNb + (nb - 1)] = Tile<mr, nb>.
template <int kMaxMr, int kMaxNb, bool kBf16, size_t... I>
constexpr std::array<TileFn, kMaxMr * kMaxNb> MakeTable(std::index_sequence<I...>) {
  return {&Tile<static_cast<int>(I / kMaxNb) + 1, static_cast<int>(I % kMaxNb) + 1, kBf16>...};
}

template <int kMaxMr, int kMaxNb, bool kBf16>
constexpr auto kTable =
    MakeTable<kMaxMr, kMaxNb, kBf16>(std::make_index_sequence<kMaxMr * kMaxNb>());

template <int kMaxMr, int kMaxNb, bool kBf16>
void TileLoop(const MatmulParams& p, int64_t row0, int64_t row1, int64_t block0, int64_t block1) {
  const PackedMatrix& w = *p.w;
  const auto& table = kTable<kMaxMr, kMaxNb, kBf16>;
  const int64_t k = w.k();
  for (int64_t b = block0; b < block1; b += kMaxNb) {
    const int nb = static_cast<int>(std::min<int64_t>(kMaxNb, block1 - b));
    TileArgs a;
    a.ldx = p.ldx;
    a.k = k;
    a.w = kBf16 ? static_cast<const void*>(w.bf16_data() + b * k * 16)
                : static_cast<const void*>(w.f32_data() + b * k * 16);
    a.bias = p.bias != nullptr ? p.bias + b * 16 : nullptr;
    a.ldy = p.ldy;
    a.n_valid = std::min<int64_t>(nb * 16, w.n() - b * 16);
    for (int64_t r = row0; r < row1; r += kMaxMr) {
      const int mr = static_cast<int>(std::min<int64_t>(kMaxMr, row1 - r));
      a.x = p.x + r * p.ldx;
      a.y = p.y + r * p.ldy + b * 16;
      table[(mr - 1) * kMaxNb + (nb - 1)](a);
    }
  }
}

}  // namespace

TileShape MatmulTileShapeAvx2(int64_t rows) {
  return rows == 1 ? TileShape{1, kWideNb} : TileShape{kMr, 1};
}

void MatmulTileAvx2(const MatmulParams& p, int64_t row0, int64_t row1, int64_t block0,
                    int64_t block1) {
  const bool bf16 = p.w->storage() == DType::kBF16;
  if (row1 - row0 == 1) {
    if (bf16) return TileLoop<1, kWideNb, true>(p, row0, row1, block0, block1);
    return TileLoop<1, kWideNb, false>(p, row0, row1, block0, block1);
  }
  if (bf16) return TileLoop<kMr, 1, true>(p, row0, row1, block0, block1);
  return TileLoop<kMr, 1, false>(p, row0, row1, block0, block1);
}

}  // namespace bitroll::kernels::internal
