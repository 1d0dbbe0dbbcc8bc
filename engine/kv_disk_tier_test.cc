// KvDiskTier: round trip, every single-byte corruption is a miss (never wrong data), the size cap
// and reopening a directory.
#include "engine/kv_disk_tier.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

namespace bitroll::engine {
namespace {

namespace fs = std::filesystem;

std::string Dir(const char* name) {
  const fs::path d = fs::path(::testing::TempDir()) / name;
  fs::remove_all(d);
  return d.string();
}

constexpr int64_t kFloats = 40;

std::vector<int32_t> Tokens(int salt) {
  std::vector<int32_t> t(16);
  for (int i = 0; i < 16; ++i) t[i] = i * 3 + salt;
  return t;
}

std::vector<float> Payload(int salt) {
  std::vector<float> p(kFloats);
  for (int i = 0; i < kFloats; ++i) p[i] = 0.125f * i - salt;
  return p;
}

TEST(KvDiskTier, RoundTripIsBitExact) {
  KvDiskTierOptions o;
  o.dir = Dir("bitroll_disk_roundtrip");
  auto t = KvDiskTier::Open(o, 16, kFloats);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_TRUE((*t)->Put(7, Tokens(1), Payload(1).data()).ok());
  std::vector<float> got(kFloats, -1.0f);
  ASSERT_TRUE((*t)->Get(7, Tokens(1), got.data()));
  EXPECT_EQ(0, std::memcmp(got.data(), Payload(1).data(), kFloats * 4));
  EXPECT_FALSE((*t)->Get(8, Tokens(1), got.data()));  // unknown hash
  EXPECT_EQ((*t)->stats().hits, 1);
  EXPECT_EQ((*t)->stats().misses, 1);
}

TEST(KvDiskTier, EveryCorruptedByteIsAMissNeverWrongData) {
  KvDiskTierOptions o;
  o.dir = Dir("bitroll_disk_corrupt");
  auto t = KvDiskTier::Open(o, 16, kFloats);
  ASSERT_TRUE(t.ok());
  const std::string path = (*t)->PathFor(5);
  int64_t checked = 0;
  for (int64_t at = 0; at < (*t)->file_bytes(); at += 7) {
    ASSERT_TRUE((*t)->Put(5, Tokens(2), Payload(2).data()).ok());
    {
      std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(at);
      char c;
      f.read(&c, 1);
      c ^= 0x20;
      f.seekp(at);
      f.write(&c, 1);
    }
    std::vector<float> got(kFloats, 0.0f);
    EXPECT_FALSE((*t)->Get(5, Tokens(2), got.data())) << "byte " << at;
    EXPECT_FALSE(fs::exists(path)) << "a corrupted file is deleted";
    ++checked;
  }
  EXPECT_EQ((*t)->stats().corrupt, checked);
  EXPECT_EQ((*t)->stats().hits, 0);
  // Truncation and the wrong tokens (a collision) are misses too.
  ASSERT_TRUE((*t)->Put(5, Tokens(2), Payload(2).data()).ok());
  fs::resize_file(path, (*t)->file_bytes() - 1);
  std::vector<float> got(kFloats);
  EXPECT_FALSE((*t)->Get(5, Tokens(2), got.data()));
  ASSERT_TRUE((*t)->Put(5, Tokens(2), Payload(2).data()).ok());
  EXPECT_FALSE((*t)->Get(5, Tokens(3), got.data()));
}

TEST(KvDiskTier, SizeCapDropsLeastRecentlyUsedAndReopenKeepsFiles) {
  KvDiskTierOptions o;
  o.dir = Dir("bitroll_disk_cap");
  int64_t file_bytes;
  {
    auto probe = KvDiskTier::Open(o, 16, kFloats);
    ASSERT_TRUE(probe.ok());
    file_bytes = (*probe)->file_bytes();
  }
  o.max_bytes = 3 * file_bytes;
  auto t = KvDiskTier::Open(o, 16, kFloats);
  ASSERT_TRUE(t.ok());
  std::vector<float> got(kFloats);
  for (int i = 1; i <= 3; ++i) ASSERT_TRUE((*t)->Put(i, Tokens(i), Payload(i).data()).ok());
  ASSERT_TRUE((*t)->Get(1, Tokens(1), got.data()));  // 1 is now the most recently used
  ASSERT_TRUE((*t)->Put(4, Tokens(4), Payload(4).data()).ok());
  EXPECT_EQ((*t)->stats().evictions, 1);
  EXPECT_EQ((*t)->stats().bytes, 3 * file_bytes);
  EXPECT_FALSE((*t)->Get(2, Tokens(2), got.data())) << "2 was the least recently used";
  t->reset();
  auto again = KvDiskTier::Open(o, 16, kFloats);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->stats().files, 3);
  ASSERT_TRUE((*again)->Get(4, Tokens(4), got.data()));
  EXPECT_EQ(0, std::memcmp(got.data(), Payload(4).data(), kFloats * 4));
}

TEST(KvDiskTier, BadOptionsAreTypedErrors) {
  KvDiskTierOptions o;
  EXPECT_EQ(KvDiskTier::Open(o, 16, kFloats).status().code(), ErrorCode::kInvalidArgument);
  o.dir = Dir("bitroll_disk_bad");
  EXPECT_EQ(KvDiskTier::Open(o, 0, kFloats).status().code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace bitroll::engine
