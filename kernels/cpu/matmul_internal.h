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

// The register tile (rows x 16-column blocks) that each ISA's function above uses for a range of
// `rows` rows. Task chunks that are multiples of it run no remainder tiles. Speed only: no tile
// shape changes a bit.
struct TileShape {
  int64_t rows;
  int64_t blocks;
};
TileShape MatmulTileShapeScalar(int64_t rows);
TileShape MatmulTileShapeAvx2(int64_t rows);
TileShape MatmulTileShapeAvx512(int64_t rows);

// The task grid of a Matmul() call on a pool: row_tasks x col_tasks tasks, the rows and column
// blocks dealt out evenly in whole tiles, so the tasks differ by at most one tile in each direction
// and, where the tile counts allow it, their number is a multiple of the thread count (equal tasks
// then give every thread equal work). Rows of one task share each weight panel from cache, so a
// task holds up to kMaxTaskRows rows before rows are split; columns are split to give about
// kTasksPerThread tasks per thread.
struct MatmulGrid {
  static constexpr int64_t kMaxTaskRows = 64;
  static constexpr int64_t kTasksPerThread = 4;

  int64_t m = 0, n_blocks = 0;
  TileShape tile{1, 1};
  int64_t row_tasks = 1, col_tasks = 1;

  int64_t tasks() const { return row_tasks * col_tasks; }
  // Row task i covers rows [RowBegin(i), RowBegin(i + 1)); column task j covers blocks
  // [BlockBegin(j), BlockBegin(j + 1)). RowBegin(row_tasks) == m, BlockBegin(col_tasks) ==
  // n_blocks.
  int64_t RowBegin(int64_t i) const;
  int64_t BlockBegin(int64_t j) const;
};
// REQUIRES: m >= 1, n_blocks >= 1, tile >= 1 x 1, threads >= 1.
MatmulGrid PlanMatmulGrid(int64_t m, int64_t n_blocks, TileShape tile, int threads);

}  // namespace bitroll::kernels::internal
