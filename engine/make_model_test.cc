// Tests for the random-model writer: loadable, reproducible, seed-dependent, usable tokenizer.
#include "engine/make_model.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/loaders/llama2c.h"
#include "engine/make_model_hf.h"
#include "engine/tokenizers/llama2c_tokenizer.h"
#include "kernels/cpu/philox.h"

namespace bitroll::engine {
namespace {

// Removes the temporary files a test binary created when it exits.
std::vector<std::string>& CreatedFiles() {
  static std::vector<std::string> files;
  return files;
}
class RemoveCreatedFiles : public ::testing::Environment {
 public:
  void TearDown() override {
    for (const std::string& f : CreatedFiles()) std::remove(f.c_str());
  }
};
[[maybe_unused]] ::testing::Environment* const kCleanup =
    ::testing::AddGlobalTestEnvironment(new RemoveCreatedFiles);

std::string Temp(const std::string& name) {
  // The pid keeps concurrent runs (several build trees, ctest -j) apart.
  const std::string path =
      ::testing::TempDir() + "/make_model_" + std::to_string(::getpid()) + "_" + name;
  CreatedFiles().push_back(path);
  return path;
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(MakeModelTest, NamedShapes) {
  struct Want {
    const char* name;
    int32_t v[7];
  };
  const Want wants[] = {
      {"stories110m", {768, 2048, 12, 12, 12, 32000, 1024}},
      {"stories110m-gqa", {768, 2048, 12, 12, 4, 32000, 1024}},
      {"stories260k", {64, 172, 5, 8, 4, 512, 512}},
      {"stories15m", {288, 768, 6, 6, 6, 32000, 256}},
      {"tiny", {32, 64, 2, 4, 2, 300, 128}},
      {"qwen0.5b-like", {896, 4864, 24, 14, 2, 151936, 4096}},
  };
  for (const Want& w : wants) {
    auto s = NamedShape(w.name);
    ASSERT_TRUE(s.ok()) << w.name;
    const int32_t got[7] = {s->dim,        s->hidden_dim, s->n_layers,   s->n_heads,
                            s->n_kv_heads, s->vocab_size, s->max_seq_len};
    EXPECT_EQ(std::memcmp(got, w.v, sizeof(got)), 0) << w.name;
    EXPECT_EQ(s->name, w.name);
  }
  auto bad = NamedShape("stories7b");
  EXPECT_EQ(bad.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(bad.status().message().find("tiny"), std::string::npos);
}

// The regime benchmark's hybrid model (docs/regimes.md): Gemma-3-like five sliding layers of
// window 128 per full one, an 8K context. Its figures in docs/ depend on exactly this shape.
TEST(MakeModelTest, HybridBenchShape) {
  auto s = NamedHfShape("hybrid-bench");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  const int32_t want[] = {256, 768, 12, 4, 2, 64, 8192, 8192, 0, 128, 6, 0};
  const int32_t got[] = {s->dim,        s->hidden_dim,     s->n_layers,   s->n_heads,
                         s->n_kv_heads, s->head_dim,       s->vocab_size, s->max_seq_len,
                         s->n_experts,  s->sliding_window, s->full_every, s->sinks ? 1 : 0};
  EXPECT_EQ(std::memcmp(got, want, sizeof(got)), 0);
  EXPECT_EQ(s->arch, "qwen3");
  auto bad = NamedHfShape("hybrid-bench-xl");
  EXPECT_EQ(bad.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(bad.status().message().find("hybrid-bench"), std::string::npos);
}

TEST(MakeModelTest, TinyModelLoadsAndIsReproducible) {
  auto shape = NamedShape("tiny");
  ASSERT_TRUE(shape.ok());
  ASSERT_TRUE(WriteRandomModel(*shape, 42, Temp("a.bin"), Temp("a_tok.bin")).ok());
  ASSERT_TRUE(WriteRandomModel(*shape, 42, Temp("b.bin"), Temp("b_tok.bin")).ok());
  ASSERT_TRUE(WriteRandomModel(*shape, 43, Temp("c.bin"), Temp("c_tok.bin")).ok());
  auto a = LoadLlama2c(Temp("a.bin"));
  auto b = LoadLlama2c(Temp("b.bin"));
  auto c = LoadLlama2c(Temp("c.bin"));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok() && c.ok());
  EXPECT_EQ(a->config.dim, 32);
  EXPECT_EQ(a->config.hidden_dim, 64);
  EXPECT_EQ(a->config.n_layers, 2);
  EXPECT_EQ(a->config.n_heads, 4);
  EXPECT_EQ(a->config.n_kv_heads, 2);
  EXPECT_EQ(a->config.vocab_size, 300);
  EXPECT_EQ(a->config.max_seq_len, 128);
  EXPECT_TRUE(a->config.shared_classifier);
  EXPECT_EQ(a->weights_hash, b->weights_hash);
  EXPECT_EQ(ReadAll(Temp("a.bin")), ReadAll(Temp("b.bin")));
  EXPECT_EQ(ReadAll(Temp("a_tok.bin")), ReadAll(Temp("b_tok.bin")));
  EXPECT_NE(a->weights_hash, c->weights_hash);

  // The first embedding value is element 0 of the documented weight stream.
  const kernels::PhiloxCounter x = kernels::Philox4x32_10({0, 0, 0x6D6F646C, 0}, {42, 0});
  const double sum = (double(x[0]) + double(x[1]) + double(x[2]) + double(x[3])) / 4294967296.0;
  const float want0 = float(0.02 * std::sqrt(3.0) * (sum - 2.0));
  EXPECT_EQ(std::memcmp(a->token_embedding.data, &want0, 4), 0);

  // Norm weights are exactly 1; weights have mean ~0 and standard deviation ~0.02.
  const float* norm = static_cast<const float*>(a->layers[1].ffn_norm.data);
  for (int i = 0; i < 32; ++i) ASSERT_EQ(norm[i], 1.0f);
  const float* w1 = static_cast<const float*>(a->layers[0].w1.data);
  double mean = 0, sq = 0;
  const int64_t n = a->layers[0].w1.numel();
  for (int64_t i = 0; i < n; ++i) mean += w1[i], sq += double(w1[i]) * w1[i];
  mean /= double(n);
  const double sd = std::sqrt(sq / double(n) - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.002);
  EXPECT_NEAR(sd, 0.02, 0.002);
}

TEST(MakeModelTest, TokenizerLoadsAndRoundTripsAscii) {
  auto shape = NamedShape("tiny");
  ASSERT_TRUE(shape.ok());
  ASSERT_TRUE(WriteRandomModel(*shape, 1, Temp("t.bin"), Temp("t_tok.bin")).ok());
  auto tok = LoadLlama2cTokenizer(Temp("t_tok.bin"), shape->vocab_size);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->vocab_size(), 300);
  for (const char* text :
       {"Once upon a time, there was a tiny model.", "x", "  two spaces",
        "tabs\tand\nnewlines ~!@#$%^&*()_+{}|:\"?>[]\\;',./`", "UTF-8: \xC3\xA9\xE4\xB8\xAD"}) {
    auto ids = (*tok)->Encode(text, true);
    ASSERT_TRUE(ids.ok());
    for (int32_t id : *ids) ASSERT_LT(id, 300);
    auto back = (*tok)->Decode(std::span<const int32_t>(*ids).subspan(1), 1);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, text);
  }
  // The vocab of a larger shape has merged pieces: common text takes fewer tokens than bytes.
  ModelShape mid = *shape;
  mid.vocab_size = 2000;
  ASSERT_TRUE(WriteRandomModel(mid, 1, Temp("m.bin"), Temp("m_tok.bin")).ok());
  auto tok2 = LoadLlama2cTokenizer(Temp("m_tok.bin"), 2000);
  ASSERT_TRUE(tok2.ok());
  const std::string text = "the cat sat on the mat and then it ran off";
  auto ids = (*tok2)->Encode(text, false);
  ASSERT_TRUE(ids.ok());
  EXPECT_LT(ids->size(), text.size() / 2);
  auto back = (*tok2)->Decode(*ids, -1);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, " " + text);
}

TEST(MakeModelTest, BadShapesAndPaths) {
  ModelShape s = *NamedShape("tiny");
  s.n_kv_heads = 3;
  EXPECT_EQ(WriteRandomModel(s, 1, Temp("x.bin"), Temp("x_tok.bin")).code(),
            ErrorCode::kInvalidArgument);
  s = *NamedShape("tiny");
  s.vocab_size = 200;
  EXPECT_EQ(WriteRandomModel(s, 1, Temp("x.bin"), Temp("x_tok.bin")).code(),
            ErrorCode::kInvalidArgument);
  s = *NamedShape("tiny");
  EXPECT_EQ(WriteRandomModel(s, 1, Temp("no/such/dir/x.bin"), Temp("x_tok.bin")).code(),
            ErrorCode::kIoError);
}

}  // namespace
}  // namespace bitroll::engine
