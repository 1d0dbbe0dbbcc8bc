#include "engine/prefix_cache.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdlib>

namespace bitroll::engine {

Result<SwaCache> ParseSwaCache(const std::string& text, int32_t block_size) {
  SwaCache c;
  if (text == "full") return c;
  if (text == "recompute") {
    c.policy = SwaCachePolicy::kRecompute;
    return c;
  }
  const std::string prefix = "checkpoint:";
  if (text.rfind(prefix, 0) == 0 && text.size() > prefix.size() &&
      text.size() < prefix.size() + 10) {
    const std::string num = text.substr(prefix.size());
    if (num.find_first_not_of("0123456789") == std::string::npos) {
      const long p = std::strtol(num.c_str(), nullptr, 10);
      if (p > 0 && p % block_size == 0) {
        c.policy = SwaCachePolicy::kCheckpoint;
        c.checkpoint = static_cast<int32_t>(p);
        return c;
      }
      return Status::InvalidArgument("swa cache '" + text + "': P must be a positive multiple of " +
                                     "the KV block size " + std::to_string(block_size));
    }
  }
  return Status::InvalidArgument("swa cache '" + text +
                                 "': expected full, checkpoint:P or recompute");
}

uint64_t PrefixCache::ChainSeed(uint64_t weights_hash, uint32_t kernel_version,
                                int32_t block_size) {
  const uint64_t parts[3] = {weights_hash, kernel_version, static_cast<uint64_t>(block_size)};
  return XXH64(parts, sizeof(parts), 0x62697472'6f6c6c00ull);  // "bitroll\0"
}

uint64_t PrefixCache::ChainHash(uint64_t parent, std::span<const int32_t> block_tokens) {
  return XXH64(block_tokens.data(), block_tokens.size_bytes(), parent);
}

bool PrefixCache::Holds(int32_t block, KvPool pool) const {
  return pool == KvPool::kFull ? by_block_.count(block) != 0 : by_sblock_.count(block) != 0;
}

bool PrefixCache::KeepsSliding(int32_t index) const {
  if (!kv_->split()) return false;
  switch (opt_.swa.policy) {
    case SwaCachePolicy::kFull:
      return true;
    case SwaCachePolicy::kRecompute:
      return false;
    case SwaCachePolicy::kCheckpoint: {
      // The first boundary c = m * P after the block's start is the one whose window reaches
      // furthest back into it: keep the block when that window (keys c - W + 1 .. c - 1) and the
      // kernel's chunk reads overlap it, i.e. when its end passes c - W + 1.
      const int64_t bs = kv_->block_size();
      const int64_t p = opt_.swa.checkpoint;
      const int64_t c = (index * bs / p + 1) * p;
      return (index + 1) * bs >= c - opt_.swa_window + 2;
    }
  }
  return false;
}

int64_t PrefixCache::Evictable() const {
  int64_t n = 0;
  for (const auto& [hash, e] : entries_) n += kv_->RefCount(e.block) == 1 ? 1 : 0;
  return n;
}

std::vector<int32_t> PrefixCache::Match(std::span<const int32_t> tokens, int32_t max_tokens,
                                        std::vector<int32_t>* sliding) {
  std::vector<int32_t> out;
  if (sliding != nullptr) sliding->clear();
  if (!opt_.enabled) return out;
  const bool with_sliding = sliding != nullptr && kv_->split();
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
    } else {
      if (opt_.disk == nullptr) break;
      if (spill_.size() < static_cast<size_t>(kv_->block_floats()))
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
      Insert(h, bt, *b, k);  // the cache's own reference; the allocation's goes to the caller
      ++stats_.disk_hit_blocks;
      out.push_back(*b);
      it = entries_.find(h);
    }
    if (!with_sliding) continue;
    Entry& e = it->second;
    if (e.sblock < 0 && opt_.sliding_disk != nullptr && KeepsSliding(k) &&
        opt_.sliding_disk->Has(h)) {
      const int64_t floats = kv_->block_floats(KvPool::kSliding);
      if (spill_.size() < static_cast<size_t>(floats)) spill_.resize(floats);
      // Evicts only sliding parts nobody else holds: the ones already matched are the caller's.
      Result<int32_t> sb = Allocate(KvPool::kSliding);
      if (sb.ok()) {
        if (opt_.sliding_disk->Get(h, bt, spill_.data())) {
          kv_->ImportBlock(*sb, spill_.data(), KvPool::kSliding);
          e.sblock = *sb;  // the allocation's reference is the cache's
          by_sblock_[*sb] = h;
          ++stats_.sliding_disk_hit_blocks;
        } else {
          kv_->Release(*sb, KvPool::kSliding);
        }
      }
    }
    if (e.sblock >= 0) {
      kv_->Retain(e.sblock, KvPool::kSliding);
      ++stats_.sliding_hit_blocks;
    }
    sliding->push_back(e.sblock);
  }
  stats_.hit_blocks += static_cast<int64_t>(out.size());
  return out;
}

void PrefixCache::Insert(uint64_t hash, std::span<const int32_t> block_tokens, int32_t block,
                         int32_t index, int32_t sliding) {
  if (!opt_.enabled) return;
  const bool keep_sliding = sliding >= 0 && by_sblock_.count(sliding) == 0 && KeepsSliding(index);
  auto it = entries_.find(hash);
  if (it != entries_.end()) {
    // Same hash, same tokens (a lookup compares them): the sequence's sliding block holds the
    // same bits, so an entry without one may take it.
    Entry& e = it->second;
    if (keep_sliding && e.sblock < 0 &&
        std::equal(block_tokens.begin(), block_tokens.end(), e.tokens.begin())) {
      e.sblock = sliding;
      by_sblock_[sliding] = hash;
      kv_->Retain(sliding, KvPool::kSliding);
    }
    return;
  }
  if (by_block_.count(block) != 0) return;
  Entry e;
  e.block = block;
  e.index = index;
  e.tokens.assign(block_tokens.begin(), block_tokens.end());
  lru_.push_back(hash);
  e.lru = std::prev(lru_.end());
  if (keep_sliding) {
    e.sblock = sliding;
    by_sblock_[sliding] = hash;
    kv_->Retain(sliding, KvPool::kSliding);
  }
  entries_.emplace(hash, std::move(e));
  by_block_[block] = hash;
  kv_->Retain(block);
  ++stats_.inserted;
}

void PrefixCache::DropSliding(uint64_t hash, Entry& e, bool spill) {
  if (e.sblock < 0) return;
  if (spill && opt_.sliding_disk != nullptr) {
    const int64_t floats = kv_->block_floats(KvPool::kSliding);
    if (spill_.size() < static_cast<size_t>(floats)) spill_.resize(floats);
    kv_->ExportBlock(e.sblock, spill_.data(), KvPool::kSliding);
    if (opt_.sliding_disk->Put(hash, e.tokens, spill_.data()).ok()) ++stats_.sliding_spilled;
  }
  by_sblock_.erase(e.sblock);
  kv_->Release(e.sblock, KvPool::kSliding);
  e.sblock = -1;
}

bool PrefixCache::EvictOne() {
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    auto e = entries_.find(*it);
    const int32_t block = e->second.block;
    if (kv_->RefCount(block) != 1) continue;  // still in some sequence's block table
    if (opt_.disk != nullptr) {
      if (spill_.size() < static_cast<size_t>(kv_->block_floats()))
        spill_.resize(kv_->block_floats());
      kv_->ExportBlock(block, spill_.data());
      // A failed write only means the block is not on disk: a later lookup misses.
      if (opt_.disk->Put(e->first, e->second.tokens, spill_.data()).ok()) ++stats_.spilled;
    }
    DropSliding(e->first, e->second, true);
    by_block_.erase(block);
    entries_.erase(e);
    lru_.erase(it);
    kv_->Release(block);
    ++stats_.evictions;
    return true;
  }
  return false;
}

bool PrefixCache::EvictSliding() {
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    auto e = entries_.find(*it);
    const int32_t sb = e->second.sblock;
    if (sb < 0 || kv_->RefCount(sb, KvPool::kSliding) != 1) continue;
    DropSliding(e->first, e->second, true);
    ++stats_.sliding_evictions;
    return true;
  }
  return false;
}

Result<int32_t> PrefixCache::Allocate(KvPool pool) {
  while (kv_->free_blocks(pool) == 0) {
    const bool evicted = pool == KvPool::kFull ? EvictOne() : EvictSliding();
    if (!evicted) return Status::ResourceExhausted("kv cache: every block is in use");
  }
  return kv_->Allocate(pool);
}

void PrefixCache::Clear() {
  for (const auto& [hash, e] : entries_) {
    kv_->Release(e.block);
    if (e.sblock >= 0) kv_->Release(e.sblock, KvPool::kSliding);
  }
  entries_.clear();
  by_block_.clear();
  by_sblock_.clear();
  lru_.clear();
}

}  // namespace bitroll::engine
