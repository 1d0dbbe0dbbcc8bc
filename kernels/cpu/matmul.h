// Matmul: y[m][n] = bias[n] + sum_k x[m][k] * W[n][k], W row-major [N][K] (nn.Linear layout).
//
// deterministic: each output is ONE fma chain in k order:
//     acc = 0.0f;  for k = 0..K-1: acc = fmaf(x[m][k], W[n][k], acc);
//     y[m][n] = bias ? acc + bias[n] : acc;
// No split-K, no partial sums, no horizontal sums. Vector code runs the same chain in each lane
// (vectorised across output columns), register tiles only choose which independent chains run
// together, and remainder rows/columns run the same chain, so the bits depend neither on the ISA,
// nor on M, nor on the tiling, nor on the thread count. MatmulReference is the readable definition.
//
// Thread-safety: PackedMatrix is immutable after Pack and may be shared by any number of threads.
// Concurrent Matmul calls are safe when their outputs are distinct and they do not share a
// ThreadPool (a pool serves one Run at a time).
#pragma once

#include <cstdint>
#include <span>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/zero_pages.h"
#include "schema/status.h"
#include "schema/vocab.h"

namespace bitroll::kernels {

using DType = ::bitroll::DType;  // schema/vocab.h

// One source matrix, row-major [rows][k] (k is given to Pack). Not owned.
struct MatrixPart {
  const void* data;  // float / uint16_t (IEEE half) / uint16_t (bfloat16) according to dtype
  DType dtype;
  int64_t rows;
};

// Weights packed column-blocked: [ceil(N/16)][K][16] values, columns past N are zero; the buffer is
// 64-byte aligned. Movable, not copyable.
class PackedMatrix {
 public:
  static constexpr int64_t kBlock = 16;  // columns per block

  // Packs the parts stacked along N (e.g. Wq;Wk;Wv -> one matrix with N = sum of rows).
  // F16/BF16 sources are widened exactly. storage is kF32 or kBF16: kBF16 keeps 16-bit weights in
  // memory (half the bandwidth); kF32 and kF16 sources are then rounded to nearest-even bf16, which
  // changes the model (callers record it, e.g. in the weights hash).
  // Errors (kInvalidArgument): k <= 0, no parts, a part with rows <= 0 or null data, an unknown
  // dtype, storage not kF32/kBF16, or a size that overflows. kResourceExhausted if allocation
  // fails.
  static Result<PackedMatrix> Pack(std::span<const MatrixPart> parts, int64_t k,
                                   DType storage = DType::kF32);

  PackedMatrix(PackedMatrix&&) noexcept = default;
  PackedMatrix& operator=(PackedMatrix&&) noexcept = default;
  PackedMatrix(const PackedMatrix&) = delete;
  PackedMatrix& operator=(const PackedMatrix&) = delete;

  int64_t n() const { return n_; }
  int64_t k() const { return k_; }
  DType storage() const { return storage_; }
  int64_t n_blocks() const { return (n_ + kBlock - 1) / kBlock; }
  size_t size_bytes() const { return size_bytes_; }

  // Unpacked fp32 copy of row `row` (W[row][0..k)). REQUIRES: 0 <= row < n(); out has k() floats.
  void UnpackRow(int64_t row, float* out) const;

  // Packed data: block b, depth kk, lane j is element [(b * k() + kk) * 16 + j].
  // f32_data() is non-null only for kF32 storage, bf16_data() only for kBF16 storage.
  const float* f32_data() const;
  const uint16_t* bf16_data() const;

 private:
  PackedMatrix() = default;

  ZeroPages data_;  // huge-page backed: the matmuls stream every byte once per forward
  size_t size_bytes_ = 0;
  int64_t n_ = 0;
  int64_t k_ = 0;
  DType storage_ = DType::kF32;
};

struct MatmulParams {
  const float* x = nullptr;  // x [m][ldx]; the first K columns are read
  int64_t m = 0;
  int64_t ldx = 0;  // REQUIRES ldx >= K
  const PackedMatrix* w = nullptr;
  const float* bias = nullptr;  // [N] or nullptr
  float* y = nullptr;           // y [m][ldy]; the first N columns are written
  int64_t ldy = 0;              // REQUIRES ldy >= N
};

// Computes p.y = p.x * W^T (+ bias). REQUIRES: IsaSupported(isa); CheckMatmulParams(p).ok();
// y does not overlap x, W or bias. pool may be nullptr (single thread). m == 0 does nothing.
// Matmul does not validate (it runs ~100 times per decode step): check a shape once with
// CheckMatmulParams where the parameters come from outside.
void Matmul(Isa isa, const MatmulParams& p, ThreadPool* pool);

// kInvalidArgument (naming the field) unless: w is non-null, m >= 0, and when m > 0: x and y are
// non-null, ldx >= w->k(), ldy >= w->n().
Status CheckMatmulParams(const MatmulParams& p);

// The readable reference on unpacked row-major fp32 W [n][k]; x is [m][k], y is [m][n], bias [n]
// or nullptr. Identical bits to Matmul on every ISA (with W = the matrix's UnpackRow values).
void MatmulReference(const float* x, int64_t m, const float* w, int64_t n, int64_t k,
                     const float* bias, float* y);

}  // namespace bitroll::kernels
