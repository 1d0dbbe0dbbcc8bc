// Per-ISA entry points of the attention kernel. Internal to kernels/cpu/attention*.cc.
#pragma once

#include "kernels/cpu/attention.h"

namespace bitroll::kernels::internal {

// Each computes exactly the canonical chunk partial documented in attention.h.
void ChunkPartialScalar(const AttentionParams& p, const float* q, int32_t kvh,
                        const int32_t* blocks, int32_t position, int32_t chunk,
                        AttentionPartial* out);
void ChunkPartialAvx2(const AttentionParams& p, const float* q, int32_t kvh, const int32_t* blocks,
                      int32_t position, int32_t chunk, AttentionPartial* out);
void ChunkPartialAvx512(const AttentionParams& p, const float* q, int32_t kvh,
                        const int32_t* blocks, int32_t position, int32_t chunk,
                        AttentionPartial* out);

// Addresses of chunk `chunk`'s keys for kv head `kvh`: K rows [head_dim][block_size] starting at
// the chunk's first key, and V rows [keys][head_dim].
struct ChunkView {
  const float* k;   // k[d * block_size + j] is key j's component d
  const float* v;   // v[j * head_dim + d]
  int32_t n_valid;  // keys of this chunk at or before the query position (1..kAttentionChunk)
};

inline ChunkView ViewChunk(const AttentionParams& p, int32_t kvh, const int32_t* blocks,
                           int32_t position, int32_t chunk) {
  const int32_t first = chunk * kAttentionChunk;
  const int32_t block = blocks[first / p.block_size];
  const int32_t offset = first % p.block_size;
  const int64_t head_block = (static_cast<int64_t>(block) * p.n_kv_heads + kvh) *
                             static_cast<int64_t>(p.head_dim) * p.block_size;
  ChunkView view;
  view.k = p.k_cache + head_block + offset;
  view.v = p.v_cache + head_block + static_cast<int64_t>(offset) * p.head_dim;
  const int32_t remaining = position + 1 - first;
  view.n_valid = remaining < kAttentionChunk ? remaining : kAttentionChunk;
  return view;
}

}  // namespace bitroll::kernels::internal
