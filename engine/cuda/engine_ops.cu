// engine/cuda/engine_ops.cu: see engine_ops.h.
#include "engine/cuda/engine_ops.h"

#include "kernels/cuda/common.cuh"

namespace bitroll::engine::cuda {
namespace {

using kernels::cuda::DevExp;
using kernels::cuda::ToBf16Bits;

constexpr int kThreads = 256;

// Blocks for `n` elements with one thread each (n >= 1).
unsigned Blocks(int64_t n) {
  return static_cast<unsigned>((n + kThreads - 1) / kThreads);
}

__global__ void EmbedRowsKernel(const int32_t* tokens, const float* table, int64_t rows,
                                int64_t dim, float* x) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * dim) return;
  const int64_t r = i / dim, c = i % dim;
  x[i] = table[static_cast<int64_t>(tokens[r]) * dim + c];
}

__global__ void SplitQkvKernel(const float* qkv, int64_t ld, const float* bias, int64_t rows,
                               int64_t dim, int64_t kv, float* q, float* k, float* v) {
  const int64_t width = dim + 2 * kv;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * width) return;
  const int64_t r = i / width, c = i % width;
  float val = qkv[r * ld + c];
  if (bias != nullptr) val = __fadd_rn(val, bias[c]);
  if (c < dim) {
    q[r * dim + c] = val;
  } else if (c < dim + kv) {
    k[r * kv + (c - dim)] = val;
  } else {
    v[r * kv + (c - dim - kv)] = val;
  }
}

__global__ void WriteKvKernel(const float* k, const float* v, const int32_t* positions,
                              const int32_t* tables, int64_t table_stride, int64_t rows,
                              int64_t n_kv, int64_t hd, int64_t bs, float* k_pool, float* v_pool) {
  const int64_t kv = n_kv * hd;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * kv) return;
  const int64_t r = i / kv, c = i % kv;
  const int64_t h = c / hd, d = c % hd;
  const int64_t pos = positions[r];
  const int64_t block = tables[r * table_stride + pos / bs];
  const int64_t slot = pos % bs;
  const int64_t base = (block * n_kv + h) * hd * bs;
  k_pool[base + d * bs + slot] = k[r * kv + c];
  v_pool[base + slot * hd + d] = v[r * kv + c];
}

__global__ void AddInPlaceKernel(float* x, const float* y, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = __fadd_rn(x[i], y[i]);
}

__global__ void F32ToBf16RowsKernel(const float* in, int64_t rows, int64_t cols, int64_t ld_in,
                                    uint16_t* out, int64_t ld_out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * cols) return;
  const int64_t r = i / cols, c = i % cols;
  out[r * ld_out + c] = ToBf16Bits(in[r * ld_in + c]);
}

__global__ void SwiGluRowsBf16Kernel(const float* h13, int64_t rows, int64_t hidden, uint16_t* out,
                                     int64_t ld_out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * hidden) return;
  const int64_t r = i / hidden, c = i % hidden;
  const float g = h13[r * 2 * hidden + c];
  const float u = h13[r * 2 * hidden + hidden + c];
  const float sig = __fdiv_rn(1.0f, __fadd_rn(1.0f, DevExp(-g)));
  out[r * ld_out + c] = ToBf16Bits(__fmul_rn(__fmul_rn(g, sig), u));
}

__global__ void GatherRowsKernel(const float* x, const int32_t* idx, int64_t m, int64_t dim,
                                 float* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= m * dim) return;
  const int64_t j = i / dim, c = i % dim;
  out[i] = x[static_cast<int64_t>(idx[j]) * dim + c];
}

}  // namespace

cudaError_t LaunchEmbedRows(const int32_t* tokens, const float* table, int64_t rows, int64_t dim,
                            float* x, cudaStream_t stream) {
  if (rows * dim <= 0) return cudaSuccess;
  EmbedRowsKernel<<<Blocks(rows * dim), kThreads, 0, stream>>>(tokens, table, rows, dim, x);
  return cudaGetLastError();
}

cudaError_t LaunchSplitQkv(const float* qkv, int64_t ld, const float* bias, int64_t rows,
                           int64_t dim, int64_t kv, float* q, float* k, float* v,
                           cudaStream_t stream) {
  if (rows * (dim + 2 * kv) <= 0) return cudaSuccess;
  SplitQkvKernel<<<Blocks(rows * (dim + 2 * kv)), kThreads, 0, stream>>>(qkv, ld, bias, rows, dim,
                                                                         kv, q, k, v);
  return cudaGetLastError();
}

cudaError_t LaunchWriteKv(const float* k, const float* v, const int32_t* positions,
                          const int32_t* tables, int64_t table_stride, int64_t rows,
                          int64_t n_kv_heads, int64_t head_dim, int64_t block_size, float* k_pool,
                          float* v_pool, cudaStream_t stream) {
  const int64_t n = rows * n_kv_heads * head_dim;
  if (n <= 0) return cudaSuccess;
  WriteKvKernel<<<Blocks(n), kThreads, 0, stream>>>(k, v, positions, tables, table_stride, rows,
                                                    n_kv_heads, head_dim, block_size, k_pool,
                                                    v_pool);
  return cudaGetLastError();
}

cudaError_t LaunchAddInPlace(float* x, const float* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  AddInPlaceKernel<<<Blocks(n), kThreads, 0, stream>>>(x, y, n);
  return cudaGetLastError();
}

cudaError_t LaunchF32ToBf16Rows(const float* in, int64_t rows, int64_t cols, int64_t ld_in,
                                uint16_t* out, int64_t ld_out, cudaStream_t stream) {
  if (rows * cols <= 0) return cudaSuccess;
  F32ToBf16RowsKernel<<<Blocks(rows * cols), kThreads, 0, stream>>>(in, rows, cols, ld_in, out,
                                                                    ld_out);
  return cudaGetLastError();
}

cudaError_t LaunchSwiGluRowsBf16(const float* h13, int64_t rows, int64_t hidden, uint16_t* out,
                                 int64_t ld_out, cudaStream_t stream) {
  if (rows * hidden <= 0) return cudaSuccess;
  SwiGluRowsBf16Kernel<<<Blocks(rows * hidden), kThreads, 0, stream>>>(h13, rows, hidden, out,
                                                                       ld_out);
  return cudaGetLastError();
}

cudaError_t LaunchGatherRows(const float* x, const int32_t* idx, int64_t m, int64_t dim, float* out,
                             cudaStream_t stream) {
  if (m * dim <= 0) return cudaSuccess;
  GatherRowsKernel<<<Blocks(m * dim), kThreads, 0, stream>>>(x, idx, m, dim, out);
  return cudaGetLastError();
}

}  // namespace bitroll::engine::cuda
