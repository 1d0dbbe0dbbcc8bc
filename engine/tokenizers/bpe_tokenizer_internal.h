// engine/tokenizers/bpe_tokenizer_internal.h: pieces shared by bpe_tokenizer.cc (encode, decode)
// and bpe_tokenizer_load.cc (tokenizer.json parsing). Not a public interface: include
// engine/tokenizers/bpe_tokenizer.h instead.
#pragma once

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/tokenizer.h"
#include "schema/status.h"

namespace bitroll::engine::bpe_internal {

// GPT-2's default pre-tokenizer pattern (ByteLevel use_regex=true).
inline constexpr const char* kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

// Length of the valid UTF-8 character at s[i], or 0 when the bytes there are not one (stray
// continuation byte, overlong form, surrogate, above U+10FFFF, truncated). *cp gets its value.
// REQUIRES: i < s.size().
size_t Utf8Char(std::string_view s, size_t i, uint32_t* cp);

// Maps a vocabulary string (GPT-2 bytes_to_unicode alphabet) to its bytes; false when a character
// is outside the alphabet (such a token can only be reached as an added token).
bool AlphabetToBytes(std::string_view s, std::string* out);

// ---- PCRE2 -------------------------------------------------------------------------------------

struct CodeDeleter {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};
struct MatchDataDeleter {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};
using MatchData = std::unique_ptr<pcre2_match_data, MatchDataDeleter>;

class Regex {
 public:
  // Compiles `pattern` with PCRE2_UTF | PCRE2_UCP (JIT when available). `literal`: the pattern is
  // a plain string (HF's {"String": ...}). Errors: kCorruption with PCRE2's message.
  static Result<std::unique_ptr<Regex>> Compile(const std::string& pattern, bool literal);

  // The (start, end) byte offsets of every match in `s`, left to right, as Oniguruma's find_iter
  // yields them (an empty match right after the previous match is skipped; after an empty match
  // the search resumes one character on).
  // REQUIRES: `s` is valid UTF-8; `md` has at least one ovector pair.
  Status FindAll(std::string_view s, pcre2_match_data* md,
                 std::vector<std::pair<size_t, size_t>>* out) const;

 private:
  std::unique_ptr<pcre2_code, CodeDeleter> code_;
};

// ---- pre-tokenizer steps -----------------------------------------------------------------------

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct PreStep {
  bool byte_level = false;        // ByteLevel step (else Split/Digits)
  bool add_prefix_space = false;  // ByteLevel only
  std::unique_ptr<Regex> re;      // null: ByteLevel with use_regex=false
  Behavior behavior = Behavior::kIsolated;
  bool invert = false;
};

// ---- added tokens ------------------------------------------------------------------------------

struct AddedToken {
  int32_t id;
  std::string content;
  bool special, lstrip, rstrip, normalized, single_word;
};

// A byte trie over added-token contents for leftmost-longest matching (aho-corasick's
// MatchKind::LeftmostLongest, which HF uses).
class AddedTrie {
 public:
  AddedTrie() : nodes_(1) { first_.fill(false); }
  void Insert(const std::string& s, int32_t token_index) {
    if (s.empty()) return;
    int32_t n = 0;
    for (char c : s) {
      auto& ch = nodes_[n].children;
      auto it = std::find_if(ch.begin(), ch.end(), [&](auto& p) { return p.first == uint8_t(c); });
      if (it == ch.end()) {
        ch.emplace_back(uint8_t(c), int32_t(nodes_.size()));
        const int32_t next = int32_t(nodes_.size());
        nodes_.emplace_back();
        n = next;
      } else {
        n = it->second;
      }
    }
    nodes_[n].token = token_index;
    first_[uint8_t(s[0])] = true;
    empty_ = false;
  }
  bool empty() const { return empty_; }
  // The longest token starting at s[i]: its index and length, or -1.
  int32_t LongestAt(std::string_view s, size_t i, size_t* len) const {
    if (!first_[uint8_t(s[i])]) return -1;
    int32_t n = 0, best = -1;
    for (size_t k = i; k < s.size(); ++k) {
      int32_t next = -1;
      for (const auto& [c, child] : nodes_[n].children) {
        if (c == uint8_t(s[k])) next = child;
      }
      if (next < 0) break;
      n = next;
      if (nodes_[n].token >= 0) best = nodes_[n].token, *len = k + 1 - i;
    }
    return best;
  }

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;
    int32_t token = -1;
  };
  std::vector<Node> nodes_;
  std::array<bool, 256> first_;
  bool empty_ = true;
};

// ---- vocabulary --------------------------------------------------------------------------------

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <typename V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

struct MergeValue {
  int32_t rank;
  int32_t id;
};

inline uint64_t PairKey(int32_t a, int32_t b) {
  return (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
}

// Everything a loaded tokenizer knows; built by bpe_tokenizer_load.cc, immutable afterwards.
struct BpeModel {
  StringMap<int32_t> vocab;                         // token bytes -> id (model vocabulary)
  std::array<int32_t, 256> byte_id;                 // id of each single-byte token, -1 if none
  std::unordered_map<uint64_t, MergeValue> merges;  // (left id, right id) -> rank, merged id
  bool ignore_merges = false;                       // a whole word in the vocabulary skips BPE
  std::vector<PreStep> steps;                       // pre-tokenizer, in order
  std::vector<AddedToken> added;
  AddedTrie raw_trie;                // added tokens with normalized=false (index into `added`)
  AddedTrie normalized_trie;         // added tokens with normalized=true
  std::vector<std::string> decoded;  // id -> bytes; size() is vocab_size()
  int32_t bos = -1, eos = -1;
};

// The tokenizer over `model`; cache_capacity as in BpeTokenizerOptions.
std::unique_ptr<Tokenizer> NewBpeTokenizer(BpeModel model, size_t cache_capacity);

}  // namespace bitroll::engine::bpe_internal
