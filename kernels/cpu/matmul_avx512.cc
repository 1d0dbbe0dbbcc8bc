// AVX-512 matmul tile. Register tile: up to kMr rows x kNr column blocks (one zmm of 16 columns
// per block), i.e. up to 24 independent fma chains, each the canonical chain over k = 0..K-1 for
// one (row, column). Decode-sized calls (<= kWideMaxRows rows) use 1-2 rows x up to kWideNr blocks
// instead (measured at M = 1: 4 weight streams beat 2, 3 and 8, from DRAM and from cache).
// Remainder rows/blocks use smaller instantiations of the same template: tile shape never changes
// bits. Batched-decode and prefill calls also prefetch the next weight panel into L2 while the
// current one is in use (TileLoop); prefetches never change what is computed.

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <utility>

#include "kernels/cpu/math_avx512.h"
#include "kernels/cpu/matmul_internal.h"

namespace bitroll::kernels::internal {
namespace {

constexpr int kMr = 8;           // rows per register tile
constexpr int kNr = 3;           // 16-column blocks per register tile
constexpr int kWideMaxRows = 2;  // row ranges this small use the wide tiles
constexpr int kWideNr = 4;       // 16-column blocks per wide tile

struct TileArgs {
  const float* x;  // x [MR][ldx], first row of the tile
  int64_t ldx;
  const void* w;  // packed block b0: [NR][K][16] with block stride K*16 elements
  int64_t k;
  const float* bias;  // bias + b0*16, or nullptr
  float* y;           // y + row*ldy + b0*16
  int64_t ldy;
  int64_t n_valid;  // columns of this tile that exist (may be < NR*16 at the right edge)
  // Lines of the next panel to prefetch into L2 while this tile runs: pf + i * 64 bytes for
  // i in [0, pf_lines), pf_per_step of them per k step.
  const char* pf;
  int64_t pf_lines;
  int pf_per_step;
};

// Software prefetch of the weight streams, kPrefetchK k-steps ahead: with several column blocks
// streamed at once the hardware prefetcher alone reached ~60% of DRAM bandwidth at M = 1; this
// reaches ~95% (bench_kernels, classifier shape). Prefetches never fault, so running past the end
// of the buffer is harmless; the address is formed as an integer for that reason.
constexpr int64_t kPrefetchK = 8;

template <bool kBf16>
inline void Prefetch(const void* w, int64_t idx) {
  const uintptr_t addr =
      reinterpret_cast<uintptr_t>(w) + static_cast<uintptr_t>(idx) * (kBf16 ? 2 : 4);
  _mm_prefetch(reinterpret_cast<const char*>(addr), _MM_HINT_T0);
}

template <bool kBf16>
inline __m512 LoadW(const void* w, int64_t idx) {
  if constexpr (kBf16) {
    return LoadBf16x16(static_cast<const uint16_t*>(w) + idx);
  } else {
    return _mm512_load_ps(static_cast<const float*>(w) + idx);
  }
}

// deterministic: acc[r][c] lane j is the chain acc = fma(x[r][k], W[col][k], acc) over k in order.
template <int MR, int NR, bool kBf16>
void Tile(const TileArgs& a) {
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  const int64_t block_stride = a.k * 16;
  const char* pf = a.pf;
  const char* const pf_end = a.pf + a.pf_lines * 64;
  for (int64_t kk = 0; kk < a.k; ++kk) {
    for (int i = 0; i < a.pf_per_step && pf < pf_end; ++i, pf += 64) {
      _mm_prefetch(pf, _MM_HINT_T1);
    }
    __m512 wv[NR];
#pragma GCC unroll 8
    for (int c = 0; c < NR; ++c) {
      wv[c] = LoadW<kBf16>(a.w, c * block_stride + kk * 16);
      Prefetch<kBf16>(a.w, c * block_stride + (kk + kPrefetchK) * 16);
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512 xv = _mm512_set1_ps(a.x[r * a.ldx + kk]);
#pragma GCC unroll 4
      for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
#pragma GCC unroll 4
  for (int c = 0; c < NR; ++c) {
    const int64_t valid = std::min<int64_t>(16, a.n_valid - c * 16);
    const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1u);
    const bool has_bias = a.bias != nullptr;
    const __m512 bias = has_bias ? _mm512_maskz_loadu_ps(mask, a.bias + c * 16) : __m512();
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      __m512 v = acc[r][c];
      if (has_bias) v = _mm512_add_ps(v, bias);
      _mm512_mask_storeu_ps(a.y + r * a.ldy + c * 16, mask, v);
    }
  }
}

using TileFn = void (*)(const TileArgs&);

// table[(mr - 1) * kMaxNr + (nr - 1)] = Tile<mr, nr>.
template <int kMaxMr, int kMaxNr, bool kBf16, size_t... I>
constexpr std::array<TileFn, kMaxMr * kMaxNr> MakeTable(std::index_sequence<I...>) {
  return {&Tile<static_cast<int>(I / kMaxNr) + 1, static_cast<int>(I % kMaxNr) + 1, kBf16>...};
}

template <int kMaxMr, int kMaxNr, bool kBf16>
constexpr auto kTable =
    MakeTable<kMaxMr, kMaxNr, kBf16>(std::make_index_sequence<kMaxMr * kMaxNr>());

// prefetch_next: prefetch the next panel into L2 (below), for calls where at least three row
// groups share each panel (M >= kPrefetchMinRows): batched decode, whose weights come from memory
// once per call, and prefill chunks, whose first wave of row tasks (one per thread, all on the
// same cold panels) reads them from memory too. With fewer
// rows the panel is consumed faster than one core's memory bandwidth can refill it, so the
// prefetches there would only add instructions. Measurements: docs/benchmarks.md, "Matmul for
// batched decode and prefill" and "Issue 19, round 5".
constexpr int64_t kPrefetchMinRows = 17;

template <int kMaxMr, int kMaxNr, bool kBf16>
void TileLoop(const MatmulParams& p, int64_t row0, int64_t row1, int64_t block0, int64_t block1,
              bool prefetch_next) {
  const PackedMatrix& w = *p.w;
  const auto& table = kTable<kMaxMr, kMaxNr, kBf16>;
  const int64_t k = w.k();
  constexpr int64_t kElem = kBf16 ? 2 : 4;
  for (int64_t b = block0; b < block1; b += kMaxNr) {
    const int nr = static_cast<int>(std::min<int64_t>(kMaxNr, block1 - b));
    TileArgs a;
    a.ldx = p.ldx;
    a.k = k;
    a.w = kBf16 ? static_cast<const void*>(w.bf16_data() + b * k * 16)
                : static_cast<const void*>(w.f32_data() + b * k * 16);
    a.bias = p.bias != nullptr ? p.bias + b * 16 : nullptr;
    a.ldy = p.ldy;
    a.n_valid = std::min<int64_t>(nr * 16, w.n() - b * 16);
    // The next panel of this call (contiguous after this one) is prefetched into L2 in equal
    // shares by this panel's row groups, so the weights stream from memory while every row group
    // computes, not only while the first one does (which reads the panel from memory).
    const int64_t next_blocks = std::min<int64_t>(kMaxNr, block1 - (b + kMaxNr));
    int64_t next_lines = prefetch_next && next_blocks > 0 ? next_blocks * k * 16 * kElem / 64 : 0;
    const int64_t groups = (row1 - row0 + kMaxMr - 1) / kMaxMr;
    const int64_t share = (next_lines + groups - 1) / groups;
    a.pf = static_cast<const char*>(a.w) + nr * k * 16 * kElem;
    a.pf_per_step = static_cast<int>((share + k - 1) / k);
    for (int64_t r = row0; r < row1; r += kMaxMr) {
      const int mr = static_cast<int>(std::min<int64_t>(kMaxMr, row1 - r));
      a.x = p.x + r * p.ldx;
      a.y = p.y + r * p.ldy + b * 16;
      a.pf_lines = std::max<int64_t>(0, std::min(share, next_lines));
      table[(mr - 1) * kMaxNr + (nr - 1)](a);
      a.pf += a.pf_lines * 64;
      next_lines -= a.pf_lines;
    }
  }
}

}  // namespace

TileShape MatmulTileShapeAvx512(int64_t rows) {
  return rows <= kWideMaxRows ? TileShape{kWideMaxRows, kWideNr} : TileShape{kMr, kNr};
}

void MatmulTileAvx512(const MatmulParams& p, int64_t row0, int64_t row1, int64_t block0,
                      int64_t block1) {
  const bool bf16 = p.w->storage() == DType::kBF16;
  const bool wide = row1 - row0 <= kWideMaxRows;
  if (wide) {
    if (bf16) return TileLoop<kWideMaxRows, kWideNr, true>(p, row0, row1, block0, block1, false);
    return TileLoop<kWideMaxRows, kWideNr, false>(p, row0, row1, block0, block1, false);
  }
  const bool prefetch_next = p.m >= kPrefetchMinRows;
  if (bf16) return TileLoop<kMr, kNr, true>(p, row0, row1, block0, block1, prefetch_next);
  return TileLoop<kMr, kNr, false>(p, row0, row1, block0, block1, prefetch_next);
}

}  // namespace bitroll::kernels::internal
