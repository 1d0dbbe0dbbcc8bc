#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

#include "kernels/cpu/math.h"
#include "kernels/cpu/matmul_internal.h"

namespace bitroll::kernels {

namespace {

bool ValidDType(DType d) {
  return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16;
}

// Element `idx` of a source part, widened exactly to fp32.
float SourceValue(const MatrixPart& part, int64_t idx) {
  switch (part.dtype) {
    case DType::kF32:
      return static_cast<const float*>(part.data)[idx];
    case DType::kF16:
      return F16ToF32(static_cast<const uint16_t*>(part.data)[idx]);
    case DType::kBF16:
      return Bf16ToF32(static_cast<const uint16_t*>(part.data)[idx]);
  }
  return 0.0f;
}

}  // namespace

Result<PackedMatrix> PackedMatrix::Pack(std::span<const MatrixPart> parts, int64_t k,
                                        DType storage) {
  if (k <= 0)
    return Status::InvalidArgument("PackedMatrix::Pack: k must be > 0, got " + std::to_string(k));
  if (parts.empty()) return Status::InvalidArgument("PackedMatrix::Pack: no parts");
  if (storage != DType::kF32 && storage != DType::kBF16) {
    return Status::InvalidArgument("PackedMatrix::Pack: storage must be kF32 or kBF16");
  }
  int64_t n_total = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const MatrixPart& part = parts[i];
    const std::string where = "PackedMatrix::Pack: part " + std::to_string(i);
    if (part.rows <= 0) {
      return Status::InvalidArgument(where + " has rows = " + std::to_string(part.rows) +
                                     " (must be > 0)");
    }
    if (part.data == nullptr) return Status::InvalidArgument(where + " has null data");
    if (!ValidDType(part.dtype)) return Status::InvalidArgument(where + " has an unknown dtype");
    if (part.rows > std::numeric_limits<int32_t>::max() - n_total) {
      return Status::InvalidArgument(where + ": total rows overflow");
    }
    n_total += part.rows;
  }
  const int64_t n_blocks = (n_total + kBlock - 1) / kBlock;
  const int64_t elem_size = storage == DType::kF32 ? 4 : 2;
  // Overflow guard: blocks * k * 16 * elem_size must fit comfortably.
  if (k > (int64_t{1} << 40) / (n_blocks * kBlock * elem_size)) {
    return Status::InvalidArgument("PackedMatrix::Pack: matrix too large (n=" +
                                   std::to_string(n_total) + ", k=" + std::to_string(k) + ")");
  }
  const size_t bytes = static_cast<size_t>(n_blocks * k * kBlock * elem_size);
  PackedMatrix pm;
  if (!pm.data_.Map(bytes, /*huge_pages=*/true)) {
    return Status::ResourceExhausted("PackedMatrix::Pack: cannot allocate " +
                                     std::to_string(bytes) + " bytes");
  }
  void* mem = pm.data_.data();
  pm.size_bytes_ = bytes;
  pm.n_ = n_total;
  pm.k_ = k;
  pm.storage_ = storage;
  float* f32 = storage == DType::kF32 ? static_cast<float*>(mem) : nullptr;
  uint16_t* bf16 = storage == DType::kBF16 ? static_cast<uint16_t*>(mem) : nullptr;

  int64_t row_base = 0;
  for (const MatrixPart& part : parts) {
    for (int64_t r = 0; r < part.rows; ++r) {
      const int64_t col = row_base + r;  // this source row is output column `col`
      const int64_t b = col / kBlock, j = col % kBlock;
      for (int64_t kk = 0; kk < k; ++kk) {
        const int64_t dst = (b * k + kk) * kBlock + j;
        const int64_t src = r * k + kk;
        if (f32 != nullptr) {
          f32[dst] = SourceValue(part, src);
        } else if (part.dtype == DType::kBF16) {
          bf16[dst] = static_cast<const uint16_t*>(part.data)[src];  // exact copy
        } else {
          bf16[dst] = F32ToBf16(SourceValue(part, src));  // rounds to nearest even
        }
      }
    }
    row_base += part.rows;
  }
  return pm;
}

void PackedMatrix::UnpackRow(int64_t row, float* out) const {
  const int64_t b = row / kBlock, j = row % kBlock;
  const float* f32 = f32_data();
  const uint16_t* bf16 = bf16_data();
  for (int64_t kk = 0; kk < k_; ++kk) {
    const int64_t idx = (b * k_ + kk) * kBlock + j;
    out[kk] = f32 != nullptr ? f32[idx] : Bf16ToF32(bf16[idx]);
  }
}

const float* PackedMatrix::f32_data() const {
  return storage_ == DType::kF32 ? reinterpret_cast<const float*>(data_.data()) : nullptr;
}

const uint16_t* PackedMatrix::bf16_data() const {
  return storage_ == DType::kBF16 ? reinterpret_cast<const uint16_t*>(data_.data()) : nullptr;
}

void Matmul(Isa isa, const MatmulParams& p, ThreadPool* pool) {
  if (p.m <= 0) return;
  using TileFn = void (*)(const MatmulParams&, int64_t, int64_t, int64_t, int64_t);
  TileFn tile = internal::MatmulTileScalar;
  if (isa == Isa::kAvx2) tile = internal::MatmulTileAvx2;
  if (isa == Isa::kAvx512) tile = internal::MatmulTileAvx512;
  const int64_t n_blocks = p.w->n_blocks();
  const int threads = pool != nullptr ? pool->size() : 1;
  // Calls smaller than ~1 us of work run on the calling thread: a Run round trip costs about that.
  // (Scheduling only: the bits are the same either way.)
  constexpr int64_t kMinParallelFma = 65536;
  const int64_t fmas = p.m * n_blocks * PackedMatrix::kBlock * p.w->k();
  if (threads == 1 || fmas < kMinParallelFma) {
    tile(p, 0, p.m, 0, n_blocks);
    return;
  }
  // deterministic: tasks split rows and column blocks only; every output's chain runs whole inside
  // one tile call, so the split (and which thread runs which task) never changes bits.
  internal::TileShape shape = internal::MatmulTileShapeScalar(p.m);
  if (isa == Isa::kAvx2) shape = internal::MatmulTileShapeAvx2(p.m);
  if (isa == Isa::kAvx512) shape = internal::MatmulTileShapeAvx512(p.m);
  const internal::MatmulGrid g = internal::PlanMatmulGrid(p.m, n_blocks, shape, threads);
  pool->Run(g.tasks(), [&](int, int64_t task) {
    const int64_t rt = task / g.col_tasks, ct = task % g.col_tasks;
    tile(p, g.RowBegin(rt), g.RowBegin(rt + 1), g.BlockBegin(ct), g.BlockBegin(ct + 1));
  });
}

namespace internal {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Start of part i of `total` items cut into `parts` parts of whole `unit`s, dealt out evenly.
int64_t EvenBegin(int64_t i, int64_t parts, int64_t total, int64_t unit) {
  const int64_t units = CeilDiv(total, unit);
  return std::min(total, i * units / parts * unit);
}

}  // namespace

MatmulGrid PlanMatmulGrid(int64_t m, int64_t n_blocks, TileShape tile, int threads) {
  MatmulGrid g;
  g.m = m;
  g.n_blocks = n_blocks;
  g.tile = tile;
  const int64_t row_units = CeilDiv(m, tile.rows), col_units = CeilDiv(n_blocks, tile.blocks);
  g.row_tasks = std::min(row_units, CeilDiv(m, MatmulGrid::kMaxTaskRows));
  g.col_tasks = std::max<int64_t>(1, CeilDiv(MatmulGrid::kTasksPerThread * threads, g.row_tasks));
  // A task count that is a multiple of the thread count: equal tasks then end together.
  const int64_t step = threads / std::gcd(g.row_tasks, static_cast<int64_t>(threads));
  g.col_tasks = std::min(col_units, CeilDiv(g.col_tasks, step) * step);
  return g;
}

int64_t MatmulGrid::RowBegin(int64_t i) const {
  return EvenBegin(i, row_tasks, m, tile.rows);
}

int64_t MatmulGrid::BlockBegin(int64_t j) const {
  return EvenBegin(j, col_tasks, n_blocks, tile.blocks);
}

}  // namespace internal

Status CheckMatmulParams(const MatmulParams& p) {
  if (p.w == nullptr) return Status::InvalidArgument("Matmul: w is null");
  if (p.m < 0) return Status::InvalidArgument("Matmul: m = " + std::to_string(p.m) + " < 0");
  if (p.m == 0) return Status::Ok();
  if (p.x == nullptr) return Status::InvalidArgument("Matmul: x is null");
  if (p.y == nullptr) return Status::InvalidArgument("Matmul: y is null");
  if (p.ldx < p.w->k()) {
    return Status::InvalidArgument("Matmul: ldx = " + std::to_string(p.ldx) +
                                   " < K = " + std::to_string(p.w->k()));
  }
  if (p.ldy < p.w->n()) {
    return Status::InvalidArgument("Matmul: ldy = " + std::to_string(p.ldy) +
                                   " < N = " + std::to_string(p.w->n()));
  }
  return Status::Ok();
}

void MatmulReference(const float* x, int64_t m, const float* w, int64_t n, int64_t k,
                     const float* bias, float* y) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      // deterministic: the canonical chain.
      float acc = 0.0f;
      for (int64_t kk = 0; kk < k; ++kk) acc = std::fma(x[i * k + kk], w[j * k + kk], acc);
      y[i * n + j] = bias != nullptr ? acc + bias[j] : acc;
    }
  }
}

}  // namespace bitroll::kernels
