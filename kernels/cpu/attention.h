// Causal attention over a block-paged KV cache: one canonical order, two kernels.
//
// The canonical order (docs/design.md, "Attention: one canonical order, two kernels"):
//   The keys 0..t of query t are cut into chunks of kAttentionChunk keys anchored at position 0.
//   Each chunk c yields a partial (m_c, l_c, o_c):
//     s_j  = (sum_d q[d] * K[j][d]) * scale   one fma chain over d = 0..head_dim-1, then one
//     multiply m_c  = max_j s_j                        exact (max does not round) p_j  = Exp(s_j -
//     m_c)                   the project's own exp (kernels/cpu/math.h) l_c  = lane-tree sum of p_j
//     lane j holds p_j (0 beyond the causal edge), then
//                                             for w in 8,4,2,1: lane[i] = lane[i] + lane[i+w]
//     o_c[d] = fma chain over j in order      acc = fmaf(p_j, V[j][d], acc), acc starting at 0
//   Partials are merged strictly left to right (MergePartial): the running state starts as chunk
//   0's partial and absorbs chunk 1, 2, ... The output is o[d] / l.
//
// Kernels:
//   kSingle: one worker walks all chunks of a (token, head) item and merges as it goes.
//   kSplit:  the chunks of one item are cut into runs spread over several workers. The first
//            run is walked and merged as kSingle walks it, which leaves its running state; the
//            later runs write their chunks' partials, and one worker merges them into that
//            state in the same left-to-right order.
// Both call the same per-chunk function and the same merge, so their results are bit-identical by
// construction. kAuto picks per item by load: items in the tail of the last wave (fewer items than
// workers) are split; the rest run single-worker. Which kernel runs never changes a bit.
//
// Speed without changing the order: the per-chunk code computes up to 8 chunk partials at once
// (consecutive chunks of one query, or one chunk of up to 8 consecutive queries of a sequence:
// prefill rows share their K/V loads), interleaving the independent fma chains of different
// partials; each partial's own operations and their order are those above. A single-worker task is
// such a group of queries of one head, or (decode rows, each alone in its sequence) the query heads
// of one row that read one kv head (grouped-query attention: each chunk of K/V is brought in once
// for all of them, and split as one unit when there are more workers than such units), or (one
// query head per kv head, with at least as many such rows as workers) a group of up to 8 heads of
// one row, whose chunks of one block are adjacent in the pool, or a sibling group: decode rows of
// different sequences whose first chunks read the same blocks (GRPO samples of one prompt share its
// blocks), which walk the chunks together so that a shared block is read once for all of them, not
// once per row, where that saves at least a twelfth of the rows' chunk reads (one head of up to 8
// rows; with AVX-512 the query heads of one kv head of up to 64 / heads-per-kv-head rows, whose
// shared chunks run in the prefill tile below, one (row, head) per lane, and whose own chunks then
// continue from each lane's running state); a split task is a run of consecutive chunks of one
// item, or of each head of such a kv unit.
// Prefill tile (AVX-512, fp32 or bf16 K/V, full attention or a sliding window, with or without
// sinks): up to 16 consecutive rows of one sequence and head run with one query per register
// lane, so the 16 scores of one key, the max and sum trees, the exponentials, the value chains
// and the merge are all vertical operations, lane by lane the canonical ones (with a window each
// lane masks the keys before its lo and starts at its own first chunk); up to 4 tiles of
// consecutive rows walk the chunks in lockstep from their rows' earliest first chunk, sharing
// each chunk's K/V loads, and keep o in registers across a few chunks (attention_tile_avx512.cc).
// How items and chunks are grouped into tasks is a scheduling choice and never changes a bit.
//
// ISA: the scalar, AVX2 and AVX-512 versions of the per-chunk code perform the same operations in
// the same order, so every ISA gives the same bits.
//
// KV cache layout, one pool per layer (block_size keys per block, a multiple of kAttentionChunk):
//   K pool [num_blocks][n_kv_heads][head_dim][block_size]   keys of a block are contiguous per d
//   V pool [num_blocks][n_kv_heads][block_size][head_dim]
// Element type (kv_dtype): fp32, or bf16 (uint16_t bits). A bf16 K/V element is widened exactly to
// fp32 when it is read, and the canonical order above runs on the widened values unchanged. So a
// bf16 cache gives the bits of an fp32 cache holding the same (rounded) values; it is a different
// numerics fingerprint from an fp32 cache only because the values were rounded when written.
// REQUIRES: the K/V of every key 0..position[t] were written before Attention() is called
// (new K/V are written to the cache before attention reads them).
//
// Sliding window and sinks (docs/design.md, "Sliding windows and attention sinks"):
//   window W > 0: query t attends to keys lo..t, lo = max(0, t - W + 1). The chunks stay anchored
//   at position 0; chunks wholly before lo are skipped, and inside the chunk holding lo the keys
//   j < lo are masked exactly like the keys beyond the causal edge (s_j = -inf, p_j = 0, no fma
//   into o). The mask depends only on the key's and the query's absolute positions, never on the
//   call. A chunk with masked leading keys runs the scalar chunk code on every ISA (which has the
//   bits of every ISA's code); a chunk without them runs the ISA's code as before.
//   sinks: per query head, a learned logit that joins the softmax denominator with no value. The
//   merge starts from the partial (m = sink, l = 1, o = 0) and absorbs the first chunk in the
//   window, then the next ones, left to right, in every kernel.
//   Without window and sinks, nothing changes: the full-attention bits are those of version 1.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/thread_pool.h"
#include "schema/vocab.h"

namespace bitroll::kernels {

// S: the attention chunk, part of the numerics fingerprint. Changing it changes bits.
inline constexpr int32_t kAttentionChunk = 16;
// Bumped whenever any kernel's canonical order changes; part of the numerics fingerprint.
inline constexpr uint32_t kKernelVersion = 1;

enum class AttentionKernel : uint8_t { kAuto = 0, kSingle = 1, kSplit = 2 };
const char* AttentionKernelName(AttentionKernel k);

struct AttentionParams {
  int32_t n_tokens = 0;                // query rows in this call
  int32_t n_heads = 0;                 // query heads
  int32_t n_kv_heads = 0;              // REQUIRES n_heads % n_kv_heads == 0 (GQA)
  int32_t head_dim = 0;                // REQUIRES 1 <= head_dim <= 256
  int32_t block_size = 0;              // REQUIRES block_size % kAttentionChunk == 0
  const float* q = nullptr;            // [n_tokens][n_heads][head_dim], RoPE applied
  float* out = nullptr;                // [n_tokens][n_heads][head_dim]
  const void* k_cache = nullptr;       // this layer's K pool (layout above), kv_dtype elements
  const void* v_cache = nullptr;       // this layer's V pool
  DType kv_dtype = DType::kF32;        // REQUIRES kF32 or kBF16
  const int32_t* positions = nullptr;  // [n_tokens]; query t attends to keys 0..positions[t]
  const int32_t* const* block_tables = nullptr;  // [n_tokens] -> block ids of the token's sequence
  float scale = 1.0f;                            // usually 1/sqrt(head_dim)
  int32_t window = 0;            // sliding window W (keys t-W+1..t); 0 = full attention
  const float* sinks = nullptr;  // [n_heads] sink logits (scaled-score units); nullptr = none
  // TEST ONLY (BITROLL_TEST_BREAK_INVARIANCE=window_chunk): [n_tokens] positions that replace
  // positions[t] in the window's lower edge, so the mask depends on the call. nullptr in
  // production.
  const int32_t* test_window_anchor = nullptr;
  // TEST ONLY (BITROLL_TEST_BREAK_INVARIANCE=sibling_tile): sibling groups walk their shared
  // chunks with the tile's o update fused (one fma instead of two multiplies and an add), so a
  // GRPO sample's bits depend on whether its siblings share its step. false in production.
  bool test_fused_sibling_tile = false;
};

// One chunk's partial for one (token, head): running max, sum of exponentials, value accumulator.
struct AttentionPartial {
  float m;
  float l;
  float o[256];
};

// Reusable scratch: the split kernel's partials and the work lists of a call (kept so that a call
// allocates nothing once the scratch has grown). Not thread-safe; one per engine.
class AttentionScratch {
 public:
  std::vector<AttentionPartial> partials;
  std::vector<int64_t> split_items;
  std::vector<int64_t> chunk_base;
  std::vector<uint8_t> is_split;
  std::vector<int32_t> split_heads;   // per split item: the heads its tasks compute (0: none)
  std::vector<int32_t> split_groups;  // the split items whose tasks compute split_heads > 0 heads
  std::vector<AttentionPartial> split_states;  // per split item: its first run's running state
  std::vector<int32_t> tasks;
  // The call's sibling groups (decode rows of different sequences that share the K/V blocks of
  // their first chunks, e.g. the samples of one GRPO prompt): group g is rows[begin[g] ..
  // begin[g + 1]), which share their first shared[g] chunks; no rows when the call had none.
  struct SiblingGroups {
    std::vector<int32_t> rows;
    std::vector<int32_t> begin;
    std::vector<int32_t> shared;
    std::vector<int32_t> work, pending;  // planning scratch
  };
  SiblingGroups siblings;
  std::vector<int32_t> alone_rows;
  std::vector<uint8_t> in_sibling_group;  // [n_tokens]
};

// Runs attention for every (token, head). `pool` may be nullptr (one worker).
void Attention(Isa isa, const AttentionParams& p, AttentionKernel kernel, ThreadPool* pool,
               AttentionScratch* scratch);

// The readable reference: one worker, scalar, chunk by chunk. Same bits as Attention().
void AttentionReference(const AttentionParams& p);

// ---- building blocks shared by every kernel and ISA (exposed for tests) ----

// Computes the partial of chunk `chunk` for query vector q (head_dim floats) against kv head `kvh`
// of a sequence with block table `blocks`, for a query at `position`.
// REQUIRES chunk * kAttentionChunk <= position.
void ChunkPartial(Isa isa, const AttentionParams& p, const float* q, int32_t kvh,
                  const int32_t* blocks, int32_t position, int32_t chunk, AttentionPartial* out);

// acc <- merge(acc, c), the one left-to-right merge rule.
void MergePartial(Isa isa, int32_t head_dim, AttentionPartial* acc, const AttentionPartial& c);

// out[d] = acc.o[d] / acc.l
void FinishPartial(Isa isa, int32_t head_dim, const AttentionPartial& acc, float* out);

}  // namespace bitroll::kernels
