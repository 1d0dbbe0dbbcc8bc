// engine/make_model_hf.cc: reproducible random Hugging Face checkpoints (see the header).
#include "engine/make_model_hf.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "engine/make_model.h"
#include "engine/model_weights.h"
#include "kernels/cpu/philox.h"

namespace bitroll::engine {
namespace {

using nlohmann::json;

const HfModelShape kShapes[] = {
    {"qwen3-tiny", "qwen3", 64, 128, 2, 4, 2, 32, 512, 512, 0, 0, 0, 0},
    {"qwen3-gqa4-tiny", "qwen3", 64, 128, 2, 8, 2, 32, 512, 512, 0, 0, 0, 0},
    {"llama3-tiny", "llama3", 64, 128, 2, 4, 2, 0, 512, 512, 0, 0, 0, 0},
    {"qwen3-moe-tiny", "qwen3_moe", 64, 128, 2, 4, 2, 16, 512, 512, 8, 2, 32, 0},
    {"qwen2-moe-tiny", "qwen2_moe", 64, 128, 2, 4, 2, 0, 512, 512, 8, 2, 32, 64},
    {"moe-100m", "qwen3_moe", 512, 1536, 8, 8, 4, 64, 32000, 1024, 8, 2, 768, 0},
    {"moe-100m-dense", "qwen3", 512, 1536, 8, 8, 4, 64, 32000, 1024, 0, 0, 0, 0},
    {"swa-tiny", "llama", 64, 128, 4, 4, 2, 0, 512, 512, 0, 0, 0, 0, 8, 2, true},
    {"swa-5to1-tiny", "qwen3", 64, 128, 6, 4, 2, 32, 512, 512, 0, 0, 0, 0, 8, 6, false},
    {"hybrid-bench", "qwen3", 256, 768, 12, 4, 2, 64, 8192, 8192, 0, 0, 0, 0, 128, 6, false},
};

constexpr uint32_t kWeightStream = 0x6D6F646C;  // "mold", as make_model.cc

// One tensor of the file: its name and shape; kind says how it is filled.
struct Spec {
  enum Kind { kRandom, kOnes, kRouter, kSink } kind;
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return n;
  }
};

std::vector<Spec> Tensors(const HfModelShape& s) {
  const int64_t d = s.dim, hd = s.head_dim > 0 ? s.head_dim : s.dim / s.n_heads;
  const int64_t qd = hd * s.n_heads, kv = hd * s.n_kv_heads;
  const bool qwen3 = s.arch == "qwen3" || s.arch == "qwen3_moe";
  const bool bias = s.arch == "qwen2_moe";
  std::vector<Spec> t;
  t.push_back({Spec::kRandom, "model.embed_tokens.weight", {s.vocab_size, d}});
  for (int32_t l = 0; l < s.n_layers; ++l) {
    const std::string b = "model.layers." + std::to_string(l) + ".";
    t.push_back({Spec::kOnes, b + "input_layernorm.weight", {d}});
    t.push_back({Spec::kRandom, b + "self_attn.q_proj.weight", {qd, d}});
    t.push_back({Spec::kRandom, b + "self_attn.k_proj.weight", {kv, d}});
    t.push_back({Spec::kRandom, b + "self_attn.v_proj.weight", {kv, d}});
    if (bias) {
      t.push_back({Spec::kRandom, b + "self_attn.q_proj.bias", {qd}});
      t.push_back({Spec::kRandom, b + "self_attn.k_proj.bias", {kv}});
      t.push_back({Spec::kRandom, b + "self_attn.v_proj.bias", {kv}});
    }
    if (qwen3) {
      t.push_back({Spec::kOnes, b + "self_attn.q_norm.weight", {hd}});
      t.push_back({Spec::kOnes, b + "self_attn.k_norm.weight", {hd}});
    }
    t.push_back({Spec::kRandom, b + "self_attn.o_proj.weight", {d, qd}});
    if (s.sinks) t.push_back({Spec::kSink, b + "self_attn.sinks", {s.n_heads}});
    t.push_back({Spec::kOnes, b + "post_attention_layernorm.weight", {d}});
    auto ffn = [&](const std::string& p, int64_t h) {
      t.push_back({Spec::kRandom, p + "gate_proj.weight", {h, d}});
      t.push_back({Spec::kRandom, p + "up_proj.weight", {h, d}});
      t.push_back({Spec::kRandom, p + "down_proj.weight", {d, h}});
    };
    if (s.n_experts > 0) {
      t.push_back({Spec::kRouter, b + "mlp.gate.weight", {s.n_experts, d}});
      for (int32_t e = 0; e < s.n_experts; ++e) {
        ffn(b + "mlp.experts." + std::to_string(e) + ".", s.moe_hidden_dim);
      }
      if (s.shared_expert_hidden > 0) {
        ffn(b + "mlp.shared_expert.", s.shared_expert_hidden);
        t.push_back({Spec::kRandom, b + "mlp.shared_expert_gate.weight", {1, d}});
      }
    } else {
      ffn(b + "mlp.", s.hidden_dim);
    }
  }
  t.push_back({Spec::kOnes, "model.norm.weight", {d}});
  t.push_back({Spec::kRandom, "lm_head.weight", {s.vocab_size, d}});
  return t;
}

json Config(const HfModelShape& s) {
  static const std::pair<const char*, const char*> kArch[] = {{"llama3", "LlamaForCausalLM"},
                                                              {"llama", "LlamaForCausalLM"},
                                                              {"qwen3", "Qwen3ForCausalLM"},
                                                              {"qwen3_moe", "Qwen3MoeForCausalLM"},
                                                              {"qwen2_moe", "Qwen2MoeForCausalLM"}};
  std::string arch;
  for (const auto& [k, v] : kArch) {
    if (s.arch == k) arch = v;
  }
  json c = {{"architectures", {arch}},
            {"hidden_size", s.dim},
            {"intermediate_size", s.hidden_dim},
            {"num_hidden_layers", s.n_layers},
            {"num_attention_heads", s.n_heads},
            {"num_key_value_heads", s.n_kv_heads},
            {"vocab_size", s.vocab_size},
            {"max_position_embeddings", s.max_seq_len},
            {"rms_norm_eps", 1e-6},
            {"rope_theta", s.arch == "llama3" ? 500000.0 : 1000000.0},
            {"tie_word_embeddings", false},
            {"hidden_act", "silu"},
            {"bos_token_id", 1},
            {"eos_token_id", 2},
            {"torch_dtype", "float32"}};
  if (s.head_dim > 0) c["head_dim"] = s.head_dim;
  if (s.sliding_window > 0) {
    c["sliding_window"] = s.sliding_window;
    if (s.sinks) {  // GPT-OSS style: explicit layer_types
      json types = json::array();
      for (int32_t l = 0; l < s.n_layers; ++l) {
        types.push_back((l + 1) % s.full_every == 0 ? "full_attention" : "sliding_attention");
      }
      c["layer_types"] = types;
    } else {  // Gemma 3 style
      c["sliding_window_pattern"] = s.full_every;
    }
  }
  if (s.arch == "llama3") {
    c["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", 8.0},
                         {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 64}};
  }
  if (s.n_experts > 0) {
    c["num_experts"] = s.n_experts;
    c["num_experts_per_tok"] = s.top_k;
    c["moe_intermediate_size"] = s.moe_hidden_dim;
    c["norm_topk_prob"] = s.arch == "qwen3_moe";
    c["decoder_sparse_step"] = 1;
    c["mlp_only_layers"] = json::array();
    if (s.shared_expert_hidden > 0) {
      c["shared_expert_intermediate_size"] = s.shared_expert_hidden;
    }
  }
  return c;
}

// GPT-2's byte -> printable code point map (byte-level BPE), as UTF-8.
std::string ByteChar(int b) {
  const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
  int cp = b;
  if (!printable) {
    int n = 0;
    for (int x = 0; x < b; ++x) {
      if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE))) ++n;
    }
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += char(cp);
  } else {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  }
  return s;
}

json ByteTokenizer(int32_t vocab_size) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteChar(b)] = b;
  // Fillers up to the model's vocabulary: never produced by encoding (there are no merges),
  // decoded as their own text.
  for (int32_t id = 256; id < vocab_size; ++id) vocab["tok" + std::to_string(id)] = id;
  const json level = {{"type", "ByteLevel"},
                      {"add_prefix_space", false},
                      {"trim_offsets", true},
                      {"use_regex", true}};
  return {{"version", "1.0"},
          {"added_tokens", json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer", level},
          {"post_processor", nullptr},
          {"decoder", level},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", false},
            {"vocab", vocab},
            {"merges", json::array()}}}};
}

Status WriteText(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return Status::IoError("cannot create " + path + ": " + std::strerror(errno));
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) return Status::IoError("write failed on " + path);
  return Status::Ok();
}

}  // namespace

Result<HfModelShape> NamedHfShape(std::string_view name) {
  return FindShape(kShapes, name);
}

Status WriteRandomHfModel(const HfModelShape& shape, uint64_t seed, const std::string& dir) {
  ModelConfig c;
  c.dim = shape.dim;
  c.hidden_dim = shape.hidden_dim;
  c.n_layers = shape.n_layers;
  c.n_heads = shape.n_heads;
  c.n_kv_heads = shape.n_kv_heads;
  c.head_size = shape.head_dim;
  c.vocab_size = shape.vocab_size;
  c.max_seq_len = shape.max_seq_len;
  c.n_experts = shape.n_experts;
  c.n_experts_per_tok = shape.top_k;
  c.moe_hidden_dim = shape.moe_hidden_dim;
  c.shared_expert_hidden = shape.shared_expert_hidden;
  if (shape.sliding_window < 0 || (shape.sliding_window > 0 && shape.full_every <= 0)) {
    return Status::InvalidArgument("sliding_window must be >= 0, with full_every > 0");
  }
  BR_RETURN_IF_ERROR(c.Validate());
  if (c.vocab_size < 256) {
    return Status::InvalidArgument("vocab_size " + std::to_string(c.vocab_size) +
                                   " < 256: the byte-level tokenizer needs 256 tokens");
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IoError("cannot create " + dir + ": " + ec.message());

  const std::vector<Spec> specs = Tensors(shape);
  json header = {{"__metadata__", {{"format", "pt"}}}};
  int64_t off = 0;
  for (const Spec& s : specs) {
    const int64_t bytes = s.numel() * 4;
    header[s.name] = {{"dtype", "F32"}, {"shape", s.shape}, {"data_offsets", {off, off + bytes}}};
    off += bytes;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  const std::string path = dir + "/model.safetensors";
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return Status::IoError("cannot create " + path + ": " + std::strerror(errno));
  bool ok = true;
  const uint64_t hlen = h.size();
  ok = ok && std::fwrite(&hlen, 8, 1, f) == 1;
  ok = ok && std::fwrite(h.data(), 1, h.size(), f) == h.size();
  const kernels::PhiloxKey key = {uint32_t(seed), uint32_t(seed >> 32)};
  constexpr double kScale = 0.02 * 1.7320508075688772;  // 0.02 * sqrt(3)
  uint64_t next = 0;
  std::vector<float> buf;
  for (const Spec& s : specs) {
    buf.assign(size_t(s.numel()), 1.0f);
    if (s.kind != Spec::kOnes) {
      // The router's logits get a standard deviation of about 1 (make_model_hf.h).
      // Sink logits get a standard deviation of about 1.
      const double gain = s.kind == Spec::kRouter ? 1.0 / (0.02 * std::sqrt(double(shape.dim)))
                          : s.kind == Spec::kSink ? 50.0
                                                  : 1.0;
      for (float& v : buf) {
        const uint64_t idx = next++;
        const kernels::PhiloxCounter x =
            kernels::Philox4x32_10({uint32_t(idx), uint32_t(idx >> 32), kWeightStream, 0}, key);
        const double sum = (double(x[0]) + double(x[1]) + double(x[2]) + double(x[3])) * 0x1p-32;
        v = float(gain * kScale * (sum - 2.0));
      }
    }
    ok = ok && std::fwrite(buf.data(), 4, buf.size(), f) == buf.size();
  }
  if (std::fclose(f) != 0 || !ok) return Status::IoError("write failed on " + path);
  BR_RETURN_IF_ERROR(WriteText(dir + "/config.json", Config(shape).dump(1)));
  return WriteText(dir + "/tokenizer.json", ByteTokenizer(shape.vocab_size).dump());
}

}  // namespace bitroll::engine
