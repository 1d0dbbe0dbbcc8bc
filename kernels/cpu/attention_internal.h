// Per-ISA entry points of the attention kernel. Internal to kernels/cpu/attention*.cc.
#pragma once

#include "kernels/cpu/attention.h"

namespace bitroll::kernels::internal {

// One chunk partial to compute: chunk `chunk` of query `q` (head_dim floats) against kv head `kvh`
// of the sequence with block table `blocks`, for a query at `position`.
// REQUIRES chunk * kAttentionChunk <= position.
struct ChunkJob {
  const float* q;
  const int32_t* blocks;
  int32_t kvh;
  int32_t position;
  int32_t chunk;
  int32_t lo = 0;  // first key in the window (0 = none masked below)
  // A later chunk of the same query and kv head whose K/V the kernel may prefetch while it
  // computes this one (-1: none). A hint only: it never changes what is computed.
  int32_t prefetch_chunk = -1;
};

// The most jobs one ChunkPartials* call takes.
inline constexpr int32_t kMaxChunkJobs = 8;

// Each computes exactly the canonical chunk partial documented in attention.h.
void ChunkPartialScalar(const AttentionParams& p, const float* q, int32_t kvh,
                        const int32_t* blocks, int32_t position, int32_t chunk,
                        AttentionPartial* out);
// The same with the keys j < lo masked (sliding window); lo <= position. The one windowed chunk
// code, shared by every ISA. With lo <= the chunk's first key it is ChunkPartialScalar.
void ChunkPartialWindowScalar(const AttentionParams& p, const float* q, int32_t kvh,
                              const int32_t* blocks, int32_t position, int32_t lo, int32_t chunk,
                              AttentionPartial* out);
void ChunkPartialAvx2(const AttentionParams& p, const float* q, int32_t kvh, const int32_t* blocks,
                      int32_t position, int32_t chunk, AttentionPartial* out);
void ChunkPartialAvx512(const AttentionParams& p, const float* q, int32_t kvh,
                        const int32_t* blocks, int32_t position, int32_t chunk,
                        AttentionPartial* out);

// out[i] <- the canonical partial of jobs[i], for i < n (1 <= n <= kMaxChunkJobs). The jobs are
// independent (any queries, heads, chunks, sequences); computing them together only interleaves
// their independent fma chains, so out[i] is bit-identical to ChunkPartial* of jobs[i] alone.
void ChunkPartialsAvx2(const AttentionParams& p, const ChunkJob* jobs, int32_t n,
                       AttentionPartial* out);
void ChunkPartialsAvx512(const AttentionParams& p, const ChunkJob* jobs, int32_t n,
                         AttentionPartial* out);

// MergePartial compiled for the ISA: the same scalar operations for m, l and the two Exp() calls
// (inlined hardware fma instead of a libm fmaf call: fma is correctly rounded either way), and the
// same element-wise multiplies and add on o, 8 or 16 lanes at a time.
void MergePartialAvx2(int32_t head_dim, AttentionPartial* acc, const AttentionPartial& c);
void MergePartialAvx512(int32_t head_dim, AttentionPartial* acc, const AttentionPartial& c);

// *acc[i] <- merge(*acc[i], c[i]) for i < n (1 <= n <= 16, AVX2: <= 8), REQUIRES distinct acc[i]:
// n independent merges, each with MergePartial's operations in its order; their scalar m, l and
// Exp() steps run as the lanes of one register (Exp16 / Exp8 are Exp lane by lane), so each result
// has the bits of MergePartial alone.
void MergePartialsAvx2(int32_t head_dim, int32_t n, AttentionPartial* const* acc,
                       const AttentionPartial* c);
void MergePartialsAvx512(int32_t head_dim, int32_t n, AttentionPartial* const* acc,
                         const AttentionPartial* c);

// The first key of token t's window: max(0, anchor - W + 1), anchor = positions[t] (or
// test_window_anchor[t]); 0 for full attention. Its chunk, lo / kAttentionChunk, is the token's
// first chunk.
inline int32_t WindowLo(const AttentionParams& p, int32_t token) {
  if (p.window <= 0) return 0;
  const int32_t anchor =
      p.test_window_anchor != nullptr ? p.test_window_anchor[token] : p.positions[token];
  return anchor - p.window + 1 > 0 ? anchor - p.window + 1 : 0;
}

// The prefill tile (AVX-512, fp32 or bf16 K/V, full attention or a sliding window, with or
// without sinks): the items (tokens first .. first + n - 1, head `head`), consecutive rows of one
// sequence (one block table), one query per lane of every register; writes their outputs. Each
// row gets the bits of the single-worker walk (the canonical order of attention.h, lane by lane;
// attention_tile_avx512.cc). 1 <= n <= kTileRows: the rows run as tiles of kTileQueries that walk
// the chunks in lockstep from the earliest first chunk of their windows, so each chunk's K/V is
// brought in once for all of them.
inline constexpr int32_t kTileQueries = 16;
inline constexpr int32_t kTileRows = 64;
void AttentionTileAvx512(const AttentionParams& p, int32_t first, int32_t n, int32_t head);
// TEST ONLY: the tile with one operation of its o update changed on purpose (o * a + o_c * b as
// one fma instead of two multiplies and an add): a negative control for the memcmp tests.
void AttentionTileAvx512FusedForTest(const AttentionParams& p, int32_t first, int32_t n,
                                     int32_t head);

// Sibling groups (full attention): of the decode rows `alone` (each alone in its sequence within
// the call), those whose tables start with the same block ids, cut into groups of at most
// max_rows rows. Rows that share more blocks among themselves than with the rest (the samples of
// one prompt under a system prompt common to several prompts) group on their own; a set of rows
// groups only where the chunks it shares save at least a twelfth of its rows' chunk reads.
// out->shared[g]: the leading chunks group g's rows share (the tile walks those). Scheduling
// only: no row's bits depend on it.
void PlanSiblingGroups(const AttentionParams& p, const std::vector<int32_t>& alone,
                       int32_t max_rows, AttentionScratch::SiblingGroups* out);

// One query of the tile: row `row` (a token of the call), query head `head`.
struct TileLane {
  int32_t row;
  int32_t head;
};

// The tile over shared chunks (AVX-512, full attention, with or without sinks): the queries
// lanes[0 .. n) (1 <= n <= kTileRows), all of one kv head (e.g. the query heads of one kv head of
// GRPO siblings decoding after one prompt), whose chunks 0 .. chunks - 1 are the same K/V (the
// same block ids in every lane's table) and hold only keys at or before every lane's position
// (chunks * kAttentionChunk <= positions[row] + 1). Walks those chunks, one query per lane, and
// leaves in states[i] lane i's running state (m, l, o[0 .. head_dim)) after them: the bits the
// single-worker walk has after merging chunk chunks - 1, so merging the query's later chunks into
// it (MergePartial, left to right) gives its canonical output. fused_for_test: the tile's fused
// o update (the negative control above).
void AttentionTileStatesAvx512(const AttentionParams& p, const TileLane* lanes, int32_t n,
                               int32_t chunks, AttentionPartial* states,
                               bool fused_for_test = false);

// Addresses of chunk `chunk`'s keys for kv head `kvh`: K rows [head_dim][block_size] starting at
// the chunk's first key, and V rows [keys][head_dim]. T: the pool's element type (float, or
// uint16_t holding bf16 bits).
template <typename T>
struct ChunkView {
  const T* k;       // k[d * block_size + j] is key j's component d
  const T* v;       // v[j * head_dim + d]
  int32_t n_valid;  // keys of this chunk at or before the query position (1..kAttentionChunk)
};

template <typename T>
inline ChunkView<T> ViewChunk(const AttentionParams& p, int32_t kvh, const int32_t* blocks,
                              int32_t position, int32_t chunk) {
  const int32_t first = chunk * kAttentionChunk;
  const int32_t block = blocks[first / p.block_size];
  const int32_t offset = first % p.block_size;
  const int64_t head_block = (static_cast<int64_t>(block) * p.n_kv_heads + kvh) *
                             static_cast<int64_t>(p.head_dim) * p.block_size;
  ChunkView<T> view;
  view.k = static_cast<const T*>(p.k_cache) + head_block + offset;
  view.v =
      static_cast<const T*>(p.v_cache) + head_block + static_cast<int64_t>(offset) * p.head_dim;
  const int32_t remaining = position + 1 - first;
  view.n_valid = remaining < kAttentionChunk ? remaining : kAttentionChunk;
  return view;
}

}  // namespace bitroll::kernels::internal
