// Per-tier behaviour of Sandbox::Run: the happy path and every limit, on every tier.
#include "sandbox/sandbox.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <limits>
#include <thread>

#include "gtest/gtest.h"
#include "sandbox/sandbox_test_util.h"

namespace bitroll::sandbox {
namespace {

using testing::SandboxProcesses;
using testing::TestOptions;

Request Cmd(Tier tier, std::vector<std::string> argv) {
  Request r;
  r.tier = tier;
  r.argv = std::move(argv);
  r.limits.wall_seconds = 10;
  return r;
}

// ---------------------------------------------------------------- function tier

TEST(SandboxFunction, RunsRegisteredHandlerWithInputsAndFiles) {
  Sandbox sb(TestOptions());
  ASSERT_TRUE(sb.Register("upper", [](const Request& req, FunctionOutput* out) {
                  for (char c : req.stdin_data) out->stdout_data += static_cast<char>(toupper(c));
                  out->stderr_data = "argc=" + std::to_string(req.argv.size());
                  out->files["copy.txt"] = req.files.at("in.txt") + "!";
                  out->files["not-requested.txt"] = "x";
                  out->exit_code = 7;
                }).ok());
  Request r;
  r.tier = Tier::kFunction;
  r.function = "upper";
  r.argv = {"a", "b"};
  r.stdin_data = "hello";
  r.files["in.txt"] = "data";
  r.output_files = {"copy.txt"};
  RunResult res = sb.Run(r);
  ASSERT_TRUE(res.status.ok()) << res.status.ToString();
  EXPECT_EQ(res.tier, Tier::kFunction);
  EXPECT_EQ(res.error, SandboxError::kNone);
  EXPECT_TRUE(res.exited);
  EXPECT_EQ(res.exit_code, 7);
  EXPECT_EQ(res.stdout_data, "HELLO");
  EXPECT_EQ(res.stderr_data, "argc=2");
  ASSERT_EQ(res.files.size(), 1u);
  EXPECT_EQ(res.files["copy.txt"].data, "data!");
  EXPECT_GT(res.duration_seconds, 0);
}

TEST(SandboxFunction, OverrunIsReportedAsTimeoutAndAbandoned) {
  Sandbox sb(TestOptions());
  auto release = std::make_shared<std::atomic<bool>>(false);
  ASSERT_TRUE(sb.Register("hang", [release](const Request&, FunctionOutput* out) {
                  while (!release->load())
                    std::this_thread::sleep_for(std::chrono::milliseconds(5));
                  out->stdout_data = "late";
                }).ok());
  Request r;
  r.tier = Tier::kFunction;
  r.function = "hang";
  r.limits.wall_seconds = 0.2;
  auto t0 = std::chrono::steady_clock::now();
  RunResult res = sb.Run(r);
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  release->store(true);
  EXPECT_EQ(res.error, SandboxError::kTimeout);
  EXPECT_EQ(res.status.code(), ErrorCode::kTimeout);
  EXPECT_NE(res.status.message().find("cannot be killed"), std::string::npos);
  EXPECT_LT(took, 2.0);
  EXPECT_TRUE(res.stdout_data.empty());
}

TEST(SandboxFunction, InlineHandlerRunsOnTheCallerThreadAndReportsOverrun) {
  Sandbox sb(TestOptions());
  FunctionOptions fo;
  fo.run_inline = true;
  auto caller = std::make_shared<std::thread::id>();
  ASSERT_TRUE(sb.Register(
                    "where",
                    [caller](const Request&, FunctionOutput* out) {
                      out->stdout_data = std::this_thread::get_id() == *caller ? "same" : "other";
                    },
                    fo)
                  .ok());
  ASSERT_TRUE(sb.Register(
                    "slow",
                    [](const Request&, FunctionOutput* out) {
                      std::this_thread::sleep_for(std::chrono::milliseconds(300));
                      out->stdout_data = "late";
                    },
                    fo)
                  .ok());
  *caller = std::this_thread::get_id();
  Request r;
  r.tier = Tier::kFunction;
  r.function = "where";
  RunResult res = sb.Run(r);
  ASSERT_TRUE(res.status.ok()) << res.status.ToString();
  EXPECT_EQ(res.stdout_data, "same");
  r.function = "slow";
  r.limits.wall_seconds = 0.1;
  res = sb.Run(r);
  EXPECT_EQ(res.error, SandboxError::kTimeout);
  EXPECT_TRUE(res.stdout_data.empty());
  EXPECT_GE(res.usage.wall_seconds, 0.29);
}

TEST(SandboxFunction, OutputCapUnknownNameAndException) {
  Sandbox sb(TestOptions());
  ASSERT_TRUE(sb.Register("big", [](const Request&, FunctionOutput* out) {
                  out->stdout_data.assign(5000, 'x');
                }).ok());
  ASSERT_TRUE(sb.Register("throws", [](const Request&, FunctionOutput*) {
                  throw std::runtime_error("boom");
                }).ok());
  EXPECT_FALSE(sb.Register("", [](const Request&, FunctionOutput*) {}).ok());
  Request r;
  r.tier = Tier::kFunction;
  r.function = "big";
  r.limits.max_output_bytes = 100;
  RunResult res = sb.Run(r);
  EXPECT_EQ(res.error, SandboxError::kOutputLimit);
  EXPECT_EQ(res.stdout_data, std::string(100, 'x'));
  EXPECT_TRUE(res.stdout_truncated);
  r.function = "nope";
  EXPECT_EQ(sb.Run(r).error, SandboxError::kInvalidArgument);
  r.function = "throws";
  res = sb.Run(r);
  EXPECT_EQ(res.error, SandboxError::kInternal);
  EXPECT_NE(res.status.message().find("boom"), std::string::npos);
}

// ---------------------------------------------------------------- availability

TEST(SandboxAvailability, MissingVmImageNamesTheScript) {
  SandboxOptions o = TestOptions();
  o.vm_image_dir = "";
  Sandbox sb(o);
  RunResult res = sb.Run(Cmd(Tier::kVm, {"true"}));
  EXPECT_EQ(res.error, SandboxError::kUnavailable);
  EXPECT_EQ(res.status.code(), ErrorCode::kUnavailable);
  EXPECT_NE(res.status.message().find("scripts/vm-image.sh"), std::string::npos);
  o.vm_image_dir = std::string(BITROLL_BINARY_DIR) + "/no-such-vm-image";
  Sandbox sb2(o);
  res = sb2.Run(Cmd(Tier::kVm, {"true"}));
  EXPECT_EQ(res.error, SandboxError::kUnavailable);
  EXPECT_NE(res.status.message().find("scripts/vm-image.sh"), std::string::npos);
}

TEST(SandboxAvailability, MissingBwrapOrHelperIsUnavailable) {
  SandboxOptions o = TestOptions();
  o.bwrap_path = "/nonexistent/bwrap";
  Sandbox sb(o);
  EXPECT_EQ(sb.Run(Cmd(Tier::kContainer, {"true"})).error, SandboxError::kUnavailable);
  o.helper_path = "/nonexistent/helper";
  Sandbox sb2(o);
  RunResult res = sb2.Run(Cmd(Tier::kProcess, {"true"}));
  EXPECT_EQ(res.error, SandboxError::kUnavailable);
  EXPECT_NE(res.status.message().find("bitroll-sandbox-helper"), std::string::npos);
}

TEST(SandboxAvailability, BadRequestsAreInvalidArguments) {
  Sandbox sb(TestOptions());
  Request r = Cmd(Tier::kProcess, {});
  EXPECT_EQ(sb.Run(r).error, SandboxError::kInvalidArgument);
  r = Cmd(Tier::kProcess, {"true"});
  r.files["../escape"] = "x";
  EXPECT_EQ(sb.Run(r).error, SandboxError::kInvalidArgument);
  r = Cmd(Tier::kProcess, {"true"});
  r.output_files = {"/etc/shadow"};
  EXPECT_EQ(sb.Run(r).error, SandboxError::kInvalidArgument);
  r = Cmd(Tier::kProcess, {"true"});
  r.limits.wall_seconds = 0;
  EXPECT_EQ(sb.Run(r).error, SandboxError::kInvalidArgument);
  r.limits.wall_seconds = std::numeric_limits<double>::infinity();
  EXPECT_EQ(sb.Run(r).error, SandboxError::kInvalidArgument);
  r.limits.wall_seconds = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(sb.Run(r).error, SandboxError::kInvalidArgument);
}

// ---------------------------------------------------------------- command tiers

class SandboxTier : public ::testing::TestWithParam<Tier> {
 protected:
  SandboxTier() : sb_(TestOptions()) {}
  void TearDown() override {
    EXPECT_TRUE(SandboxProcesses(sb_.options()).empty()) << "a sandboxed process survived";
    testing::ExpectWarmRunIfPooled(sb_, GetParam());
  }
  Sandbox sb_;
};

// The VM tier (a boot costs seconds) runs the tests of SandboxTier; SandboxLocalTier's run on
// the process and container tiers only.
class SandboxLocalTier : public SandboxTier {};

TEST_P(SandboxTier, StdinStdoutStderrFilesAndExitCode) {
  SKIP_IF_TIER_UNAVAILABLE(sb_, GetParam());
  Request r = Cmd(GetParam(), {"sh", "-c",
                               "cat; echo err >&2; cat in.txt > out.txt; echo \"$GREETING\" >> "
                               "out.txt; ln -s /etc/passwd link.txt; exit 3"});
  r.stdin_data = "hello from stdin\n";
  r.files["in.txt"] = "file data\n";
  r.env = {"GREETING=it's me"};
  r.output_files = {"out.txt", "missing.txt", "link.txt"};
  RunResult res = sb_.Run(r);
  ASSERT_EQ(res.error, SandboxError::kNone) << res.status.ToString() << " " << res.stderr_data;
  EXPECT_TRUE(res.status.ok());
  EXPECT_EQ(res.tier, GetParam());
  EXPECT_TRUE(res.exited);
  EXPECT_EQ(res.exit_code, 3);
  EXPECT_EQ(res.stdout_data, "hello from stdin\n");
  EXPECT_EQ(res.stderr_data, "err\n");
  EXPECT_FALSE(res.stdout_truncated);
  ASSERT_EQ(res.files.count("out.txt"), 1u);
  EXPECT_EQ(res.files["out.txt"].data, "file data\nit's me\n");
  EXPECT_EQ(res.files.count("missing.txt"), 0u);
  EXPECT_EQ(res.files.count("link.txt"), 0u) << "a symlink must never be followed";
  EXPECT_GT(res.usage.wall_seconds, 0);
  EXPECT_GE(res.duration_seconds, res.usage.wall_seconds);
  EXPECT_EQ(res.limits.wall_seconds, r.limits.wall_seconds);
}

TEST_P(SandboxLocalTier, EchoAndSignalDeath) {
  SKIP_IF_TIER_UNAVAILABLE(sb_, GetParam());
  RunResult res = sb_.Run(Cmd(GetParam(), {"echo", "hi"}));
  ASSERT_EQ(res.error, SandboxError::kNone) << res.status.ToString();
  EXPECT_EQ(res.stdout_data, "hi\n");
  EXPECT_EQ(res.exit_code, 0);
  res = sb_.Run(Cmd(GetParam(), {"sh", "-c", "kill -TERM $$; sleep 5"}));
  EXPECT_EQ(res.error, SandboxError::kNone) << res.status.ToString();
  EXPECT_FALSE(res.exited);
  EXPECT_EQ(res.term_signal, SIGTERM);
}

TEST_P(SandboxTier, WallTimeoutKillsTheRun) {
  SKIP_IF_TIER_UNAVAILABLE(sb_, GetParam());
  Request r = Cmd(GetParam(), {"sh", "-c", "echo started; sleep 30"});
  r.limits.wall_seconds = 1;
  auto t0 = std::chrono::steady_clock::now();
  RunResult res = sb_.Run(r);
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(res.error, SandboxError::kTimeout) << res.status.ToString();
  EXPECT_EQ(res.status.code(), ErrorCode::kTimeout);
  EXPECT_LT(took, GetParam() == Tier::kVm ? 60.0 : 4.0);
  if (GetParam() != Tier::kVm) {
    EXPECT_GE(res.usage.wall_seconds, 0.9);
    EXPECT_EQ(res.stdout_data, "started\n");
  }
}

TEST_P(SandboxLocalTier, OutputIsTruncatedAndMarked) {
  SKIP_IF_TIER_UNAVAILABLE(sb_, GetParam());
  Request r = Cmd(GetParam(), {"sh", "-c", "echo small >&2; yes abcdefgh | head -c 200000"});
  r.limits.max_output_bytes = 1000;
  RunResult res = sb_.Run(r);
  EXPECT_EQ(res.error, SandboxError::kOutputLimit) << res.status.ToString();
  EXPECT_EQ(res.status.code(), ErrorCode::kResourceExhausted);
  EXPECT_TRUE(res.stdout_truncated);
  ASSERT_EQ(res.stdout_data.size(), 1000u);
  EXPECT_EQ(res.stdout_data.substr(0, 18), "abcdefgh\nabcdefgh\n");
  EXPECT_FALSE(res.stderr_truncated);
}

TEST_P(SandboxLocalTier, CpuTimeLimit) {
  SKIP_IF_TIER_UNAVAILABLE(sb_, GetParam());
  Request r = Cmd(GetParam(), {"sh", "-c", "while :; do :; done"});
  r.limits.cpu_seconds = 1;
  r.limits.wall_seconds = 30;  // generous: on a loaded machine 1 CPU second takes longer
  RunResult res = sb_.Run(r);
  EXPECT_EQ(res.error, SandboxError::kCpuTime) << res.status.ToString();
  // RLIMIT_CPU fires on tick-sampled CPU time, rusage reports precise time: allow slack.
  EXPECT_GE(res.usage.cpu_seconds, 0.5);
  EXPECT_LT(res.usage.wall_seconds, 29);
}

TEST_P(SandboxLocalTier, MemoryLimit) {
  SKIP_IF_TIER_UNAVAILABLE(sb_, GetParam());
  // The shell holds 300 MB of command substitution against a 64 MiB limit.
  Request r = Cmd(GetParam(), {"sh", "-c",
                               "x=$(head -c 300000000 /dev/zero | tr '\\0' a); "
                               "echo survived ${#x}"});
  r.limits.memory_bytes = 64ull << 20;
  r.limits.wall_seconds = 15;
  RunResult res = sb_.Run(r);
  EXPECT_NE(res.stdout_data.substr(0, 8), "survived");
  EXPECT_FALSE(res.exited && res.exit_code == 0);
  if (sb_.LimitMechanism() == "rlimits") {
    GTEST_SKIP() << "NO MEMORY CGROUP: the limit held (RLIMIT_AS) but cannot be typed as kMemory";
  }
  EXPECT_EQ(res.error, SandboxError::kMemory) << res.status.ToString();
  EXPECT_LE(res.usage.max_rss_bytes, (64ull << 20) + (4ull << 20));
}

TEST_P(SandboxLocalTier, ProcessLimit) {
  SKIP_IF_TIER_UNAVAILABLE(sb_, GetParam());
  Request r = Cmd(GetParam(), {"sh", "-c",
                               "n=0; for i in 1 2 3 4 5 6 7 8 9 10 11 12; do "
                               "sleep 3 & n=$((n+1)); done; wait; echo $n"});
  r.limits.max_processes = 6;
  r.limits.wall_seconds = 6;
  RunResult res = sb_.Run(r);
  if (sb_.LimitMechanism() == "rlimits") {
    EXPECT_NE(res.error, SandboxError::kNone);
    GTEST_SKIP() << "NO PIDS CGROUP: RLIMIT_NPROC held but a hit cannot be typed";
  }
  EXPECT_EQ(res.error, SandboxError::kProcessLimit) << res.status.ToString() << res.stderr_data;
}

TEST_P(SandboxLocalTier, CommandNotFoundIsASpawnFailure) {
  SKIP_IF_TIER_UNAVAILABLE(sb_, GetParam());
  RunResult res = sb_.Run(Cmd(GetParam(), {"no-such-command-bitroll"}));
  EXPECT_EQ(res.error, SandboxError::kSpawnFailure) << res.status.ToString();
  EXPECT_NE(res.status.message().find("no-such-command-bitroll"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Tiers, SandboxTier,
                         ::testing::Values(Tier::kProcess, Tier::kContainer, Tier::kVm),
                         testing::TierParamName);
INSTANTIATE_TEST_SUITE_P(Tiers, SandboxLocalTier,
                         ::testing::Values(Tier::kProcess, Tier::kContainer),
                         testing::TierParamName);
// The same tests with pre-warmed helpers (SandboxOptions::prewarm on).
INSTANTIATE_TEST_SUITE_P(Pooled, SandboxTier, ::testing::Values(Tier::kProcess, Tier::kContainer),
                         testing::TierParamName);
INSTANTIATE_TEST_SUITE_P(Pooled, SandboxLocalTier,
                         ::testing::Values(Tier::kProcess, Tier::kContainer),
                         testing::TierParamName);

TEST(SandboxConcurrency, ParallelRunsGetDistinctSlots) {
  Sandbox sb(TestOptions());
  SKIP_IF_TIER_UNAVAILABLE(sb, Tier::kProcess);
  std::vector<std::thread> threads;
  std::vector<RunResult> results(6);
  for (int i = 0; i < 6; ++i) {
    threads.emplace_back([&, i] { results[i] = sb.Run(Cmd(Tier::kProcess, {"id", "-u"})); });
  }
  for (auto& t : threads) t.join();
  for (const RunResult& res : results) {
    ASSERT_EQ(res.error, SandboxError::kNone) << res.status.ToString();
    unsigned long uid = std::strtoul(res.stdout_data.c_str(), nullptr, 10);
    EXPECT_GE(uid, sb.options().uid_base);
    EXPECT_LT(uid, sb.options().uid_base + sb.options().max_concurrent);
  }
}

}  // namespace
}  // namespace bitroll::sandbox
