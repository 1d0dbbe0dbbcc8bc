// `bitroll generate` on its command-line edges (issue 12 items 7 and 9b), run as a child process:
//   - --seed takes the whole uint64 range of the wire seed: 18446744073709551615 runs, is
//     deterministic, and equals (memcmp of ids and logprob bits) the same request through the
//     service and the C++ client; a negative or too large seed is a clear usage error;
//   - --temperature in (0, 1e-6) is refused (it gave NaN logprobs), like other out-of-range
//     sampling flags, before any model is loaded.
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "rollout/cli_test_util.h"
#include "rollout/client.h"
#include "rollout/coordinator.h"

namespace bitroll::rollout {
namespace {

namespace fs = std::filesystem;
constexpr int kTimeoutMs = 60000;
constexpr const char* kMaxSeed = "18446744073709551615";  // 2^64 - 1

std::string ModelPath() {
  return std::string(BITROLL_MODELS_DIR) + "/stories260K.bin";
}

// Runs `bitroll generate ARGS` (model, tokenizer and a short generation added) and collects its
// exit status, stdout and stderr.
CmdResult Generate(const std::vector<std::string>& args) {
  std::string cmd = ShellQuote(BITROLL_EXE) + " generate --model " + ShellQuote(ModelPath()) +
                    " --tokenizer " + ShellQuote(std::string(BITROLL_MODELS_DIR) + "/tok512.bin") +
                    " --prompt 'Once upon a time' -n 2 --max-tokens 24";
  for (const auto& a : args) cmd += " " + ShellQuote(a);
  return RunShell(cmd);
}

struct Sample {
  std::vector<int32_t> ids;
  std::vector<uint32_t> bits;  // fp32 logprob bit patterns
};

// sample index -> trajectory, from generate's JSON lines.
std::map<uint32_t, Sample> Parse(const std::string& out) {
  std::map<uint32_t, Sample> m;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("ids")) continue;
    Sample s;
    s.ids = j["ids"].get<std::vector<int32_t>>();
    for (const auto& h : j["logprob_bits"]) {
      s.bits.push_back(static_cast<uint32_t>(std::stoul(h.get<std::string>(), nullptr, 16)));
    }
    m[j["sample_index"].get<uint32_t>()] = std::move(s);
  }
  return m;
}

bool Same(const Sample& a, const Sample& b) {
  return a.ids.size() == b.ids.size() && a.bits.size() == b.bits.size() && !a.ids.empty() &&
         std::memcmp(a.ids.data(), b.ids.data(), 4 * a.ids.size()) == 0 &&
         std::memcmp(a.bits.data(), b.bits.data(), 4 * a.bits.size()) == 0;
}

bool HasNaN(const Sample& s) {
  for (uint32_t b : s.bits) {
    if ((b & 0x7F800000u) == 0x7F800000u && (b & 0x007FFFFFu) != 0) return true;
  }
  return false;
}

bool HaveModel() {
  return access(ModelPath().c_str(), R_OK) == 0;
}

TEST(GenerateCliTest, SeedTakesTheWholeUint64RangeAndMatchesTheService) {
  if (!HaveModel()) GTEST_SKIP() << "no " << ModelPath();
  const CmdResult a = Generate({"--seed", kMaxSeed, "--json"});
  ASSERT_EQ(a.rc, 0) << a.err;
  const auto ga = Parse(a.out);
  ASSERT_EQ(ga.size(), 2u) << a.out;
  const CmdResult b = Generate({"--seed", kMaxSeed, "--json"});
  ASSERT_EQ(b.rc, 0) << b.err;
  const auto gb = Parse(b.out);
  ASSERT_EQ(gb.size(), 2u);
  for (uint32_t i = 0; i < 2; ++i) EXPECT_TRUE(Same(ga.at(i), gb.at(i))) << "sample " << i;
  // Negative control: the neighbouring seed gives other tokens.
  const CmdResult c = Generate({"--seed", "18446744073709551614", "--json"});
  ASSERT_EQ(c.rc, 0) << c.err;
  const auto gc = Parse(c.out);
  ASSERT_EQ(gc.size(), 2u);
  EXPECT_FALSE(Same(ga.at(0), gc.at(0)) && Same(ga.at(1), gc.at(1)));

  // The same request through the service (one in-process replica on the real engine).
  engine::EngineOptions eo;
  eo.model_path = ModelPath();
  eo.tokenizer_path = std::string(BITROLL_MODELS_DIR) + "/tok512.bin";
  auto e = engine::OpenEngine(eo);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  std::vector<std::unique_ptr<engine::Engine>> engines;
  engines.push_back(std::move(e).value());
  CoordinatorOptions o;
  o.bind = "tcp://127.0.0.1:*";
  auto coord = Coordinator::Start(o, std::move(engines));
  ASSERT_TRUE(coord.ok()) << coord.status().ToString();
  ClientOptions co;
  co.endpoint = (*coord)->endpoint();
  auto client = Client::Connect(co);
  ASSERT_TRUE(client.ok());
  SubmitRequest q;
  q.group_id = 1;
  q.text_prompts = {"Once upon a time"};
  q.n = 2;
  q.temperature = 1.0f;
  q.top_p = 0.9f;  // generate's default
  q.seed = ~0ull;
  q.max_tokens = 24;
  auto r = (*client)->Run(q, kTimeoutMs);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 2u);
  for (const TrajectoryResult& t : *r) {
    Sample s;
    s.ids = t.ids;
    s.bits.resize(t.logprobs.size());
    std::memcpy(s.bits.data(), t.logprobs.data(), 4 * t.logprobs.size());
    EXPECT_TRUE(Same(s, ga.at(t.sample_index))) << "sample " << t.sample_index;
  }
}

// make-model's MoE shape through the command line: `generate --json --routes` records routing,
// `bitroll audit` re-derives it (exit 0), and a record with one flipped routing weight bit is a
// divergence (exit 1) naming the routing.
TEST(GenerateCliTest, MoeRoutesAreRecordedAndAudited) {
  const fs::path dir = fs::temp_directory_path() / ("bitroll_gen_moe_" + std::to_string(getpid()));
  fs::remove_all(dir);
  const std::string exe = ShellQuote(BITROLL_EXE);
  ASSERT_EQ(
      RunShell(exe + " make-model --shape qwen3-moe-tiny --out " + ShellQuote((dir / "m").string()))
          .rc,
      0);
  const CmdResult gen = RunShell(exe + " generate --model " + ShellQuote((dir / "m").string()) +
                                 " --prompt hello -n 2 --max-tokens 12 --json --routes");
  ASSERT_EQ(gen.rc, 0) << gen.err;
  std::istringstream in(gen.out);
  std::string line, bad;
  int routed = 0;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("routing")) continue;
    ++routed;
    EXPECT_EQ(j["routing"]["shape"][1], 2);  // layers
    EXPECT_EQ(j["routing"]["shape"][2], 2);  // top-2
    auto& bits = j["routing"]["weight_bits"];
    const uint32_t b =
        static_cast<uint32_t>(std::stoul(bits.back().get<std::string>(), nullptr, 16));
    char hex[9];
    std::snprintf(hex, sizeof(hex), "%08x", b ^ 1u);
    bits.back() = hex;
    bad += j.dump() + "\n";
  }
  EXPECT_EQ(routed, 2);
  std::ofstream((dir / "good.jsonl").string()) << gen.out;
  std::ofstream((dir / "bad.jsonl").string()) << bad;
  const std::string audit = exe + " audit --model " + ShellQuote((dir / "m").string()) + " ";
  const CmdResult ok = RunShell(audit + ShellQuote((dir / "good.jsonl").string()));
  EXPECT_EQ(ok.rc, 0) << ok.out << ok.err;
  const CmdResult caught = RunShell(audit + ShellQuote((dir / "bad.jsonl").string()));
  EXPECT_EQ(caught.rc, 1) << caught.out << caught.err;
  EXPECT_NE(caught.out.find("routing differs"), std::string::npos) << caught.out;
  fs::remove_all(dir);
}

TEST(GenerateCliTest, OutOfRangeSeedIsAClearError) {
  for (const char* seed :
       {"-1", "18446744073709551616", "99999999999999999999999", "1.5", "0x10", ""}) {
    const CmdResult r = Generate({std::string("--seed=") + seed, "--json"});
    EXPECT_EQ(r.rc, 2) << seed << ": " << r.err;
    EXPECT_NE(r.err.find("--seed"), std::string::npos) << seed << ": " << r.err;
    EXPECT_TRUE(r.out.empty()) << seed;
  }
  const CmdResult neg = Generate({"--seed", "-1", "--json"});
  EXPECT_EQ(neg.rc, 2);
  EXPECT_NE(neg.err.find("[0, 18446744073709551615]"), std::string::npos) << neg.err;
}

TEST(GenerateCliTest, TinyTemperatureAndOtherBadSamplingFlagsAreRefused) {
  const std::vector<std::vector<std::string>> bad = {
      {"--temperature", "1e-38"}, {"--temperature", "1e-45"}, {"--temperature", "5e-7"},
      {"--temperature", "1e39"},  {"--temperature", "nan"},   {"--temperature", "inf"},
      {"--temperature", "-1"},    {"--top-p", "0"},           {"--top-p", "1.5"},
      {"--min-p", "-0.1"},        {"--min-p", "2"},           {"--top-k", "-1"},
      {"--top-k", "4294967296"}};
  for (const auto& flags : bad) {
    std::vector<std::string> args = flags;
    args.push_back("--json");
    const CmdResult r = Generate(args);
    EXPECT_EQ(r.rc, 2) << flags[0] << " " << flags[1] << ": " << r.err;
    std::string field = flags[0].substr(2);  // the message names the field: top_p, min_p, ...
    for (char& ch : field) ch = ch == '-' ? '_' : ch;
    EXPECT_NE(r.err.find(field), std::string::npos) << flags[0] << " " << flags[1] << ": " << r.err;
    EXPECT_TRUE(r.out.empty()) << flags[0] << " " << flags[1] << ": " << r.out;
  }
}

TEST(GenerateCliTest, EdgeSamplingFlagsRunWithoutNaN) {
  if (!HaveModel()) GTEST_SKIP() << "no " << ModelPath();
  const std::vector<std::vector<std::string>> good = {{"--temperature", "1e-6"},
                                                      {"--temperature", "3e38"},
                                                      {"--top-p", "1e-45", "--min-p", "1"},
                                                      {"--top-k", "2147483647", "--top-p", "1"}};
  for (const auto& flags : good) {
    std::vector<std::string> args = flags;
    args.push_back("--json");
    const CmdResult r = Generate(args);
    ASSERT_EQ(r.rc, 0) << flags[0] << ": " << r.err;
    const auto g = Parse(r.out);
    ASSERT_EQ(g.size(), 2u) << flags[0];
    for (const auto& [i, s] : g) {
      EXPECT_FALSE(s.ids.empty());
      EXPECT_FALSE(HasNaN(s)) << flags[0] << " " << flags[1] << " sample " << i;
    }
  }
  // The 1e-6 limit is as greedy as it gets: both samples take the greedy tokens here.
  const CmdResult greedy = Generate({"--temperature", "0", "--json"});
  ASSERT_EQ(greedy.rc, 0) << greedy.err;
  const CmdResult tiny = Generate({"--temperature", "1e-6", "--json"});
  ASSERT_EQ(tiny.rc, 0) << tiny.err;
  const auto gg = Parse(greedy.out), gt = Parse(tiny.out);
  ASSERT_EQ(gg.size(), 2u);
  ASSERT_EQ(gt.size(), 2u);
  EXPECT_EQ(gg.at(0).ids, gt.at(0).ids);
  EXPECT_EQ(gg.at(1).ids, gt.at(1).ids);
}

}  // namespace
}  // namespace bitroll::rollout
