#include "kernels/cpu/isa.h"

#include <gtest/gtest.h>

#include <cstring>

namespace bitroll::kernels {
namespace {

TEST(IsaTest, NamesRoundTrip) {
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    Result<Isa> parsed = ParseIsa(IsaName(isa));
    if (IsaSupported(isa)) {
      ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
      EXPECT_EQ(*parsed, isa);
    } else {
      ASSERT_FALSE(parsed.ok());
      EXPECT_EQ(parsed.status().code(), ErrorCode::kUnsupported);
    }
  }
  EXPECT_STREQ(IsaName(Isa::kScalar), "scalar");
  EXPECT_STREQ(IsaName(Isa::kAvx2), "avx2");
  EXPECT_STREQ(IsaName(Isa::kAvx512), "avx512");
  EXPECT_STREQ(IsaName(static_cast<Isa>(9)), "unknown");
}

TEST(IsaTest, AutoIsBestAndSupported) {
  Result<Isa> parsed = ParseIsa("auto");
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(*parsed, BestIsa());
  EXPECT_TRUE(IsaSupported(BestIsa()));
  EXPECT_TRUE(IsaSupported(Isa::kScalar));
  // AVX-512 implies AVX2 support (the AVX-512 files also use AVX2/FMA instructions).
  if (IsaSupported(Isa::kAvx512)) {
    EXPECT_TRUE(IsaSupported(Isa::kAvx2));
  }
  std::printf("best ISA here: %s\n", IsaName(BestIsa()));
}

TEST(IsaTest, BadNameIsInvalidArgument) {
  for (const char* name : {"", "AVX2", "sse", "avx512f", "auto "}) {
    Result<Isa> parsed = ParseIsa(name);
    ASSERT_FALSE(parsed.ok()) << name;
    EXPECT_EQ(parsed.status().code(), ErrorCode::kInvalidArgument) << name;
  }
}

}  // namespace
}  // namespace bitroll::kernels
