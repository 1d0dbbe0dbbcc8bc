// Golden: greedy generation from the real stories260K model equals the reference implementation
// (karpathy/llama2.c run.c) token for token and byte for byte.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/engine_test_util.h"

namespace bitroll {
namespace {

using testing_util::ModelsDir;
using testing_util::ReadGoldenIds;

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

engine::SequenceOutput Greedy(const std::string& isa, const std::vector<int32_t>& prompt,
                              int steps) {
  testing_util::EngineSetup setup;
  setup.isa = isa;
  auto e = testing_util::MakeEngine(setup);
  if (e == nullptr) return {};
  auto out = testing_util::RunAll(*e, {testing_util::RunCRequest(1, prompt, steps)});
  return out[1];
}

TEST(Golden, OnceUponATimeGreedy256MatchesRunC) {
  std::vector<int32_t> prompt, seq;
  ASSERT_TRUE(ReadGoldenIds(ModelsDir() + "/golden/once_upon_n256.ids.txt", &prompt, &seq));
  auto tok = testing_util::Tok512();
  ASSERT_NE(tok, nullptr);
  Result<std::vector<int32_t>> enc = tok->Encode("Once upon a time", true);
  ASSERT_TRUE(enc.ok()) << enc.status().ToString();
  EXPECT_EQ(*enc, prompt);

  const engine::SequenceOutput out = Greedy("auto", prompt, 256);
  const std::vector<int32_t> got = testing_util::RunCSequence(prompt, out.tokens);
  ASSERT_EQ(got.size(), seq.size());
  EXPECT_EQ(got, seq);

  std::string text;
  int32_t prev = prompt[0];
  for (int32_t id : got) {
    Result<std::string> piece = tok->DecodePiece(prev, id);
    ASSERT_TRUE(piece.ok()) << piece.status().ToString();
    text += engine::PrintablePiece(*piece);
    prev = id;
  }
  text += "\n";
  EXPECT_EQ(text, ReadFile(ModelsDir() + "/golden/once_upon_n256.txt"));
}

TEST(Golden, EveryIsaGivesTheSameGreedyBits) {
  std::vector<int32_t> prompt, seq;
  ASSERT_TRUE(ReadGoldenIds(ModelsDir() + "/golden/once_upon_n256.ids.txt", &prompt, &seq));
  const engine::SequenceOutput scalar = Greedy("scalar", prompt, 128);
  ASSERT_FALSE(scalar.tokens.empty());
  for (const char* isa : {"avx2", "avx512"}) {
    if (!kernels::ParseIsa(isa).ok()) {
      std::cerr << "*** golden_test: this CPU lacks " << isa << "; that path is NOT tested ***\n";
      continue;
    }
    EXPECT_TRUE(testing_util::SameTrajectory(scalar, Greedy(isa, prompt, 128))) << isa;
  }
}

// More prompts, each checked against the reference forward pass (tests/golden/README.md).
TEST(Golden, MorePromptsMatchTheReferenceForwardPass) {
  std::ifstream f(std::string(BITROLL_SOURCE_DIR) + "/tests/golden/run_c_greedy_stories260K.tsv");
  ASSERT_TRUE(f.good());
  auto tok = testing_util::Tok512();
  ASSERT_NE(tok, nullptr);
  std::string line;
  int checked = 0;
  while (std::getline(f, line)) {
    std::istringstream cols(line);
    std::string text, prompt_s, want_s;
    std::getline(cols, text, '\t');
    std::getline(cols, prompt_s, '\t');
    std::getline(cols, want_s, '\t');
    std::vector<int32_t> prompt, want;
    std::istringstream ps(prompt_s), ws(want_s);
    for (int32_t x; ps >> x;) prompt.push_back(x);
    for (int32_t x; ws >> x;) want.push_back(x);
    Result<std::vector<int32_t>> enc = tok->Encode(text, true);
    ASSERT_TRUE(enc.ok());
    EXPECT_EQ(*enc, prompt) << text;
    const engine::SequenceOutput out = Greedy("auto", prompt, 200);
    // run.c stops before printing BOS; bitroll reports the stop token as part of the trajectory.
    std::vector<int32_t> got = out.tokens;
    if (out.finish == FinishReason::kEos && !got.empty() && got.back() == 1) got.pop_back();
    EXPECT_EQ(got, want) << text;
    ++checked;
  }
  EXPECT_GE(checked, 5);
}

}  // namespace
}  // namespace bitroll
