// engine/cuda/engine_ops.h: the small element-wise device kernels the CUDA forward pass needs
// besides kernels/cuda (embedding gather, q/k/v split, KV scatter into the paged pool, residual
// add, fp32 -> bf16, row-wise SwiGLU to bf16, row gather). Public, C++-only launchers.
//
// deterministic: every kernel is element-wise (one output element from a fixed set of inputs,
// explicit _rn intrinsics, built with -fmad=false), so no output depends on the batch, the grid or
// the launch. SwiGLU uses kernels/cuda/common.cuh's DevExp: the CPU's exact operation sequence.
// All pointers are device pointers. Launchers return the launch's cudaError_t (cudaSuccess for
// empty work) and never synchronize.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace bitroll::engine::cuda {

// x[r][0..dim) = table[tokens[r]][0..dim)   (fp32 table [vocab][dim])
cudaError_t LaunchEmbedRows(const int32_t* tokens, const float* table, int64_t rows, int64_t dim,
                            float* x, cudaStream_t stream);

// Splits qkv rows [rows][ld] (q | k | v, ld >= dim + 2 * kv) into contiguous q [rows][dim],
// k [rows][kv], v [rows][kv]; adds bias [dim + 2 * kv] (fp32 add) when non-null.
cudaError_t LaunchSplitQkv(const float* qkv, int64_t ld, const float* bias, int64_t rows,
                           int64_t dim, int64_t kv, float* q, float* k, float* v,
                           cudaStream_t stream);

// Stores row r's k and v ([n_kv_heads][head_dim] each) in the paged pool of one layer at block
// tables[r * table_stride + positions[r] / block_size], slot positions[r] % block_size, in
// engine/kv_cache.h's layout: K [block][kv_head][head_dim][block_size], V
// [block][kv_head][block_size][head_dim].
cudaError_t LaunchWriteKv(const float* k, const float* v, const int32_t* positions,
                          const int32_t* tables, int64_t table_stride, int64_t rows,
                          int64_t n_kv_heads, int64_t head_dim, int64_t block_size, float* k_pool,
                          float* v_pool, cudaStream_t stream);

// x[i] = x[i] + y[i] for i < n (the CPU's kernels::Add).
cudaError_t LaunchAddInPlace(float* x, const float* y, int64_t n, cudaStream_t stream);

// out[r][c] = bf16(in[r][c]) for c < cols (round to nearest even); columns cols..ld_out-1 of out
// are left alone (the caller keeps them zero: the GEMM's K padding).
cudaError_t LaunchF32ToBf16Rows(const float* in, int64_t rows, int64_t cols, int64_t ld_in,
                                uint16_t* out, int64_t ld_out, cudaStream_t stream);

// h13 rows [rows][2 * hidden] = gate | up;  out[r][i] = bf16((g * (1 / (1 + Exp(-g)))) * u)
// (kernels/cuda SwiGLU's operations, then rounded to bf16 for the down projection).
cudaError_t LaunchSwiGluRowsBf16(const float* h13, int64_t rows, int64_t hidden, uint16_t* out,
                                 int64_t ld_out, cudaStream_t stream);

// out[j][0..dim) = x[idx[j]][0..dim) for j < m.
cudaError_t LaunchGatherRows(const float* x, const int32_t* idx, int64_t m, int64_t dim, float* out,
                             cudaStream_t stream);

}  // namespace bitroll::engine::cuda
