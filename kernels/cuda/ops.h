// Row ops on the GPU (fp32): RMSNorm, RoPE, SwiGLU, log-softmax. Public, C++-only launchers.
//
// deterministic: each row is reduced by ONE CTA of kOpsThreads threads in one fixed order that
// depends only on the row length: thread t accumulates elements t, t + 256, t + 512, ... in
// increasing order, then the 256 partials combine by the fixed pairwise tree of common.cuh
// (CtaTreeSum / CtaTreeMax). The number of rows, the row's index and the grid never enter.
// Element-wise ops (RoPE, SwiGLU, the final scaling of RMSNorm / log-softmax) run the same IEEE
// operations as kernels/cpu/ops.h, and Exp/Log are kernels/cpu/math.h's sequences, so:
//   - RoPE and SwiGLU are BIT-IDENTICAL to the CPU ops (tested with memcmp);
//   - RMSNorm and log-softmax differ from the CPU only through the reduction order (the CPU uses
//     16 lanes, the GPU 256 threads): agreement within a few ulp, tested with a tolerance.
// All pointers are device pointers; rows are contiguous. Launchers return cudaErrorInvalidValue
// for bad shapes or null pointers (checked on the host, no device needed), else the launch error.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace bitroll::kernels::cuda {

inline constexpr int kOpsThreads = 256;

// out[r][i] = weight[i] * (inv * x[r][i]),  inv = 1 / sqrt(ss / dim + eps),  ss = sum x^2 (fma).
// Writes out_f32 and/or out_bf16 (round to nearest even), whichever is non-null (at least one).
// REQUIRES rows >= 0, dim >= 1. out_f32 may alias x.
cudaError_t CudaRmsNorm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
                        float* out_f32, uint16_t* out_bf16, cudaStream_t stream);

// In place on x [n_tokens][n_heads][head_dim]: token t is rotated by the table row positions[t]
// (cos/sin tables [max_pos][head_dim / 2], as kernels::RopeTable builds them). half_split false:
// pairs (2i, 2i+1) (llama2.c); true: pairs (i, i + head_dim/2) (HF/NeoX).
//   out0 = x0*c - x1*s; out1 = x0*s + x1*c   (multiplies then sub/add, no fma)
// REQUIRES head_dim even >= 2; positions[t] in [0, max_pos) (tokens outside are left unrotated).
cudaError_t CudaRope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim,
                     const int32_t* positions, const float* cos_table, const float* sin_table,
                     int64_t max_pos, bool half_split, cudaStream_t stream);

// out[i] = (g[i] * (1 / (1 + Exp(-g[i])))) * up[i]. out may alias gate or up.
cudaError_t CudaSwiGlu(const float* gate, const float* up, int64_t n, float* out,
                       cudaStream_t stream);

// out[r][i] = (x[r][i] - m) - Log(sum_j Exp(x[r][j] - m)),  m = max_j x[r][j]. out may alias x.
// REQUIRES finite inputs.
cudaError_t CudaLogSoftmax(const float* x, int64_t rows, int64_t n, float* out,
                           cudaStream_t stream);

}  // namespace bitroll::kernels::cuda
