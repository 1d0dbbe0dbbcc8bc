// The `bitroll` command line, run as a child process (issue 13 item 7): one parser for every
// subcommand, so that
//   - `bitroll <command> --help` prints the command's flags on stdout and exits 0;
//   - an unknown flag, a missing value and a bad number give one message style on stderr,
//     "bitroll <command>: <what>" and a hint to run `bitroll <command> --help`, and exit 2;
//   - `bitroll`, `bitroll --help` and `bitroll help` print the overview.
// None of these runs needs a model: every error is found before anything loads.
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "rollout/cli_test_util.h"

namespace bitroll::rollout {
namespace {

namespace fs = std::filesystem;

// Runs `bitroll ARGS` without BITROLL_MODEL and collects its exit status, stdout and stderr.
CmdResult Bitroll(const std::vector<std::string>& args) {
  std::string cmd = "env -u BITROLL_MODEL " + ShellQuote(BITROLL_EXE);
  for (const auto& a : args) cmd += " " + ShellQuote(a);
  return RunShell(cmd);
}

struct Command {
  std::string name;
  std::vector<std::string> flags;  // what --help must name
  std::string value_flag;          // a flag that takes a value
  std::string int_flag;            // a flag that takes an integer
};

const std::vector<Command>& Commands() {
  static const std::vector<Command> k = {
      {"serve",
       {"--model",
        "--replicas",
        "--bind",
        "--replica-bind",
        "--config",
        "--engine",
        "--device",
        "--threads",
        "--max-queued",
        "--replica-timeout-ms",
        "--stream-timeout-ms",
        "--price-replica-hour",
        "--weights-load-timeout-ms",
        "--log-level",
        "--data-dir",
        "--durability",
        "--wal-commit-ms",
        "--wal-sync-window-ms",
        "--retention-max-age-s",
        "--retention-max-groups",
        "--max-client-buffer-bytes",
        "--tool-workers",
        "--tool-max-concurrent",
        "--tool-uid-base",
        "--tool-append-file",
        "--tool-append-delay-ms",
        "--price-sandbox-cpu-hour",
        "--tool-work-root",
        "--tool-disk-bytes",
        "--null-delay-us",
        "--null-vocab",
        "--skip-self-test",
        "--max-step-tokens",
        "--max-running",
        "--kv-dtype",
        "--prefix-cache",
        "--kv-disk-dir",
        "--swa-cache"},
       "--bind",
       "--replicas"},
      {"replica",
       {"--connect", "--model", "--name", "--engine", "--device", "--threads",
        "--weights-load-timeout-ms", "--log-level", "--skip-self-test"},
       "--connect",
       "--threads"},
      {"generate",
       {"--model",      "--tokenizer",   "--prompt",          "--prompts", "-n",
        "--max-tokens", "--steps",       "--temperature",     "--top-p",   "--top-k",
        "--min-p",      "--seed",        "--device",          "--threads", "--isa",
        "--attention",  "--kv-cache-mb", "--max-step-tokens", "--weights", "--kv-dtype",
        "--swa-cache",  "--json"},
       "--model",
       "--threads"},
      {"make-model", {"--shape", "--out", "--seed"}, "--out", "--seed"},
      {"self-test",
       {"--model", "--device", "--threads", "--isa", "--tokens"},
       "--model",
       "--tokens"},
      {"audit",
       {"FILE", "--data-dir", "--model", "--tokenizer", "--mode", "--json", "--device", "--threads",
        "--isa", "--attention", "--max-step-tokens", "--kv-cache-mb", "--kv-dtype", "--swa-cache"},
       "--mode",
       "--threads"},
      {"cost",
       {"FILE", "--format", "--price-replica-hour", "--price-sandbox-cpu-hour", "--long-context"},
       "--format",
       "--long-context"},
      {"update-weights",
       {"--connect", "--version", "--path", "--stream", "--full", "--drain", "--part-kib",
        "--timeout-ms"},
       "--connect",
       "--part-kib"},
  };
  return k;
}

// The one error style: "bitroll CMD: WHAT" and the hint, on stderr; exit 2; nothing on stdout.
void ExpectUsageError(const CmdResult& r, const std::string& cmd, const std::string& what,
                      const std::string& context) {
  EXPECT_EQ(r.rc, 2) << context << "\n" << r.err;
  EXPECT_NE(r.err.find("bitroll " + cmd + ": " + what), std::string::npos)
      << context << ": stderr is\n"
      << r.err;
  EXPECT_NE(r.err.find("Run 'bitroll " + cmd + " --help'"), std::string::npos)
      << context << ": no --help hint in\n"
      << r.err;
  EXPECT_TRUE(r.out.empty()) << context << ": stdout is\n" << r.out;
}

TEST(CliTest, HelpOnEveryCommandNamesItsFlags) {
  for (const Command& c : Commands()) {
    for (const char* help : {"--help", "-h"}) {
      const CmdResult r = Bitroll({c.name, help});
      EXPECT_EQ(r.rc, 0) << c.name << " " << help << "\n" << r.err;
      EXPECT_NE(r.out.find("bitroll " + c.name), std::string::npos) << c.name << "\n" << r.out;
      for (const std::string& f : c.flags) {
        EXPECT_NE(r.out.find(f), std::string::npos)
            << "`bitroll " << c.name << " " << help << "` does not name " << f << ":\n"
            << r.out;
      }
      EXPECT_TRUE(r.err.empty()) << c.name << " " << help << "\n" << r.err;
    }
  }
}

TEST(CliTest, HelpWinsOverOtherFlags) {
  const CmdResult r = Bitroll({"serve", "--engine", "null", "--no-such-flag", "--help"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("--replicas"), std::string::npos) << r.out;
}

TEST(CliTest, UnknownFlagIsOneErrorEverywhere) {
  for (const Command& c : Commands()) {
    ExpectUsageError(Bitroll({c.name, "--no-such-flag"}), c.name, "unknown flag --no-such-flag",
                     c.name + " --no-such-flag");
    ExpectUsageError(Bitroll({c.name, "--no-such-flag", "3"}), c.name,
                     "unknown flag --no-such-flag", c.name + " --no-such-flag 3");
  }
}

TEST(CliTest, MissingValueIsOneErrorEverywhere) {
  for (const Command& c : Commands()) {
    ExpectUsageError(Bitroll({c.name, c.value_flag}), c.name, c.value_flag + " needs a value",
                     c.name + " " + c.value_flag);
  }
}

TEST(CliTest, BadNumberIsOneErrorEverywhere) {
  for (const Command& c : Commands()) {
    for (const char* bad : {"12x", "x", "1.5"}) {
      ExpectUsageError(Bitroll({c.name, c.int_flag, bad}), c.name,
                       c.int_flag + ": '" + bad + "' is not an integer",
                       c.name + " " + c.int_flag + " " + bad);
    }
  }
  // Floating-point flags refuse trailing garbage too.
  ExpectUsageError(Bitroll({"generate", "--temperature", "0.5x"}), "generate",
                   "--temperature: '0.5x' is not a number", "generate --temperature 0.5x");
  ExpectUsageError(Bitroll({"serve", "--price-replica-hour", "2.5$"}), "serve",
                   "--price-replica-hour: '2.5$' is not a number", "serve --price-replica-hour");
  ExpectUsageError(Bitroll({"cost", "-", "--price-replica-hour", "2.5$"}), "cost",
                   "--price-replica-hour: '2.5$' is not a number", "cost --price-replica-hour");
  // An integer past its type's range names the range.
  ExpectUsageError(Bitroll({"serve", "--replicas", "99999999999"}), "serve",
                   "--replicas: '99999999999' is not an integer in [", "serve --replicas 1e11");
  ExpectUsageError(Bitroll({"update-weights", "--version", "-1"}), "update-weights",
                   "--version: '-1' is not an integer in [0, 18446744073709551615]",
                   "update-weights --version -1");
}

TEST(CliTest, UnexpectedArgumentIsAUsageError) {
  ExpectUsageError(Bitroll({"serve", "stray"}), "serve", "unexpected argument 'stray'",
                   "serve stray");
  ExpectUsageError(Bitroll({"cost", "a.jsonl", "b.jsonl"}), "cost", "unexpected argument 'b.jsonl'",
                   "cost a b");
}

TEST(CliTest, RequiredFlagsAreUsageErrors) {
  ExpectUsageError(Bitroll({"replica", "--engine", "null"}), "replica", "--connect", "replica");
  ExpectUsageError(Bitroll({"update-weights", "--version", "1"}), "update-weights", "--connect",
                   "update-weights");
  ExpectUsageError(Bitroll({"cost"}), "cost", "FILE", "cost");
  ExpectUsageError(Bitroll({"make-model", "--shape", "tiny"}), "make-model", "--out", "make-model");
  ExpectUsageError(Bitroll({"generate", "--json"}), "generate", "--model", "generate");
}

TEST(CliTest, ServeConfigFileErrorsAreUsageErrors) {
  const fs::path dir = fs::temp_directory_path() / ("bitroll_cli_cfg_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string cfg = (dir / "bad.json").string();
  std::ofstream(cfg) << R"({"replicaz": 2})";
  ExpectUsageError(Bitroll({"serve", "--config", cfg}), "serve",
                   cfg + ": unknown config key 'replicaz' in the top level",
                   "serve --config bad.json");
  ExpectUsageError(Bitroll({"serve", "--config"}), "serve", "--config needs a value",
                   "serve --config");
  fs::remove_all(dir);
}

TEST(CliTest, OverviewAndUnknownCommand) {
  for (const char* h : {"--help", "-h", "help"}) {
    const CmdResult r = Bitroll({h});
    EXPECT_EQ(r.rc, 0) << h;
    EXPECT_NE(r.out.find("usage: bitroll <command> [flags]"), std::string::npos) << h;
    for (const Command& c : Commands()) {
      EXPECT_NE(r.out.find("  " + c.name + " "), std::string::npos) << c.name << "\n" << r.out;
    }
  }
  const CmdResult none = Bitroll({});
  EXPECT_EQ(none.rc, 2);
  EXPECT_NE(none.err.find("usage: bitroll <command> [flags]"), std::string::npos) << none.err;
  const CmdResult bad = Bitroll({"frobnicate"});
  EXPECT_EQ(bad.rc, 2);
  EXPECT_NE(bad.err.find("bitroll: unknown command 'frobnicate'"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace bitroll::rollout
