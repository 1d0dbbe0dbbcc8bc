// Causal attention on the GPU over the block-paged fp32 KV cache: one canonical order, two kernels
// (kernel 1 "single": one CTA walks all chunks of an item; kernel 2 "split": the chunks of one
// item spread over several CTAs, their partials merged left to right by a merge kernel), plus a
// NON-invariant flash-decoding baseline for benchmarks and the negative control.
// Public, C++-only launchers; the kernels and the canonical order are in attention.cuh.
//
// deterministic: an item is (query token, kv head). Its output bits depend only on its query
// vectors, its position and the K/V of keys 0..position: not on the other items, the batch size,
// which kernel ran, the grid, or whether the query came in a prefill or a decode call. Kernels 1
// and 2 are bit-identical by construction (same chunk function, same merge function, same order).
// CudaFlashDecodeAttention chooses its split count from the batch and is deliberately NOT
// invariant; never use it to serve a model.
//
// KV layout: exactly engine/kv_cache.h's (and kernels/cpu/attention.h's), one pool per layer,
//   K [num_blocks][n_kv_heads][head_dim][block_size],  V
//   [num_blocks][n_kv_heads][block_size][head_dim]
// in fp32, so the engine can mirror its cache to the device unchanged (bf16 KV: a later step).
// REQUIRES: the K/V of keys 0..positions[t] are written before the call.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace bitroll::kernels::cuda {

// S, anchored at position 0; equal to kernels::kAttentionChunk.
inline constexpr int32_t kCudaAttentionChunk = 16;
inline constexpr int32_t kCudaAttentionMaxGroup = 8;  // n_heads / n_kv_heads
inline constexpr int32_t kCudaAttentionMaxHeadDim = 256;

enum class CudaAttentionKernel : uint8_t { kAuto = 0, kSingle = 1, kSplit = 2 };

struct CudaAttentionParams {
  int32_t n_tokens = 0;  // query rows (decode: one per sequence; prefill: one per position)
  int32_t n_heads = 0;   // REQUIRES n_heads % n_kv_heads == 0, n_heads / n_kv_heads <= 8
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;                   // REQUIRES 1 <= head_dim <= 256
  int32_t block_size = 0;                 // REQUIRES a multiple of 16
  const float* q = nullptr;               // device [n_tokens][n_heads][head_dim], RoPE applied
  float* out = nullptr;                   // device [n_tokens][n_heads][head_dim]
  const float* k_cache = nullptr;         // device, this layer's K pool
  const float* v_cache = nullptr;         // device, this layer's V pool
  const int32_t* positions = nullptr;     // device [n_tokens]; token t sees keys 0..positions[t]
  const int32_t* block_tables = nullptr;  // device [n_tokens][block_table_stride] block ids
  int32_t block_table_stride = 0;         // REQUIRES >= ceil(max_context / block_size)
  int32_t max_context = 0;  // REQUIRES every positions[t] < max_context (tokens outside: skipped)
  float scale = 1.0f;
};

// Host-only checks (no device needed): cudaSuccess or cudaErrorInvalidValue.
cudaError_t CheckCudaAttentionParams(const CudaAttentionParams& p);

// Which items run where. Items are numbered token * n_kv_heads + kv_head; items [0, first_split)
// run kernel 1, items [first_split, n_items) run kernel 2 with `split_ctas` CTAs each.
// kAuto: whole waves of `slots` resident CTAs run kernel 1, the tail of the last wave (or
// everything, when there is less than one wave) runs kernel 2. A scheduling choice only: it never
// changes a bit. Pure host function.
struct CudaAttentionPlan {
  int64_t first_split = 0;
  int32_t split_ctas = 1;
};
CudaAttentionPlan PlanCudaAttention(int64_t n_items, int64_t slots, int32_t max_chunks,
                                    CudaAttentionKernel kernel);

// Resident CTAs of kernel 1 on the current device (SMs x occupancy), or 0 without a device.
int64_t CudaAttentionSlots();

// Workspace for CudaAttention with this kernel choice (0 for kSingle; kAuto asks the device).
size_t CudaAttentionWorkspaceBytes(const CudaAttentionParams& p, CudaAttentionKernel kernel);

// Runs attention for every (token, head). workspace: device memory of at least
// CudaAttentionWorkspaceBytes(p, kernel) bytes (may be null when that is 0).
cudaError_t CudaAttention(const CudaAttentionParams& p, CudaAttentionKernel kernel, void* workspace,
                          size_t workspace_bytes, cudaStream_t stream);

// ---- NON-invariant baseline (flash-decoding): split count chosen from the batch ----
// splits = clamp(ceil(2 * num_sms / n_items), 1, max_chunks), each split a contiguous range of
// ceil(max_chunks / splits) chunks merged in-CTA, then the split partials merged.
int32_t CudaFlashDecodeSplits(int64_t n_items, int32_t num_sms, int32_t max_chunks);
size_t CudaFlashDecodeWorkspaceBytes(const CudaAttentionParams& p, int32_t num_sms);
cudaError_t CudaFlashDecodeAttention(const CudaAttentionParams& p, int32_t num_sms, void* workspace,
                                     size_t workspace_bytes, cudaStream_t stream);

}  // namespace bitroll::kernels::cuda
