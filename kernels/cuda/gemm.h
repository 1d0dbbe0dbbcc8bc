// Batch-invariant bf16 GEMM on the GPU: public, C++-only launchers (kernels live in gemm.cuh).
//
//   y[m][n] = sum_k x[m][k] * w[n][k]      x, w bf16; fp32 accumulation; y fp32 or bf16
//
// deterministic: the bits of y[m][n] depend only on row m of x, row n of w and K. They do not
// depend on M, on the row's position in the batch, on the tile configuration or on the launch
// (the argument is in gemm.cuh). CudaGemmSplitKByM is the deliberately batch-variant negative
// control and must never serve a model.
//
// Thread-safety: the launchers are pure functions of their arguments; they enqueue on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace bitroll::kernels::cuda {

enum class GemmOut : uint8_t { kF32 = 0, kBF16 = 1 };

struct CudaGemmParams {
  const uint16_t* x = nullptr;  // bf16 bits [m][ldx]; 16-byte aligned
  int64_t m = 0;                // rows (tokens); 0 does nothing
  int64_t ldx = 0;              // REQUIRES ldx >= k, ldx % 8 == 0
  const uint16_t* w = nullptr;  // bf16 bits [n][k], contiguous; 16-byte aligned
  int64_t n = 0;                // REQUIRES n >= 1
  int64_t k = 0;                // REQUIRES k >= 8, k % 8 == 0
  void* y = nullptr;            // float or bf16 bits [m][ldy]
  int64_t ldy = 0;              // REQUIRES ldy >= n
  GemmOut out = GemmOut::kF32;
};

// One tile configuration, chosen from (n, k) only; `id` indexes the compiled configurations.
struct GemmTileConfig {
  int id;
  int bm, bn, bk;        // CTA tile
  int warps_m, warps_n;  // warp grid of the CTA
  int stages;            // cp.async pipeline depth
  size_t smem_bytes;     // dynamic shared memory of one CTA
};
inline constexpr int kGemmNumConfigs = 2;
GemmTileConfig CudaGemmConfig(int id);  // REQUIRES 0 <= id < kGemmNumConfigs
GemmTileConfig CudaGemmTileConfigFor(int64_t n, int64_t k);

// cudaSuccess, or cudaErrorInvalidValue for any violated REQUIRES above (null pointers when
// m > 0, misaligned x/w/y, bad sizes, m >= 2^21). Host-only: needs no device.
cudaError_t CheckCudaGemmParams(const CudaGemmParams& p);

// The invariant GEMM with the tile configuration of CudaGemmTileConfigFor(n, k).
cudaError_t CudaGemm(const CudaGemmParams& p, cudaStream_t stream);
// The same with configuration `config_id` forced (tests: the bits must not change).
cudaError_t CudaGemmWithConfig(const CudaGemmParams& p, int config_id, cudaStream_t stream);

// NEGATIVE CONTROL ONLY: splits K into CudaGemmSplitKCount(m) parts (a function of M: 4 for
// m <= 32, 2 for m <= 128, else 1), writes fp32 partials to `workspace` and sums them in split
// order. Deterministic run to run, but a row's bits change with the batch size.
int CudaGemmSplitKCount(int64_t m);
size_t CudaGemmSplitKWorkspaceBytes(int64_t m, int64_t n);
cudaError_t CudaGemmSplitKByM(const CudaGemmParams& p, float* workspace, size_t workspace_bytes,
                              cudaStream_t stream);

}  // namespace bitroll::kernels::cuda
