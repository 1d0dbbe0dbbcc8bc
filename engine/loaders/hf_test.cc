// Tests for engine/loaders/hf: random checkpoints written by scripts/make-hf-checkpoint.py (Llama
// and Qwen2 shapes, GQA, f32/bf16/f16, tied/untied, 1-3 shards) load with the right config and
// tensors, and every broken directory gives a typed error naming what is wrong.
#include "engine/loaders/hf.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "engine/loaders/safetensors.h"

namespace bitroll::engine {
namespace {

namespace fs = std::filesystem;

bool HavePythonNumpy() {
  static const bool ok = std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") == 0;
  return ok;
}

// Writes a checkpoint with the writer script; returns its directory ("" on failure).
std::string MakeCheckpoint(const std::string& name, const std::string& args) {
  const fs::path dir =
      fs::temp_directory_path() / ("bitroll_hf_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(dir);
  const std::string cmd = "/usr/bin/python3 " + std::string(BITROLL_SOURCE_DIR) +
                          "/scripts/make-hf-checkpoint.py --out " + dir.string() + " " + args;
  if (std::system(cmd.c_str()) != 0) return "";
  return dir.string();
}

std::string ReadText(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void WriteText(const std::string& path, const std::string& s) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << s;
}

void Replace(const std::string& path, const std::string& from, const std::string& to) {
  std::string s = ReadText(path);
  const size_t at = s.find(from);
  ASSERT_NE(at, std::string::npos) << from << " not in " << path;
  s.replace(at, from.size(), to);
  WriteText(path, s);
}

#define REQUIRE_PYTHON()                                                                 \
  if (!HavePythonNumpy())                                                                \
  GTEST_SKIP() << "/usr/bin/python3 with numpy is needed to write the test checkpoints " \
                  "(Debian: python3-numpy)"

TEST(HuggingFace, LoadsLlamaF32SingleShard) {
  REQUIRE_PYTHON();
  const std::string dir = MakeCheckpoint("llama_f32", "--arch llama --dtype f32 --seed 1");
  ASSERT_FALSE(dir.empty());
  Result<ModelWeights> w = LoadHuggingFace(dir, HfLoadOptions{.max_seq_len = 128});
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const ModelConfig& c = w->config;
  EXPECT_EQ(c.arch, "llama");
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 96);
  EXPECT_EQ(c.n_layers, 2);
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.vocab_size, 256);
  EXPECT_EQ(c.max_seq_len, 128);  // capped from 2048
  EXPECT_EQ(c.rope_layout, kernels::RopeLayout::kHalfSplit);
  EXPECT_FALSE(c.shared_classifier);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(c.norm_eps, 1e-6f);
  EXPECT_EQ(c.bos_id, 1);
  EXPECT_EQ(c.eos_id, 2);
  EXPECT_EQ(w->layers[1].wk.shape, (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(w->classifier.shape, (std::vector<int64_t>{256, 64}));
  EXPECT_NE(w->classifier.data, w->token_embedding.data);
  // The tensor bytes are the file's: the embedding view equals the safetensors payload.
  const std::string file = ReadText(dir + "/model.safetensors");
  Result<SafetensorsHeader> h =
      ParseSafetensors(reinterpret_cast<const uint8_t*>(file.data()), file.size());
  ASSERT_TRUE(h.ok());
  const SafetensorsTensor* emb = h->Find("model.embed_tokens.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(std::memcmp(w->token_embedding.data, file.data() + h->data_offset + emb->begin,
                        emb->end - emb->begin),
            0);
  fs::remove_all(dir);
}

TEST(HuggingFace, LoadsQwen2Bf16ThreeShardsWithGenerationConfig) {
  REQUIRE_PYTHON();
  const std::string dir = MakeCheckpoint(
      "qwen_bf16", "--arch qwen2 --dtype bf16 --shards 3 --kv-heads 1 --tied --seed 2");
  ASSERT_FALSE(dir.empty());
  Result<ModelWeights> w = LoadHuggingFace(dir);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->config.arch, "qwen2");
  EXPECT_TRUE(w->config.qkv_bias);
  EXPECT_EQ(w->config.n_kv_heads, 1);
  EXPECT_EQ(w->config.max_seq_len, 2048);
  EXPECT_TRUE(w->config.shared_classifier);
  EXPECT_EQ(w->classifier.data, w->token_embedding.data);
  EXPECT_EQ(w->config.bos_id, 3);  // from generation_config.json
  EXPECT_EQ(w->config.eos_id, 4);  // first of the eos list
  EXPECT_EQ(w->layers[0].bk.shape, (std::vector<int64_t>{16}));
  EXPECT_EQ(w->token_embedding.dtype, kernels::DType::kBF16);
  // The views stay valid through the shared storage after the loader's locals are gone.
  EXPECT_EQ(w->weights_hash, HashWeights(*w));
  fs::remove_all(dir);
}

TEST(HuggingFace, BrokenCheckpointsGiveTypedErrors) {
  REQUIRE_PYTHON();
  struct Case {
    const char* name;
    std::function<void(const std::string&)> damage;
    ErrorCode code;
    const char* part;
  };
  const std::string shard2 = "/model-00002-of-00002.safetensors";
  const std::vector<Case> cases = {
      {"missing shard", [&](const std::string& d) { fs::remove(d + shard2); }, ErrorCode::kNotFound,
       "missing shard"},
      {"missing tensor in index",
       [](const std::string& d) {
         Replace(d + "/model.safetensors.index.json", "\"model.norm.weight\"", "\"model.nrm\"");
       },
       ErrorCode::kNotFound, "missing tensor model.norm.weight"},
      {"index points at the wrong shard",
       [](const std::string& d) {
         std::string s = ReadText(d + "/model.safetensors.index.json");
         const std::string key = "\"model.norm.weight\": \"model-00002-of-00002.safetensors\"";
         const size_t at = s.find(key);
         ASSERT_NE(at, std::string::npos);
         s.replace(at, key.size(), "\"model.norm.weight\": \"model-00001-of-00002.safetensors\"");
         WriteText(d + "/model.safetensors.index.json", s);
       },
       ErrorCode::kCorruption, "lacks it"},
      {"shard outside the directory",
       [](const std::string& d) {
         Replace(d + "/model.safetensors.index.json", "\"model-00001-of-00002.safetensors\"",
                 "\"../x.safetensors\"");
       },
       ErrorCode::kCorruption, "not a plain file name"},
      {"corrupt shard header",
       [&](const std::string& d) {
         std::string s = ReadText(d + shard2);
         s[8] = '[';
         WriteText(d + shard2, s);
       },
       ErrorCode::kCorruption, "safetensors"},
      {"truncated shard",
       [&](const std::string& d) {
         std::string s = ReadText(d + shard2);
         s.resize(s.size() - 10);
         WriteText(d + shard2, s);
       },
       ErrorCode::kCorruption, "past the end"},
      {"unsupported architecture",
       [](const std::string& d) {
         Replace(d + "/config.json", "LlamaForCausalLM", "MistralForCausalLM");
       },
       ErrorCode::kUnsupported, "\"MistralForCausalLM\""},
      {"rope scaling",
       [](const std::string& d) {
         Replace(d + "/config.json", "\"rope_scaling\": null",
                 "\"rope_scaling\": {\"rope_type\": \"llama3\"}");
       },
       ErrorCode::kUnsupported, "rope_scaling"},
      {"shape disagrees with config",
       [](const std::string& d) {
         Replace(d + "/config.json", "\"intermediate_size\": 96", "\"intermediate_size\": 80");
       },
       ErrorCode::kInvalidArgument, "has shape [96, 64], config.json implies [80, 64]"},
      {"bad config value",
       [](const std::string& d) {
         Replace(d + "/config.json", "\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3");
       },
       ErrorCode::kInvalidArgument, "not a multiple of n_kv_heads"},
      {"config not json", [](const std::string& d) { WriteText(d + "/config.json", "{oops"); },
       ErrorCode::kCorruption, "not a JSON object"},
      {"no weights", [&](const std::string& d) { fs::remove(d + "/model.safetensors.index.json"); },
       ErrorCode::kNotFound, "no model.safetensors"},
  };
  for (const Case& c : cases) {
    const std::string dir = MakeCheckpoint("broken", "--arch llama --dtype f16 --shards 2");
    ASSERT_FALSE(dir.empty());
    ASSERT_TRUE(LoadHuggingFace(dir).ok()) << c.name << ": the undamaged checkpoint must load";
    c.damage(dir);
    Result<ModelWeights> w = LoadHuggingFace(dir);
    ASSERT_FALSE(w.ok()) << c.name;
    EXPECT_EQ(w.status().code(), c.code) << c.name << ": " << w.status().ToString();
    EXPECT_NE(w.status().message().find(c.part), std::string::npos)
        << c.name << ": " << w.status().ToString();
    fs::remove_all(dir);
  }
  EXPECT_EQ(LoadHuggingFace("/nonexistent-bitroll-dir").status().code(), ErrorCode::kNotFound);
}

TEST(HuggingFace, UnsupportedDtypeIsNamed) {
  // A one-tensor-wrong checkpoint written by hand: the embedding is F64.
  REQUIRE_PYTHON();
  const std::string dir = MakeCheckpoint("f64", "--arch llama --dtype f32 --layers 1");
  ASSERT_FALSE(dir.empty());
  const std::string path = dir + "/model.safetensors";
  std::string s = ReadText(path);
  // Same byte count: F32 [256, 64] -> F64 [128, 64] ("F32" and "F64" have equal lengths).
  const std::string from = "\"model.embed_tokens.weight\":{\"dtype\":\"F32\",\"shape\":[256,64]";
  const std::string to = "\"model.embed_tokens.weight\":{\"dtype\":\"F64\",\"shape\":[128,64]";
  const size_t at = s.find(from);
  ASSERT_NE(at, std::string::npos);
  s.replace(at, from.size(), to);
  WriteText(path, s);
  Result<ModelWeights> w = LoadHuggingFace(dir);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), ErrorCode::kUnsupported) << w.status().ToString();
  EXPECT_NE(w.status().message().find("model.embed_tokens.weight has dtype F64"), std::string::npos)
      << w.status().ToString();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace bitroll::engine
