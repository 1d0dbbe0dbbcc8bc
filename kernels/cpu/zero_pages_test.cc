#include "kernels/cpu/zero_pages.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

namespace bitroll::kernels {
namespace {

constexpr size_t kHuge = size_t{2} << 20;

bool AllZero(const unsigned char* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

TEST(ZeroPagesTest, MapsZeroedWritableAlignedMemory) {
  for (bool huge : {false, true}) {
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{4095}, kHuge - 1, kHuge, 3 * kHuge + 5}) {
      SCOPED_TRACE(std::to_string(bytes) + (huge ? " huge" : " small"));
      ZeroPages z;
      ASSERT_TRUE(z.Map(bytes, huge));
      ASSERT_NE(z.data(), nullptr);
      EXPECT_EQ(z.size(), bytes);
      const auto addr = reinterpret_cast<uintptr_t>(z.data());
      EXPECT_EQ(addr % 4096, 0u);
      if (huge && bytes >= kHuge) {
        EXPECT_EQ(addr % kHuge, 0u);
      }
      EXPECT_TRUE(AllZero(z.data(), bytes));
      if (bytes > 0) {
        z.data()[0] = 1;
        z.data()[bytes - 1] = 2;
        EXPECT_EQ(z.data()[bytes - 1], 2);
      }
    }
  }
}

TEST(ZeroPagesTest, MapAgainReplacesAndMoveTransfers) {
  ZeroPages a;
  ASSERT_TRUE(a.Map(3 * kHuge, true));
  a.data()[7] = 9;
  ASSERT_TRUE(a.Map(kHuge + 1, true));  // a fresh mapping: zero again
  EXPECT_EQ(a.size(), kHuge + 1);
  EXPECT_TRUE(AllZero(a.data(), a.size()));
  a.data()[7] = 9;

  ZeroPages b(std::move(a));
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(a.size(), 0u);
  ASSERT_NE(b.data(), nullptr);
  EXPECT_EQ(b.data()[7], 9);

  ZeroPages c;
  ASSERT_TRUE(c.Map(100, false));
  c = std::move(b);
  EXPECT_EQ(c.size(), kHuge + 1);
  EXPECT_EQ(c.data()[7], 9);
}

TEST(ZeroPagesTest, RefusedMemoryIsAFalseReturnNotACrash) {
  ZeroPages z;
  EXPECT_FALSE(z.Map(size_t{1} << 62, true));
  EXPECT_FALSE(z.Map(size_t{1} << 62, false));
  EXPECT_EQ(z.data(), nullptr);
  EXPECT_EQ(z.size(), 0u);
}

// The kernel's THP policy: the bracketed word of /sys/kernel/mm/transparent_hugepage/enabled
// ("always", "madvise", "never"), or "" where the kernel has no THP.
std::string ThpPolicy() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (!std::getline(f, line)) return "";
  const size_t a = line.find('['), b = line.find(']');
  return a == std::string::npos || b == std::string::npos ? "" : line.substr(a + 1, b - a - 1);
}

// The THPeligible field of the /proc/self/smaps mapping that holds p, or -1 if none says.
int ThpEligible(const void* p) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  std::ifstream f("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(f, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find(' ')) {
      inside = addr >= lo && addr < hi;
      continue;
    }
    if (inside && line.rfind("THPeligible:", 0) == 0) {
      std::istringstream in(line.substr(12));
      int v = -1;
      in >> v;
      return v;
    }
  }
  return -1;
}

TEST(ZeroPagesTest, HugeMappingsAreEligibleForTransparentHugePages) {
  const std::string policy = ThpPolicy();
  if (policy != "madvise" && policy != "always") {
    GTEST_SKIP() << "THIS KERNEL GIVES NO TRANSPARENT HUGE PAGES (policy '" << policy
                 << "'): huge mappings fall back to 4 KiB pages, and this check cannot run";
  }
  ZeroPages huge, small;
  ASSERT_TRUE(huge.Map(4 * kHuge, true));
  ASSERT_TRUE(small.Map(4 * kHuge, false));
  huge.data()[0] = 1;
  small.data()[0] = 1;
  const int eligible = ThpEligible(huge.data());
  if (eligible < 0) {
    GTEST_SKIP() << "THIS KERNEL'S /proc/self/smaps HAS NO THPeligible FIELD (before Linux 5.0): "
                    "whether huge pages were granted cannot be checked here";
  }
  EXPECT_EQ(eligible, 1);
  // Negative control: the mapping advised against huge pages is not eligible, under either policy.
  EXPECT_EQ(ThpEligible(small.data()), 0);
}

}  // namespace
}  // namespace bitroll::kernels
