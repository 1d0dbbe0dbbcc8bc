// engine/kv_cache.h: the block-paged KV cache.
//
// Memory is a pool of fixed-size blocks of `block_size` token slots per layer, in the layout the
// attention kernel reads (kernels/cpu/attention.h):
//   K [layer][block][kv_head][head_dim][block_size]   V
//   [layer][block][kv_head][block_size][head_dim]
// A sequence owns a block table (block ids in position order). Blocks are reference counted so
// that sequences can share the blocks of a common prefix; a block returns to the free list when its
// last reference is released.
//
// Element type (KvCacheOptions::dtype): fp32, or bf16 (uint16_t bits, rounded to nearest even by
// Write(): half the bytes, a different numerics fingerprint; attention widens them exactly).
//
// Invariance: where a token's K/V lives (which block id) never changes a bit; attention reads keys
// through the block table in position order.
//
// Sharing: a block with RefCount() > 1 is shared (a prefix-cache entry, GRPO siblings, a prompt
// prefix); nobody may Write() into it. Writers first copy it (CopyBlock into a fresh block:
// copy-on-write, done by the scheduler before the step runs).
//
// Pools per layer kind (KvCacheOptions::layer_sliding): a hybrid model's sliding-window layers
// may live in a second pool (KvPool::kSliding) with its own block ids, reference counts and free
// list, so that a sequence can hold only the sliding blocks its windows still read while it keeps
// every full-attention block (docs/design.md "KV memory per layer kind"). Every block operation
// takes the pool (default kFull); the layer-indexed ones (k_layer, v_layer, Write) map a model
// layer to its pool by themselves, and the caller passes a block id of that pool. Without
// layer_sliding there is one pool holding every layer: the layout, the ids and the bytes are the
// single-pool cache's.
//
// Device storage: a forward backend that keeps the K/V bytes elsewhere (the CUDA backend's device
// pool, indexed by the same block ids) installs a KvBlockStore with set_store(); CopyBlock,
// ExportBlock and ImportBlock then act on that store, and the host pages (lazily mapped zero
// pages) are never touched, so they cost nothing. The accounting (Allocate / Retain / Release /
// RefCount) is the same either way.
//
// Thread-safety: not thread-safe; owned by one engine. Write() calls for distinct slots or distinct
// head ranges may run in parallel (split by head range to keep threads off each other's lines).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/cpu/zero_pages.h"
#include "schema/status.h"
#include "schema/vocab.h"

namespace bitroll::engine {

// Block operations of a backend that stores the K/V bytes itself (engine/forward_backend.h).
// Payload layout of Export/Import: KvCache::ExportBlock's. Errors are the store's to keep and
// report (the CUDA store reports them from the next forward pass).
class KvBlockStore {
 public:
  virtual ~KvBlockStore() = default;
  virtual void CopyBlock(int32_t src, int32_t dst) = 0;
  virtual void ExportBlock(int32_t block, float* out) const = 0;
  virtual void ImportBlock(int32_t block, const float* in) = 0;
};

enum class KvPool : uint8_t { kFull = 0, kSliding = 1 };

struct KvCacheOptions {
  int32_t n_layers = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_size = 16;  // a multiple of kernels::kAttentionChunk
  int64_t num_blocks = 0;   // >= 1
  // Element type: kF32, or kBF16 (half the memory and the attention traffic; K/V are rounded when
  // written, so a different numerics fingerprint). kF16 is refused.
  DType dtype = DType::kF32;
  // Empty: one pool for every layer. Else n_layers entries, non-zero for a layer whose K/V live in
  // the sliding pool (num_sliding_blocks blocks); at least one layer must stay in the full pool.
  std::vector<uint8_t> layer_sliding;
  int64_t num_sliding_blocks = 0;
};

class KvCache {
 public:
  // Errors: kInvalidArgument for bad sizes, kResourceExhausted when the memory can't be had.
  static Result<std::unique_ptr<KvCache>> Create(const KvCacheOptions& options);
  // Bytes of one block of `pool` across its layers (K and V); kFull without layer_sliding: every
  // layer.
  static int64_t BlockBytes(const KvCacheOptions& options, KvPool pool = KvPool::kFull);

  const KvCacheOptions& options() const { return opt_; }
  int32_t block_size() const { return opt_.block_size; }
  // True when the sliding layers have their own pool.
  bool split() const { return pools_[1].n_layers > 0; }
  KvPool pool_of(int32_t layer) const { return layer_pool_[layer]; }
  int64_t num_blocks(KvPool pool = KvPool::kFull) const { return P(pool).num_blocks; }
  int64_t free_blocks(KvPool pool = KvPool::kFull) const {
    return static_cast<int64_t>(P(pool).free.size());
  }
  int64_t bytes() const;

  // A free block with reference count 1, or kResourceExhausted.
  Result<int32_t> Allocate(KvPool pool = KvPool::kFull);
  void Retain(int32_t block, KvPool pool = KvPool::kFull);
  // Drops one reference; at zero the block is free again.
  void Release(int32_t block, KvPool pool = KvPool::kFull);
  int32_t RefCount(int32_t block, KvPool pool = KvPool::kFull) const { return P(pool).refs[block]; }
  // True when `block` is on the free list (reference count 0).
  bool IsFree(int32_t block, KvPool pool = KvPool::kFull) const { return P(pool).refs[block] == 0; }

  // Floats of one block of `pool` across its layers, K then V (the Export/Import payload; with a
  // bf16 cache the payload is the bf16 bytes, two elements per float slot).
  int64_t block_floats(KvPool pool = KvPool::kFull) const { return BlockBytes(opt_, pool) / 4; }
  // Routes CopyBlock / ExportBlock / ImportBlock to `store` (not owned; nullptr = the host pages).
  void set_store(KvBlockStore* store) { store_ = store; }
  const KvBlockStore* store() const { return store_; }
  // Copies every layer's K and V (of the pool's layers) of block `src` into block `dst`
  // (copy-on-write). REQUIRES: src != dst, both allocated.
  void CopyBlock(int32_t src, int32_t dst, KvPool pool = KvPool::kFull);
  // Gathers block `block` into `out` ([layer][K|V][kv_head * head_dim * block_size], over the
  // pool's layers, block_floats(pool) floats) and back. Used by the disk tier; the bits round-trip
  // exactly. The sliding pool is always host memory (a store serves kFull only).
  void ExportBlock(int32_t block, float* out, KvPool pool = KvPool::kFull) const;
  void ImportBlock(int32_t block, const float* in, KvPool pool = KvPool::kFull);

  // This layer's host pages (in its pool), as the CPU attention kernel wants them (unused with a
  // store): options().dtype elements (float, or uint16_t bf16 bits).
  const void* k_layer(int32_t layer) const;
  const void* v_layer(int32_t layer) const;
  // Stores one token's k and v (each n_kv_heads * head_dim floats) at `slot` of `block` (a block
  // of the layer's pool), rounded to bf16 (nearest even) in a bf16 cache. The head range form
  // stores only kv heads [head0, head0 + heads) of them: calls for disjoint head ranges touch
  // disjoint cache lines, so threads can split a step's writes by head without sharing a line
  // (a block keeps each head's K as [head_dim][block_size], so the tokens of one block share
  // every K line of a head). REQUIRES: 0 <= head0, heads >= 0, head0 + heads <= n_kv_heads.
  void Write(int32_t layer, int32_t block, int32_t slot, const float* k, const float* v) {
    Write(layer, block, slot, k, v, 0, opt_.n_kv_heads);
  }
  void Write(int32_t layer, int32_t block, int32_t slot, const float* k, const float* v,
             int32_t head0, int32_t heads);

 private:
  explicit KvCache(const KvCacheOptions& options) : opt_(options) {}

  struct Pool {
    int32_t n_layers = 0;
    int64_t num_blocks = 0;
    int64_t layer_stride = 0;  // bytes per layer in k and v
    // Anonymous zero pages: the kernel zeroes a page on first touch, so a large cache costs nothing
    // at startup (a restart after a crash pays only for the blocks it uses). 4 KiB pages: a huge
    // page's first touch costs milliseconds here and prefill would pay it (zero_pages.h).
    kernels::ZeroPages k;
    kernels::ZeroPages v;
    std::vector<int32_t> refs;
    std::vector<int32_t> free;  // a stack: the most recently freed block is reused first
  };
  const Pool& P(KvPool p) const { return pools_[static_cast<int>(p)]; }
  Pool& P(KvPool p) { return pools_[static_cast<int>(p)]; }

  KvCacheOptions opt_;
  int64_t elem_ = 4;  // bytes per element
  Pool pools_[2];
  std::vector<KvPool> layer_pool_;    // [n_layers]
  std::vector<int32_t> layer_index_;  // [n_layers]: the layer's index inside its pool
  KvBlockStore* store_ = nullptr;
};

}  // namespace bitroll::engine
