// The scalar matmul tile: the canonical chain written out plainly (reads the packed layout).

#include <cmath>

#include "kernels/cpu/math.h"
#include "kernels/cpu/matmul_internal.h"

namespace bitroll::kernels::internal {

TileShape MatmulTileShapeScalar(int64_t) {
  return {1, 1};
}

void MatmulTileScalar(const MatmulParams& p, int64_t row0, int64_t row1, int64_t block0,
                      int64_t block1) {
  const PackedMatrix& w = *p.w;
  const int64_t n_cols = w.n();
  const int64_t k_dim = w.k();
  const float* wf = w.f32_data();
  const uint16_t* wh = w.bf16_data();
  for (int64_t r = row0; r < row1; ++r) {
    const float* x = p.x + r * p.ldx;  // x [K]
    float* y = p.y + r * p.ldy;        // y [N]
    for (int64_t b = block0; b < block1; ++b) {
      for (int64_t j = 0; j < PackedMatrix::kBlock; ++j) {
        const int64_t col = b * PackedMatrix::kBlock + j;
        if (col >= n_cols) break;
        // deterministic: one fma chain over k = 0..K-1, then the bias.
        float acc = 0.0f;
        for (int64_t kk = 0; kk < k_dim; ++kk) {
          const int64_t idx = (b * k_dim + kk) * PackedMatrix::kBlock + j;
          const float wv = wf != nullptr ? wf[idx] : Bf16ToF32(wh[idx]);
          acc = std::fma(x[kk], wv, acc);
        }
        y[col] = p.bias != nullptr ? acc + p.bias[col] : acc;
      }
    }
  }
}

}  // namespace bitroll::kernels::internal
