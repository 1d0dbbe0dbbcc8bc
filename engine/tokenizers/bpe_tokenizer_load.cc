// engine/tokenizers/bpe_tokenizer_load.cc: parsing tokenizer.json (and tokenizer_config.json)
// into a BpeModel; the public LoadBpeTokenizer / ParseBpeTokenizer. See bpe_tokenizer.h for the
// supported subset.
#include "engine/tokenizers/bpe_tokenizer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "engine/tokenizers/bpe_tokenizer_internal.h"

namespace bitroll::engine {
namespace {

using Json = nlohmann::json;
using namespace bpe_internal;  // NOLINT: this file builds the internal model

// A field's string value, "" when absent or null; false when present with another type.
bool OptString(const Json& obj, const char* key, std::string* out) {
  out->clear();
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return true;
  if (!it->is_string()) return false;
  *out = it->get<std::string>();
  return true;
}

bool OptBool(const Json& obj, const char* key, bool def) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_boolean() ? it->get<bool>() : def;
}

std::string TypeOf(const Json& j) {
  if (!j.is_object()) return "";
  auto it = j.find("type");
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

Status ParseNormalizer(const Json& n) {
  if (n.is_null()) return Status::Ok();
  const std::string type = TypeOf(n);
  if (type == "NFC") return Status::Ok();
  if (type == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array()) {
    for (const Json& s : n["normalizers"]) BR_RETURN_IF_ERROR(ParseNormalizer(s));
    return Status::Ok();
  }
  return Status::Unsupported("normalizer \"" + type + "\" (supported: null, NFC, Sequence)");
}

Status ParsePreTokenizer(const Json& p, std::vector<PreStep>* steps) {
  const std::string type = TypeOf(p);
  if (type == "Sequence") {
    auto it = p.find("pretokenizers");
    if (it == p.end() || !it->is_array())
      return Status::Corruption("Sequence without pretokenizers");
    for (const Json& s : *it) BR_RETURN_IF_ERROR(ParsePreTokenizer(s, steps));
    return Status::Ok();
  }
  const bool after_byte_level =
      std::any_of(steps->begin(), steps->end(), [](const PreStep& s) { return s.byte_level; });
  PreStep step;
  if (type == "ByteLevel") {
    step.byte_level = true;
    step.add_prefix_space = OptBool(p, "add_prefix_space", true);
    if (OptBool(p, "use_regex", true)) {
      BR_ASSIGN_OR_RETURN(step.re, Regex::Compile(kGpt2Pattern, false));
    }
  } else if (type == "Split" || type == "Digits") {
    if (after_byte_level) {
      return Status::Unsupported("pre_tokenizer " + type + " after ByteLevel");
    }
    if (type == "Digits") {
      const bool individual = OptBool(p, "individual_digits", false);
      BR_ASSIGN_OR_RETURN(step.re, Regex::Compile(individual ? "\\p{N}" : "\\p{N}+", false));
    } else {
      auto pat = p.find("pattern");
      if (pat == p.end() || !pat->is_object()) return Status::Corruption("Split without pattern");
      std::string pattern;
      bool literal;
      if (pat->contains("Regex") && (*pat)["Regex"].is_string()) {
        pattern = (*pat)["Regex"].get<std::string>(), literal = false;
      } else if (pat->contains("String") && (*pat)["String"].is_string()) {
        pattern = (*pat)["String"].get<std::string>(), literal = true;
      } else {
        return Status::Corruption("Split pattern is neither {\"Regex\": s} nor {\"String\": s}");
      }
      BR_ASSIGN_OR_RETURN(step.re, Regex::Compile(pattern, literal));
      std::string behavior;
      if (!OptString(p, "behavior", &behavior)) return Status::Corruption("Split behavior");
      static const std::pair<const char*, Behavior> kBehaviors[] = {
          {"Removed", Behavior::kRemoved},
          {"Isolated", Behavior::kIsolated},
          {"MergedWithPrevious", Behavior::kMergedWithPrevious},
          {"MergedWithNext", Behavior::kMergedWithNext},
          {"Contiguous", Behavior::kContiguous}};
      auto b = std::find_if(std::begin(kBehaviors), std::end(kBehaviors),
                            [&](const auto& kv) { return behavior == kv.first; });
      if (b == std::end(kBehaviors)) {
        return Status::Unsupported("Split behavior \"" + behavior + "\"");
      }
      step.behavior = b->second;
      step.invert = OptBool(p, "invert", false);
    }
    if (type == "Digits") step.behavior = Behavior::kIsolated;
  } else {
    return Status::Unsupported("pre_tokenizer \"" + type +
                               "\" (supported: ByteLevel, Split, Digits, Sequence)");
  }
  steps->push_back(std::move(step));
  return Status::Ok();
}

// The BOS named by the post-processor, appended to *bos ("" when none).
Status ParsePostProcessor(const Json& p, std::string* bos) {
  if (p.is_null()) return Status::Ok();
  const std::string type = TypeOf(p);
  if (type == "ByteLevel") return Status::Ok();
  if (type == "Sequence") {
    auto it = p.find("processors");
    if (it == p.end() || !it->is_array()) return Status::Corruption("Sequence without processors");
    for (const Json& s : *it) BR_RETURN_IF_ERROR(ParsePostProcessor(s, bos));
    return Status::Ok();
  }
  if (type != "TemplateProcessing") {
    return Status::Unsupported("post_processor \"" + type +
                               "\" (supported: TemplateProcessing, ByteLevel, Sequence)");
  }
  auto single = p.find("single");
  if (single == p.end() || !single->is_array()) {
    return Status::Corruption("TemplateProcessing without single");
  }
  std::vector<std::string> prefix;
  bool seen_sequence = false;
  for (const Json& item : *single) {
    if (item.contains("Sequence")) {
      seen_sequence = true;
    } else if (item.contains("SpecialToken") && item["SpecialToken"].is_object()) {
      std::string id;
      if (!OptString(item["SpecialToken"], "id", &id)) return Status::Corruption("SpecialToken id");
      if (seen_sequence) {
        return Status::Unsupported("TemplateProcessing appends \"" + id +
                                   "\" after the sequence; only a BOS prefix is supported");
      }
      prefix.push_back(id);
    } else {
      return Status::Corruption("TemplateProcessing item is neither Sequence nor SpecialToken");
    }
  }
  if (prefix.size() > 1) {
    return Status::Unsupported("TemplateProcessing prefixes " + std::to_string(prefix.size()) +
                               " special tokens; only one (BOS) is supported");
  }
  if (prefix.size() == 1) {
    // The template names a key of "special_tokens"; its first id's token is the BOS content.
    *bos = prefix[0];
    auto st = p.find("special_tokens");
    if (st != p.end() && st->is_object() && st->contains(prefix[0])) {
      const Json& e = (*st)[prefix[0]];
      if (e.contains("tokens") && e["tokens"].is_array() && e["tokens"].size() == 1 &&
          e["tokens"][0].is_string()) {
        *bos = e["tokens"][0].get<std::string>();
      }
    }
  }
  return Status::Ok();
}

// bos_token / eos_token of tokenizer_config.json: a string, null, or {"content": s}.
std::string ConfigToken(const Json& cfg, const char* key) {
  auto it = cfg.find(key);
  if (it == cfg.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return "";
}

// Parses tokenizer.json. model.vocab and model.merges are the bulk of the file (100k+ entries
// each): they are taken out of the token stream as the parser meets them rather than built into
// the DOM, which halves the load time. Entries of an unexpected shape stay in the DOM and are
// reported by ParseVocab / ParseMerges.
Result<Json> ParseRoot(std::string_view json,
                       std::vector<std::pair<std::string, Json>>* vocab_entries,
                       std::vector<Json>* merge_entries) {
  std::string keys[4];  // the current object key at depth 1..3
  const Json::parser_callback_t capture = [&](int depth, Json::parse_event_t event, Json& parsed) {
    using E = Json::parse_event_t;
    const bool in_model = depth == 3 && keys[1] == "model";
    if (event == E::key && depth <= 3) {
      keys[depth] = parsed.get<std::string>();
      return !(in_model && keys[2] == "vocab");  // no DOM slot for a vocab key
    }
    if (in_model && keys[2] == "vocab") {
      if (event == E::value) {
        vocab_entries->emplace_back(keys[3], std::move(parsed));  // non-integers reported later
      } else if (event == E::object_start || event == E::array_start) {
        vocab_entries->emplace_back(keys[3], Json());  // a structured id: reported later
      }
      return false;
    }
    if (in_model && keys[2] == "merges" &&
        (event == E::value || (event == E::array_end && parsed.size() == 2))) {
      merge_entries->push_back(std::move(parsed));
      return false;
    }
    return true;
  };
  Json root = Json::parse(json, capture, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    return Status::Corruption("not a JSON object (malformed JSON)");
  }
  return root;
}

// The model's type and options, the normalizer, pre-tokenizer, decoder and post-processor: fills
// bm->ignore_merges and bm->steps, and the post-processor's BOS into *template_bos.
Status ParsePipeline(const Json& root, const Json& model, BpeModel* bm, std::string* template_bos) {
  const std::string model_type = TypeOf(model);
  if (model_type != "BPE") {
    return Status::Unsupported("model type \"" + model_type + "\" (supported: BPE)");
  }
  if (model.contains("dropout") && !model["dropout"].is_null()) {
    return Status::Unsupported("BPE dropout is random; bitroll needs a deterministic tokenizer");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    std::string v;
    if (!OptString(model, key, &v) || !v.empty()) return Status::Unsupported(std::string(key));
  }
  bm->ignore_merges = OptBool(model, "ignore_merges", false);
  BR_RETURN_IF_ERROR(ParseNormalizer(root.value("normalizer", Json())));
  const Json pre = root.value("pre_tokenizer", Json());
  if (!pre.is_null()) BR_RETURN_IF_ERROR(ParsePreTokenizer(pre, &bm->steps));
  if (std::none_of(bm->steps.begin(), bm->steps.end(),
                   [](const PreStep& s) { return s.byte_level; })) {
    return Status::Unsupported("pre_tokenizer has no ByteLevel step: not a byte-level BPE");
  }
  const Json decoder = root.value("decoder", Json());
  if (!decoder.is_null() && TypeOf(decoder) != "ByteLevel") {
    return Status::Unsupported("decoder \"" + TypeOf(decoder) + "\" (supported: ByteLevel)");
  }
  return ParsePostProcessor(root.value("post_processor", Json()), template_bos);
}

// Vocabulary: fills bm->vocab and bm->byte_id, `by_text` (the file's strings, GPT-2 alphabet, to
// ids, for merges and names) and `decoded` (each id's bytes).
Status ParseVocab(const Json& model, const std::vector<std::pair<std::string, Json>>& entries,
                  BpeModel* bm, std::unordered_map<std::string, int32_t>* by_text,
                  std::vector<std::string>* decoded) {
  auto vocab_it = model.find("vocab");
  if (vocab_it == model.end() || !vocab_it->is_object()) return Status::Corruption("no vocab");
  by_text->reserve(entries.size());
  std::vector<bool> used;
  bm->byte_id.fill(-1);
  std::string bytes;
  for (const auto& [text, idj] : entries) {
    if (!idj.is_number_integer() || idj.get<int64_t>() < 0 || idj.get<int64_t>() >= INT32_MAX) {
      return Status::Corruption("vocab entry \"" + text + "\" has an invalid id");
    }
    const auto id = int32_t(idj.get<int64_t>());
    if (size_t(id) >= decoded->size()) decoded->resize(size_t(id) + 1), used.resize(size_t(id) + 1);
    if (used[id]) return Status::Corruption("vocab id " + std::to_string(id) + " is used twice");
    used[id] = true;
    by_text->emplace(text, id);
    if (AlphabetToBytes(text, &bytes)) {
      (*decoded)[id] = bytes;
      if (bytes.size() == 1) bm->byte_id[uint8_t(bytes[0])] = id;
      bm->vocab.emplace(bytes, id);
    } else {
      (*decoded)[id] = text;  // outside the byte alphabet: decodes to itself (HF's ByteLevel rule)
    }
  }
  return Status::Ok();
}

// Merges: "a b" or ["a", "b"]; rank = index. A repeated pair keeps its last rank (HF collects
// them into a HashMap in order).
Status ParseMerges(const Json& model, const std::vector<Json>& entries,
                   const std::unordered_map<std::string, int32_t>& by_text, BpeModel* bm) {
  auto merges_it = model.find("merges");
  if (merges_it == model.end() || !merges_it->is_array()) return Status::Corruption("no merges");
  if (!merges_it->empty()) {
    return Status::Corruption("merge " + (*merges_it)[0].dump() + " is neither \"a b\" nor [a, b]");
  }
  bm->merges.reserve(entries.size());
  int32_t rank = 0;
  for (const Json& m : entries) {
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
        return Status::Corruption("merge " + std::to_string(rank) + " \"" + s +
                                  "\" is not two tokens separated by one space");
      }
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>(), b = m[1].get<std::string>();
    } else {
      return Status::Corruption("merge " + std::to_string(rank) + " is neither \"a b\" nor [a, b]");
    }
    auto ia = by_text.find(a), ib = by_text.find(b), iab = by_text.find(a + b);
    for (const auto& [it, name] : {std::pair{ia, &a}, std::pair{ib, &b}}) {
      if (it == by_text.end()) {
        return Status::Corruption("merge " + std::to_string(rank) + " names \"" + *name +
                                  "\", which is not in the vocabulary");
      }
    }
    if (iab == by_text.end()) {
      return Status::Corruption("merge " + std::to_string(rank) + " makes \"" + a + b +
                                "\", which is not in the vocabulary");
    }
    bm->merges[PairKey(ia->second, ib->second)] = MergeValue{rank, iab->second};
    ++rank;
  }
  return Status::Ok();
}

// Added tokens: fills bm->added and its tries, `decoded` for their ids and `added_by_text`.
Status ParseAddedTokens(const Json& root, const BpeTokenizerOptions& options, BpeModel* bm,
                        std::vector<std::string>* decoded,
                        std::unordered_map<std::string, int32_t>* added_by_text) {
  auto added_it = root.find("added_tokens");
  if (added_it == root.end() || added_it->is_null()) return Status::Ok();
  if (!added_it->is_array()) return Status::Corruption("added_tokens is not an array");
  std::string bytes;
  for (const Json& a : *added_it) {
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
        !a.contains("content") || !a["content"].is_string()) {
      return Status::Corruption("added token without integer id and string content");
    }
    const int64_t id = a["id"].get<int64_t>();
    if (id < 0 || id >= INT32_MAX) return Status::Corruption("added token id out of range");
    AddedToken t{int32_t(id),
                 a["content"].get<std::string>(),
                 OptBool(a, "special", false),
                 OptBool(a, "lstrip", false),
                 OptBool(a, "rstrip", false),
                 OptBool(a, "normalized", false),
                 OptBool(a, "single_word", false)};
    if (t.content.empty())
      return Status::Corruption("added token " + std::to_string(id) + " is empty");
    if (size_t(id) >= decoded->size()) decoded->resize(size_t(id) + 1);
    // HF's ByteLevel decoder maps a token whose characters are all in the byte alphabet.
    (*decoded)[id] = AlphabetToBytes(t.content, &bytes) ? bytes : t.content;
    (*added_by_text)[t.content] = t.id;
    const int32_t index = int32_t(bm->added.size());
    if (!(t.special && options.split_special_tokens)) {
      (t.normalized ? bm->normalized_trie : bm->raw_trie).Insert(t.content, index);
    }
    bm->added.push_back(std::move(t));
  }
  return Status::Ok();
}

// BOS / EOS: the options' tokens, else the post-processor's BOS, else tokenizer_config.json's;
// each is looked up among the added tokens first, then the vocabulary.
Status ResolveBosEos(std::string_view config_json, const BpeTokenizerOptions& options,
                     const std::string& template_bos,
                     const std::unordered_map<std::string, int32_t>& by_text,
                     const std::unordered_map<std::string, int32_t>& added_by_text, BpeModel* bm) {
  Json cfg;
  if (!config_json.empty()) {
    cfg = Json::parse(config_json, nullptr, false);
    if (cfg.is_discarded() || !cfg.is_object()) {
      return Status::Corruption("tokenizer_config.json is not a JSON object");
    }
  }
  auto resolve = [&](const std::string& content, const char* what, int32_t* id) -> Status {
    if (content.empty()) return Status::Ok();
    if (auto it = added_by_text.find(content); it != added_by_text.end()) {
      *id = it->second;
    } else if (auto jt = by_text.find(content); jt != by_text.end()) {
      *id = jt->second;
    } else {
      return Status::InvalidArgument(std::string(what) + " token \"" + content +
                                     "\" is not in the vocabulary");
    }
    return Status::Ok();
  };
  std::string bos = options.bos_token, eos = options.eos_token;
  if (bos.empty()) bos = template_bos;
  if (bos.empty() && cfg.is_object()) bos = ConfigToken(cfg, "bos_token");
  if (eos.empty() && cfg.is_object()) eos = ConfigToken(cfg, "eos_token");
  BR_RETURN_IF_ERROR(resolve(bos, "BOS", &bm->bos));
  return resolve(eos, "EOS", &bm->eos);
}

Result<std::unique_ptr<Tokenizer>> ParseImpl(std::string_view json, std::string_view config_json,
                                             int32_t expected_vocab_size,
                                             const BpeTokenizerOptions& options) {
  if (expected_vocab_size < 0) {
    return Status::InvalidArgument("expected_vocab_size must be >= 0, got " +
                                   std::to_string(expected_vocab_size));
  }
  std::vector<std::pair<std::string, Json>> vocab_entries;
  std::vector<Json> merge_entries;
  BR_ASSIGN_OR_RETURN(Json root, ParseRoot(json, &vocab_entries, &merge_entries));
  auto model_it = root.find("model");
  if (model_it == root.end() || !model_it->is_object()) return Status::Corruption("no model");
  const Json& model = *model_it;
  BpeModel bm;
  std::string template_bos;
  BR_RETURN_IF_ERROR(ParsePipeline(root, model, &bm, &template_bos));

  std::unordered_map<std::string, int32_t> by_text;
  std::vector<std::string> decoded;
  BR_RETURN_IF_ERROR(ParseVocab(model, vocab_entries, &bm, &by_text, &decoded));
  BR_RETURN_IF_ERROR(ParseMerges(model, merge_entries, by_text, &bm));
  std::unordered_map<std::string, int32_t> added_by_text;
  BR_RETURN_IF_ERROR(ParseAddedTokens(root, options, &bm, &decoded, &added_by_text));

  if (decoded.size() > size_t(INT32_MAX)) return Status::Corruption("too many tokens");
  if (expected_vocab_size != 0 && int64_t(decoded.size()) > expected_vocab_size) {
    return Status::InvalidArgument("tokenizer.json has " + std::to_string(decoded.size()) +
                                   " tokens, model expects " + std::to_string(expected_vocab_size));
  }
  bm.decoded = std::move(decoded);
  BR_RETURN_IF_ERROR(
      ResolveBosEos(config_json, options, template_bos, by_text, added_by_text, &bm));
  return NewBpeTokenizer(std::move(bm), options.cache_capacity);
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> ParseBpeTokenizer(std::string_view json,
                                                     std::string_view config_json,
                                                     int32_t expected_vocab_size,
                                                     const BpeTokenizerOptions& options,
                                                     const std::string& name) {
  try {
    auto r = ParseImpl(json, config_json, expected_vocab_size, options);
    if (!r.ok()) return r.status().WithContext(name);
    return r;
  } catch (const std::exception& e) {  // nlohmann type errors on unexpected shapes; bad_alloc
    return Status::Corruption(name + ": " + e.what());
  }
}

Result<std::unique_ptr<Tokenizer>> LoadBpeTokenizer(const std::string& path,
                                                    int32_t expected_vocab_size,
                                                    const BpeTokenizerOptions& options) {
  std::string json, config;
  BR_RETURN_IF_ERROR(ReadTokenizerFile(path, &json));
  if (!options.config_path.empty()) {
    BR_RETURN_IF_ERROR(ReadTokenizerFile(options.config_path, &config));
  } else {
    const size_t slash = path.find_last_of('/');
    const std::string dir = slash == std::string::npos ? "" : path.substr(0, slash + 1);
    const Status s = ReadTokenizerFile(dir + "tokenizer_config.json", &config);
    if (s.code() == ErrorCode::kNotFound) {
      config.clear();
    } else {
      BR_RETURN_IF_ERROR(s);
    }
  }
  return ParseBpeTokenizer(json, config, expected_vocab_size, options, path);
}

Result<std::unique_ptr<Tokenizer>> LoadBpeTokenizer(const std::string& path,
                                                    int32_t expected_vocab_size) {
  return LoadBpeTokenizer(path, expected_vocab_size, BpeTokenizerOptions());
}

}  // namespace bitroll::engine
