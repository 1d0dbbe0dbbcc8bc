// The start-up invariance self-test through the `bitroll` command line, as a user runs it
// (rollout/self_test_gate.h): a healthy build serves after the self-test passed; with the
// test-only switch BITROLL_TEST_BREAK_INVARIANCE=matmul (engine/invariance_break.h) `serve`
// refuses to start (exit 1, the failed check on stderr), a remote `replica` does not join, and
// `self-test` reports the batch check; with =sibling_tile `serve` refuses on the group check;
// --skip-self-test starts anyway and logs the warning. The coordinator keeps the verdict it was
// started with (Coordinator::self_test()).
//
// Every command that might serve runs under timeout(1), so a gate that fails to refuse shows up
// as exit 124 instead of a hung test.
#include <gtest/gtest.h>

#include <iostream>

#include <string>
#include <vector>

#include "kernels/cpu/isa.h"
#include "rollout/cli_test_util.h"
#include "rollout/coordinator.h"
#include "rollout/null_engine.h"
#include "rollout/self_test_gate.h"

namespace bitroll::rollout {
namespace {

const std::string kModel = std::string(BITROLL_MODELS_DIR) + "/stories260K.bin";

// `bitroll ARGS` with the break switch set to `what` (or unset when empty), under
// `timeout -s TERM seconds`.
CmdResult BitrollBroken(const std::string& what, int seconds,
                        const std::vector<std::string>& args) {
  std::string cmd = (what.empty() ? std::string("env -u BITROLL_TEST_BREAK_INVARIANCE")
                                  : "env BITROLL_TEST_BREAK_INVARIANCE=" + what) +
                    " timeout -s TERM " + std::to_string(seconds) + " " + ShellQuote(BITROLL_EXE);
  for (const auto& a : args) cmd += " " + ShellQuote(a);
  return RunShell(cmd);
}

// The same with the matmul switch (broken) or none.
CmdResult Bitroll(bool broken, int seconds, const std::vector<std::string>& args) {
  return BitrollBroken(broken ? "matmul" : "", seconds, args);
}

std::vector<std::string> Serve(std::vector<std::string> extra = {}) {
  std::vector<std::string> a = {"serve",  "--model",          kModel, "--replicas", "1",
                                "--bind", "tcp://127.0.0.1:*"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

bool Has(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

TEST(SelfTestCli, AHealthyServePassesTheSelfTestThenServes) {
  const CmdResult r = Bitroll(false, 8, Serve());
  EXPECT_EQ(r.rc, 124) << "serve should run until timeout stops it\n" << r.err;
  EXPECT_TRUE(Has(r.out,
                  "bitroll serve: invariance self-test passed: batch, chunking, "
                  "prefill_vs_decode, variants, group"))
      << r.out;
  EXPECT_TRUE(Has(r.out, "bitroll serve: clients tcp://127.0.0.1:")) << r.out;
}

TEST(SelfTestCli, ServeRefusesToStartWithABrokenMatmul) {
  const CmdResult r = Bitroll(true, 60, Serve());
  EXPECT_EQ(r.rc, 1) << r.out << r.err;
  EXPECT_TRUE(Has(r.err, "bitroll serve: refusing to serve: the invariance self-test failed"))
      << r.err;
  EXPECT_TRUE(Has(r.err, "FAILED: batch: ")) << r.err;
  EXPECT_TRUE(Has(r.err, "recorded id")) << r.err;
  EXPECT_FALSE(Has(r.out, "bitroll serve: clients")) << r.out;
}

TEST(SelfTestCli, SkipSelfTestStartsAndWarnsLoudly) {
  const CmdResult r = Bitroll(true, 8, Serve({"--skip-self-test"}));
  EXPECT_EQ(r.rc, 124) << "serve should run until timeout stops it\n" << r.err;
  EXPECT_TRUE(Has(r.out, "[warning]")) << r.out;
  EXPECT_TRUE(Has(r.out, "--skip-self-test: the start-up invariance self-test was NOT run"))
      << r.out;
  EXPECT_TRUE(Has(r.out, "bitroll serve: clients tcp://127.0.0.1:")) << r.out;
}

TEST(SelfTestCli, ARemoteReplicaWithABrokenMatmulDoesNotJoin) {
  // Nothing listens there: a replica that went on would retry the connection until timeout.
  const CmdResult r =
      Bitroll(true, 60, {"replica", "--connect", "tcp://127.0.0.1:9", "--model", kModel});
  EXPECT_EQ(r.rc, 1) << r.out << r.err;
  EXPECT_TRUE(Has(r.err, "bitroll replica: refusing to serve")) << r.err;
  EXPECT_FALSE(Has(r.out, "connecting to")) << r.out;
}

TEST(SelfTestCli, TheSelfTestCommandPrintsTheReport) {
  const CmdResult ok = Bitroll(false, 60, {"self-test", "--model", kModel});
  EXPECT_EQ(ok.rc, 0) << ok.out << ok.err;
  EXPECT_EQ(ok.out.rfind("passed: ", 0), 0u) << ok.out;
  for (const char* check : {"batch", "chunking", "prefill_vs_decode", "variants", "group"}) {
    EXPECT_TRUE(Has(ok.out, std::string("  ") + check)) << ok.out;
  }
  const CmdResult bad = Bitroll(true, 60, {"self-test", "--model", kModel});
  EXPECT_EQ(bad.rc, 1) << bad.out << bad.err;
  EXPECT_EQ(bad.out.rfind("FAILED: batch: ", 0), 0u) << bad.out;
  EXPECT_TRUE(Has(bad.out, "MISMATCH")) << bad.out;
  EXPECT_TRUE(Has(bad.err, "invariance self-test failed")) << bad.err;
}

// GRPO siblings whose shared-chunk attention tile fuses its o update (the sibling_tile switch,
// AVX-512 only): `serve` refuses to start, and the group check names it.
TEST(SelfTestCli, ServeRefusesToStartWithABrokenSiblingTile) {
  if (!kernels::IsaSupported(kernels::Isa::kAvx512)) {
    std::cerr << "*** self_test_cli_test: no avx512; the sibling tile's break is NOT tested ***\n";
    return;
  }
  const CmdResult r = BitrollBroken("sibling_tile", 60, Serve());
  EXPECT_EQ(r.rc, 1) << r.out << r.err;
  EXPECT_TRUE(Has(r.err, "bitroll serve: refusing to serve: the invariance self-test failed"))
      << r.err;
  EXPECT_TRUE(Has(r.err, "FAILED: group: ")) << r.err;
  EXPECT_FALSE(Has(r.out, "bitroll serve: clients")) << r.out;
}

// The verdict a service keeps for Status and /health: the gate's, as the coordinator was given
// it. An engine without weights (the NullEngine) is skipped, never failed.
TEST(SelfTestVerdict, TheCoordinatorKeepsTheGatesVerdict) {
  std::vector<std::unique_ptr<engine::Engine>> engines;
  engines.push_back(std::make_unique<NullEngine>(NullEngineOptions{}));
  CoordinatorOptions o;
  o.bind = "tcp://127.0.0.1:*";
  o.self_test = GateOnSelfTest("test", *engines[0], engine::EngineOptions{}, false);
  EXPECT_EQ(o.self_test.state, engine::SelfTestVerdict::State::kSkipped);
  EXPECT_TRUE(o.self_test.ok_to_serve());
  EXPECT_NE(o.self_test.reason.find("no weights"), std::string::npos) << o.self_test.reason;
  auto c = Coordinator::Start(o, std::move(engines));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ((*c)->self_test().state, engine::SelfTestVerdict::State::kSkipped);
  EXPECT_EQ((*c)->self_test().reason, o.self_test.reason);
  EXPECT_STREQ((*c)->self_test().state_name(), "skipped");
  (*c)->Stop();
}

}  // namespace
}  // namespace bitroll::rollout
