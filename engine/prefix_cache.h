// engine/prefix_cache.h: content-addressed reuse of full KV blocks (vLLM / SGLang style).
//
// A FULL block (block_size computed tokens) is named by a hash chain over token ids:
//   h_0 = seed,   h_{k+1} = XXH64(tokens of block k, seed = h_k)
// so a block's name covers its whole prefix. `seed` folds in the numerics fingerprint (weights
// hash, kernel version, block size): K/V computed by other weights never match. Every entry also
// keeps its tokens and a lookup compares them, so a hash collision is a miss, never wrong data.
//
// Invariance: block boundaries are multiples of the attention chunk S (block_size % S == 0), and a
// row's K/V is a pure function of its token, position and the K/V of earlier positions. A chain
// of cached blocks therefore holds exactly the bits a cold prefill of the same tokens writes, and a
// prefix hit replays them (tests/prefix_cache_test.cc proves it with memcmp).
//
// Ownership: the cache holds one KvCache reference on every block it names. A block whose only
// reference is the cache's is "unreferenced": it may be evicted (least recently used first) when
// the KV pool runs out, optionally spilling its bits to a KvDiskTier. Cached blocks are immutable:
// whoever shares one and must write into it copies it first (copy-on-write, see scheduler.h).
//
// Thread-safety: not thread-safe; owned by one engine, beside its KvCache.
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/kv_cache.h"
#include "engine/kv_disk_tier.h"
#include "schema/status.h"

namespace bitroll::engine {

struct PrefixCacheOptions {
  bool enabled = true;         // false: Match() never hits and Insert() keeps nothing
  uint64_t seed = 0;           // h_0; fold the numerics fingerprint in (see ChainSeed)
  KvDiskTier* disk = nullptr;  // not owned; nullptr = no disk tier
};

struct PrefixCacheStats {
  int64_t hit_blocks = 0;       // blocks returned by Match() (memory or disk)
  int64_t disk_hit_blocks = 0;  // of those, loaded from the disk tier
  int64_t inserted = 0;         // blocks named by Insert()
  int64_t evictions = 0;        // unreferenced blocks freed to make room
  int64_t spilled = 0;          // evicted blocks written to the disk tier
};

class PrefixCache {
 public:
  // `kv` must outlive the cache.
  PrefixCache(KvCache* kv, const PrefixCacheOptions& options) : kv_(kv), opt_(options) {}
  ~PrefixCache() { Clear(); }
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // h_0 for a model: mixes the weights hash, the kernel version and the block size.
  static uint64_t ChainSeed(uint64_t weights_hash, uint32_t kernel_version, int32_t block_size);
  // h_{k+1} from h_k and block k's tokens.
  static uint64_t ChainHash(uint64_t parent, std::span<const int32_t> block_tokens);

  // The longest chain of cached full blocks that are prefixes of tokens[0, max_tokens): the
  // returned ids are the blocks for positions [0, n * block_size). Each returned block carries one
  // new reference owned by the caller. Blocks found only on disk are loaded into fresh blocks
  // (evicting others if needed) and named in memory again.
  std::vector<int32_t> Match(std::span<const int32_t> tokens, int32_t max_tokens);

  // Names `block`, which holds the computed K/V of `block_tokens` whose chain hash is `hash`.
  // The cache takes one reference. No-op when disabled, when `hash` is already named (the caller
  // keeps its private copy) or when `block` is already named.
  void Insert(uint64_t hash, std::span<const int32_t> block_tokens, int32_t block);

  // A block for the caller (reference count 1): a free one, else the least recently used
  // unreferenced cached block is evicted (spilled to disk when there is a tier) and reused.
  // kResourceExhausted when every block is referenced.
  Result<int32_t> Allocate();

  // Drops every entry (weights changed). Blocks still in use by sequences stay theirs.
  void Clear();

  // Clear(), then name blocks under a new h_0 (new weights).
  void Reset(uint64_t seed) {
    Clear();
    opt_.seed = seed;
  }
  uint64_t seed() const { return opt_.seed; }
  bool enabled() const { return opt_.enabled; }
  // True when the cache holds a reference on `block`.
  bool Holds(int32_t block) const;
  int64_t size() const { return static_cast<int64_t>(entries_.size()); }
  // Cached blocks nobody else references (what Allocate() may reclaim).
  int64_t Evictable() const;
  const PrefixCacheStats& stats() const { return stats_; }

 private:
  struct Entry {
    int32_t block = -1;
    std::vector<int32_t> tokens;
    std::list<uint64_t>::iterator lru;  // position in lru_
  };
  bool EvictOne();

  KvCache* kv_;
  PrefixCacheOptions opt_;
  std::unordered_map<uint64_t, Entry> entries_;     // chain hash -> entry
  std::unordered_map<int32_t, uint64_t> by_block_;  // block id -> chain hash
  std::list<uint64_t> lru_;                         // front = least recently used
  std::vector<float> spill_;                        // one block's payload (disk tier I/O)
  PrefixCacheStats stats_;
};

}  // namespace bitroll::engine
