// Attention kernels on the paged fp32 KV cache (contract in attention.h).
//
// The GPU canonical order. Item = (query token, kv head); its G = n_heads / n_kv_heads query heads
// share every K/V read. Keys 0..pos are cut into chunks of S = 16 anchored at 0; chunk c holds keys
// 16c .. min(16c + 15, pos) (n_valid of them). One CTA of 128 threads computes a chunk partial
// (ChunkPartial):
//   1. score slices: thread t = 16 * slice + j (slice 0..7, key j) runs, for each head g,
//        acc = 0; for d = slice, slice + 8, ... < D: acc = fma(q[g][d], K[j][d], acc)
//   2. s_j = ((sl0 + sl4) + (sl2 + sl6)) + ((sl1 + sl5) + (sl3 + sl7)), then s_j = s_j * scale;
//      keys j >= n_valid get s_j = -inf, p_j = 0 and are never read
//   3. m = max_j s_j by the fixed tree  for w in 8,4,2,1: lane[j] = MaxKeep(lane[j], lane[j+w])
//      p_j = Exp(s_j - m) (common.cuh DevExp = the CPU Exp),  l = the same tree with + over p_j
//   4. o[g][d] = fma chain over j = 0 .. n_valid-1 in order: o = fma(p_j, V[j][d], o), o from 0
// Partials merge strictly left to right (MergeInto, the CPU MergePartial formula):
//   m = max(A.m, C.m); a = Exp(A.m - m); b = Exp(C.m - m); l = A.l*a + C.l*b; o = A.o*a + C.o*b
// starting from chunk 0's partial; the output is o / l.
//
// Kernel 1 (AttnSingleKernel) computes chunk 0, then merges chunks 1, 2, ... as it goes.
// Kernel 2 (AttnSplitChunksKernel) computes any subset of an item's chunks per CTA and stores each
// chunk's partial unmerged (fp32 stores and loads are exact); AttnMergeKernel then loads chunk 0's
// partial and merges chunks 1, 2, ... with the same MergeInto. Same functions, same operands, same
// order => the same bits. Every float operation is an explicit _rn intrinsic, so no FMA
// contraction can differ between the two kernels' instantiations (and -fmad=false besides).
// The flash-decoding baseline (FlashSplitKernel) instead merges each contiguous split in-CTA and
// then the splits: a different association whenever splits > 1, chosen from the batch size.
#pragma once

#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace bitroll::kernels::cuda {

inline constexpr int kAttnChunk = 16;
inline constexpr int kAttnThreads = 128;
inline constexpr int kAttnSlices = kAttnThreads / kAttnChunk;  // 8
inline constexpr int kAttnMaxGroup = 8;
inline constexpr int kAttnMaxHeadDim = 256;
inline constexpr int kAttnOwned = kAttnMaxHeadDim / kAttnThreads;  // d = t + 128 * r, r < 2

struct AttnKernelParams {
  const float* q;
  float* out;
  const float* k_cache;
  const float* v_cache;
  const int32_t* positions;
  const int32_t* block_tables;
  int n_heads, n_kv_heads, head_dim, block_size, group, block_table_stride, max_context;
  float scale;
  int item_begin;       // item of blockIdx.x == 0
  int max_parts;        // partial slots per item in the workspace
  int chunks_per_part;  // 1 for the dual kernel; the split length for flash-decoding
  float* ws_ml;         // [item slot][max_parts][group][2]  (m, l)
  float* ws_o;          // [item slot][max_parts][group][head_dim]
};

// One thread's view of a partial: m, l of every head (kept redundantly by every thread, computed
// identically) and o of the head dims it owns (d = threadIdx.x + 128 * r).
struct AttnState {
  float m[kAttnMaxGroup];
  float l[kAttnMaxGroup];
  float o[kAttnMaxGroup][kAttnOwned];
};

struct AttnShared {
  float q[kAttnMaxGroup * kAttnMaxHeadDim];
  float sp[kAttnSlices * kAttnMaxGroup * kAttnChunk];
  float p[kAttnMaxGroup * kAttnChunk];
  float m[kAttnMaxGroup];
  float l[kAttnMaxGroup];
};

namespace attn_detail {

__device__ __forceinline__ float NegInf() {
  return __int_as_float(static_cast<int>(0xFF800000u));
}

struct Item {
  int token, kvh, pos;
  const int32_t* blocks;
  bool valid;
};

__device__ __forceinline__ Item ItemOf(const AttnKernelParams& p, int item) {
  Item it;
  it.token = item / p.n_kv_heads;
  it.kvh = item % p.n_kv_heads;
  it.pos = p.positions[it.token];
  it.blocks = p.block_tables + static_cast<int64_t>(it.token) * p.block_table_stride;
  it.valid = it.pos >= 0 && it.pos < p.max_context;
  return it;
}

__device__ __forceinline__ int NumChunks(int pos) {
  return pos / kAttnChunk + 1;
}

// Copies the item's G query vectors to shared memory (ends with a barrier).
__device__ __forceinline__ void LoadQuery(const AttnKernelParams& p, const Item& it,
                                          AttnShared& sh) {
  const int n = p.group * p.head_dim;
  const int64_t base =
      (static_cast<int64_t>(it.token) * p.n_heads + static_cast<int64_t>(it.kvh) * p.group) *
      p.head_dim;
  for (int i = threadIdx.x; i < n; i += kAttnThreads) sh.q[i] = p.q[base + i];
  __syncthreads();
}

// The canonical chunk partial (header comment, steps 1-4). Every thread of the CTA must call it
// (it contains barriers). On return every thread holds m, l of all heads and o of its dims.
__device__ __forceinline__ void ChunkPartial(const AttnKernelParams& p, const Item& it, int chunk,
                                             AttnShared& sh, AttnState& c) {
  const int t = threadIdx.x;
  const int G = p.group;
  const int D = p.head_dim;
  const int first = chunk * kAttnChunk;
  const int block = it.blocks[first / p.block_size];
  const int offset = first % p.block_size;
  const int64_t head_block = (static_cast<int64_t>(block) * p.n_kv_heads + it.kvh) *
                             static_cast<int64_t>(D) * p.block_size;
  const float* kb = p.k_cache + head_block + offset;                            // kb[d*bs + j]
  const float* vb = p.v_cache + head_block + static_cast<int64_t>(offset) * D;  // vb[j*D + d]
  const int n_valid = min(kAttnChunk, it.pos + 1 - first);

  // The V values this thread needs in step 4, loaded first so that their latency overlaps the
  // K loads and the softmax (values only: the arithmetic below is unchanged).
  float vr[kAttnChunk][kAttnOwned];
#pragma unroll
  for (int j = 0; j < kAttnChunk; ++j) {
#pragma unroll
    for (int r = 0; r < kAttnOwned; ++r) {
      const int d = t + kAttnThreads * r;
      vr[j][r] = j < n_valid && d < D ? vb[static_cast<int64_t>(j) * D + d] : 0.0f;
    }
  }

  {  // 1. score slices
    const int j = t & (kAttnChunk - 1);
    const int slice = t / kAttnChunk;
    float acc[kAttnMaxGroup];
#pragma unroll
    for (int g = 0; g < kAttnMaxGroup; ++g) acc[g] = 0.0f;
    if (j < n_valid) {
      for (int d = slice; d < D; d += kAttnSlices) {
        const float kv = kb[static_cast<int64_t>(d) * p.block_size + j];
#pragma unroll
        for (int g = 0; g < kAttnMaxGroup; ++g) {
          if (g < G) acc[g] = __fmaf_rn(sh.q[g * D + d], kv, acc[g]);
        }
      }
    }
#pragma unroll
    for (int g = 0; g < kAttnMaxGroup; ++g) {
      if (g < G) sh.sp[(slice * kAttnMaxGroup + g) * kAttnChunk + j] = acc[g];
    }
  }
  __syncthreads();
  {  // 2-3. scores, chunk max, probabilities, chunk sum: thread t = 16 * g + j
    const int g = t / kAttnChunk;
    const int j = t & (kAttnChunk - 1);
    const bool live = g < G && j < n_valid;
    float s = NegInf();
    if (live) {
      constexpr int kS = kAttnMaxGroup * kAttnChunk;  // stride between slices
      const float* sp = sh.sp + g * kAttnChunk + j;
      const float a0 = __fadd_rn(sp[0 * kS], sp[4 * kS]);
      const float a1 = __fadd_rn(sp[1 * kS], sp[5 * kS]);
      const float a2 = __fadd_rn(sp[2 * kS], sp[6 * kS]);
      const float a3 = __fadd_rn(sp[3 * kS], sp[7 * kS]);
      s = __fmul_rn(__fadd_rn(__fadd_rn(a0, a2), __fadd_rn(a1, a3)), p.scale);
    }
    // Fixed trees over the 16 lanes of this half warp; lane 0's result is broadcast.
    float mx = s;
#pragma unroll
    for (int w = 8; w >= 1; w /= 2) mx = MaxKeep(mx, __shfl_down_sync(0xffffffffu, mx, w, 16));
    const float m = __shfl_sync(0xffffffffu, mx, 0, 16);
    const float pj = live ? DevExp(__fsub_rn(s, m)) : 0.0f;
    float sum = pj;
#pragma unroll
    for (int w = 8; w >= 1; w /= 2) sum = __fadd_rn(sum, __shfl_down_sync(0xffffffffu, sum, w, 16));
    const float l = __shfl_sync(0xffffffffu, sum, 0, 16);
    if (g < G) {
      sh.p[g * kAttnChunk + j] = pj;
      if (j == 0) {
        sh.m[g] = m;
        sh.l[g] = l;
      }
    }
  }
  __syncthreads();
  // 4. values
#pragma unroll
  for (int g = 0; g < kAttnMaxGroup; ++g) {
    c.m[g] = g < G ? sh.m[g] : 0.0f;
    c.l[g] = g < G ? sh.l[g] : 0.0f;
#pragma unroll
    for (int r = 0; r < kAttnOwned; ++r) c.o[g][r] = 0.0f;
  }
#pragma unroll
  for (int j = 0; j < kAttnChunk; ++j) {
    if (j >= n_valid) break;
#pragma unroll
    for (int r = 0; r < kAttnOwned; ++r) {
      const int d = t + kAttnThreads * r;
      if (d < D) {
#pragma unroll
        for (int g = 0; g < kAttnMaxGroup; ++g) {
          if (g < G) c.o[g][r] = __fmaf_rn(sh.p[g * kAttnChunk + j], vr[j][r], c.o[g][r]);
        }
      }
    }
  }
}

// acc <- merge(acc, c): the one left-to-right merge rule (per thread, no barriers).
__device__ __forceinline__ void MergeInto(AttnState& acc, const AttnState& c, int G) {
#pragma unroll
  for (int g = 0; g < kAttnMaxGroup; ++g) {
    if (g >= G) continue;
    const float m = acc.m[g] < c.m[g] ? c.m[g] : acc.m[g];  // std::max(acc.m, c.m)
    const float a = DevExp(__fsub_rn(acc.m[g], m));
    const float b = DevExp(__fsub_rn(c.m[g], m));
    acc.l[g] = __fadd_rn(__fmul_rn(acc.l[g], a), __fmul_rn(c.l[g], b));
#pragma unroll
    for (int r = 0; r < kAttnOwned; ++r) {
      acc.o[g][r] = __fadd_rn(__fmul_rn(acc.o[g][r], a), __fmul_rn(c.o[g][r], b));
    }
    acc.m[g] = m;
  }
}

// out[token][kvh * G + g][d] = o / l.
__device__ __forceinline__ void Finish(const AttnKernelParams& p, const Item& it,
                                       const AttnState& acc) {
#pragma unroll
  for (int g = 0; g < kAttnMaxGroup; ++g) {
    if (g >= p.group) continue;
    float* out = p.out + (static_cast<int64_t>(it.token) * p.n_heads +
                          static_cast<int64_t>(it.kvh) * p.group + g) *
                             p.head_dim;
#pragma unroll
    for (int r = 0; r < kAttnOwned; ++r) {
      const int d = threadIdx.x + kAttnThreads * r;
      if (d < p.head_dim) out[d] = __fdiv_rn(acc.o[g][r], acc.l[g]);
    }
  }
}

__device__ __forceinline__ int64_t PartIndex(const AttnKernelParams& p, int slot, int part) {
  return static_cast<int64_t>(slot) * p.max_parts + part;
}

__device__ __forceinline__ void StorePart(const AttnKernelParams& p, int slot, int part,
                                          const AttnState& c) {
  const int64_t base = PartIndex(p, slot, part) * p.group;
  if (threadIdx.x == 0) {
#pragma unroll
    for (int g = 0; g < kAttnMaxGroup; ++g) {
      if (g >= p.group) continue;
      p.ws_ml[(base + g) * 2 + 0] = c.m[g];
      p.ws_ml[(base + g) * 2 + 1] = c.l[g];
    }
  }
#pragma unroll
  for (int g = 0; g < kAttnMaxGroup; ++g) {
    if (g >= p.group) continue;
#pragma unroll
    for (int r = 0; r < kAttnOwned; ++r) {
      const int d = threadIdx.x + kAttnThreads * r;
      if (d < p.head_dim) p.ws_o[(base + g) * p.head_dim + d] = c.o[g][r];
    }
  }
}

__device__ __forceinline__ void LoadPart(const AttnKernelParams& p, int slot, int part,
                                         AttnState& c) {
  const int64_t base = PartIndex(p, slot, part) * p.group;
#pragma unroll
  for (int g = 0; g < kAttnMaxGroup; ++g) {
    const bool live = g < p.group;
    c.m[g] = live ? p.ws_ml[(base + g) * 2 + 0] : 0.0f;
    c.l[g] = live ? p.ws_ml[(base + g) * 2 + 1] : 0.0f;
#pragma unroll
    for (int r = 0; r < kAttnOwned; ++r) {
      const int d = threadIdx.x + kAttnThreads * r;
      c.o[g][r] = live && d < p.head_dim ? p.ws_o[(base + g) * p.head_dim + d] : 0.0f;
    }
  }
}

}  // namespace attn_detail

// Kernel 1: one CTA per item, all chunks in order, merged as they come.
__global__ void __launch_bounds__(kAttnThreads) AttnSingleKernel(AttnKernelParams p);
// Kernel 2: grid (items, CTAs per item); CTA y computes chunks y, y + gridDim.y, ... and stores
// each chunk's partial in slot blockIdx.x, part = chunk.
__global__ void __launch_bounds__(kAttnThreads) AttnSplitChunksKernel(AttnKernelParams p);
// Merges an item's parts 0 .. ceil(chunks / chunks_per_part) - 1 left to right and finishes.
__global__ void __launch_bounds__(kAttnThreads) AttnMergeKernel(AttnKernelParams p);
// Flash-decoding baseline: grid (items, splits); split y merges chunks
// [y * chunks_per_part, (y + 1) * chunks_per_part) in-CTA and stores one part.
__global__ void __launch_bounds__(kAttnThreads) FlashSplitKernel(AttnKernelParams p);

}  // namespace bitroll::kernels::cuda
