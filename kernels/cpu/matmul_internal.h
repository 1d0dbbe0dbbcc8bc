// Internal to kernels/: the per-ISA matmul tiles behind Matmul(). Not a public header.
#pragma once

#include <cstdint>

#include "kernels/cpu/matmul.h"

namespace bitroll::kernels::internal {

// Computes y for rows [row0, row1) and column blocks [block0, block1) of p (16 columns per block;
// columns >= N are never written). Each output is the canonical fma chain of matmul.h.
// REQUIRES: the ISA of the function is supported; p is valid; ranges are within bounds.
void MatmulTileScalar(const MatmulParams& p, int64_t row0, int64_t row1, int64_t block0,
                      int64_t block1);
void MatmulTileAvx2(const MatmulParams& p, int64_t row0, int64_t row1, int64_t block0,
                    int64_t block1);
void MatmulTileAvx512(const MatmulParams& p, int64_t row0, int64_t row1, int64_t block0,
                      int64_t block1);

}  // namespace bitroll::kernels::internal
