// engine/kv_disk_tier.h: a disk tier for prefix-cache blocks evicted from KV memory.
//
// When the prefix cache evicts an unreferenced full block, it may Put() the block's K/V here. A
// later prefix lookup that misses in memory asks Get() for the next block of its hash chain and, on
// a verified hit, imports the bits into a fresh KV block. The bits are exactly the ones evicted, so
// a disk hit replays what a cold prefill would have produced.
//
// One file per block under `dir`, named <chain hash as 16 hex digits>.kvb:
//   offset 0   char[8]  magic "BRKVBLK1"
//          8   uint32   format version (1)
//         12   uint32   n_tokens (the block size)
//         16   uint64   chain hash
//         24   uint64   payload bytes
//         32   int32    tokens[n_tokens]
//          .   float    payload (KvCache::ExportBlock layout)
//          .   uint64   XXH64 (seed 0) of every byte before it
// All integers little-endian (host order; x86-64 only). Files are written to a temporary name and
// renamed, so a crash leaves either the old state or a complete file. Get() checks the size, magic,
// version, hash, tokens and checksum; any mismatch is a miss (the file is deleted and counted in
// stats().corrupt), never wrong data.
//
// Size cap: when the files exceed max_bytes, the least recently used ones are deleted.
//
// Thread-safety: not thread-safe; owned by one engine.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>

#include "schema/status.h"

namespace bitroll::engine {

struct KvDiskTierOptions {
  std::string dir;                // created if missing; files from an earlier run are reused
  int64_t max_bytes = 1ll << 30;  // cap on the files' total size; LRU files are deleted above it
};

struct KvDiskTierStats {
  int64_t puts = 0;       // blocks written
  int64_t hits = 0;       // verified blocks returned by Get()
  int64_t misses = 0;     // Get() found no file
  int64_t corrupt = 0;    // files that failed verification (deleted; counted as misses too)
  int64_t evictions = 0;  // files deleted by the size cap
  int64_t bytes = 0;      // current total file size
  int64_t files = 0;
};

class KvDiskTier {
 public:
  // `payload_floats` is KvCache::block_floats(); `block_size` the tokens per block.
  // Errors: kInvalidArgument (empty dir, bad sizes), kIoError (dir cannot be created or listed).
  static Result<std::unique_ptr<KvDiskTier>> Open(const KvDiskTierOptions& options,
                                                  int32_t block_size, int64_t payload_floats);

  // Stores one block. A block already on disk under `hash` is kept (same hash, same tokens: same
  // bits). Errors: kIoError (the block is then simply not on disk; callers may ignore it).
  // REQUIRES: tokens.size() == block_size; payload holds payload_floats floats.
  Status Put(uint64_t hash, std::span<const int32_t> tokens, const float* payload);

  // Fills `payload` and returns true when a verified block for (hash, tokens) is on disk.
  bool Get(uint64_t hash, std::span<const int32_t> tokens, float* payload);

  // True when a file for `hash` is indexed (its contents are verified only by Get()).
  bool Has(uint64_t hash) const { return index_.count(hash) != 0; }

  // The path of the file that would hold `hash` (tests corrupt it).
  std::string PathFor(uint64_t hash) const;
  int64_t file_bytes() const { return file_bytes_; }
  const KvDiskTierStats& stats() const { return stats_; }

 private:
  KvDiskTier() = default;
  void Touch(uint64_t hash);
  void Forget(uint64_t hash, bool unlink);
  void EnforceCap();

  KvDiskTierOptions opt_;
  int32_t block_size_ = 0;
  int64_t payload_floats_ = 0;
  int64_t file_bytes_ = 0;   // size of one file
  std::list<uint64_t> lru_;  // front = least recently used
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> index_;
  KvDiskTierStats stats_;
};

}  // namespace bitroll::engine
