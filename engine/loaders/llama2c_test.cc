// Tests for the llama2.c checkpoint loader: the real stories260K.bin and damaged copies of it.
#include "engine/loaders/llama2c.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace bitroll::engine {
namespace {

std::string ModelsDir() {
  const char* env = std::getenv("BITROLL_MODELS_DIR");
  return env != nullptr && env[0] != '\0' ? std::string(env) : std::string(BITROLL_MODELS_DIR);
}
std::string ModelPath() {
  return ModelsDir() + "/stories260K.bin";
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

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

std::string WriteTemp(const std::string& name, const std::string& data) {
  // The pid keeps concurrent runs (several build trees, ctest -j) apart.
  const std::string path =
      ::testing::TempDir() + "/llama2c_" + std::to_string(::getpid()) + "_" + name;
  CreatedFiles().push_back(path);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(data.data(), std::streamsize(data.size()));
  return path;
}

void SetHeader(std::string* data, int index, int32_t value) {
  std::memcpy(&(*data)[size_t(index) * 4], &value, 4);
}

class Stories260KTest : public ::testing::Test {
 protected:
  void SetUp() override {
    raw_ = ReadAll(ModelPath());
    ASSERT_FALSE(raw_.empty()) << "the real test model is required (set BITROLL_MODELS_DIR): "
                               << ModelPath();
  }
  std::string raw_;
};

TEST_F(Stories260KTest, LoadsHeaderAsDocumentedInReadme) {
  auto r = LoadLlama2c(ModelPath());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const ModelConfig& c = r->config;
  // README.txt: dim=64 hidden_dim=172 n_layers=5 n_heads=8 n_kv_heads=4 vocab_size=512
  // (positive: shared classifier) seq_len=512; interleaved RoPE; BOS=1, EOS=2.
  EXPECT_EQ(c.arch, "llama");
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 172);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.max_seq_len, 512);
  EXPECT_EQ(c.head_dim(), 8);
  EXPECT_EQ(c.kv_dim(), 32);
  EXPECT_TRUE(c.shared_classifier);
  EXPECT_EQ(c.rope_layout, kernels::RopeLayout::kInterleaved);
  EXPECT_EQ(c.bos_id, 1);
  EXPECT_EQ(c.eos_id, 2);
  EXPECT_EQ(r->source, "llama2c:stories260K.bin");
  ASSERT_EQ(r->layers.size(), 5u);
  EXPECT_EQ(r->classifier.data, r->token_embedding.data);
  EXPECT_TRUE(r->storage != nullptr);
  EXPECT_EQ(r->layers[0].bq.data, nullptr);
}

// Each tensor view holds the bytes at the offset computed here from the format description.
TEST_F(Stories260KTest, TensorsPointAtTheRightBytes) {
  auto r = LoadLlama2c(ModelPath());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const int64_t D = 64, H = 172, L = 5, V = 512, KV = 32;
  int64_t off = 28;  // bytes
  auto expect_at = [&](const Tensor& t, std::vector<int64_t> shape, int64_t count) {
    EXPECT_EQ(t.shape, shape);
    ASSERT_EQ(t.numel(), count);
    ASSERT_LE(off + count * 4, int64_t(raw_.size()));
    EXPECT_EQ(std::memcmp(t.data, raw_.data() + off, size_t(count) * 4), 0) << "offset " << off;
  };
  expect_at(r->token_embedding, {V, D}, V * D);
  off += V * D * 4;
  const int64_t rms_att = off;
  const int64_t wq = rms_att + L * D * 4, wk = wq + L * D * D * 4, wv = wk + L * KV * D * 4;
  const int64_t wo = wv + L * KV * D * 4, rms_ffn = wo + L * D * D * 4, w1 = rms_ffn + L * D * 4;
  const int64_t w2 = w1 + L * H * D * 4, w3 = w2 + L * D * H * 4, fin = w3 + L * H * D * 4;
  for (int64_t l = 0; l < L; ++l) {
    const LayerWeights& lw = r->layers[size_t(l)];
    off = rms_att + l * D * 4, expect_at(lw.attn_norm, {D}, D);
    off = wq + l * D * D * 4, expect_at(lw.wq, {D, D}, D * D);
    off = wk + l * KV * D * 4, expect_at(lw.wk, {KV, D}, KV * D);
    off = wv + l * KV * D * 4, expect_at(lw.wv, {KV, D}, KV * D);
    off = wo + l * D * D * 4, expect_at(lw.wo, {D, D}, D * D);
    off = rms_ffn + l * D * 4, expect_at(lw.ffn_norm, {D}, D);
    off = w1 + l * H * D * 4, expect_at(lw.w1, {H, D}, H * D);
    off = w2 + l * D * H * 4, expect_at(lw.w2, {D, H}, D * H);
    off = w3 + l * H * D * 4, expect_at(lw.w3, {H, D}, H * D);
  }
  off = fin, expect_at(r->final_norm, {D}, D);
  // Then the two RoPE tables [seq_len][head_dim/2], and nothing after them.
  EXPECT_EQ(fin + D * 4 + 2 * 512 * 4 * 4, int64_t(raw_.size()));
}

TEST_F(Stories260KTest, WeightsHashIsStableAndSeesEveryByteChange) {
  auto a = LoadLlama2c(ModelPath());
  auto b = LoadLlama2c(ModelPath());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->weights_hash, b->weights_hash);
  EXPECT_NE(a->weights_hash, 0u);
  // Negative control: flipping one bit of the last layer's w3 changes the hash.
  std::string changed = raw_;
  const size_t fin = raw_.size() - 2 * 512 * 4 * 4 - 64 * 4;
  changed[fin - 5] ^= 0x01;
  auto c = LoadLlama2c(WriteTemp("bitflip.bin", changed));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_NE(c->weights_hash, a->weights_hash);
  // The skipped RoPE tables are not weights: changing them leaves the hash alone.
  std::string rope = raw_;
  rope[raw_.size() - 3] ^= 0x01;
  auto d = LoadLlama2c(WriteTemp("ropeflip.bin", rope));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->weights_hash, a->weights_hash);
}

TEST_F(Stories260KTest, SeparateClassifierWhenVocabIsNegative) {
  std::string data = raw_;
  SetHeader(&data, 5, -512);
  std::string cls(512 * 64 * 4, '\0');
  for (size_t i = 0; i < cls.size(); ++i) cls[i] = char(i * 7);
  data += cls;
  auto r = LoadLlama2c(WriteTemp("sepcls.bin", data));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->config.shared_classifier);
  EXPECT_EQ(r->config.vocab_size, 512);
  EXPECT_NE(r->classifier.data, r->token_embedding.data);
  EXPECT_EQ(std::memcmp(r->classifier.data, cls.data(), cls.size()), 0);
  // Without the classifier bytes the same header is a truncated file.
  std::string no_cls = raw_;
  SetHeader(&no_cls, 5, -512);
  auto t = LoadLlama2c(WriteTemp("sepcls_trunc.bin", no_cls));
  EXPECT_EQ(t.status().code(), ErrorCode::kCorruption);
}

TEST_F(Stories260KTest, TruncatedOrPaddedFileIsCorruption) {
  const std::string n = std::to_string(raw_.size());
  for (size_t cut : {size_t(4), size_t(1000)}) {
    auto r = LoadLlama2c(WriteTemp("trunc.bin", raw_.substr(0, raw_.size() - cut)));
    ASSERT_EQ(r.status().code(), ErrorCode::kCorruption) << r.status().ToString();
    const std::string want =
        "expected " + n + " bytes for this header, file has " + std::to_string(raw_.size() - cut);
    EXPECT_NE(r.status().message().find(want), std::string::npos) << r.status().message();
  }
  auto p = LoadLlama2c(WriteTemp("padded.bin", raw_ + "x"));
  ASSERT_EQ(p.status().code(), ErrorCode::kCorruption);
  EXPECT_NE(p.status().message().find("trailing"), std::string::npos) << p.status().message();
  auto tiny = LoadLlama2c(WriteTemp("tiny.bin", raw_.substr(0, 10)));
  ASSERT_EQ(tiny.status().code(), ErrorCode::kCorruption);
  EXPECT_NE(tiny.status().message().find("file has 10"), std::string::npos);
  auto empty = LoadLlama2c(WriteTemp("empty.bin", ""));
  EXPECT_EQ(empty.status().code(), ErrorCode::kCorruption);
}

TEST_F(Stories260KTest, BadHeaderValuesAreInvalidArgument) {
  struct Case {
    int index;
    int32_t value;
    const char* words;
  };
  const Case cases[] = {
      {0, 0, "dim must be > 0"},
      {0, -64, "dim must be > 0"},
      {1, 0, "hidden_dim must be > 0"},
      {2, 0, "n_layers must be > 0"},
      {3, 0, "n_heads must be > 0"},
      {3, 7, "not a multiple of n_heads"},
      {4, 3, "not a multiple of n_kv_heads"},
      {4, 0, "n_kv_heads must be > 0"},
      {3, 64, "head_dim 1 must be even"},
      {5, 0, "vocab_size must be > 0"},
      {6, -1, "max_seq_len must be > 0"},
      {0, 1 << 30, "overflow"},
  };
  for (const Case& c : cases) {
    std::string data = raw_;
    SetHeader(&data, c.index, c.value);
    if (c.index == 0 && c.value == (1 << 30)) {
      SetHeader(&data, 1, 1 << 30);  // hidden_dim too: the byte count overflows int64
      SetHeader(&data, 2, 1 << 20);
    }
    auto r = LoadLlama2c(WriteTemp("badheader.bin", data));
    ASSERT_EQ(r.status().code(), ErrorCode::kInvalidArgument)
        << "field " << c.index << " = " << c.value << ": " << r.status().ToString();
    EXPECT_NE(r.status().message().find(c.words), std::string::npos) << r.status().message();
  }
}

TEST(Llama2cLoaderTest, MissingFileAndWrongKinds) {
  auto missing = LoadLlama2c(::testing::TempDir() + "/no_such_model.bin");
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
  auto dir = LoadLlama2c(::testing::TempDir());
  EXPECT_EQ(dir.status().code(), ErrorCode::kInvalidArgument);
  std::string v1(256, '\0');
  const uint32_t magic = 0x616b3432, version = 1;
  std::memcpy(&v1[0], &magic, 4);
  std::memcpy(&v1[4], &version, 4);
  auto ak42 = LoadLlama2c(WriteTemp("v1.bin", v1));
  EXPECT_EQ(ak42.status().code(), ErrorCode::kUnsupported);
  EXPECT_NE(ak42.status().message().find("version 1"), std::string::npos);
  auto gguf = LoadLlama2c(ModelsDir() + "/stories260K.gguf");
  EXPECT_EQ(gguf.status().code(), ErrorCode::kUnsupported) << gguf.status().ToString();
}

TEST(ModelConfigTest, Validate) {
  ModelConfig c;
  c.dim = 64, c.hidden_dim = 172, c.n_layers = 5, c.n_heads = 8, c.n_kv_heads = 4;
  c.vocab_size = 512, c.max_seq_len = 512;
  EXPECT_TRUE(c.Validate().ok());
  ModelConfig bad = c;
  bad.norm_eps = 0.0f;
  EXPECT_EQ(bad.Validate().code(), ErrorCode::kInvalidArgument);
  bad = c;
  bad.rope_theta = INFINITY;
  EXPECT_EQ(bad.Validate().code(), ErrorCode::kInvalidArgument);
  bad = c;
  bad.eos_id = 512;
  EXPECT_EQ(bad.Validate().code(), ErrorCode::kInvalidArgument);
  bad = c;
  bad.bos_id = -1;
  EXPECT_EQ(bad.Validate().code(), ErrorCode::kInvalidArgument);
}

// Random header values never crash the loader: a value or a typed error, and a loaded model's
// tensors all lie inside the file.
TEST_F(Stories260KTest, RandomHeadersGiveValueOrTypedError) {
  std::mt19937 rng(8);
  for (int i = 0; i < 100; ++i) {
    std::string data = raw_;
    const int field = int(rng() % 7);
    const int32_t choices[] = {0, -1, 1, 2, 3, 4, 8, 64, 512, INT32_MAX, INT32_MIN, int32_t(rng())};
    SetHeader(&data, field, choices[rng() % 12]);
    if (i % 3 == 0) data.resize(rng() % (data.size() + 1));
    auto r = LoadLlama2c(WriteTemp("fuzz.bin", data));
    if (!r.ok()) {
      const ErrorCode c = r.status().code();
      EXPECT_TRUE(c == ErrorCode::kCorruption || c == ErrorCode::kInvalidArgument ||
                  c == ErrorCode::kUnsupported)
          << r.status().ToString();
      continue;
    }
    EXPECT_TRUE(r->config.Validate().ok());
    const char* base = static_cast<const char*>(r->token_embedding.data) - 28;
    const char* last = static_cast<const char*>(r->final_norm.data) + r->final_norm.size_bytes();
    EXPECT_LE(last - base, int64_t(data.size()));
  }
}

}  // namespace
}  // namespace bitroll::engine
