// engine/tokenizers/bpe_tokenizer.cc: encode and decode for the tokenizer.json byte-level BPE
// (see bpe_tokenizer.h; loading is in bpe_tokenizer_load.cc).
//
// The pipeline mirrors Hugging Face tokenizers (tokenizer.rs, added_vocabulary.rs,
// pre_tokenizers/{split,byte_level}.rs, models/bpe/{model,word}.rs) step by step, so each step
// can be checked against it. Everything works on raw bytes: vocabulary strings are mapped back
// through bytes_to_unicode at load time, so no text is ever re-encoded to the GPT-2 alphabet.
#include "engine/tokenizers/bpe_tokenizer_internal.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <deque>
#include <functional>
#include <mutex>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

namespace bitroll::engine::bpe_internal {
namespace {

constexpr size_t kMaxCachedWord = 256;  // HF's MAX_LENGTH for its word cache
constexpr int kCacheShards = 16;

// ---- GPT-2 bytes_to_unicode --------------------------------------------------------------------

// Byte b is shown as itself when printable (! .. ~, ¡ .. ¬, ® .. ÿ), else as 256 + n for the n-th
// other byte in increasing order. Codepoints used: 33..323.
struct ByteAlphabet {
  std::array<uint32_t, 256> byte_to_cp;
  std::array<int16_t, 324> cp_to_byte;  // -1: not a byte character
  ByteAlphabet() {
    cp_to_byte.fill(-1);
    uint32_t n = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool shown = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      byte_to_cp[b] = shown ? b : 256 + n++;
      cp_to_byte[byte_to_cp[b]] = int16_t(b);
    }
  }
};
const ByteAlphabet& Alphabet() {
  static const ByteAlphabet a;
  return a;
}

}  // namespace

size_t Utf8Char(std::string_view s, size_t i, uint32_t* cp) {
  const auto b0 = uint8_t(s[i]);
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  size_t n;
  uint32_t v, min;
  if ((b0 & 0xE0) == 0xC0) {
    n = 2, v = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 3, v = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    n = 4, v = b0 & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (s.size() - i < n) return 0;
  for (size_t k = 1; k < n; ++k) {
    const auto b = uint8_t(s[i + k]);
    if ((b & 0xC0) != 0x80) return 0;
    v = (v << 6) | (b & 0x3F);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  *cp = v;
  return n;
}

namespace {

// Rust's char::is_whitespace (Unicode White_Space).
bool IsWhiteSpace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

bool IsAsciiWordChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

}  // namespace

bool AlphabetToBytes(std::string_view s, std::string* out) {
  out->clear();
  const ByteAlphabet& a = Alphabet();
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    const size_t n = Utf8Char(s, i, &cp);
    if (n == 0 || cp >= a.cp_to_byte.size() || a.cp_to_byte[cp] < 0) return false;
    *out += char(a.cp_to_byte[cp]);
    i += n;
  }
  return true;
}

// ---- PCRE2 -------------------------------------------------------------------------------------

Result<std::unique_ptr<Regex>> Regex::Compile(const std::string& pattern, bool literal) {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  const uint32_t flags = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);  // UCP: \p, \s, \w
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   flags, &err, &err_off, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    return Status::Corruption("regex /" + pattern + "/ rejected by PCRE2 at offset " +
                              std::to_string(err_off) + ": " + reinterpret_cast<const char*>(msg));
  }
  auto re = std::make_unique<Regex>();
  re->code_.reset(code);
  // JIT is an optimization only: both paths implement the same matching semantics.
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return re;
}

Status Regex::FindAll(std::string_view s, pcre2_match_data* md,
                      std::vector<std::pair<size_t, size_t>>* out) const {
  out->clear();
  const auto subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t off = 0;
  size_t last_end = SIZE_MAX;
  while (off <= s.size()) {
    int rc = pcre2_match(code_.get(), subject, s.size(), off, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      rc = pcre2_match(code_.get(), subject, s.size(), off, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md,
                       nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof(msg));
      return Status::ResourceExhausted(std::string("pre-tokenizer regex failed: ") +
                                       reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t start = ov[0], end = ov[1];
    if (start == end) {
      if (start != last_end) out->emplace_back(start, end);
      if (end >= s.size()) break;
      uint32_t cp;
      off = end + std::max<size_t>(1, Utf8Char(s, end, &cp));
    } else {
      out->emplace_back(start, end);
      off = end;
    }
    last_end = end;
  }
  return Status::Ok();
}

namespace {

struct Span {
  size_t begin, end;
  bool match;
};

// HF NormalizedString::split: the pieces of `s` cut by `matches` under `behavior`, empty ones
// dropped.
void SplitByBehavior(std::string_view s, const std::vector<std::pair<size_t, size_t>>& matches,
                     Behavior behavior, bool invert, std::vector<Span>* spans,
                     std::vector<std::string_view>* out) {
  spans->clear();
  if (s.empty()) {
    spans->push_back({0, 0, false});
  } else {
    size_t prev = 0;
    for (const auto& [a, b] : matches) {
      if (prev != a) spans->push_back({prev, a, false});
      spans->push_back({a, b, true});
      prev = b;
    }
    if (prev != s.size()) spans->push_back({prev, s.size(), false});
  }
  if (invert) {
    for (Span& sp : *spans) sp.match = !sp.match;
  }
  std::vector<Span> merged;
  bool previous_match = false;
  switch (behavior) {
    case Behavior::kIsolated:
      merged = *spans;
      for (Span& sp : merged) sp.match = false;
      break;
    case Behavior::kRemoved:
      merged = *spans;
      break;
    case Behavior::kContiguous:
      for (const Span& sp : *spans) {
        if (sp.match == previous_match && !merged.empty()) {
          merged.back().end = sp.end;
        } else {
          merged.push_back({sp.begin, sp.end, false});
        }
        previous_match = sp.match;
      }
      break;
    case Behavior::kMergedWithPrevious:
      for (const Span& sp : *spans) {
        if (sp.match && !previous_match && !merged.empty()) {
          merged.back().end = sp.end;
        } else {
          merged.push_back({sp.begin, sp.end, false});
        }
        previous_match = sp.match;
      }
      break;
    case Behavior::kMergedWithNext:
      for (auto it = spans->rbegin(); it != spans->rend(); ++it) {
        if (it->match && !previous_match && !merged.empty()) {
          merged.back().begin = it->begin;
        } else {
          merged.push_back({it->begin, it->end, false});
        }
        previous_match = it->match;
      }
      std::reverse(merged.begin(), merged.end());
      break;
  }
  for (const Span& sp : merged) {
    if (!sp.match && sp.end > sp.begin) out->push_back(s.substr(sp.begin, sp.end - sp.begin));
  }
}

// A piece of the input: an added token (id >= 0) or text to pre-tokenize (id == -1).
struct Segment {
  size_t begin, end;
  int32_t id;
};

// ---- word cache --------------------------------------------------------------------------------

// Thread-safe, bounded (stops inserting when full, as HF's cache does).
class WordCache {
 public:
  explicit WordCache(size_t capacity) : per_shard_(capacity / kCacheShards + 1) {}
  bool Get(std::string_view w, std::vector<int32_t>* out) const {
    const Shard& sh = shards_[StringHash{}(w) % kCacheShards];
    std::lock_guard<std::mutex> lock(sh.mu);
    auto it = sh.map.find(w);
    if (it == sh.map.end()) return false;
    out->insert(out->end(), it->second.begin(), it->second.end());
    return true;
  }
  void Put(std::string_view w, std::span<const int32_t> ids) {
    Shard& sh = shards_[StringHash{}(w) % kCacheShards];
    std::lock_guard<std::mutex> lock(sh.mu);
    if (sh.map.size() >= per_shard_) return;
    sh.map.emplace(std::string(w), std::vector<int32_t>(ids.begin(), ids.end()));
  }

 private:
  struct Shard {
    mutable std::mutex mu;
    StringMap<std::vector<int32_t>> map;
  };
  size_t per_shard_;
  std::array<Shard, kCacheShards> shards_;
};

// ---- the tokenizer -----------------------------------------------------------------------------

// Per-Encode scratch memory.
struct Scratch {
  MatchData md;
  std::vector<std::pair<size_t, size_t>> matches;
  std::vector<Span> spans;
  std::deque<std::string> owned;  // pieces that gained a prefix space
  struct Symbol {
    int32_t id, prev, next;
  };
  std::vector<Symbol> syms;
  struct Cand {
    int32_t rank, pos, new_id;
  };
  std::vector<Cand> heap;
};

class BpeTokenizer final : public Tokenizer {
 public:
  BpeTokenizer(BpeModel model, size_t cache_capacity) : m_(std::move(model)) {
    if (cache_capacity > 0) cache_ = std::make_unique<WordCache>(cache_capacity);
  }
  int32_t vocab_size() const override { return int32_t(m_.decoded.size()); }
  int32_t bos_id() const override { return m_.bos; }
  int32_t eos_id() const override { return m_.eos; }
  Result<std::vector<int32_t>> Encode(std::string_view text, bool add_bos) const override;
  Result<std::string> DecodePiece(int32_t prev, int32_t token) const override;

 private:
  void FindAdded(const AddedTrie& trie, std::string_view text, size_t base,
                 std::vector<Segment>* out) const;
  Status EncodeText(std::string_view s, Scratch* sc, std::vector<int32_t>* out) const;
  Status EncodeValid(std::string_view s, Scratch* sc, std::vector<int32_t>* out) const;
  Status EncodeWord(std::string_view w, Scratch* sc, std::vector<int32_t>* out) const;

  const BpeModel m_;
  std::unique_ptr<WordCache> cache_;  // null when disabled
};

void BpeTokenizer::FindAdded(const AddedTrie& trie, std::string_view text, size_t base,
                             std::vector<Segment>* out) const {
  size_t start_offset = 0;
  size_t i = 0;
  while (i < text.size()) {
    size_t len = 0;
    const int32_t t = trie.LongestAt(text, i, &len);
    if (t < 0) {
      ++i;
      continue;
    }
    const AddedToken& tok = m_.added[t];
    size_t start = i, stop = i + len;
    i = stop;  // aho-corasick resumes after the match whatever we do with it
    if (tok.single_word) {
      const bool start_space = start == 0 || !IsAsciiWordChar(text[start - 1]);
      const bool stop_space = stop == text.size() || !IsAsciiWordChar(text[stop]);
      if (!start_space || !stop_space) continue;
    }
    if (tok.lstrip) {
      size_t b = start;
      while (b > start_offset) {  // step back over whitespace characters
        size_t c = b - 1;
        while (c > 0 && (uint8_t(text[c]) & 0xC0) == 0x80) --c;
        uint32_t cp;
        if (Utf8Char(text, c, &cp) != b - c || !IsWhiteSpace(cp)) break;
        b = c;
      }
      start = b;
    }
    if (tok.rstrip) {
      uint32_t cp;
      size_t n;
      while (stop < text.size() && (n = Utf8Char(text, stop, &cp)) > 0 && IsWhiteSpace(cp)) {
        stop += n;
      }
    }
    if (start_offset < start) out->push_back({base + start_offset, base + start, -1});
    out->push_back({base + start, base + stop, tok.id});
    start_offset = stop;
    i = std::max(i, stop);
  }
  if (start_offset < text.size()) out->push_back({base + start_offset, base + text.size(), -1});
}

Result<std::vector<int32_t>> BpeTokenizer::Encode(std::string_view text, bool add_bos) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos && m_.bos >= 0) out.push_back(m_.bos);
  if (text.empty()) return out;
  Scratch sc;
  sc.md.reset(pcre2_match_data_create(1, nullptr));
  if (sc.md == nullptr) return Status::ResourceExhausted("pcre2_match_data_create failed");

  // HF's order: non-normalized added tokens on the raw text, then normalized ones in the gaps.
  std::vector<Segment> first, segs;
  FindAdded(m_.raw_trie, text, 0, &first);
  for (const Segment& s : first) {
    if (s.id >= 0 || m_.normalized_trie.empty()) {
      segs.push_back(s);
    } else {
      FindAdded(m_.normalized_trie, text.substr(s.begin, s.end - s.begin), s.begin, &segs);
    }
  }
  for (const Segment& s : segs) {
    if (s.id >= 0) {
      out.push_back(s.id);
    } else {
      BR_RETURN_IF_ERROR(EncodeText(text.substr(s.begin, s.end - s.begin), &sc, &out));
    }
  }
  return out;
}

// Splits `s` into runs of valid UTF-8 (normalized and pre-tokenized) and runs of invalid bytes
// (each one word, encoded from byte tokens).
Status BpeTokenizer::EncodeText(std::string_view s, Scratch* sc, std::vector<int32_t>* out) const {
  size_t i = 0;
  while (i < s.size()) {
    size_t start = i;
    uint32_t cp;
    size_t n;
    while (i < s.size() && (n = Utf8Char(s, i, &cp)) > 0) i += n;
    if (i > start) BR_RETURN_IF_ERROR(EncodeValid(s.substr(start, i - start), sc, out));
    start = i;
    while (i < s.size() && Utf8Char(s, i, &cp) == 0) ++i;
    if (i > start) BR_RETURN_IF_ERROR(EncodeWord(s.substr(start, i - start), sc, out));
  }
  return Status::Ok();
}

Status BpeTokenizer::EncodeValid(std::string_view s, Scratch* sc, std::vector<int32_t>* out) const {
  // The normalizer (NFC) is the identity here: see the header.
  std::vector<std::string_view> pieces{s}, next;
  sc->owned.clear();
  for (const PreStep& step : m_.steps) {
    next.clear();
    for (std::string_view p : pieces) {
      if (step.byte_level && step.add_prefix_space && (p.empty() || p[0] != ' ')) {
        sc->owned.push_back(" " + std::string(p));
        p = sc->owned.back();
      }
      if (step.re == nullptr) {
        if (!p.empty()) next.push_back(p);
        continue;
      }
      BR_RETURN_IF_ERROR(step.re->FindAll(p, sc->md.get(), &sc->matches));
      SplitByBehavior(p, sc->matches, step.behavior, step.invert, &sc->spans, &next);
    }
    pieces.swap(next);
  }
  for (std::string_view p : pieces) BR_RETURN_IF_ERROR(EncodeWord(p, sc, out));
  return Status::Ok();
}

// HF Word::merge_all: repeatedly merge the adjacent pair of lowest rank, ties to the leftmost.
Status BpeTokenizer::EncodeWord(std::string_view w, Scratch* sc, std::vector<int32_t>* out) const {
  if (w.empty()) return Status::Ok();
  if (m_.ignore_merges) {
    auto it = m_.vocab.find(w);
    if (it != m_.vocab.end()) {
      out->push_back(it->second);
      return Status::Ok();
    }
  }
  const bool cacheable = cache_ != nullptr && w.size() < kMaxCachedWord;
  if (cacheable && cache_->Get(w, out)) return Status::Ok();

  auto& syms = sc->syms;
  syms.clear();
  for (size_t i = 0; i < w.size(); ++i) {
    const int32_t id = m_.byte_id[uint8_t(w[i])];
    if (id < 0) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "0x%02X", unsigned(uint8_t(w[i])));
      return Status::Unsupported(std::string("byte ") + hex + " has no token in the vocabulary");
    }
    syms.push_back({id, int32_t(i) - 1, i + 1 < w.size() ? int32_t(i) + 1 : -1});
  }
  // Min-heap on (rank, pos).
  auto later = [](const Scratch::Cand& a, const Scratch::Cand& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  auto& heap = sc->heap;
  heap.clear();
  auto push_pair = [&](int32_t pos) {
    if (pos < 0 || syms[pos].next < 0) return;
    auto it = m_.merges.find(PairKey(syms[pos].id, syms[syms[pos].next].id));
    if (it == m_.merges.end()) return;
    heap.push_back({it->second.rank, pos, it->second.id});
    std::push_heap(heap.begin(), heap.end(), later);
  };
  for (int32_t i = 0; i + 1 < int32_t(syms.size()); ++i) push_pair(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Scratch::Cand top = heap.back();
    heap.pop_back();
    auto& l = syms[top.pos];
    if (l.id < 0 || l.next < 0) continue;  // dead symbol or the last one
    const int32_t r = l.next;
    auto it = m_.merges.find(PairKey(l.id, syms[r].id));
    if (it == m_.merges.end() || it->second.id != top.new_id) continue;  // expired entry
    l.id = top.new_id;
    l.next = syms[r].next;
    if (l.next >= 0) syms[l.next].prev = top.pos;
    syms[r].id = -1;
    push_pair(l.prev);
    push_pair(top.pos);
  }
  const size_t before = out->size();
  for (int32_t i = 0; i >= 0; i = syms[i].next) out->push_back(syms[i].id);
  if (cacheable)
    cache_->Put(w, std::span<const int32_t>(out->data() + before, out->size() - before));
  return Status::Ok();
}

Result<std::string> BpeTokenizer::DecodePiece(int32_t /*prev*/, int32_t token) const {
  if (token < 0 || token >= vocab_size()) {
    return Status::OutOfRange("token " + std::to_string(token) + " outside the vocabulary of " +
                              std::to_string(vocab_size()));
  }
  return m_.decoded[token];
}

}  // namespace

std::unique_ptr<Tokenizer> NewBpeTokenizer(BpeModel model, size_t cache_capacity) {
  return std::make_unique<BpeTokenizer>(std::move(model), cache_capacity);
}

}  // namespace bitroll::engine::bpe_internal
