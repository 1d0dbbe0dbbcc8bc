// Attention kernels 1 and 2, the merge, the flash-decoding baseline, and their launchers.
#include <algorithm>
#include <array>
#include <atomic>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/attention.h"

namespace bitroll::kernels::cuda {

using attn_detail::ChunkPartial;
using attn_detail::Finish;
using attn_detail::Item;
using attn_detail::ItemOf;
using attn_detail::LoadPart;
using attn_detail::LoadQuery;
using attn_detail::MergeInto;
using attn_detail::NumChunks;
using attn_detail::StorePart;

__global__ void __launch_bounds__(kAttnThreads) AttnSingleKernel(AttnKernelParams p) {
  __shared__ AttnShared sh;
  const Item it = ItemOf(p, p.item_begin + static_cast<int>(blockIdx.x));
  if (!it.valid) return;  // uniform over the CTA
  LoadQuery(p, it, sh);
  AttnState acc;
  AttnState c;
  ChunkPartial(p, it, 0, sh, acc);
  const int n = NumChunks(it.pos);
  for (int chunk = 1; chunk < n; ++chunk) {
    ChunkPartial(p, it, chunk, sh, c);
    MergeInto(acc, c, p.group);
  }
  Finish(p, it, acc);
}

__global__ void __launch_bounds__(kAttnThreads) AttnSplitChunksKernel(AttnKernelParams p) {
  __shared__ AttnShared sh;
  const int slot = static_cast<int>(blockIdx.x);
  const Item it = ItemOf(p, p.item_begin + slot);
  if (!it.valid) return;
  const int n = NumChunks(it.pos);
  if (static_cast<int>(blockIdx.y) >= n) return;
  LoadQuery(p, it, sh);
  AttnState c;
  for (int chunk = blockIdx.y; chunk < n; chunk += gridDim.y) {
    ChunkPartial(p, it, chunk, sh, c);
    StorePart(p, slot, chunk, c);
  }
}

__global__ void __launch_bounds__(kAttnThreads) AttnMergeKernel(AttnKernelParams p) {
  const int slot = static_cast<int>(blockIdx.x);
  const Item it = ItemOf(p, p.item_begin + slot);
  if (!it.valid) return;
  const int parts = (NumChunks(it.pos) + p.chunks_per_part - 1) / p.chunks_per_part;
  AttnState acc;
  AttnState c;
  LoadPart(p, slot, 0, acc);
  for (int part = 1; part < parts; ++part) {
    LoadPart(p, slot, part, c);
    MergeInto(acc, c, p.group);
  }
  Finish(p, it, acc);
}

__global__ void __launch_bounds__(kAttnThreads) FlashSplitKernel(AttnKernelParams p) {
  __shared__ AttnShared sh;
  const int slot = static_cast<int>(blockIdx.x);
  const Item it = ItemOf(p, p.item_begin + slot);
  if (!it.valid) return;
  const int n = NumChunks(it.pos);
  const int begin = static_cast<int>(blockIdx.y) * p.chunks_per_part;
  if (begin >= n) return;
  const int end = min(n, begin + p.chunks_per_part);
  LoadQuery(p, it, sh);
  AttnState acc;
  AttnState c;
  ChunkPartial(p, it, begin, sh, acc);
  for (int chunk = begin + 1; chunk < end; ++chunk) {
    ChunkPartial(p, it, chunk, sh, c);
    MergeInto(acc, c, p.group);
  }
  StorePart(p, slot, static_cast<int>(blockIdx.y), acc);
}

namespace {

constexpr int64_t kMaxGridX = 2147483647;
constexpr int64_t kMaxGridY = 65535;

int32_t MaxChunks(const CudaAttentionParams& p) {
  return (p.max_context + kCudaAttentionChunk - 1) / kCudaAttentionChunk;
}

int64_t NumItems(const CudaAttentionParams& p) {
  return static_cast<int64_t>(p.n_tokens) * p.n_kv_heads;
}

size_t PartBytes(const CudaAttentionParams& p) {
  const int64_t g = p.n_heads / p.n_kv_heads;
  return static_cast<size_t>(g) * static_cast<size_t>(p.head_dim + 2) * sizeof(float);
}

AttnKernelParams KernelParams(const CudaAttentionParams& p) {
  AttnKernelParams k;
  k.q = p.q;
  k.out = p.out;
  k.k_cache = p.k_cache;
  k.v_cache = p.v_cache;
  k.positions = p.positions;
  k.block_tables = p.block_tables;
  k.n_heads = p.n_heads;
  k.n_kv_heads = p.n_kv_heads;
  k.head_dim = p.head_dim;
  k.block_size = p.block_size;
  k.group = p.n_heads / p.n_kv_heads;
  k.block_table_stride = p.block_table_stride;
  k.max_context = p.max_context;
  k.scale = p.scale;
  k.item_begin = 0;
  k.max_parts = MaxChunks(p);
  k.chunks_per_part = 1;
  k.ws_ml = nullptr;
  k.ws_o = nullptr;
  return k;
}

// Lays out `slots` items x max_parts partials in the workspace: all (m, l) first, then all o.
void AssignWorkspace(AttnKernelParams& k, void* workspace, int64_t slots) {
  float* base = static_cast<float*>(workspace);
  k.ws_ml = base;
  k.ws_o = base + slots * k.max_parts * k.group * 2;
}

size_t WorkspaceFor(const CudaAttentionParams& p, int64_t slots, int64_t parts) {
  return static_cast<size_t>(slots) * static_cast<size_t>(parts) * PartBytes(p);
}

}  // namespace

cudaError_t CheckCudaAttentionParams(const CudaAttentionParams& p) {
  if (p.n_tokens < 0 || p.n_heads < 1 || p.n_kv_heads < 1) return cudaErrorInvalidValue;
  if (p.n_heads % p.n_kv_heads != 0) return cudaErrorInvalidValue;
  if (p.n_heads / p.n_kv_heads > kCudaAttentionMaxGroup) return cudaErrorInvalidValue;
  if (p.head_dim < 1 || p.head_dim > kCudaAttentionMaxHeadDim) return cudaErrorInvalidValue;
  if (p.block_size < kCudaAttentionChunk || p.block_size % kCudaAttentionChunk != 0) {
    return cudaErrorInvalidValue;
  }
  if (p.max_context < 1) return cudaErrorInvalidValue;
  const int64_t blocks_needed =
      (static_cast<int64_t>(p.max_context) + p.block_size - 1) / p.block_size;
  if (p.block_table_stride < blocks_needed) return cudaErrorInvalidValue;
  if (NumItems(p) > kMaxGridX) return cudaErrorInvalidValue;
  if (p.n_tokens == 0) return cudaSuccess;
  if (p.q == nullptr || p.out == nullptr || p.k_cache == nullptr || p.v_cache == nullptr ||
      p.positions == nullptr || p.block_tables == nullptr) {
    return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

CudaAttentionPlan PlanCudaAttention(int64_t n_items, int64_t slots, int32_t max_chunks,
                                    CudaAttentionKernel kernel) {
  CudaAttentionPlan plan;
  plan.first_split = n_items;
  if (kernel == CudaAttentionKernel::kSplit) {
    plan.first_split = 0;
  } else if (kernel == CudaAttentionKernel::kAuto && slots > 0) {
    const int64_t tail = n_items % slots;  // n_items < slots: everything is "tail"
    plan.first_split = n_items - tail;
  }
  const int64_t n_split = n_items - plan.first_split;
  if (n_split > 0) {
    const int64_t fill = std::max<int64_t>(slots, 1) * 2;
    int64_t ctas = (fill + n_split - 1) / n_split;
    ctas = std::min<int64_t>(ctas, std::max<int32_t>(max_chunks, 1));
    ctas = std::min<int64_t>(ctas, kMaxGridY);
    plan.split_ctas = static_cast<int32_t>(std::max<int64_t>(ctas, 1));
  }
  return plan;
}

int64_t CudaAttentionSlots() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  // A property of the device and the kernel: queried once per device (the occupancy query costs
  // host time on every attention call otherwise).
  static std::array<std::atomic<int64_t>, 64> cache{};
  const bool cached = device >= 0 && device < 64;
  if (cached) {
    const int64_t known = cache[device].load(std::memory_order_relaxed);
    if (known > 0) return known;
  }
  int sms = 0;
  int per_sm = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, AttnSingleKernel, kAttnThreads, 0) !=
          cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  const int64_t slots = static_cast<int64_t>(sms) * std::max(per_sm, 1);
  if (cached) cache[device].store(slots, std::memory_order_relaxed);
  return slots;
}

size_t CudaAttentionWorkspaceBytes(const CudaAttentionParams& p, CudaAttentionKernel kernel) {
  if (CheckCudaAttentionParams(p) != cudaSuccess) return 0;
  const int64_t n_items = NumItems(p);
  int64_t split_items = 0;
  if (kernel == CudaAttentionKernel::kSplit) {
    split_items = n_items;
  } else if (kernel == CudaAttentionKernel::kAuto) {
    const int64_t slots = CudaAttentionSlots();
    split_items = PlanCudaAttention(n_items, slots, MaxChunks(p), kernel).first_split;
    split_items = n_items - split_items;
  }
  return WorkspaceFor(p, split_items, MaxChunks(p));
}

cudaError_t CudaAttention(const CudaAttentionParams& p, CudaAttentionKernel kernel, void* workspace,
                          size_t workspace_bytes, cudaStream_t stream) {
  cudaError_t err = CheckCudaAttentionParams(p);
  if (err != cudaSuccess) return err;
  const int64_t n_items = NumItems(p);
  if (n_items == 0) return cudaSuccess;
  // kSplit also needs the slot count: it sizes how many CTAs share one item's chunks.
  const int64_t slots = kernel == CudaAttentionKernel::kSingle ? 0 : CudaAttentionSlots();
  const CudaAttentionPlan plan = PlanCudaAttention(n_items, slots, MaxChunks(p), kernel);
  AttnKernelParams k = KernelParams(p);
  if (plan.first_split > 0) {
    AttnSingleKernel<<<static_cast<unsigned>(plan.first_split), kAttnThreads, 0, stream>>>(k);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  const int64_t n_split = n_items - plan.first_split;
  if (n_split == 0) return cudaSuccess;
  if (workspace == nullptr || workspace_bytes < WorkspaceFor(p, n_split, k.max_parts)) {
    return cudaErrorInvalidValue;
  }
  AssignWorkspace(k, workspace, n_split);
  k.item_begin = static_cast<int>(plan.first_split);
  const dim3 grid(static_cast<unsigned>(n_split), static_cast<unsigned>(plan.split_ctas));
  AttnSplitChunksKernel<<<grid, kAttnThreads, 0, stream>>>(k);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  AttnMergeKernel<<<static_cast<unsigned>(n_split), kAttnThreads, 0, stream>>>(k);
  return cudaGetLastError();
}

int32_t CudaFlashDecodeSplits(int64_t n_items, int32_t num_sms, int32_t max_chunks) {
  if (n_items < 1) return 1;
  int64_t splits = (2 * static_cast<int64_t>(std::max(num_sms, 1)) + n_items - 1) / n_items;
  splits = std::clamp<int64_t>(splits, 1, std::max(max_chunks, 1));
  const int64_t per = (max_chunks + splits - 1) / splits;
  return static_cast<int32_t>((max_chunks + per - 1) / per);  // splits actually used
}

size_t CudaFlashDecodeWorkspaceBytes(const CudaAttentionParams& p, int32_t num_sms) {
  if (CheckCudaAttentionParams(p) != cudaSuccess) return 0;
  const int64_t n_items = NumItems(p);
  return WorkspaceFor(p, n_items, CudaFlashDecodeSplits(n_items, num_sms, MaxChunks(p)));
}

cudaError_t CudaFlashDecodeAttention(const CudaAttentionParams& p, int32_t num_sms, void* workspace,
                                     size_t workspace_bytes, cudaStream_t stream) {
  cudaError_t err = CheckCudaAttentionParams(p);
  if (err != cudaSuccess) return err;
  const int64_t n_items = NumItems(p);
  if (n_items == 0) return cudaSuccess;
  const int32_t max_chunks = MaxChunks(p);
  const int32_t splits = CudaFlashDecodeSplits(n_items, num_sms, max_chunks);
  if (workspace == nullptr || workspace_bytes < WorkspaceFor(p, n_items, splits)) {
    return cudaErrorInvalidValue;
  }
  AttnKernelParams k = KernelParams(p);
  k.max_parts = splits;
  k.chunks_per_part = (max_chunks + splits - 1) / splits;
  AssignWorkspace(k, workspace, n_items);
  const dim3 grid(static_cast<unsigned>(n_items), static_cast<unsigned>(splits));
  FlashSplitKernel<<<grid, kAttnThreads, 0, stream>>>(k);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  AttnMergeKernel<<<static_cast<unsigned>(n_items), kAttnThreads, 0, stream>>>(k);
  return cudaGetLastError();
}

}  // namespace bitroll::kernels::cuda
