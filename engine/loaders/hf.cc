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

// rope_scaling: null, or rope_type (or "type") "llama3" with factor, low_freq_factor,
// high_freq_factor and original_max_position_embeddings. Anything else is kUnsupported.
Status RopeScalingFromJson(const json& j, const std::string& file, ModelConfig* c) {
  auto it = j.find("rope_scaling");
  if (it == j.end() || it->is_null()) return Status::Ok();
  const json& rs = *it;
  std::string type;
  for (const char* key : {"rope_type", "type"}) {
    if (rs.is_object() && rs.contains(key) && rs[key].is_string()) {
      type = rs[key].get<std::string>();
      break;
    }
  }
  if (type != "llama3") {
    return Status::Unsupported(file + ": rope_scaling " + Dump(rs) +
                               " is not supported (rope_type \"llama3\" is)");
  }
  const std::string what = file + " rope_scaling";
  BR_ASSIGN_OR_RETURN(double factor, FloatField(rs, "factor", what, -1.0));
  BR_ASSIGN_OR_RETURN(double lo, FloatField(rs, "low_freq_factor", what, -1.0));
  BR_ASSIGN_OR_RETURN(double hi, FloatField(rs, "high_freq_factor", what, -1.0));
  BR_ASSIGN_OR_RETURN(int64_t old_len,
                      IntField(rs, "original_max_position_embeddings", what, std::nullopt));
  if (!(factor >= 1.0) || !(lo > 0.0) || !(hi > lo) || old_len <= 0 ||
      old_len > std::numeric_limits<int32_t>::max()) {
    return Status::InvalidArgument(what + ": " + Dump(rs) +
                                   " needs factor >= 1, 0 < low_freq_factor < high_freq_factor "
                                   "and original_max_position_embeddings > 0");
  }
  c->rope_factor = float(factor);
  c->rope_low_freq_factor = float(lo);
  c->rope_high_freq_factor = float(hi);
  c->rope_original_max_pos = int32_t(old_len);
  return Status::Ok();
}

// Qwen3-MoE / Qwen2-MoE: num_experts, num_experts_per_tok, moe_intermediate_size, norm_topk_prob
// (default: true for Qwen3-MoE, false for Qwen2-MoE), shared_expert_intermediate_size (Qwen2-MoE;
// 0 = none). Every layer must be sparse: decoder_sparse_step 1 and no mlp_only_layers.
Status MoeFromJson(const json& j, const std::string& file, ModelConfig* c) {
  if (c->arch != "qwen3_moe" && c->arch != "qwen2_moe") return Status::Ok();
  auto positive = [&](const char* key, std::optional<int64_t> def, int32_t* dst) -> Status {
    BR_ASSIGN_OR_RETURN(int64_t v, IntField(j, key, file, def));
    if (v < 0 || v > std::numeric_limits<int32_t>::max()) {
      return Status::InvalidArgument(file + ": " + key + " = " + std::to_string(v) +
                                     " is out of range");
    }
    *dst = int32_t(v);
    return Status::Ok();
  };
  BR_RETURN_IF_ERROR(positive("num_experts", std::nullopt, &c->n_experts));
  BR_RETURN_IF_ERROR(positive("num_experts_per_tok", std::nullopt, &c->n_experts_per_tok));
  BR_RETURN_IF_ERROR(positive("moe_intermediate_size", std::nullopt, &c->moe_hidden_dim));
  if (c->arch == "qwen2_moe") {
    BR_RETURN_IF_ERROR(
        positive("shared_expert_intermediate_size", int64_t{0}, &c->shared_expert_hidden));
  }
  c->norm_topk_prob = BoolField(j, "norm_topk_prob", c->arch == "qwen3_moe");
  BR_ASSIGN_OR_RETURN(int64_t step, IntField(j, "decoder_sparse_step", file, int64_t{1}));
  auto only = j.find("mlp_only_layers");
  const bool dense_layers = only != j.end() && only->is_array() && !only->empty();
  if (step != 1 || dense_layers) {
    return Status::Unsupported(file + ": dense layers in a MoE model (decoder_sparse_step " +
                               std::to_string(step) + ", mlp_only_layers) are not supported");
  }
  if (c->n_experts == 0) return Status::InvalidArgument(file + ": num_experts is 0");
  return Status::Ok();
}

// Sliding-window layers: layer_types (["sliding_attention" | "full_attention", ...], GPT-OSS /
// Gemma 3 / newer transformers) or sliding_window_pattern P (Gemma 3: layer i is full when
// (i + 1) % P == 0), with sliding_window W. A sliding_window without either applies to every
// layer (Mistral), unless use_sliding_window is false (Qwen2/3 configs carry an unused one).
Status SlidingWindowFromJson(const json& j, const std::string& file, ModelConfig* c) {
  c->layer_window.clear();
  const bool has_types = j.contains("layer_types") && !j["layer_types"].is_null();
  const bool has_pattern =
      j.contains("sliding_window_pattern") && !j["sliding_window_pattern"].is_null();
  const bool has_window = j.contains("sliding_window") && !j["sliding_window"].is_null();
  if (!BoolField(j, "use_sliding_window", true)) return Status::Ok();
  if (!has_types && !has_pattern && !has_window) return Status::Ok();
  if (!has_types && j.contains("max_window_layers")) {  // Qwen2's use_sliding_window: true
    return Status::Unsupported(file +
                               ": use_sliding_window with max_window_layers is not "
                               "supported (layer_types or sliding_window_pattern are)");
  }
  std::vector<bool> sliding(size_t(c->n_layers), true);
  if (has_types) {
    const json& t = j["layer_types"];
    if (!t.is_array() || t.size() != size_t(c->n_layers)) {
      return Status::InvalidArgument(file + ": layer_types must list " +
                                     std::to_string(c->n_layers) + " layer types, got " + Dump(t));
    }
    for (size_t l = 0; l < t.size(); ++l) {
      const std::string kind = t[l].is_string() ? t[l].get<std::string>() : Dump(t[l]);
      if (kind != "sliding_attention" && kind != "full_attention") {
        return Status::InvalidArgument(file + ": layer_types[" + std::to_string(l) +
                                       "] is the unknown layer type \"" + kind +
                                       "\" (sliding_attention and full_attention are known)");
      }
      sliding[l] = kind == "sliding_attention";
    }
  } else if (has_pattern) {
    BR_ASSIGN_OR_RETURN(int64_t pat, IntField(j, "sliding_window_pattern", file, std::nullopt));
    if (pat <= 0) {
      return Status::InvalidArgument(file + ": sliding_window_pattern " + std::to_string(pat) +
                                     " must be > 0");
    }
    for (int32_t l = 0; l < c->n_layers; ++l) sliding[size_t(l)] = (l + 1) % pat != 0;
  }
  bool any = false;
  for (bool s : sliding) any = any || s;
  if (!any) return Status::Ok();
  if (!has_window) return Status::InvalidArgument(file + ": sliding layers but no sliding_window");
  BR_ASSIGN_OR_RETURN(int64_t w, IntField(j, "sliding_window", file, std::nullopt));
  if (w <= 0 || w > std::numeric_limits<int32_t>::max()) {
    return Status::InvalidArgument(file + ": sliding_window " + std::to_string(w) + " must be > 0");
  }
  c->layer_window.assign(size_t(c->n_layers), 0);
  for (int32_t l = 0; l < c->n_layers; ++l) {
    if (sliding[size_t(l)]) c->layer_window[size_t(l)] = int32_t(w);
  }
  return Status::Ok();
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
  } else if (arch == "Qwen3ForCausalLM" || arch == "qwen3") {
    c->arch = "qwen3";
  } else if (arch == "Qwen3MoeForCausalLM" || arch == "qwen3_moe") {
    c->arch = "qwen3_moe";
  } else if (arch == "Qwen2MoeForCausalLM" || arch == "qwen2_moe") {
    c->arch = "qwen2_moe";
  } else {
    return Status::Unsupported(file + ": architecture \"" + arch +
                               "\" is not supported (LlamaForCausalLM, Qwen2ForCausalLM, "
                               "Qwen3ForCausalLM, Qwen3MoeForCausalLM and Qwen2MoeForCausalLM "
                               "are)");
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
  const bool qwen3 = c->arch == "qwen3" || c->arch == "qwen3_moe";
  c->qkv_bias = c->arch == "qwen2" || c->arch == "qwen2_moe";
  if (qwen3 && BoolField(j, "attention_bias", false)) {
    return Status::Unsupported(file + ": attention_bias on Qwen3 is not supported");
  }
  c->qk_norm = qwen3;
  c->shared_classifier = BoolField(j, "tie_word_embeddings", false);
  BR_RETURN_IF_ERROR(RopeScalingFromJson(j, file, c));
  BR_RETURN_IF_ERROR(MoeFromJson(j, file, c));
  BR_RETURN_IF_ERROR(SlidingWindowFromJson(j, file, c));
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
    if (hd <= 0 || hd > 4096) {
      return Status::InvalidArgument(file + ": head_dim " + std::to_string(hd) +
                                     " is out of range");
    }
    if (hd * c->n_heads != c->dim) {
      if (!qwen3) {
        return Status::Unsupported(file + ": head_dim " + std::to_string(hd) +
                                   " differs from hidden_size / num_attention_heads");
      }
      c->head_size = int32_t(hd);
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

  // GPT-OSS attention sinks: a self_attn.sinks tensor [n_heads] in every layer (layer 0 decides).
  {
    const std::string sink0 = "model.layers.0.self_attn.sinks";
    c.attn_sinks = weight_map.empty() ? shards.at("model.safetensors").header.Find(sink0) != nullptr
                                      : weight_map.count(sink0) > 0;
  }
  const int64_t dim = c.dim, kv = c.kv_dim(), hidden = c.hidden_dim, vocab = c.vocab_size;
  const int64_t qd = c.q_dim(), hd = c.head_dim();
  auto ffn = [&](const std::string& p, int64_t h, FfnWeights* f) -> Status {
    BR_ASSIGN_OR_RETURN(f->w1, get(p + "gate_proj.weight", {h, dim}));
    BR_ASSIGN_OR_RETURN(f->w2, get(p + "down_proj.weight", {dim, h}));
    BR_ASSIGN_OR_RETURN(f->w3, get(p + "up_proj.weight", {h, dim}));
    return Status::Ok();
  };
  ModelWeights w;
  w.config = c;
  BR_ASSIGN_OR_RETURN(w.token_embedding, get("model.embed_tokens.weight", {vocab, dim}));
  w.layers.resize(size_t(c.n_layers));
  for (int32_t l = 0; l < c.n_layers; ++l) {
    LayerWeights& L = w.layers[size_t(l)];
    const std::string b = "model.layers." + std::to_string(l) + ".";
    BR_ASSIGN_OR_RETURN(L.attn_norm, get(b + "input_layernorm.weight", {dim}));
    BR_ASSIGN_OR_RETURN(L.wq, get(b + "self_attn.q_proj.weight", {qd, dim}));
    BR_ASSIGN_OR_RETURN(L.wk, get(b + "self_attn.k_proj.weight", {kv, dim}));
    BR_ASSIGN_OR_RETURN(L.wv, get(b + "self_attn.v_proj.weight", {kv, dim}));
    if (c.qkv_bias) {
      BR_ASSIGN_OR_RETURN(L.bq, get(b + "self_attn.q_proj.bias", {qd}));
      BR_ASSIGN_OR_RETURN(L.bk, get(b + "self_attn.k_proj.bias", {kv}));
      BR_ASSIGN_OR_RETURN(L.bv, get(b + "self_attn.v_proj.bias", {kv}));
    }
    BR_ASSIGN_OR_RETURN(L.wo, get(b + "self_attn.o_proj.weight", {dim, qd}));
    if (c.attn_sinks) {
      BR_ASSIGN_OR_RETURN(L.sinks, get(b + "self_attn.sinks", {c.n_heads}));
    }
    if (c.qk_norm) {
      BR_ASSIGN_OR_RETURN(L.q_norm, get(b + "self_attn.q_norm.weight", {hd}));
      BR_ASSIGN_OR_RETURN(L.k_norm, get(b + "self_attn.k_norm.weight", {hd}));
    }
    BR_ASSIGN_OR_RETURN(L.ffn_norm, get(b + "post_attention_layernorm.weight", {dim}));
    if (c.is_moe()) {
      BR_ASSIGN_OR_RETURN(L.router, get(b + "mlp.gate.weight", {c.n_experts, dim}));
      L.experts.resize(size_t(c.n_experts));
      for (int32_t e = 0; e < c.n_experts; ++e) {
        BR_RETURN_IF_ERROR(ffn(b + "mlp.experts." + std::to_string(e) + ".", c.moe_hidden_dim,
                               &L.experts[size_t(e)]));
      }
      if (c.shared_expert_hidden > 0) {
        BR_RETURN_IF_ERROR(ffn(b + "mlp.shared_expert.", c.shared_expert_hidden, &L.shared_expert));
        BR_ASSIGN_OR_RETURN(L.shared_expert_gate,
                            get(b + "mlp.shared_expert_gate.weight", {1, dim}));
      }
    } else {
      BR_ASSIGN_OR_RETURN(L.w1, get(b + "mlp.gate_proj.weight", {hidden, dim}));
      BR_ASSIGN_OR_RETURN(L.w2, get(b + "mlp.down_proj.weight", {dim, hidden}));
      BR_ASSIGN_OR_RETURN(L.w3, get(b + "mlp.up_proj.weight", {hidden, dim}));
    }
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
