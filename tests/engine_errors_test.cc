// Bad input reaches the engine as a typed error: no crash, no abort, nothing accepted is lost.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/make_model.h"
#include "engine/model_loader.h"
#include "tests/engine_test_util.h"

namespace bitroll {
namespace {

namespace fs = std::filesystem;
using testing_util::ModelsDir;

std::string Scratch(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) / "bitroll_engine_errors";
  fs::create_directories(dir);
  return (dir / name).string();
}

std::vector<char> ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(f), {});
}

void WriteAll(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

Status Open(const std::string& model, const std::string& tokenizer = "") {
  engine::EngineOptions o;
  o.model_path = model;
  o.tokenizer_path = tokenizer;
  return engine::OpenEngine(o).status();
}

TEST(EngineErrors, MissingModelIsNotFound) {
  const Status s = Open(Scratch("no-such-model.bin"));
  EXPECT_EQ(s.code(), ErrorCode::kNotFound) << s.ToString();
}

TEST(EngineErrors, TruncatedCheckpointIsCorruption) {
  std::vector<char> bytes = ReadAll(ModelsDir() + "/stories260K.bin");
  ASSERT_GT(bytes.size(), 1000u);
  bytes.resize(bytes.size() - 1000);
  const std::string path = Scratch("truncated.bin");
  WriteAll(path, bytes);
  const Status s = Open(path);
  EXPECT_EQ(s.code(), ErrorCode::kCorruption) << s.ToString();
}

TEST(EngineErrors, CorruptedHeaderIsRejected) {
  std::vector<char> bytes = ReadAll(ModelsDir() + "/stories260K.bin");
  ASSERT_GT(bytes.size(), 28u);
  const int32_t absurd = 1 << 30;  // n_layers
  std::memcpy(bytes.data() + 8, &absurd, 4);
  const std::string path = Scratch("bad-header.bin");
  WriteAll(path, bytes);
  const Status s = Open(path);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(s.code() == ErrorCode::kInvalidArgument || s.code() == ErrorCode::kCorruption)
      << s.ToString();
}

TEST(EngineErrors, TokenizerOfAnotherVocabularyIsRejected) {
  // A tokenizer file whose vocabulary (512) does not match a 300-token model.
  engine::ModelWeights w;
  auto weights = testing_util::Stories260K();
  ASSERT_NE(weights, nullptr);
  Result<std::unique_ptr<engine::Tokenizer>> t =
      engine::LoadTokenizerFor(ModelsDir() + "/stories260K.bin", ModelsDir() + "/tok512.bin", 300);
  EXPECT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), ErrorCode::kInvalidArgument) << t.status().ToString();
}

TEST(EngineErrors, BadRequestsGetTypedErrorsAndOthersContinue) {
  auto e = testing_util::MakeEngine({});
  ASSERT_NE(e, nullptr);
  engine::SequenceRequest good;
  good.id = 1;
  good.prompt = {1, 403, 407};
  good.stop.max_tokens = 8;
  ASSERT_TRUE(e->Add(good).ok());

  engine::SequenceRequest r = good;
  r.id = 2;
  r.prompt = {1, 512};
  EXPECT_EQ(e->Add(r).code(), ErrorCode::kOutOfRange);
  r.prompt = {1, -3};
  EXPECT_EQ(e->Add(r).code(), ErrorCode::kOutOfRange);
  r.prompt = {};
  EXPECT_EQ(e->Add(r).code(), ErrorCode::kInvalidArgument);
  r.prompt = std::vector<int32_t>(600, 5);
  EXPECT_EQ(e->Add(r).code(), ErrorCode::kOutOfRange);
  r.prompt = {1};
  r.stop.max_tokens = -4;
  EXPECT_EQ(e->Add(r).code(), ErrorCode::kInvalidArgument);
  r.stop.max_tokens = 4;
  r.sampling.temperature = -1.0f;
  EXPECT_EQ(e->Add(r).code(), ErrorCode::kInvalidArgument);
  r.sampling.temperature = 1.0f;
  r.sampling.top_p = 0.0f;
  EXPECT_EQ(e->Add(r).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(e->Add(good).code(), ErrorCode::kInvalidArgument) << "duplicate live id";
  EXPECT_EQ(e->Abort(99).code(), ErrorCode::kNotFound);

  auto out = testing_util::RunAll(*e, {});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[1].tokens.size(), 8u);
  EXPECT_EQ(out[1].finish, FinishReason::kLength);
}

// Issue 12 item 7: a temperature in (0, 1e-6) made every logprob NaN on the real model; it is
// refused with InvalidArgument, nothing is queued, and temperature 1e-6 runs with finite
// logprobs (greedy stays the reference for the T -> 0 limit).
TEST(EngineErrors, TinyTemperatureIsRefusedNeverNaN) {
  auto e = testing_util::MakeEngine({});
  ASSERT_NE(e, nullptr);
  for (float t : {1e-45f, 1e-38f, 5e-7f}) {
    engine::SequenceRequest r = testing_util::Target(1, testing_util::Sampled());
    r.sampling.temperature = t;
    const Status s = e->Add(r);
    EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << t << ": " << s.ToString();
  }
  EXPECT_FALSE(e->HasWork());
  engine::SequenceRequest r = testing_util::Target(2, testing_util::Sampled());
  r.sampling.temperature = 1e-6f;
  auto out = testing_util::RunAll(*e, {r});
  ASSERT_EQ(out.size(), 1u);
  ASSERT_FALSE(out[2].logprobs.empty());
  for (float lp : out[2].logprobs) EXPECT_FALSE(std::isnan(lp));
}

TEST(EngineErrors, AbortFinishesWithAbortedAndFreesBlocks) {
  auto e = testing_util::MakeEngine({});
  ASSERT_NE(e, nullptr);
  const int64_t free_before = e->stats().kv_blocks_free;
  engine::SequenceRequest r;
  r.id = 5;
  r.prompt = {1, 403, 407, 261, 378};
  r.stop.max_tokens = 100;
  ASSERT_TRUE(e->Add(r).ok());
  ASSERT_TRUE(e->Step().ok());
  ASSERT_TRUE(e->Step().ok());
  ASSERT_TRUE(e->Abort(5).ok());
  auto step = e->Step();
  ASSERT_TRUE(step.ok());
  ASSERT_EQ(step->finished.size(), 1u);
  EXPECT_EQ(step->finished[0].finish, FinishReason::kAborted);
  EXPECT_EQ(step->finished[0].tokens.size(), 2u);
  EXPECT_EQ(e->stats().kv_blocks_free, free_before);
  EXPECT_FALSE(e->HasWork());
}

// EngineOptions::kv_cache_bytes = 0 sizes the KV pool from the model and the machine: a model
// whose one full-context sequence needs more than the old fixed 256 MiB opens with no flag (it
// was refused: "holds fewer blocks than one full-context sequence needs"), and an explicit
// budget still means what it says.
TEST(EngineErrors, LongContextModelOpensWithTheDefaultKvBudget) {
  engine::ModelShape shape{"long", 256, 512, 4, 8, 8, 300, 34816};  // 8 KiB of K/V per token
  const std::string model = Scratch("long.bin");
  ASSERT_TRUE(engine::WriteRandomModel(shape, 1, model, Scratch("long_tok.bin")).ok());
  const int64_t per_sequence = int64_t{8192} * shape.max_seq_len;  // 272 MiB
  engine::EngineOptions o;
  o.model_path = model;
  auto e = engine::OpenEngine(o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const engine::EngineStats st = (*e)->stats();
  const int64_t tokens = st.kv_blocks_total * st.kv_block_tokens;
  EXPECT_GE(tokens, shape.max_seq_len) << "not even one full-context sequence fits";
  EXPECT_LE(tokens * 8192, engine::AutoKvCacheBytes(per_sequence, 0));  // at most 8 sequences
  o.kv_cache_bytes = 256ll << 20;  // the old default: refused, with the reason
  auto old = engine::OpenEngine(o);
  ASSERT_FALSE(old.ok());
  EXPECT_EQ(old.status().code(), ErrorCode::kInvalidArgument);
}

TEST(EngineErrors, AutoKvBudgetPolicy) {
  constexpr int64_t kMiB = 1 << 20;
  EXPECT_EQ(engine::AutoKvCacheBytes(1 * kMiB, 0), 256 * kMiB);    // small models: 256 MiB
  EXPECT_EQ(engine::AutoKvCacheBytes(100 * kMiB, 0), 800 * kMiB);  // 8 full sequences
  EXPECT_EQ(engine::AutoKvCacheBytes(100 * kMiB, 1000 * kMiB), 400 * kMiB);  // 40% of memory
  EXPECT_EQ(engine::AutoKvCacheBytes(600 * kMiB, 1000 * kMiB), 600 * kMiB);  // one sequence
}

}  // namespace
}  // namespace bitroll
