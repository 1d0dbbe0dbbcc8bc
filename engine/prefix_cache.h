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
// Sliding-window layers (a KvCache with a sliding pool, KvCache::split()): an entry names the
// full-pool block of its chain link and, as the SWA policy decides, the sliding-pool block of the
// same positions (docs/design.md "SWA prefix-cache policies"):
//   kFull        every entry keeps its sliding block;
//   kCheckpoint  only the blocks a window ending at a multiple of P reads (a query at position
//                c = m * P, m >= 1, reads keys c - W + 1 .. c - 1 of the past, W the widest
//                window);
//   kRecompute   none.
// The sliding part of an entry may be evicted alone (the sliding pool ran out) and spills to its
// own disk tier (`sliding_disk`, keyed by the same chain hash). Match() hands back the sliding
// blocks it has beside the full ones, -1 where it has none; the scheduler decides where the
// sliding state resumes.
//
// Thread-safety: not thread-safe; owned by one engine, beside its KvCache.
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/kv_cache.h"
#include "engine/kv_disk_tier.h"
#include "schema/status.h"

namespace bitroll::engine {

// The SWA prefix-cache policy (EngineOptions::swa_cache).
enum class SwaCachePolicy { kFull, kCheckpoint, kRecompute };
struct SwaCache {
  SwaCachePolicy policy = SwaCachePolicy::kFull;
  int32_t checkpoint = 0;  // kCheckpoint: P tokens, a positive multiple of the block size
};
// Parses "full" | "checkpoint:P" | "recompute". kInvalidArgument otherwise, or when P is not a
// positive multiple of `block_size`.
Result<SwaCache> ParseSwaCache(const std::string& text, int32_t block_size);

struct PrefixCacheOptions {
  bool enabled = true;         // false: Match() never hits and Insert() keeps nothing
  uint64_t seed = 0;           // h_0; fold the numerics fingerprint in (see ChainSeed)
  KvDiskTier* disk = nullptr;  // not owned; nullptr = no disk tier
  // With a split KvCache: the policy, the widest sliding window, and the sliding blocks' disk tier
  // (not owned; nullptr = none; payload KvCache::block_floats(KvPool::kSliding)).
  SwaCache swa;
  int32_t swa_window = 0;
  KvDiskTier* sliding_disk = nullptr;
};

struct PrefixCacheStats {
  int64_t hit_blocks = 0;               // blocks returned by Match() (memory or disk)
  int64_t disk_hit_blocks = 0;          // of those, loaded from the disk tier
  int64_t inserted = 0;                 // blocks named by Insert()
  int64_t evictions = 0;                // unreferenced blocks freed to make room
  int64_t spilled = 0;                  // evicted blocks written to the disk tier
  int64_t sliding_hit_blocks = 0;       // sliding blocks returned beside hit blocks
  int64_t sliding_disk_hit_blocks = 0;  // of those, loaded from the sliding disk tier
  int64_t sliding_evictions = 0;        // sliding parts freed to make room
  int64_t sliding_spilled = 0;          // of those, written to the sliding disk tier
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
  // With a split cache and `sliding` set: (*sliding)[k] is the sliding block of the same positions
  // (one new reference for the caller) or -1.
  std::vector<int32_t> Match(std::span<const int32_t> tokens, int32_t max_tokens,
                             std::vector<int32_t>* sliding = nullptr);

  // Names `block`, which holds the computed K/V of `block_tokens` whose chain hash is `hash`.
  // The cache takes one reference. No-op when disabled, when `hash` is already named (the caller
  // keeps its private copy) or when `block` is already named. With a split cache, `index` is the
  // block's place in the chain and `sliding` the sliding block of the same positions (-1: none;
  // it must hold exact K/V): kept when the policy keeps that index, also for an entry that exists
  // without one.
  void Insert(uint64_t hash, std::span<const int32_t> block_tokens, int32_t block,
              int32_t index = 0, int32_t sliding = -1);
  // True when the policy keeps the sliding block of chain index `index`.
  bool KeepsSliding(int32_t index) const;

  // A block of `pool` for the caller (reference count 1): a free one, else the least recently
  // used unreferenced cached block (or sliding part) is evicted (spilled to disk when there is a
  // tier) and reused. kResourceExhausted when every block is referenced.
  Result<int32_t> Allocate(KvPool pool = KvPool::kFull);

  // Drops every entry (weights changed). Blocks still in use by sequences stay theirs.
  void Clear();

  // Clear(), then name blocks under a new h_0 (new weights).
  void Reset(uint64_t seed) {
    Clear();
    opt_.seed = seed;
  }
  uint64_t seed() const { return opt_.seed; }
  bool enabled() const { return opt_.enabled; }
  // True when the cache holds a reference on `block` of `pool`.
  bool Holds(int32_t block, KvPool pool = KvPool::kFull) const;
  // Sliding blocks the cache holds.
  int64_t sliding_size() const { return static_cast<int64_t>(by_sblock_.size()); }
  int64_t size() const { return static_cast<int64_t>(entries_.size()); }
  // Cached blocks nobody else references (what Allocate() may reclaim).
  int64_t Evictable() const;
  const PrefixCacheStats& stats() const { return stats_; }

 private:
  struct Entry {
    int32_t block = -1;
    int32_t sblock = -1;  // sliding pool; -1 = not kept
    int32_t index = 0;    // place in the chain
    std::vector<int32_t> tokens;
    std::list<uint64_t>::iterator lru;  // position in lru_
  };
  bool EvictOne();
  bool EvictSliding();
  // Spills the entry's sliding part (when there is a sliding tier) and drops it.
  void DropSliding(uint64_t hash, Entry& e, bool spill);

  KvCache* kv_;
  PrefixCacheOptions opt_;
  std::unordered_map<uint64_t, Entry> entries_;      // chain hash -> entry
  std::unordered_map<int32_t, uint64_t> by_block_;   // block id -> chain hash
  std::unordered_map<int32_t, uint64_t> by_sblock_;  // sliding block id -> chain hash
  std::list<uint64_t> lru_;                          // front = least recently used
  std::vector<float> spill_;                         // one block's payload (disk tier I/O)
  PrefixCacheStats stats_;
};

}  // namespace bitroll::engine
