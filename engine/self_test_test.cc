// The start-up invariance self-test (engine/self_test.h) on stories260K: it passes on every ISA
// this CPU has, and it fails, naming the batch check, when BITROLL_TEST_BREAK_INVARIANCE=matmul
// makes the matmul batch-size dependent (the negative control: the self-test can fail).
#include "engine/self_test.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <string>

#include "engine/cpu_engine.h"
#include "engine/engine.h"
#include "engine/invariance_break.h"
#include "kernels/cpu/isa.h"
#include "tests/engine_test_util.h"

namespace bitroll::engine {
namespace {

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

EngineOptions Stories(const std::string& isa = "auto") {
  EngineOptions o;
  o.model_path = testing_util::ModelsDir() + "/stories260K.bin";
  o.isa = isa;
  return o;
}

TEST(SelfTest, PassesOnEveryIsaHere) {
  unsetenv(kTestBreakInvarianceEnv);
  int tested = 0;
  for (kernels::Isa isa : {kernels::Isa::kScalar, kernels::Isa::kAvx2, kernels::Isa::kAvx512}) {
    if (!kernels::IsaSupported(isa)) {
      std::cerr << "*** self_test_test: this CPU lacks " << kernels::IsaName(isa)
                << "; the self-test is NOT run on that path ***\n";
      continue;
    }
    const EngineOptions o = Stories(kernels::IsaName(isa));
    Result<std::unique_ptr<Engine>> e = OpenEngine(o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    SelfTestReport report;
    const Status s = RunInvarianceSelfTest(**e, o, SelfTestOptions{}, &report);
    std::cerr << "served isa " << kernels::IsaName(isa) << ": " << report.ToString();
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_TRUE(report.ran);
    EXPECT_TRUE(report.passed);
    ASSERT_EQ(report.checks.size(), 5u);
    EXPECT_EQ(report.checks[0].name, "batch");
    EXPECT_EQ(report.checks[1].name, "chunking");
    EXPECT_EQ(report.checks[2].name, "prefill_vs_decode");
    EXPECT_EQ(report.checks[3].name, "variants");
    EXPECT_EQ(report.checks[4].name, "group");
    // Every ISA here is compared, whichever one serves.
    EXPECT_NE(report.Summary().find(kernels::IsaName(kernels::BestIsa())), std::string::npos)
        << report.Summary();
    const SelfTestVerdict v = VerdictOf(s, report);
    EXPECT_EQ(v.state, SelfTestVerdict::State::kPassed);
    EXPECT_TRUE(v.ok_to_serve());
    ++tested;
  }
  EXPECT_GE(tested, 1);
}

// `bitroll serve` runs the self-test before it serves: it must pass on hybrid (sliding-window)
// models under every SWA cache policy, whose sliding pool is sized by the policy.
TEST(SelfTest, PassesOnHybridModelsUnderEverySwaPolicy) {
  unsetenv(kTestBreakInvarianceEnv);
  for (const char* shape : {"swa-tiny", "swa-5to1-tiny"}) {
    for (const char* policy : {"full", "checkpoint:32", "recompute"}) {
      CpuEngineParts parts;
      parts.weights = testing_util::HfShapeModel(shape);
      ASSERT_NE(parts.weights, nullptr) << shape;
      parts.options.swa_cache = policy;
      const EngineOptions o = parts.options;
      Result<std::unique_ptr<CpuEngine>> e = CpuEngine::Create(std::move(parts));
      ASSERT_TRUE(e.ok()) << shape << " " << policy << ": " << e.status().ToString();
      SelfTestReport report;
      const Status s = RunInvarianceSelfTest(**e, o, SelfTestOptions{}, &report);
      EXPECT_TRUE(s.ok()) << shape << " " << policy << ": " << s.ToString();
      EXPECT_TRUE(report.passed) << shape << " " << policy << ": " << report.ToString();
    }
  }
}

// The self-test on stories260K (`isa`) with the break switch set to `what`; its status in *s.
SelfTestReport RunBroken(const char* what, const std::string& isa, Status* s) {
  ScopedEnv broken(kTestBreakInvarianceEnv, what);
  const EngineOptions o = Stories(isa);
  Result<std::unique_ptr<Engine>> e = OpenEngine(o);
  SelfTestReport report;
  if (!e.ok()) {
    *s = e.status();
    return report;
  }
  *s = RunInvarianceSelfTest(**e, o, SelfTestOptions{}, &report);
  std::cerr << report.ToString();
  return report;
}

TEST(SelfTest, ABatchVariantMatmulFailsTheBatchCheck) {
  Status s;
  const SelfTestReport report = RunBroken("matmul", "auto", &s);
  EXPECT_EQ(s.code(), ErrorCode::kInternal) << s.ToString();
  EXPECT_NE(s.message().find("invariance self-test failed: batch"), std::string::npos)
      << s.message();
  EXPECT_TRUE(report.ran);
  EXPECT_FALSE(report.passed);
  ASSERT_FALSE(report.mismatches.empty());
  const InvarianceMismatch& first = report.mismatches.front();
  EXPECT_EQ(first.check, "batch");
  ASSERT_GE(first.token, 0) << first.ToString();
  EXPECT_TRUE(first.recorded_bits != first.recomputed_bits ||
              first.recorded_id != first.recomputed_id)
      << first.ToString();
  ASSERT_FALSE(report.checks.empty());
  EXPECT_GT(report.checks[0].mismatches, 0u);
  EXPECT_EQ(report.Summary().rfind("FAILED: batch: ", 0), 0u) << report.Summary();
  const SelfTestVerdict v = VerdictOf(s, report);
  EXPECT_EQ(v.state, SelfTestVerdict::State::kFailed);
  EXPECT_FALSE(v.ok_to_serve());
  EXPECT_NE(v.reason.find("batch"), std::string::npos);
}

// GRPO siblings whose shared-chunk tile fuses its o update (the sibling_tile switch): only the
// group check can see it (no other check decodes samples of one prompt together).
TEST(SelfTest, AFusedSiblingTileFailsTheGroupCheck) {
  if (!kernels::IsaSupported(kernels::Isa::kAvx512)) {
    std::cerr << "*** self_test_test: no avx512; the sibling tile's break is NOT tested ***\n";
    return;
  }
  Status s;
  const SelfTestReport report = RunBroken("sibling_tile", "avx512", &s);
  EXPECT_EQ(s.code(), ErrorCode::kInternal) << s.ToString();
  ASSERT_EQ(report.checks.size(), 5u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(report.checks[i].mismatches, 0u) << report.checks[i].name;
  }
  EXPECT_EQ(report.checks[4].name, "group");
  EXPECT_GT(report.checks[4].mismatches, 0u);
  ASSERT_FALSE(report.mismatches.empty());
  EXPECT_EQ(report.mismatches.front().check, "group");
  EXPECT_FALSE(VerdictOf(s, report).ok_to_serve());
}

TEST(SelfTest, TheBreakSwitchIsInertUnlessSetAndRefusesOtherValues) {
  {
    ScopedEnv unset(kTestBreakInvarianceEnv, "");
    Result<MatmulFn> f = TestBreakMatmulFromEnv();
    ASSERT_TRUE(f.ok());
    EXPECT_EQ(*f, nullptr);
  }
  {
    ScopedEnv typo(kTestBreakInvarianceEnv, "matmull");
    EXPECT_EQ(TestBreakMatmulFromEnv().status().code(), ErrorCode::kInvalidArgument);
    Result<std::unique_ptr<Engine>> e = OpenEngine(Stories());
    EXPECT_EQ(e.status().code(), ErrorCode::kInvalidArgument) << e.status().ToString();
  }
  ScopedEnv set(kTestBreakInvarianceEnv, "matmul");
  Result<MatmulFn> f = TestBreakMatmulFromEnv();
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(*f, &BatchVariantMatmul);
}

}  // namespace
}  // namespace bitroll::engine
