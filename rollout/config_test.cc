// Tests of rollout/config.{h,cc}: JSON config and flags, and their exact errors.
#include "rollout/config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

namespace bitroll::rollout {
namespace {

Status Flags(std::vector<std::string> args, ServeConfig* c) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return ApplyFlags(static_cast<int>(argv.size()), argv.data(), 1, c);
}

TEST(ConfigTest, JsonSetsEveryField) {
  ServeConfig c;
  ASSERT_TRUE(ParseConfigJson(R"({"bind": "tcp://127.0.0.1:7000", "replicas": 3,
      "engine": "null", "max_queued": 99, "replica_timeout_ms": 1234, "stream_timeout_ms": 4321,
      "limits": {"max_n": 16, "max_tokens": 100},
      "price": {"replica_hour_usd": 2.5, "sandbox_cpu_hour_usd": 0.25},
      "null_engine": {"vocab_size": 64, "step_delay_us": 7}})",
                              &c)
                  .ok());
  EXPECT_EQ(c.coordinator.bind, "tcp://127.0.0.1:7000");
  EXPECT_EQ(c.replicas, 3);
  EXPECT_EQ(c.engine, "null");
  EXPECT_EQ(c.coordinator.max_queued, 99u);
  EXPECT_EQ(c.coordinator.replica_timeout_ms, 1234);
  EXPECT_EQ(c.coordinator.stream_timeout_ms, 4321);
  EXPECT_EQ(c.coordinator.submit.max_n, 16u);
  EXPECT_EQ(c.coordinator.submit.max_tokens, 100);
  EXPECT_EQ(c.coordinator.price.replica_hour_usd, 2.5);
  EXPECT_EQ(c.coordinator.price.sandbox_cpu_hour_usd, 0.25);
  EXPECT_EQ(c.null_engine.vocab_size, 64);
  EXPECT_EQ(c.null_engine.step_delay_us, 7);
}

TEST(ConfigTest, BadJsonGetsExactErrors) {
  ServeConfig c;
  Status s = ParseConfigJson("[1, 2]", &c);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "config is not a JSON object");
  s = ParseConfigJson(R"({"replicaz": 2})", &c);
  EXPECT_EQ(s.message(), "unknown config key 'replicaz' in the top level");
  s = ParseConfigJson(R"({"price": {"gpu_hour": 1}})", &c);
  EXPECT_EQ(s.message(), "unknown config key 'gpu_hour' in price");
  s = ParseConfigJson(R"({"replicas": "two"})", &c);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(s.message().rfind("config key 'replicas': ", 0), 0u) << s.message();
  EXPECT_EQ(LoadConfigFile("/nonexistent/bitroll.json", &c).code(), ErrorCode::kNotFound);
}

TEST(ConfigTest, FlagsOverrideTheFile) {
  const std::string path = std::string(BITROLL_BINARY_DIR) + "/config_test.json";
  std::ofstream(path) << R"({"replicas": 3, "bind": "tcp://127.0.0.1:7000"})";
  ServeConfig c;
  // --replicas comes before --config on the command line and still wins.
  ASSERT_TRUE(Flags({"serve", "--replicas", "5", "--config", path, "--engine", "null"}, &c).ok());
  EXPECT_EQ(c.replicas, 5);
  EXPECT_EQ(c.coordinator.bind, "tcp://127.0.0.1:7000");
  EXPECT_EQ(c.engine, "null");
  std::remove(path.c_str());
}

TEST(ConfigTest, FlagsOverrideTheFileWhereverTheyAppear) {
  const std::string path = std::string(BITROLL_BINARY_DIR) + "/config_test_order.json";
  std::ofstream(path) << R"({"replicas": 3, "engine": "null", "tokenizer": "t.bin",
      "price": {"replica_hour_usd": 2.5}})";
  ServeConfig c;
  // --replicas after --config, --bind=EP form, the last of a repeated flag.
  ASSERT_TRUE(Flags({"serve", "--config", path, "--replicas", "7", "--bind=tcp://127.0.0.1:9",
                     "--threads", "2", "--threads", "3"},
                    &c)
                  .ok());
  EXPECT_EQ(c.replicas, 7);
  EXPECT_EQ(c.engine, "null");                          // from the file
  EXPECT_EQ(c.engine_options.tokenizer_path, "t.bin");  // from the file
  EXPECT_EQ(c.coordinator.price.replica_hour_usd, 2.5);
  EXPECT_EQ(c.coordinator.bind, "tcp://127.0.0.1:9");
  EXPECT_EQ(c.engine_options.threads, 3);
  // An unknown key in the file stays an error; --help applies nothing.
  std::ofstream(path) << R"({"replicas": 3, "gpus": 2})";
  ServeConfig d;
  EXPECT_EQ(Flags({"serve", "--config", path}, &d).message(),
            path + ": unknown config key 'gpus' in the top level");
  ServeConfig e;
  ASSERT_TRUE(Flags({"serve", "--config", path, "--replicas", "9", "--help"}, &e).ok());
  EXPECT_EQ(e.replicas, 1);
  std::remove(path.c_str());
}

TEST(ConfigTest, ToolWorkRootAndDiskCap) {
  ServeConfig c;
  EXPECT_EQ(c.coordinator.tools.sandbox.work_disk_bytes, 256ull << 20);  // the default
  ASSERT_TRUE(
      ParseConfigJson(R"({"tools": {"work_root": "/srv/bitroll-work", "disk_bytes": 1048576}})", &c)
          .ok());
  EXPECT_EQ(c.coordinator.tools.sandbox.work_root, "/srv/bitroll-work");
  EXPECT_EQ(c.coordinator.tools.sandbox.work_disk_bytes, 1048576u);
  EXPECT_EQ(ParseConfigJson(R"({"tools": {"disk": 1}})", &c).message(),
            "unknown config key 'disk' in tools");
  ASSERT_TRUE(
      Flags({"serve", "--tool-work-root", "/var/tmp/w", "--tool-disk-bytes", "0"}, &c).ok());
  EXPECT_EQ(c.coordinator.tools.sandbox.work_root, "/var/tmp/w");
  EXPECT_EQ(c.coordinator.tools.sandbox.work_disk_bytes, 0u);
  EXPECT_EQ(Flags({"serve", "--tool-disk-bytes", "-5"}, &c).message(),
            "--tool-disk-bytes: '-5' is not an integer in [0, 18446744073709551615]");
}

TEST(ConfigTest, MetricsBind) {
  ServeConfig c;
  EXPECT_EQ(c.metrics_bind, "");  // off by default
  ASSERT_TRUE(ParseConfigJson(R"({"metrics_bind": "0.0.0.0:9400"})", &c).ok());
  EXPECT_EQ(c.metrics_bind, "0.0.0.0:9400");
  ASSERT_TRUE(Flags({"serve", "--metrics-bind", "127.0.0.1:0"}, &c).ok());
  EXPECT_EQ(c.metrics_bind, "127.0.0.1:0");
}

// The engine settings reach every replica's EngineOptions from the file and from the flags (the
// flags generate and audit take: one registration, rollout/engine_flags.h).
TEST(ConfigTest, EngineSettings) {
  ServeConfig c;
  ASSERT_TRUE(ParseConfigJson(R"({"isa": "avx2", "attention": "split", "max_step_tokens": 64,
      "max_running": 8, "max_prefill_chunk": 32, "kv_dtype": "bf16", "prefix_cache": false,
      "kv_disk_dir": "kvd", "kv_disk_bytes": 4096})",
                              &c)
                  .ok());
  const engine::EngineOptions& eo = c.engine_options;
  EXPECT_EQ(eo.isa, "avx2");
  EXPECT_EQ(eo.attention, "split");
  EXPECT_EQ(eo.max_step_tokens, 64);
  EXPECT_EQ(eo.max_running, 8);
  EXPECT_EQ(eo.max_prefill_chunk, 32);
  EXPECT_EQ(eo.kv_dtype, "bf16");
  EXPECT_FALSE(eo.prefix_cache);
  EXPECT_EQ(eo.kv_disk_dir, "kvd");
  EXPECT_EQ(eo.kv_disk_bytes, 4096);
  ASSERT_TRUE(Flags({"serve", "--max-step-tokens", "128", "--kv-dtype", "f32", "--prefix-cache",
                     "on", "--kv-cache-mb", "3"},
                    &c)
                  .ok());
  EXPECT_EQ(eo.max_step_tokens, 128);
  EXPECT_EQ(eo.kv_dtype, "f32");
  EXPECT_TRUE(eo.prefix_cache);
  EXPECT_EQ(eo.kv_cache_bytes, 3 << 20);
  EXPECT_EQ(eo.max_running, 8);  // the file's value stays where no flag overrides it

  ServeConfig d;
  EXPECT_EQ(Flags({"serve", "--kv-dtype", "f16"}, &d).message(),
            "--kv-dtype must be f32 or bf16, got 'f16'");
  EXPECT_EQ(Flags({"serve", "--prefix-cache", "yes"}, &d).message(),
            "--prefix-cache must be on or off, got 'yes'");
  EXPECT_EQ(Flags({"serve", "--kv-cache-mb", "-1"}, &d).message(),
            "--kv-cache-mb must be in [0, 2^40]");
  ServeConfig e;
  EXPECT_EQ(Flags({"serve", "--max-running", "0"}, &e).message(),
            "--max-step-tokens, --max-running and --max-prefill-chunk must be >= 1");
  ServeConfig g;
  EXPECT_EQ(ParseConfigJson(R"({"kv_dtype": 16})", &g).code(), ErrorCode::kInvalidArgument);
}

TEST(ConfigTest, BadFlags) {
  ServeConfig c;
  Status s = Flags({"serve", "--replicas", "x"}, &c);
  EXPECT_EQ(s.message(), "--replicas: 'x' is not an integer in [-2147483648, 2147483647]");
  s = Flags({"serve", "--replicas", "2x"}, &c);  // trailing garbage
  EXPECT_EQ(s.message(), "--replicas: '2x' is not an integer in [-2147483648, 2147483647]");
  s = Flags({"serve", "--price-replica-hour", "1.5usd"}, &c);
  EXPECT_EQ(s.message(), "--price-replica-hour: '1.5usd' is not a number");
  s = Flags({"serve", "--frobnicate", "1"}, &c);
  EXPECT_EQ(s.message(), "unknown flag --frobnicate");
  s = Flags({"serve", "--model"}, &c);
  EXPECT_EQ(s.message(), "--model needs a value");
  s = Flags({"serve", "--frobnicate"}, &c);
  EXPECT_EQ(s.message(), "unknown flag --frobnicate");
  s = Flags({"serve", "stray"}, &c);
  EXPECT_EQ(s.message(), "unexpected argument 'stray'");
  s = Flags({"serve", "--engine", "gpu"}, &c);
  EXPECT_EQ(s.message(), "--engine must be auto or null");
  ServeConfig d;
  s = Flags({"serve", "--replicas", "-1"}, &d);
  EXPECT_EQ(s.message(), "--replicas must be in [0, 1024]");
}

}  // namespace
}  // namespace bitroll::rollout
