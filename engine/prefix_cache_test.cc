// PrefixCache: hash-chain lookups, reference ownership, LRU eviction of unreferenced blocks only,
// collision safety and the disk tier round trip.
#include "engine/prefix_cache.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <vector>

namespace bitroll::engine {
namespace {

std::unique_ptr<KvCache> Pool(int64_t blocks) {
  KvCacheOptions o;
  o.n_layers = 1;
  o.n_kv_heads = 1;
  o.head_dim = 2;
  o.block_size = 16;
  o.num_blocks = blocks;
  return std::move(KvCache::Create(o)).value();
}

std::vector<int32_t> Tokens(int n, int salt) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(3 + (i * 7 + salt) % 500);
  return t;
}

// Names the full blocks of `t` with freshly allocated blocks; returns them (caller holds refs).
std::vector<int32_t> Fill(PrefixCache* pc, KvCache* kv, const std::vector<int32_t>& t) {
  std::vector<int32_t> blocks;
  uint64_t h = pc->seed();
  for (size_t k = 0; (k + 1) * 16 <= t.size(); ++k) {
    const std::span<const int32_t> bt(t.data() + k * 16, 16);
    h = PrefixCache::ChainHash(h, bt);
    const int32_t b = *pc->Allocate();
    const float kv_val[2] = {float(k), float(h & 0xff)};
    for (int s = 0; s < 16; ++s) kv->Write(0, b, s, kv_val, kv_val);
    pc->Insert(h, bt, b);
    blocks.push_back(b);
  }
  return blocks;
}

TEST(PrefixCache, LongestChainHitAndReferenceOwnership) {
  auto kv = Pool(16);
  PrefixCacheOptions o;
  o.seed = 99;
  PrefixCache pc(kv.get(), o);
  const std::vector<int32_t> t = Tokens(50, 1);  // 3 full blocks
  const std::vector<int32_t> mine = Fill(&pc, kv.get(), t);
  ASSERT_EQ(mine.size(), 3u);
  EXPECT_EQ(kv->RefCount(mine[0]), 2);  // the filler and the cache
  // A prompt sharing 2 blocks and diverging in the third.
  std::vector<int32_t> u = t;
  u[40] += 1;
  std::vector<int32_t> hit = pc.Match(u, static_cast<int32_t>(u.size()));
  ASSERT_EQ(hit.size(), 2u);
  EXPECT_EQ(hit[0], mine[0]);
  EXPECT_EQ(hit[1], mine[1]);
  EXPECT_EQ(kv->RefCount(mine[0]), 3);
  // max_tokens limits the hit to whole blocks inside it.
  EXPECT_EQ(pc.Match(t, 47).size(), 2u);
  EXPECT_EQ(pc.Match(t, 48).size(), 3u);
  // A different first block breaks the chain even if later blocks are equal.
  std::vector<int32_t> w = t;
  w[0] += 1;
  EXPECT_TRUE(pc.Match(w, 50).empty());
  EXPECT_EQ(pc.stats().hit_blocks, 7);
}

TEST(PrefixCache, EvictsOnlyUnreferencedBlocksLeastRecentlyUsedFirst) {
  auto kv = Pool(4);
  PrefixCache pc(kv.get(), PrefixCacheOptions{});
  const std::vector<int32_t> a = Tokens(16, 1), b = Tokens(16, 2);
  std::vector<int32_t> ba = Fill(&pc, kv.get(), a), bb = Fill(&pc, kv.get(), b);
  kv->Release(ba[0]);  // only the cache holds a's block now
  // b is still referenced: allocating everything evicts a only.
  std::vector<int32_t> got;
  for (int i = 0; i < 3; ++i) {
    auto x = pc.Allocate();
    ASSERT_TRUE(x.ok()) << i;
    got.push_back(*x);
  }
  EXPECT_EQ(pc.stats().evictions, 1);
  EXPECT_TRUE(pc.Match(a, 16).empty());
  auto full = pc.Allocate();
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.status().code(), ErrorCode::kResourceExhausted);
  // Release b's filler reference: b is evictable now.
  kv->Release(bb[0]);
  EXPECT_EQ(pc.Evictable(), 1);
  EXPECT_TRUE(pc.Allocate().ok());
  EXPECT_EQ(pc.size(), 0);
}

TEST(PrefixCache, HashCollisionIsAMiss) {
  auto kv = Pool(4);
  PrefixCache pc(kv.get(), PrefixCacheOptions{});
  const std::vector<int32_t> a = Tokens(16, 1);
  const int32_t b = *pc.Allocate();
  const uint64_t h = PrefixCache::ChainHash(pc.seed(), a);
  std::vector<int32_t> other = Tokens(16, 5);
  pc.Insert(h, other, b);  // forged: the name of `a`, the tokens of `other`
  EXPECT_TRUE(pc.Match(a, 16).empty());
}

TEST(PrefixCache, DisabledNeverHitsAndClearFreesEverything) {
  auto kv = Pool(4);
  PrefixCacheOptions off;
  off.enabled = false;
  PrefixCache pc(kv.get(), off);
  const std::vector<int32_t> a = Tokens(32, 1);
  std::vector<int32_t> blocks = Fill(&pc, kv.get(), a);
  EXPECT_TRUE(pc.Match(a, 32).empty());
  EXPECT_EQ(pc.size(), 0);
  for (int32_t x : blocks) kv->Release(x);
  EXPECT_EQ(kv->free_blocks(), 4);

  PrefixCache on(kv.get(), PrefixCacheOptions{});
  blocks = Fill(&on, kv.get(), a);
  for (int32_t x : blocks) kv->Release(x);
  EXPECT_EQ(kv->free_blocks(), 2);
  on.Clear();
  EXPECT_EQ(kv->free_blocks(), 4);
}

TEST(PrefixCache, EvictedBlocksComeBackFromDiskBitExact) {
  const std::string dir =
      (std::filesystem::path(::testing::TempDir()) / "bitroll_prefix_cache_disk").string();
  std::filesystem::remove_all(dir);
  auto kv = Pool(3);
  KvDiskTierOptions dopt;
  dopt.dir = dir;
  auto disk = KvDiskTier::Open(dopt, 16, kv->block_floats());
  ASSERT_TRUE(disk.ok()) << disk.status().ToString();
  PrefixCacheOptions o;
  o.disk = disk->get();
  PrefixCache pc(kv.get(), o);
  const std::vector<int32_t> a = Tokens(32, 1);
  std::vector<int32_t> blocks = Fill(&pc, kv.get(), a);
  std::vector<float> before(kv->block_floats() * 2);
  kv->ExportBlock(blocks[0], before.data());
  kv->ExportBlock(blocks[1], before.data() + kv->block_floats());
  for (int32_t x : blocks) kv->Release(x);
  // Take every block: both cached blocks are evicted to disk.
  std::vector<int32_t> held;
  for (int i = 0; i < 3; ++i) held.push_back(*pc.Allocate());
  EXPECT_EQ(pc.stats().spilled, 2);
  EXPECT_EQ(pc.size(), 0);
  for (int32_t x : held) kv->Release(x);
  std::vector<int32_t> hit = pc.Match(a, 32);
  ASSERT_EQ(hit.size(), 2u);
  EXPECT_EQ(pc.stats().disk_hit_blocks, 2);
  std::vector<float> after(before.size());
  kv->ExportBlock(hit[0], after.data());
  kv->ExportBlock(hit[1], after.data() + kv->block_floats());
  EXPECT_EQ(0, std::memcmp(before.data(), after.data(), before.size() * 4));
  EXPECT_EQ(kv->RefCount(hit[0]), 2);  // the caller and the cache
}

TEST(PrefixCache, DiskLoadThatMustEvictStillImportsTheRightBits) {
  const std::string dir =
      (std::filesystem::path(::testing::TempDir()) / "bitroll_prefix_cache_disk2").string();
  std::filesystem::remove_all(dir);
  auto kv = Pool(3);
  KvDiskTierOptions dopt;
  dopt.dir = dir;
  auto disk = KvDiskTier::Open(dopt, 16, kv->block_floats());
  ASSERT_TRUE(disk.ok());
  PrefixCacheOptions o;
  o.disk = disk->get();
  PrefixCache pc(kv.get(), o);
  const std::vector<int32_t> a = Tokens(16, 1), b = Tokens(16, 2);
  std::vector<int32_t> ba = Fill(&pc, kv.get(), a);
  std::vector<float> before(kv->block_floats()), after(kv->block_floats());
  kv->ExportBlock(ba[0], before.data());
  kv->Release(ba[0]);
  std::vector<int32_t> held;
  for (int i = 0; i < 3; ++i) held.push_back(*pc.Allocate());  // spills a
  for (int32_t x : held) kv->Release(x);
  std::vector<int32_t> bb = Fill(&pc, kv.get(), b);  // b: cached, unreferenced below
  kv->Release(bb[0]);
  const int32_t h1 = *pc.Allocate(), h2 = *pc.Allocate();  // no free block is left
  std::vector<int32_t> hit = pc.Match(a, 16);              // loading a evicts (and spills) b first
  ASSERT_EQ(hit.size(), 1u);
  kv->ExportBlock(hit[0], after.data());
  EXPECT_EQ(0, std::memcmp(before.data(), after.data(), before.size() * 4));
  EXPECT_EQ(pc.stats().spilled, 2);
  kv->Release(h1);
  kv->Release(h2);
}

}  // namespace
}  // namespace bitroll::engine
