// KvCache: reference counts, the free list, copy-on-write copies and the export/import payload.
#include "engine/kv_cache.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kernels/cpu/math.h"

namespace bitroll::engine {
namespace {

KvCacheOptions Small() {
  KvCacheOptions o;
  o.n_layers = 2;
  o.n_kv_heads = 2;
  o.head_dim = 4;
  o.block_size = 16;
  o.num_blocks = 4;
  return o;
}

void FillBlock(KvCache* c, int32_t block, float base) {
  std::vector<float> k(8), v(8);
  for (int32_t l = 0; l < 2; ++l) {
    for (int32_t slot = 0; slot < 16; ++slot) {
      for (int i = 0; i < 8; ++i) {
        k[i] = base + l * 1000 + slot * 10 + i;
        v[i] = -k[i];
      }
      c->Write(l, block, slot, k.data(), v.data());
    }
  }
}

TEST(KvCache, RefCountsAndFreeList) {
  auto c = KvCache::Create(Small());
  ASSERT_TRUE(c.ok());
  KvCache& kv = **c;
  EXPECT_EQ(kv.free_blocks(), 4);
  auto a = kv.Allocate();
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(kv.RefCount(*a), 1);
  kv.Retain(*a);
  kv.Release(*a);
  EXPECT_FALSE(kv.IsFree(*a));
  EXPECT_EQ(kv.free_blocks(), 3);
  kv.Release(*a);
  EXPECT_TRUE(kv.IsFree(*a));
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(kv.Allocate().ok());
  auto none = kv.Allocate();
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), ErrorCode::kResourceExhausted);
}

TEST(KvCache, CopyBlockAndExportImportAreExact) {
  auto c = KvCache::Create(Small());
  ASSERT_TRUE(c.ok());
  KvCache& kv = **c;
  const int32_t a = *kv.Allocate(), b = *kv.Allocate(), d = *kv.Allocate();
  FillBlock(&kv, a, 0.5f);
  FillBlock(&kv, b, 7.25f);
  std::vector<float> pa(kv.block_floats()), pb(kv.block_floats()), pc(kv.block_floats());
  kv.ExportBlock(a, pa.data());
  kv.ExportBlock(b, pb.data());
  ASSERT_NE(0, std::memcmp(pa.data(), pb.data(), pa.size() * 4)) << "distinct contents";
  kv.CopyBlock(a, b);
  kv.ExportBlock(b, pb.data());
  EXPECT_EQ(0, std::memcmp(pa.data(), pb.data(), pa.size() * 4));
  kv.ImportBlock(d, pa.data());
  kv.ExportBlock(d, pc.data());
  EXPECT_EQ(0, std::memcmp(pa.data(), pc.data(), pa.size() * 4));
  // The copy went through the attention layout: the layer pools see the same bits.
  const int64_t per = 2 * 4 * 16;
  for (int32_t l = 0; l < 2; ++l) {
    const auto* kl = static_cast<const float*>(kv.k_layer(l));
    const auto* vl = static_cast<const float*>(kv.v_layer(l));
    EXPECT_EQ(0, std::memcmp(kl + a * per, kl + d * per, per * 4));
    EXPECT_EQ(0, std::memcmp(vl + a * per, vl + d * per, per * 4));
  }
}

// A bf16 cache: half the bytes, values rounded to nearest even when written, and the
// export/import payload (the disk tier's) carries those bf16 bits exactly.
TEST(KvCache, Bf16StoresRoundedValuesAndRoundTripsExactly) {
  KvCacheOptions o = Small();
  o.dtype = DType::kBF16;
  EXPECT_EQ(KvCache::BlockBytes(o) * 2, KvCache::BlockBytes(Small()));
  auto c = KvCache::Create(o);
  ASSERT_TRUE(c.ok());
  KvCache& kv = **c;
  const int32_t a = *kv.Allocate(), b = *kv.Allocate();
  FillBlock(&kv, a, 0.3f);  // 0.3 + ... is not a bf16 value: rounding is visible
  const auto* k16 = static_cast<const uint16_t*>(kv.k_layer(1));
  const int64_t per = 2 * 4 * 16;  // kv heads x head_dim x block_size
  // layer 1, slot 3, head 0, d 2: k = 0.3 + 1000 + 30 + 2 at [head][d][slot]
  EXPECT_EQ(k16[a * per + 2 * 16 + 3], kernels::F32ToBf16(0.3f + 1000 + 30 + 2));
  EXPECT_NE(kernels::Bf16ToF32(kernels::F32ToBf16(0.3f + 1000 + 30 + 2)), 0.3f + 1000 + 30 + 2);
  std::vector<float> pa(kv.block_floats()), pb(kv.block_floats());
  kv.ExportBlock(a, pa.data());
  kv.ImportBlock(b, pa.data());
  kv.ExportBlock(b, pb.data());
  EXPECT_EQ(0, std::memcmp(pa.data(), pb.data(), pa.size() * sizeof(float)));
  for (int32_t l = 0; l < 2; ++l) {
    const auto* kl = static_cast<const uint16_t*>(kv.k_layer(l));
    const auto* vl = static_cast<const uint16_t*>(kv.v_layer(l));
    EXPECT_EQ(0, std::memcmp(kl + a * per, kl + b * per, per * 2));
    EXPECT_EQ(0, std::memcmp(vl + a * per, vl + b * per, per * 2));
  }
  o.dtype = DType::kF16;
  EXPECT_EQ(KvCache::Create(o).status().code(), ErrorCode::kInvalidArgument);
}

// A split cache: the sliding layers' pool has its own ids, counts and free list; writes land in
// the layer's pool; CopyBlock / Export / Import act on one pool's layers; bad splits are refused.
// The head-range writes that threads split a step by (Transformer::WriteKv) store exactly what a
// whole-row write stores, fp32 and bf16; a range left out shows (the comparison can fail).
TEST(KvCache, HeadRangeWritesEqualWholeRowWrites) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    KvCacheOptions o = Small();
    o.n_kv_heads = 3;
    o.dtype = dtype;
    auto whole = KvCache::Create(o), split = KvCache::Create(o), partial = KvCache::Create(o);
    ASSERT_TRUE(whole.ok() && split.ok() && partial.ok());
    for (KvCache* c : {whole->get(), split->get(), partial->get()}) ASSERT_TRUE(c->Allocate().ok());
    std::vector<float> k(12), v(12);
    for (int32_t l = 0; l < 2; ++l) {
      for (int32_t slot = 0; slot < 16; ++slot) {
        for (int i = 0; i < 12; ++i) {
          k[i] = 0.1f * (l * 1000 + slot * 17 + i) + 1e-3f;
          v[i] = -2.0f * k[i];
        }
        (*whole)->Write(l, 0, slot, k.data(), v.data());
        (*split)->Write(l, 0, slot, k.data(), v.data(), 2, 1);  // heads out of order
        (*split)->Write(l, 0, slot, k.data(), v.data(), 0, 2);
        (*partial)->Write(l, 0, slot, k.data(), v.data(), 0, 2);  // head 2 missing
      }
    }
    const int64_t n = (*whole)->block_floats();
    std::vector<float> a(n), b(n), c(n);
    (*whole)->ExportBlock(0, a.data());
    (*split)->ExportBlock(0, b.data());
    (*partial)->ExportBlock(0, c.data());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), n * sizeof(float)), 0);
    EXPECT_NE(std::memcmp(a.data(), c.data(), n * sizeof(float)), 0);
  }
}

TEST(KvCache, SlidingPoolIsSeparate) {
  KvCacheOptions o = Small();
  o.n_layers = 3;
  o.layer_sliding = {1, 0, 1};
  o.num_sliding_blocks = 2;
  auto c = KvCache::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  KvCache& kv = **c;
  EXPECT_TRUE(kv.split());
  EXPECT_EQ(kv.pool_of(0), KvPool::kSliding);
  EXPECT_EQ(kv.pool_of(1), KvPool::kFull);
  EXPECT_EQ(KvCache::BlockBytes(o, KvPool::kFull) * 2, KvCache::BlockBytes(o, KvPool::kSliding));
  EXPECT_EQ(kv.num_blocks(KvPool::kSliding), 2);
  Result<int32_t> a = kv.Allocate(KvPool::kSliding);
  Result<int32_t> b = kv.Allocate(KvPool::kSliding);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_FALSE(kv.Allocate(KvPool::kSliding).ok());
  EXPECT_EQ(kv.free_blocks(KvPool::kFull), 4);  // the full pool is untouched
  std::vector<float> k(8, 1.5f), v(8, -2.5f);
  kv.Write(0, *a, 3, k.data(), v.data());  // sliding layer 0, sliding block a
  kv.Write(2, *a, 4, k.data(), v.data());
  kv.CopyBlock(*a, *b, KvPool::kSliding);
  std::vector<float> pa(kv.block_floats(KvPool::kSliding)), pb(pa.size());
  kv.ExportBlock(*a, pa.data(), KvPool::kSliding);
  kv.ExportBlock(*b, pb.data(), KvPool::kSliding);
  EXPECT_EQ(0, std::memcmp(pa.data(), pb.data(), pa.size() * sizeof(float)));
  EXPECT_EQ(pa[3 * 8 + 0], 0.0f);   // K is [head_dim][block]: slot 3 of d 0 ...
  EXPECT_EQ(pa[0 * 16 + 3], 1.5f);  // ... is element 3
  kv.Release(*a, KvPool::kSliding);
  EXPECT_TRUE(kv.IsFree(*a, KvPool::kSliding));
  for (std::vector<uint8_t> bad :
       {std::vector<uint8_t>{1, 1, 1}, std::vector<uint8_t>{0, 0, 0}, std::vector<uint8_t>{1, 0}}) {
    KvCacheOptions x = o;
    x.layer_sliding = bad;
    EXPECT_EQ(KvCache::Create(x).status().code(), ErrorCode::kInvalidArgument);
  }
  KvCacheOptions none = o;
  none.num_sliding_blocks = 0;
  EXPECT_EQ(KvCache::Create(none).status().code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace bitroll::engine
