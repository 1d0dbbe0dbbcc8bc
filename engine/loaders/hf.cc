// engine/loaders/hf.cc: Hugging Face config.json + safetensors -> ModelWeights.
#include "engine/loaders/hf.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <tuple>

#include "engine/loaders/mapped_file.h"
#include "engine/loaders/safetensors.h"

namespace bitroll::engine {
namespace {

using nlohmann::json;

// JSON text for an error message; invalid UTF-8 is replaced instead of throwing.
std::string Dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

// Reads and parses a JSON file. kNotFound when absent, kCorruption when not JSON.
Result<json> ReadJson(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return Status::NotFound("no file " + path);
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::IoError("cannot open " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Status::Corruption(path + " is not a JSON object");
  }
  return j;
}

// An integer field: absent -> `def` (or kNotFound when def is empty), null counts as absent.
Result<int64_t> IntField(const json& j, const std::string& key, const std::string& file,
                         std::optional<int64_t> def) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (def.has_value()) return *def;
    return Status::NotFound(file + ": no " + key);
  }
  if (it->is_array() && !it->empty()) it = it->begin();  // eos_token_id: [a, b] -> a
  if (!it->is_number_integer()) return Status::Corruption(file + ": " + key + " is not an integer");
  return it->get<int64_t>();
}

Result<double> FloatField(const json& j, const std::string& key, const std::string& file,
                          double def) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  if (!it->is_number()) return Status::Corruption(file + ": " + key + " is not a number");
  return it->get<double>();
}

bool BoolField(const json& j, const std::string& key, bool def) {
  auto it = j.find(key);
  return it == j.end() || !it->is_boolean() ? def : it->get<bool>();
}

struct Storage {
  std::vector<std::shared_ptr<const MappedFile>> maps;
};

struct Shard {
  std::shared_ptr<const MappedFile> map;
  SafetensorsHeader header;
};

std::string ShapeStr(const std::vector<int64_t>& s) {
  std::string o = "[";
  for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
  return o + "]";
}

Status ConfigFromJson(const json& j, const json* gen, const std::string& file, ModelConfig* c) {
  std::string arch;
  auto archs = j.find("architectures");
  if (archs != j.end() && archs->is_array() && !archs->empty() && (*archs)[0].is_string()) {
    arch = (*archs)[0].get<std::string>();
  } else if (j.contains("model_type") && j["model_type"].is_string()) {
    arch = j["model_type"].get<std::string>();
  }
  if (arch == "LlamaForCausalLM" || arch == "llama") {
    c->arch = "llama";
  } else if (arch == "Qwen2ForCausalLM" || arch == "qwen2") {
    c->arch = "qwen2";
  } else {
    return Status::Unsupported(file + ": architecture \"" + arch +
                               "\" is not supported (LlamaForCausalLM and Qwen2ForCausalLM are)");
  }
  struct {
    const char* key;
    int32_t* dst;
  } ints[] = {{"hidden_size", &c->dim},
              {"intermediate_size", &c->hidden_dim},
              {"num_hidden_layers", &c->n_layers},
              {"num_attention_heads", &c->n_heads},
              {"vocab_size", &c->vocab_size},
              {"max_position_embeddings", &c->max_seq_len}};
  for (auto& f : ints) {
    BR_ASSIGN_OR_RETURN(int64_t v, IntField(j, f.key, file, std::nullopt));
    if (v <= 0 || v > std::numeric_limits<int32_t>::max()) {
      return Status::InvalidArgument(file + ": " + f.key + " = " + std::to_string(v) +
                                     " is out of range");
    }
    *f.dst = int32_t(v);
  }
  BR_ASSIGN_OR_RETURN(int64_t kvh, IntField(j, "num_key_value_heads", file, c->n_heads));
  if (kvh <= 0 || kvh > c->n_heads) {
    return Status::InvalidArgument(file + ": num_key_value_heads = " + std::to_string(kvh) +
                                   " is out of range");
  }
  c->n_kv_heads = int32_t(kvh);
  BR_ASSIGN_OR_RETURN(double eps, FloatField(j, "rms_norm_eps", file, 1e-6));
  BR_ASSIGN_OR_RETURN(double theta, FloatField(j, "rope_theta", file, 10000.0));
  c->norm_eps = float(eps);
  c->rope_theta = float(theta);
  c->rope_layout = kernels::RopeLayout::kHalfSplit;
  c->qkv_bias = c->arch == "qwen2";
  c->shared_classifier = BoolField(j, "tie_word_embeddings", false);
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    return Status::Unsupported(file + ": rope_scaling " + Dump(j["rope_scaling"]) +
                               " is not supported");
  }
  if (j.contains("hidden_act") && j["hidden_act"] != "silu") {
    return Status::Unsupported(file + ": hidden_act " + Dump(j["hidden_act"]) +
                               " is not supported (silu is)");
  }
  if (c->arch == "llama" &&
      (BoolField(j, "attention_bias", false) || BoolField(j, "mlp_bias", false))) {
    return Status::Unsupported(file + ": attention_bias / mlp_bias are not supported");
  }
  if (j.contains("head_dim") && !j["head_dim"].is_null()) {
    BR_ASSIGN_OR_RETURN(int64_t hd, IntField(j, "head_dim", file, std::nullopt));
    if (c->n_heads > 0 && hd * c->n_heads != c->dim) {
      return Status::Unsupported(file + ": head_dim " + std::to_string(hd) +
                                 " differs from hidden_size / num_attention_heads");
    }
  }
  for (auto [key, dst, def] : {std::tuple{"bos_token_id", &c->bos_id, int64_t{1}},
                               std::tuple{"eos_token_id", &c->eos_id, int64_t{2}}}) {
    Result<int64_t> v = IntField(j, key, file, std::nullopt);
    if (!v.ok() && v.status().code() == ErrorCode::kNotFound && gen != nullptr) {
      v = IntField(*gen, key, "generation_config.json", def);
    }
    if (!v.ok() && v.status().code() == ErrorCode::kNotFound) v = def;
    if (!v.ok()) return v.status();
    if (*v < 0 || *v >= c->vocab_size) {
      return Status::InvalidArgument(file + ": " + key + " = " + std::to_string(*v) +
                                     " outside the vocabulary of " + std::to_string(c->vocab_size));
    }
    *dst = int32_t(*v);
  }
  return Status::Ok();
}

// A shard file name from the index must stay inside the directory.
bool PlainName(const std::string& s) {
  return !s.empty() && s.find('/') == std::string::npos && s != "." && s != "..";
}

Result<ModelWeights> Load(const std::string& dir, const HfLoadOptions& options) {
  const std::string cfg_path = dir + "/config.json";
  BR_ASSIGN_OR_RETURN(json cfg, ReadJson(cfg_path));
  Result<json> gen = ReadJson(dir + "/generation_config.json");
  if (!gen.ok() && gen.status().code() != ErrorCode::kNotFound) return gen.status();
  ModelConfig c;
  BR_RETURN_IF_ERROR(ConfigFromJson(cfg, gen.ok() ? &*gen : nullptr, cfg_path, &c));
  if (options.max_seq_len > 0) c.max_seq_len = std::min(c.max_seq_len, options.max_seq_len);
  {
    Status s = c.Validate();
    if (!s.ok()) return s.WithContext(cfg_path);
  }

  // Shards: name -> shard file, and the mapped files.
  std::map<std::string, Shard> shards;            // by file name
  std::map<std::string, std::string> weight_map;  // tensor -> file name ("" = single file)
  const std::string index_path = dir + "/model.safetensors.index.json";
  Result<json> index = ReadJson(index_path);
  if (!index.ok() && index.status().code() != ErrorCode::kNotFound) return index.status();
  auto open_shard = [&](const std::string& file) -> Status {
    if (shards.count(file)) return Status::Ok();
    const std::string p = dir + "/" + file;
    Result<std::shared_ptr<const MappedFile>> m = MapFile(p);
    if (!m.ok()) {
      if (m.status().code() == ErrorCode::kNotFound) {
        return Status::NotFound("missing shard " + p);
      }
      return m.status();
    }
    Result<SafetensorsHeader> h = ParseSafetensors((*m)->data, (*m)->size);
    if (!h.ok()) return h.status().WithContext(p);
    shards[file] = Shard{*m, std::move(h).value()};
    return Status::Ok();
  };
  if (index.ok()) {
    auto wm = index->find("weight_map");
    if (wm == index->end() || !wm->is_object()) {
      return Status::Corruption(index_path + ": no weight_map object");
    }
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      if (!it->is_string() || !PlainName(it->get<std::string>())) {
        return Status::Corruption(index_path + ": weight_map entry " + it.key() +
                                  " is not a plain file name");
      }
      weight_map[it.key()] = it->get<std::string>();
    }
    std::vector<std::string> files;
    for (const auto& [name, file] : weight_map) files.push_back(file);
    std::sort(files.begin(), files.end());
    files.erase(std::unique(files.begin(), files.end()), files.end());
    for (const std::string& file : files) BR_RETURN_IF_ERROR(open_shard(file));
  } else {
    Status s = open_shard("model.safetensors");
    if (!s.ok() && s.code() == ErrorCode::kNotFound) {
      return Status::NotFound(dir + ": no model.safetensors or model.safetensors.index.json");
    }
    BR_RETURN_IF_ERROR(s);
  }

  auto get = [&](const std::string& name, std::vector<int64_t> shape) -> Result<Tensor> {
    const Shard* shard = nullptr;
    std::string file = "model.safetensors";
    if (!weight_map.empty()) {
      auto it = weight_map.find(name);
      if (it == weight_map.end()) {
        return Status::NotFound(dir + ": missing tensor " + name + " (not in the index)");
      }
      file = it->second;
    }
    shard = &shards.at(file);
    const SafetensorsTensor* t = shard->header.Find(name);
    if (t == nullptr) {
      if (!weight_map.empty()) {
        return Status::Corruption(dir + ": the index puts " + name + " in " + file +
                                  ", which lacks it");
      }
      return Status::NotFound(dir + ": missing tensor " + name);
    }
    Tensor out;
    if (t->dtype == "F32") {
      out.dtype = kernels::DType::kF32;
    } else if (t->dtype == "F16") {
      out.dtype = kernels::DType::kF16;
    } else if (t->dtype == "BF16") {
      out.dtype = kernels::DType::kBF16;
    } else {
      return Status::Unsupported(dir + ": tensor " + name + " has dtype " + t->dtype +
                                 "; only F32, F16 and BF16 are supported");
    }
    if (t->shape != shape) {
      return Status::InvalidArgument(dir + ": tensor " + name + " has shape " + ShapeStr(t->shape) +
                                     ", config.json implies " + ShapeStr(shape));
    }
    const uint64_t at = shard->header.data_offset + t->begin;
    if (at % uint64_t(t->elem_bytes) != 0) {
      return Status::Unsupported(dir + ": tensor " + name + " at offset " + std::to_string(at) +
                                 " of " + file + " is not aligned to its element size");
    }
    out.shape = std::move(shape);
    out.data = shard->map->data + at;
    return out;
  };

  const int64_t dim = c.dim, kv = c.kv_dim(), hidden = c.hidden_dim, vocab = c.vocab_size;
  ModelWeights w;
  w.config = c;
  BR_ASSIGN_OR_RETURN(w.token_embedding, get("model.embed_tokens.weight", {vocab, dim}));
  w.layers.resize(size_t(c.n_layers));
  for (int32_t l = 0; l < c.n_layers; ++l) {
    LayerWeights& L = w.layers[size_t(l)];
    const std::string b = "model.layers." + std::to_string(l) + ".";
    BR_ASSIGN_OR_RETURN(L.attn_norm, get(b + "input_layernorm.weight", {dim}));
    BR_ASSIGN_OR_RETURN(L.wq, get(b + "self_attn.q_proj.weight", {dim, dim}));
    BR_ASSIGN_OR_RETURN(L.wk, get(b + "self_attn.k_proj.weight", {kv, dim}));
    BR_ASSIGN_OR_RETURN(L.wv, get(b + "self_attn.v_proj.weight", {kv, dim}));
    if (c.qkv_bias) {
      BR_ASSIGN_OR_RETURN(L.bq, get(b + "self_attn.q_proj.bias", {dim}));
      BR_ASSIGN_OR_RETURN(L.bk, get(b + "self_attn.k_proj.bias", {kv}));
      BR_ASSIGN_OR_RETURN(L.bv, get(b + "self_attn.v_proj.bias", {kv}));
    }
    BR_ASSIGN_OR_RETURN(L.wo, get(b + "self_attn.o_proj.weight", {dim, dim}));
    BR_ASSIGN_OR_RETURN(L.ffn_norm, get(b + "post_attention_layernorm.weight", {dim}));
    BR_ASSIGN_OR_RETURN(L.w1, get(b + "mlp.gate_proj.weight", {hidden, dim}));
    BR_ASSIGN_OR_RETURN(L.w2, get(b + "mlp.down_proj.weight", {dim, hidden}));
    BR_ASSIGN_OR_RETURN(L.w3, get(b + "mlp.up_proj.weight", {hidden, dim}));
  }
  BR_ASSIGN_OR_RETURN(w.final_norm, get("model.norm.weight", {dim}));
  if (c.shared_classifier) {
    w.classifier = w.token_embedding;
  } else {
    BR_ASSIGN_OR_RETURN(w.classifier, get("lm_head.weight", {vocab, dim}));
  }
  auto storage = std::make_shared<Storage>();
  for (auto& [file, shard] : shards) storage->maps.push_back(shard.map);
  w.storage = std::shared_ptr<const void>(storage, storage.get());
  std::string trimmed = dir;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  w.source = "hf:" + PathBaseName(trimmed);
  w.weights_hash = HashWeights(w);
  return w;
}

}  // namespace

Result<ModelWeights> LoadHuggingFace(const std::string& dir, const HfLoadOptions& options) {
  try {
    return Load(dir, options);
  } catch (const std::exception& e) {  // nlohmann or the allocator; never crosses the boundary
    return Status::Internal(dir + ": unexpected exception while loading: " + e.what());
  }
}

}  // namespace bitroll::engine
