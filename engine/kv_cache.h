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
// Device storage: a forward backend that keeps the K/V bytes elsewhere (the CUDA backend's device
// pool, indexed by the same block ids) installs a KvBlockStore with set_store(); CopyBlock,
// ExportBlock and ImportBlock then act on that store, and the host pages (lazily mapped zero
// pages) are never touched, so they cost nothing. The accounting (Allocate / Retain / Release /
// RefCount) is the same either way.
//
// Thread-safety: not thread-safe; owned by one engine. Write() calls for distinct slots may run in
// parallel.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

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

struct KvCacheOptions {
  int32_t n_layers = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_size = 16;  // a multiple of kernels::kAttentionChunk
  int64_t num_blocks = 0;   // >= 1
  // Element type: kF32, or kBF16 (half the memory and the attention traffic; K/V are rounded when
  // written, so a different numerics fingerprint). kF16 is refused.
  DType dtype = DType::kF32;
};

class KvCache {
 public:
  // Errors: kInvalidArgument for bad sizes, kResourceExhausted when the memory can't be had.
  static Result<std::unique_ptr<KvCache>> Create(const KvCacheOptions& options);
  // Bytes of one block across all layers (K and V).
  static int64_t BlockBytes(const KvCacheOptions& options);

  const KvCacheOptions& options() const { return opt_; }
  int32_t block_size() const { return opt_.block_size; }
  int64_t num_blocks() const { return opt_.num_blocks; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  int64_t bytes() const { return static_cast<int64_t>(k_.size() + v_.size()); }

  // A free block with reference count 1, or kResourceExhausted.
  Result<int32_t> Allocate();
  void Retain(int32_t block);
  // Drops one reference; at zero the block is free again.
  void Release(int32_t block);
  int32_t RefCount(int32_t block) const { return refs_[block]; }
  // True when `block` is on the free list (reference count 0).
  bool IsFree(int32_t block) const { return refs_[block] == 0; }

  // Floats of one block across all layers, K then V (the Export/Import payload; with a bf16 cache
  // the payload is the bf16 bytes, two elements per float slot).
  int64_t block_floats() const { return BlockBytes(opt_) / 4; }
  // Routes CopyBlock / ExportBlock / ImportBlock to `store` (not owned; nullptr = the host pages).
  void set_store(KvBlockStore* store) { store_ = store; }
  const KvBlockStore* store() const { return store_; }
  // Copies every layer's K and V of block `src` into block `dst` (copy-on-write).
  // REQUIRES: src != dst, both allocated.
  void CopyBlock(int32_t src, int32_t dst);
  // Gathers block `block` into `out` ([layer][K|V][kv_head * head_dim * block_size], block_floats()
  // floats) and back. Used by the disk tier; the bits round-trip exactly.
  void ExportBlock(int32_t block, float* out) const;
  void ImportBlock(int32_t block, const float* in);

  // This layer's host pools, as the CPU attention kernel wants them (unused with a store):
  // options().dtype elements (float, or uint16_t bf16 bits).
  const void* k_layer(int32_t layer) const { return k_.data() + layer * layer_stride_; }
  const void* v_layer(int32_t layer) const { return v_.data() + layer * layer_stride_; }
  // Stores one token's k and v (each n_kv_heads * head_dim floats) at `slot` of `block`, rounded
  // to bf16 (nearest even) in a bf16 cache.
  void Write(int32_t layer, int32_t block, int32_t slot, const float* k, const float* v);

 private:
  explicit KvCache(const KvCacheOptions& options) : opt_(options) {}

  // Anonymous zero pages (mmap): the kernel zeroes a page on first touch, so a large cache costs
  // nothing at startup (a restart after a crash pays only for the blocks it uses).
  class ZeroPages {
   public:
    ZeroPages() = default;
    ZeroPages(const ZeroPages&) = delete;
    ZeroPages& operator=(const ZeroPages&) = delete;
    ~ZeroPages();
    bool Map(size_t bytes);  // false when the mapping fails
    unsigned char* data() { return p_; }
    const unsigned char* data() const { return p_; }
    size_t size() const { return n_; }  // bytes

   private:
    unsigned char* p_ = nullptr;
    size_t n_ = 0;
  };

  KvCacheOptions opt_;
  int64_t layer_stride_ = 0;  // bytes per layer in each pool
  int64_t elem_ = 4;          // bytes per element
  ZeroPages k_;
  ZeroPages v_;
  std::vector<int32_t> refs_;
  std::vector<int32_t> free_;  // a stack: the most recently freed block is reused first
  KvBlockStore* store_ = nullptr;
};

}  // namespace bitroll::engine
