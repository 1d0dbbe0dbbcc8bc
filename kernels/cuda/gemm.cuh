// The batch-invariant bf16 GEMM kernel (tensor cores, mma.sync m16n8k16; sm_80 and later).
//
//   y[m][n] = sum_k x[m][k] * w[n][k]      bf16 inputs, fp32 accumulators, fp32 or bf16 output
//
// Structure (the classic Ampere-style pipeline, chosen for being simple and checkable):
//   - one CTA computes a BM x BN tile of y; its warps form a WM x WN grid and each warp owns a
//     (BM/WM) x (BN/WN) sub-tile, i.e. MT x NT fragments of 16 x 8 accumulators;
//   - K is walked in BK = 32 slices k0 = k_begin, k_begin + 32, ... in increasing order; a
//     STAGES-deep cp.async ring prefetches the x and w slices into padded shared memory (rows of
//     BK + 8 bf16: 80 bytes, so the eight 16-byte rows one ldmatrix reads hit distinct banks);
//   - each slice is consumed as two k16 steps (kk = 0, 16) by ldmatrix.x4 + mma.sync.
//   - rows past M, columns past N and k past K are loaded as zeros (cp.async with src-size 0) and
//     never stored.
//
// deterministic -- the invariance argument. Fix one output element y[m][n]. Its accumulator is
// one fp32 register, initialised to +0 and updated ONLY by the sequence of mma instructions
//     acc = mma(x[m][k0 .. k0+15], w[n][k0 .. k0+15], acc)   for k0 = 0, 16, 32, ... < K
// in increasing k0 (the pipeline changes when data arrives, never the order of the mma's). One
// mma computes each element of D = A*B + C from that element's own A row, B column and C value:
// the hardware's internal order within one instruction is fixed and the same for every row and
// column slot of the fragment. Zero-filled k >= K (when K % 16 != 0) are a function of K alone.
// So the bits of y[m][n] depend only on x row m, w row n and K: not on M, not on which tile or
// fragment slot the row lands in, not on BM/BN/warp layout (all configurations give the same
// bits; the tests check that too), not on the grid. There is no split-K, no stream-K, no atomics.
// The tile configuration is nonetheless chosen from (N, K) only (CudaGemmTileConfigFor), never M.
// The bf16 output is rounded once from the final fp32 accumulator (round to nearest even).
//
// The only deviation, used only by the negative control: k_split_len < K with gridDim.z splits
// makes each split write a partial over [z * k_split_len, ...) to y + z * y_split_stride (fp32).
#pragma once

#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace bitroll::kernels::cuda {

struct GemmKernelParams {
  const uint16_t* x;  // [m][ldx] bf16 bits
  const uint16_t* w;  // [n][k] bf16 bits
  void* y;            // [m][ldy] float or bf16 bits
  int m, n, k;
  int64_t ldx, ldy;
  int out_bf16;            // 1: y is bf16, else fp32
  int k_split_len;         // K range of one blockIdx.z (== k when not split)
  int64_t y_split_stride;  // elements between the outputs of consecutive splits (0 when not split)
};

inline constexpr int kGemmBK = 32;
inline constexpr int kGemmLds = kGemmBK + 8;  // padded shared row, in bf16 elements

namespace gemm_detail {

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global->shared copy; src_bytes 0 writes zeros (src must still be a valid address).
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SmemAddr(smem)), "l"(gmem),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void LdMatrixX4(const void* smem, uint32_t& r0, uint32_t& r1,
                                           uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(SmemAddr(smem))
               : "memory");
}

// d = a * b + d for one m16n8k16 tile (bf16 inputs, fp32 accumulators).
__device__ __forceinline__ void MmaBf16(float* d, const uint32_t* a, const uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

}  // namespace gemm_detail

template <int BM, int BN, int WM, int WN, int STAGES>
struct GemmShape {
  static constexpr int kThreads = WM * WN * 32;
  static constexpr int kWarpM = BM / WM;
  static constexpr int kWarpN = BN / WN;
  static constexpr int kMT = kWarpM / 16;
  static constexpr int kNT = kWarpN / 8;
  static constexpr int kSmemBytes = STAGES * (BM + BN) * kGemmLds * 2;
  static_assert(kWarpM % 16 == 0 && kWarpN % 16 == 0,
                "warp tile must be 16-row x 16-col multiples");
  static_assert((BM * kGemmBK / 8) % kThreads == 0 && (BN * kGemmBK / 8) % kThreads == 0,
                "tile loads must divide evenly over the threads");
  static_assert(STAGES >= 2, "need at least double buffering");
};

template <int BM, int BN, int WM, int WN, int STAGES>
__global__ void __launch_bounds__(WM* WN * 32) GemmBf16Kernel(GemmKernelParams p) {
  using namespace gemm_detail;
  using S = GemmShape<BM, BN, WM, WN, STAGES>;
  extern __shared__ __align__(16) unsigned char gemm_smem[];
  uint16_t* s_a = reinterpret_cast<uint16_t*>(gemm_smem);  // [STAGES][BM][kGemmLds]
  uint16_t* s_b = s_a + STAGES * BM * kGemmLds;            // [STAGES][BN][kGemmLds]

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int warp_m = warp / WN;
  const int warp_n = warp % WN;
  const int m0 = blockIdx.y * BM;
  const int n0 = blockIdx.x * BN;
  const int k_begin = blockIdx.z * p.k_split_len;
  const int k_end = min(p.k, k_begin + p.k_split_len);
  const int ktiles = (k_end - k_begin + kGemmBK - 1) / kGemmBK;

  // Loads K slice `kt` into ring stage `stage`: 16-byte chunks, 4 per 32-wide row.
  auto load_tile = [&](int stage, int kt) {
    const int k0 = k_begin + kt * kGemmBK;
    uint16_t* sa = s_a + stage * BM * kGemmLds;
    uint16_t* sb = s_b + stage * BN * kGemmLds;
#pragma unroll
    for (int i = 0; i < BM * kGemmBK / 8 / S::kThreads; ++i) {
      const int idx = tid + i * S::kThreads;
      const int row = idx >> 2;
      const int col = (idx & 3) * 8;
      const int gm = m0 + row;
      const int gk = k0 + col;
      const bool ok = gm < p.m && gk < k_end;
      const uint16_t* src = ok ? p.x + static_cast<int64_t>(gm) * p.ldx + gk : p.x;
      CpAsync16(sa + row * kGemmLds + col, src, ok ? 16 : 0);
    }
#pragma unroll
    for (int i = 0; i < BN * kGemmBK / 8 / S::kThreads; ++i) {
      const int idx = tid + i * S::kThreads;
      const int row = idx >> 2;
      const int col = (idx & 3) * 8;
      const int gn = n0 + row;
      const int gk = k0 + col;
      const bool ok = gn < p.n && gk < k_end;
      const uint16_t* src = ok ? p.w + static_cast<int64_t>(gn) * p.k + gk : p.w;
      CpAsync16(sb + row * kGemmLds + col, src, ok ? 16 : 0);
    }
  };

  float acc[S::kMT][S::kNT][4];
#pragma unroll
  for (int i = 0; i < S::kMT; ++i)
#pragma unroll
    for (int j = 0; j < S::kNT; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.0f;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < ktiles) load_tile(s, s);
    CpAsyncCommit();
  }

  for (int kt = 0; kt < ktiles; ++kt) {
    CpAsyncWait<STAGES - 2>();  // slice kt has landed (this thread's copies)
    __syncthreads();            // ... everyone's; and everyone is done with slice kt - 1
    const int next = kt + STAGES - 1;
    if (next < ktiles) load_tile(next % STAGES, next);
    CpAsyncCommit();

    const uint16_t* sa = s_a + (kt % STAGES) * BM * kGemmLds;
    const uint16_t* sb = s_b + (kt % STAGES) * BN * kGemmLds;
#pragma unroll
    for (int kk = 0; kk < kGemmBK; kk += 16) {
      uint32_t a[S::kMT][4];
      uint32_t b[S::kNT][2];
#pragma unroll
      for (int mt = 0; mt < S::kMT; ++mt) {
        const int row = warp_m * S::kWarpM + mt * 16 + (lane & 15);
        const int col = kk + (lane >> 4) * 8;
        LdMatrixX4(sa + row * kGemmLds + col, a[mt][0], a[mt][1], a[mt][2], a[mt][3]);
      }
#pragma unroll
      for (int np = 0; np < S::kNT / 2; ++np) {
        const int row = warp_n * S::kWarpN + np * 16 + ((lane >> 4) << 3) + (lane & 7);
        const int col = kk + ((lane >> 3) & 1) * 8;
        LdMatrixX4(sb + row * kGemmLds + col, b[2 * np][0], b[2 * np][1], b[2 * np + 1][0],
                   b[2 * np + 1][1]);
      }
#pragma unroll
      for (int mt = 0; mt < S::kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < S::kNT; ++nt) MmaBf16(acc[mt][nt], a[mt], b[nt]);
    }
  }
  CpAsyncWait<0>();

  // Epilogue: accumulator r of fragment (mt, nt) is element (row + 8 * (r >= 2), col + (r & 1)).
  const int64_t split_off = static_cast<int64_t>(blockIdx.z) * p.y_split_stride;
#pragma unroll
  for (int mt = 0; mt < S::kMT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < S::kNT; ++nt) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int row = m0 + warp_m * S::kWarpM + mt * 16 + (lane >> 2) + (r >= 2 ? 8 : 0);
        const int col = n0 + warp_n * S::kWarpN + nt * 8 + (lane & 3) * 2 + (r & 1);
        if (row >= p.m || col >= p.n) continue;
        const int64_t off = split_off + static_cast<int64_t>(row) * p.ldy + col;
        if (p.out_bf16) {
          static_cast<uint16_t*>(p.y)[off] = ToBf16Bits(acc[mt][nt][r]);
        } else {
          static_cast<float*>(p.y)[off] = acc[mt][nt][r];
        }
      }
    }
  }
}

}  // namespace bitroll::kernels::cuda
