#include "engine/prefix_cache.h"

#include <xxhash.h>

#include <algorithm>

namespace bitroll::engine {

uint64_t PrefixCache::ChainSeed(uint64_t weights_hash, uint32_t kernel_version,
                                int32_t block_size) {
  const uint64_t parts[3] = {weights_hash, kernel_version, static_cast<uint64_t>(block_size)};
  return XXH64(parts, sizeof(parts), 0x62697472'6f6c6c00ull);  // "bitroll\0"
}

uint64_t PrefixCache::ChainHash(uint64_t parent, std::span<const int32_t> block_tokens) {
  return XXH64(block_tokens.data(), block_tokens.size_bytes(), parent);
}

bool PrefixCache::Holds(int32_t block) const {
  return by_block_.count(block) != 0;
}

int64_t PrefixCache::Evictable() const {
  int64_t n = 0;
  for (const auto& [hash, e] : entries_) n += kv_->RefCount(e.block) == 1 ? 1 : 0;
  return n;
}

std::vector<int32_t> PrefixCache::Match(std::span<const int32_t> tokens, int32_t max_tokens) {
  std::vector<int32_t> out;
  if (!opt_.enabled) return out;
  const int32_t bs = kv_->block_size();
  const int32_t limit = std::min<int32_t>(max_tokens, static_cast<int32_t>(tokens.size()));
  uint64_t h = opt_.seed;
  for (int32_t k = 0; (k + 1) * bs <= limit; ++k) {
    const std::span<const int32_t> bt = tokens.subspan(static_cast<size_t>(k) * bs, bs);
    h = ChainHash(h, bt);
    auto it = entries_.find(h);
    if (it != entries_.end()) {
      if (!std::equal(bt.begin(), bt.end(), it->second.tokens.begin())) break;  // collision
      kv_->Retain(it->second.block);
      lru_.splice(lru_.end(), lru_, it->second.lru);
      out.push_back(it->second.block);
      continue;
    }
    if (opt_.disk == nullptr) break;
    if (spill_.size() != static_cast<size_t>(kv_->block_floats()))
      spill_.resize(kv_->block_floats());
    // Allocate before reading: an eviction spills through spill_ too. Never evicts `out`: those
    // blocks hold the caller's reference.
    if (!opt_.disk->Has(h)) break;
    Result<int32_t> b = Allocate();
    if (!b.ok()) break;
    if (!opt_.disk->Get(h, bt, spill_.data())) {
      kv_->Release(*b);
      break;
    }
    kv_->ImportBlock(*b, spill_.data());
    Insert(h, bt, *b);  // the cache's own reference; the allocation's goes to the caller
    ++stats_.disk_hit_blocks;
    out.push_back(*b);
  }
  stats_.hit_blocks += static_cast<int64_t>(out.size());
  return out;
}

void PrefixCache::Insert(uint64_t hash, std::span<const int32_t> block_tokens, int32_t block) {
  if (!opt_.enabled || entries_.count(hash) != 0 || by_block_.count(block) != 0) return;
  Entry e;
  e.block = block;
  e.tokens.assign(block_tokens.begin(), block_tokens.end());
  lru_.push_back(hash);
  e.lru = std::prev(lru_.end());
  entries_.emplace(hash, std::move(e));
  by_block_[block] = hash;
  kv_->Retain(block);
  ++stats_.inserted;
}

bool PrefixCache::EvictOne() {
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    auto e = entries_.find(*it);
    const int32_t block = e->second.block;
    if (kv_->RefCount(block) != 1) continue;  // still in some sequence's block table
    if (opt_.disk != nullptr) {
      if (spill_.size() != static_cast<size_t>(kv_->block_floats()))
        spill_.resize(kv_->block_floats());
      kv_->ExportBlock(block, spill_.data());
      // A failed write only means the block is not on disk: a later lookup misses.
      if (opt_.disk->Put(e->first, e->second.tokens, spill_.data()).ok()) ++stats_.spilled;
    }
    by_block_.erase(block);
    entries_.erase(e);
    lru_.erase(it);
    kv_->Release(block);
    ++stats_.evictions;
    return true;
  }
  return false;
}

Result<int32_t> PrefixCache::Allocate() {
  while (kv_->free_blocks() == 0) {
    if (!EvictOne()) return Status::ResourceExhausted("kv cache: every block is in use");
  }
  return kv_->Allocate();
}

void PrefixCache::Clear() {
  for (const auto& [hash, e] : entries_) kv_->Release(e.block);
  entries_.clear();
  by_block_.clear();
  lru_.clear();
}

}  // namespace bitroll::engine
