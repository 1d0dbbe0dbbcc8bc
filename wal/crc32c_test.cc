// Tests for wal/crc32c.h: standard check values, both paths equal, Extend composes.
#include "wal/crc32c.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace bitroll::wal::crc32c {
namespace {

TEST(Crc32c, StandardCheckValue) {
  const char* s = "123456789";
  EXPECT_EQ(Value(s, 9), 0xE3069283u);
  EXPECT_EQ(ExtendPortable(0, s, 9), 0xE3069283u);
  if (!HasHardware()) GTEST_SKIP() << "no SSE4.2 on this CPU: hardware path not exercised";
  EXPECT_EQ(ExtendHardware(0, s, 9), 0xE3069283u);
}

// RFC 3720 (iSCSI) B.4 test vectors.
TEST(Crc32c, Rfc3720Vectors) {
  std::vector<uint8_t> buf(32, 0);
  EXPECT_EQ(ExtendPortable(0, buf.data(), 32), 0x8A9136AAu);
  std::fill(buf.begin(), buf.end(), 0xFF);
  EXPECT_EQ(ExtendPortable(0, buf.data(), 32), 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(ExtendPortable(0, buf.data(), 32), 0x46DD794Eu);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<uint8_t>(31 - i);
  EXPECT_EQ(ExtendPortable(0, buf.data(), 32), 0x113FDB5Cu);
  EXPECT_EQ(Value(buf.data(), 32), 0x113FDB5Cu);
}

TEST(Crc32c, HardwareEqualsPortableAtEveryLengthAndAlignment) {
  if (!HasHardware()) GTEST_SKIP() << "no SSE4.2 on this CPU: only the portable path exists";
  std::mt19937 rng(7);
  std::vector<uint8_t> buf(1100);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  for (size_t off = 0; off < 8; ++off) {
    for (size_t n = 0; n + off <= buf.size(); n += (n < 64 ? 1 : 37)) {
      ASSERT_EQ(ExtendHardware(0x1234u, buf.data() + off, n),
                ExtendPortable(0x1234u, buf.data() + off, n))
          << "off=" << off << " n=" << n;
    }
  }
}

TEST(Crc32c, ExtendComposesAndDetectsOneBitFlips) {
  const std::string a = "the quick brown fox ", b = "jumps over the lazy dog";
  const std::string ab = a + b;
  EXPECT_EQ(Extend(Value(a.data(), a.size()), b.data(), b.size()), Value(ab.data(), ab.size()));
  std::string flipped = ab;
  const uint32_t base = Value(ab.data(), ab.size());
  for (size_t i = 0; i < flipped.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      flipped[i] ^= static_cast<char>(1 << bit);
      EXPECT_NE(Value(flipped.data(), flipped.size()), base) << i << ":" << bit;
      flipped[i] ^= static_cast<char>(1 << bit);
    }
  }
}

}  // namespace
}  // namespace bitroll::wal::crc32c
