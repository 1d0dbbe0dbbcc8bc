// Device selection (EngineOptions::device, engine/forward_backend.h CheckDevice): typed errors in
// every build, with or without CUDA, with or without a GPU. Runs everywhere.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "engine/cpu_engine.h"
#include "engine/engine.h"
#include "engine/forward_backend.h"

namespace bitroll::engine {
namespace {

TEST(DeviceSelection, UnknownDeviceIsInvalidArgumentBeforeTheModelIsRead) {
  EngineOptions o;
  o.model_path = "no-such-model.bin";
  o.device = "gpu";
  Result<std::unique_ptr<Engine>> e = OpenEngine(o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), ErrorCode::kInvalidArgument) << e.status().ToString();
  EXPECT_EQ(CheckDevice("").code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(CheckDevice("CUDA").code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(CheckDevice("cpu").ok());
}

TEST(DeviceSelection, CudaIsTypedInThisBuild) {
  const Status s = CheckDevice("cuda");
#ifdef BITROLL_HAVE_CUDA
  if (s.ok()) {
    std::fprintf(stderr, "*** device_test: a usable CUDA device is present ***\n");
  } else {
    EXPECT_EQ(s.code(), ErrorCode::kUnavailable) << s.ToString();
    EXPECT_EQ(s.message().rfind("no CUDA device: ", 0), 0u) << s.message();
    std::fprintf(stderr, "*** device_test: CUDA build, %s ***\n", s.ToString().c_str());
  }
#else
  EXPECT_EQ(s.code(), ErrorCode::kUnsupported) << s.ToString();
  EXPECT_NE(s.message().find("this build has no CUDA"), std::string::npos) << s.message();
  std::fprintf(stderr, "*** device_test: CPU-only build, %s ***\n", s.ToString().c_str());
#endif
  if (s.ok()) return;
  EngineOptions o;
  o.model_path = "no-such-model.bin";
  o.device = "cuda";
  Result<std::unique_ptr<Engine>> e = OpenEngine(o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), s.code()) << "the device is checked before the model is read";
  EXPECT_EQ(e.status().message(), s.message());
}

}  // namespace
}  // namespace bitroll::engine
