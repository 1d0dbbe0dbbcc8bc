// Tests for engine/loaders/hf: random checkpoints written by scripts/make-hf-checkpoint.py (Llama,
// Llama 3 rope scaling, Qwen2, Qwen3, Qwen3-MoE and Qwen2-MoE shapes, GQA, f32/bf16/f16,
// tied/untied, 1-3 shards) load with the right config and
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
#include <vector>

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
      {"rope scaling of another type",
       [](const std::string& d) {
         Replace(d + "/config.json", "\"rope_scaling\": null",
                 "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}");
       },
       ErrorCode::kUnsupported, "rope_scaling"},
      {"llama3 rope scaling without its fields",
       [](const std::string& d) {
         Replace(d + "/config.json", "\"rope_scaling\": null",
                 "\"rope_scaling\": {\"rope_type\": \"llama3\"}");
       },
       ErrorCode::kNotFound, "original_max_position_embeddings"},
      {"llama3 rope scaling with a bad factor",
       [](const std::string& d) {
         Replace(d + "/config.json", "\"rope_scaling\": null",
                 "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 0.5, "
                 "\"low_freq_factor\": 1, \"high_freq_factor\": 4, "
                 "\"original_max_position_embeddings\": 64}");
       },
       ErrorCode::kInvalidArgument, "factor >= 1"},
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

TEST(HuggingFace, LoadsQwen3MoeAndLlama3Configs) {
  REQUIRE_PYTHON();
  const std::string q3 = MakeCheckpoint("q3moe", "--arch qwen3_moe --head-dim 32 --seed 3");
  Result<ModelWeights> w = LoadHuggingFace(q3);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const ModelConfig& c = w->config;
  EXPECT_EQ(c.arch, "qwen3_moe");
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.head_dim(), 32);
  EXPECT_EQ(c.q_dim(), 128);
  EXPECT_EQ(c.n_experts, 8);
  EXPECT_EQ(c.n_experts_per_tok, 2);
  EXPECT_EQ(c.moe_hidden_dim, 48);
  EXPECT_TRUE(c.norm_topk_prob);  // Qwen3-MoE's default
  EXPECT_EQ(w->layers[1].experts.size(), 8u);
  EXPECT_EQ(w->layers[1].wq.shape, (std::vector<int64_t>{128, 64}));
  EXPECT_EQ(w->layers[1].q_norm.shape, (std::vector<int64_t>{32}));
  // An expert tensor is hashed: changing one byte of expert 7's down_proj changes the hash.
  const std::string q2 = MakeCheckpoint("q2moe", "--arch qwen2_moe --seed 4");
  Result<ModelWeights> w2 = LoadHuggingFace(q2);
  ASSERT_TRUE(w2.ok()) << w2.status().ToString();
  EXPECT_FALSE(w2->config.norm_topk_prob);  // Qwen2-MoE's default
  EXPECT_EQ(w2->config.shared_expert_hidden, 80);
  EXPECT_TRUE(w2->config.qkv_bias);
  ASSERT_NE(w2->layers[0].shared_expert_gate.data, nullptr);
  ModelWeights copy = *w2;
  std::vector<uint8_t> bytes(static_cast<const uint8_t*>(copy.layers[1].experts[7].w2.data),
                             static_cast<const uint8_t*>(copy.layers[1].experts[7].w2.data) +
                                 copy.layers[1].experts[7].w2.size_bytes());
  bytes[5] ^= 1;
  copy.layers[1].experts[7].w2.data = bytes.data();
  EXPECT_NE(HashWeights(copy), w2->weights_hash);
  const std::string l3 = MakeCheckpoint("l3", "--arch llama --llama3-scaling --seed 5");
  Result<ModelWeights> w3 = LoadHuggingFace(l3);
  ASSERT_TRUE(w3.ok()) << w3.status().ToString();
  EXPECT_EQ(w3->config.rope_factor, 8.0f);
  EXPECT_EQ(w3->config.rope_original_max_pos, 64);
  for (const std::string& d : {q3, q2, l3}) fs::remove_all(d);
}

TEST(HuggingFace, BrokenMoeAndQwen3CheckpointsGiveTypedErrors) {
  REQUIRE_PYTHON();
  struct Case {
    const char* name;
    std::function<void(const std::string&)> damage;
    ErrorCode code;
    const char* part;
  };
  const std::vector<Case> cases = {
      {"no num_experts",
       [](const std::string& d) {
         Replace(d + "/config.json", "\"num_experts\": 8", "\"num_experts_x\": 8");
       },
       ErrorCode::kNotFound, "num_experts"},
      {"top-k above the expert count",
       [](const std::string& d) {
         Replace(d + "/config.json", "\"num_experts_per_tok\": 2", "\"num_experts_per_tok\": 9");
       },
       ErrorCode::kInvalidArgument, "n_experts_per_tok"},
      {"dense layers inside the MoE",
       [](const std::string& d) {
         Replace(d + "/config.json", "\"mlp_only_layers\": []", "\"mlp_only_layers\": [1]");
       },
       ErrorCode::kUnsupported, "mlp_only_layers"},
      {"attention bias on qwen3",
       [](const std::string& d) {
         Replace(d + "/config.json", "\"attention_bias\": false", "\"attention_bias\": true");
       },
       ErrorCode::kUnsupported, "attention_bias"},
      {"a missing expert tensor",
       [](const std::string& d) {
         Replace(d + "/model.safetensors", "model.layers.1.mlp.experts.3.up_proj.weight",
                 "model.layers.1.mlp.experts.3.up_proj.weighz");
       },
       ErrorCode::kNotFound, "model.layers.1.mlp.experts.3.up_proj.weight"},
      {"a missing q_norm",
       [](const std::string& d) {
         Replace(d + "/model.safetensors", "model.layers.0.self_attn.q_norm.weight",
                 "model.layers.0.self_attn.q_norm.weighz");
       },
       ErrorCode::kNotFound, "q_norm"},
  };
  for (const Case& c : cases) {
    const std::string dir = MakeCheckpoint("brokenmoe", "--arch qwen3_moe --head-dim 32");
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
