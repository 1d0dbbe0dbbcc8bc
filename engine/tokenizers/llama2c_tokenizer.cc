// engine/tokenizers/llama2c_tokenizer.cc: llama2.c's BPE tokenizer (see the header).
#include "engine/tokenizers/llama2c_tokenizer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <queue>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace bitroll::engine {
namespace {

constexpr int32_t kBosId = 1;
constexpr int32_t kEosId = 2;
constexpr int32_t kByteOffset = 3;        // ids 3..258 are <0x00>..<0xFF>
constexpr float kMinMergeScore = -1e10f;  // run.c's initial best_score: merges must beat it

class Llama2cTokenizer final : public Tokenizer {
 public:
  // `byte_pieces`: false = llama2.c's fixed layout (byte b is id b + 3); true = byte b is the
  // piece spelled "<0xXX>" (upper-case hex), wherever it sits.
  Llama2cTokenizer(std::vector<std::string> pieces, std::vector<float> scores, int32_t bos_id,
                   int32_t eos_id, bool byte_pieces)
      : pieces_(std::move(pieces)),
        scores_(std::move(scores)),
        bos_id_(bos_id),
        eos_id_(eos_id),
        byte_pieces_(byte_pieces) {
    lookup_.reserve(pieces_.size());
    // Ascending ids with emplace: among duplicate pieces the lowest id wins.
    for (size_t i = 0; i < pieces_.size(); ++i) lookup_.emplace(pieces_[i], int32_t(i));
    for (int b = 0; b < 256; ++b) {
      if (!byte_pieces_) {
        byte_ids_[b] = b + kByteOffset < vocab_size() ? b + kByteOffset : -1;
      } else {
        char name[8];
        std::snprintf(name, sizeof(name), "<0x%02X>", b);
        byte_ids_[b] = Find(name);
      }
    }
  }

  int32_t vocab_size() const override { return int32_t(pieces_.size()); }
  int32_t bos_id() const override { return bos_id_; }
  int32_t eos_id() const override { return eos_id_; }

  Result<std::vector<int32_t>> Encode(std::string_view text, bool add_bos) const override;
  Result<std::string> DecodePiece(int32_t prev, int32_t token) const override;

 private:
  int32_t Find(const std::string& s) const {
    auto it = lookup_.find(s);
    return it == lookup_.end() ? -1 : it->second;
  }

  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  int32_t bos_id_;
  int32_t eos_id_;
  bool byte_pieces_;
  int32_t byte_ids_[256];  // token of each byte for byte fallback; -1 when absent
  std::unordered_map<std::string, int32_t> lookup_;
};

// One symbol of the working sequence during merging: a doubly linked list over the initial
// tokens; a merge rewrites the left symbol's id and unlinks the right one.
struct Symbol {
  int32_t id;
  int32_t prev;  // index of the previous live symbol, -1 at the front
  int32_t next;  // index of the next live symbol, -1 at the end
};

// A candidate merge of symbols (left, left.next) into `merged`. Valid while both symbols still
// hold the ids recorded here and are adjacent (ids only grow longer, so they never recur).
struct Bigram {
  float score;
  int32_t left;
  int32_t right;
  int32_t left_id;
  int32_t right_id;
  int32_t merged;
};

// Max-heap order: higher score first, then the leftmost pair (run.c's strict '>' scan).
struct BigramLess {
  bool operator()(const Bigram& a, const Bigram& b) const {
    if (a.score != b.score) return a.score < b.score;
    return a.left > b.left;
  }
};

Result<std::vector<int32_t>> Llama2cTokenizer::Encode(std::string_view text, bool add_bos) const {
  const int32_t n_vocab = vocab_size();
  std::vector<Symbol> syms;
  syms.reserve(text.size() + 2);
  auto push = [&](int32_t id) {
    const int32_t i = int32_t(syms.size());
    syms.push_back(Symbol{id, i - 1, -1});
    if (i > 0) syms[i - 1].next = i;
  };
  auto push_bytes = [&](std::string_view bytes) -> Status {
    for (char c : bytes) {
      const int32_t id = byte_ids_[static_cast<unsigned char>(c)];
      if (id < 0) {
        if (!byte_pieces_) {
          return Status::Unsupported("byte fallback needs ids 3..258, vocabulary has " +
                                     std::to_string(n_vocab) + " tokens");
        }
        char name[8];
        std::snprintf(name, sizeof(name), "<0x%02X>", static_cast<unsigned char>(c));
        return Status::Unsupported(std::string("byte fallback needs the piece ") + name +
                                   ", which the vocabulary lacks");
      }
      push(id);
    }
    return Status::Ok();
  };

  if (add_bos) push(bos_id_);
  std::string buf;
  if (!text.empty()) {
    buf = " ";
    const int32_t dummy = Find(buf);
    if (dummy >= 0) {
      push(dummy);
    } else {
      BR_RETURN_IF_ERROR(push_bytes(buf));
    }
  }
  // Group each UTF-8 codepoint (a non-continuation byte plus up to 3 continuation bytes, as
  // run.c does) and look it up; fall back to one byte token per byte.
  size_t i = 0;
  while (i < text.size()) {
    size_t len = 1;
    while (i + len < text.size() && len < 4 &&
           (static_cast<unsigned char>(text[i + len]) & 0xC0) == 0x80) {
      ++len;
    }
    buf.assign(text.substr(i, len));
    const int32_t id = Find(buf);
    if (id >= 0) {
      push(id);
    } else {
      BR_RETURN_IF_ERROR(push_bytes(buf));
    }
    i += len;
  }

  // Greedy merging: always the best-scoring adjacent pair, ties to the leftmost.
  std::priority_queue<Bigram, std::vector<Bigram>, BigramLess> queue;
  auto try_pair = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = syms[left].next;
    if (right < 0) return;
    buf = pieces_[syms[left].id];
    buf += pieces_[syms[right].id];
    const int32_t merged = Find(buf);
    if (merged < 0 || !(scores_[merged] > kMinMergeScore)) return;
    queue.push(Bigram{scores_[merged], left, right, syms[left].id, syms[right].id, merged});
  };
  for (int32_t s = 0; s + 1 < int32_t(syms.size()); ++s) try_pair(s);
  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& l = syms[b.left];
    if (l.id != b.left_id || l.next != b.right || syms[b.right].id != b.right_id) continue;
    Symbol& r = syms[b.right];
    l.id = b.merged;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = b.left;
    r.id = -1;  // dead: never matches a recorded id again
    try_pair(l.prev);
    try_pair(b.left);
  }

  std::vector<int32_t> out;
  out.reserve(syms.size());
  for (int32_t s = syms.empty() ? -1 : 0; s >= 0; s = syms[s].next) out.push_back(syms[s].id);
  return out;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

Result<std::string> Llama2cTokenizer::DecodePiece(int32_t prev, int32_t token) const {
  if (token < 0 || token >= vocab_size()) {
    return Status::OutOfRange("token " + std::to_string(token) + " outside the vocabulary of " +
                              std::to_string(vocab_size()));
  }
  std::string_view piece = pieces_[token];
  // SentencePiece's decoder strips the leading space of the first piece after BOS.
  if (prev == bos_id_ && !piece.empty() && piece[0] == ' ') piece.remove_prefix(1);
  // Raw byte pieces look like <0x0A>; run.c parses them with sscanf("<0x%02hhX>"), which takes
  // one or two hex digits.
  if (piece.size() >= 4 && piece.substr(0, 3) == "<0x" && HexValue(piece[3]) >= 0) {
    int value = HexValue(piece[3]);
    if (piece.size() >= 5 && HexValue(piece[4]) >= 0) value = value * 16 + HexValue(piece[4]);
    return std::string(1, static_cast<char>(value));
  }
  return std::string(piece);
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> LoadLlama2cTokenizer(const std::string& path,
                                                        int32_t expected_vocab_size) {
  if (expected_vocab_size < 0) {
    return Status::InvalidArgument("expected_vocab_size must be >= 0, got " +
                                   std::to_string(expected_vocab_size));
  }
  std::string data;
  BR_RETURN_IF_ERROR(ReadTokenizerFile(path, &data));
  auto corrupt = [&](const std::string& what) { return Status::Corruption(path + ": " + what); };
  if (data.size() < 4) {
    return corrupt("expected at least 4 bytes (max_token_length), file has " +
                   std::to_string(data.size()));
  }
  int32_t max_token_length;
  std::memcpy(&max_token_length, data.data(), 4);
  if (max_token_length < 0) {
    return corrupt("negative max_token_length " + std::to_string(max_token_length));
  }
  std::vector<std::string> pieces;
  std::vector<float> scores;
  size_t off = 4;
  while (off < data.size()) {
    const size_t entry = pieces.size();
    if (data.size() - off < 8) {
      return corrupt("truncated in token " + std::to_string(entry) + ": expected 8 header bytes " +
                     "at offset " + std::to_string(off) + ", file has " +
                     std::to_string(data.size()));
    }
    float score;
    int32_t len;
    std::memcpy(&score, data.data() + off, 4);
    std::memcpy(&len, data.data() + off + 4, 4);
    off += 8;
    if (len < 0) {
      return corrupt("token " + std::to_string(entry) + " has negative length " +
                     std::to_string(len));
    }
    if (data.size() - off < size_t(len)) {
      return corrupt("truncated in token " + std::to_string(entry) + ": expected " +
                     std::to_string(off + size_t(len)) + " bytes, file has " +
                     std::to_string(data.size()));
    }
    if (pieces.size() >= size_t(INT32_MAX)) return corrupt("more than 2^31 tokens");
    pieces.emplace_back(data.data() + off, size_t(len));
    scores.push_back(score);
    off += size_t(len);
  }
  if (pieces.empty()) return corrupt("no tokens");
  if (expected_vocab_size != 0 && int64_t(pieces.size()) != expected_vocab_size) {
    return Status::InvalidArgument(path + ": tokenizer has " + std::to_string(pieces.size()) +
                                   " tokens, model expects " + std::to_string(expected_vocab_size));
  }
  if (pieces.size() <= size_t(kEosId)) {
    return Status::InvalidArgument(path + ": tokenizer has " + std::to_string(pieces.size()) +
                                   " tokens, needs at least <unk>, BOS and EOS");
  }
  return std::unique_ptr<Tokenizer>(
      new Llama2cTokenizer(std::move(pieces), std::move(scores), kBosId, kEosId, false));
}

Result<std::unique_ptr<Tokenizer>> MakeLlama2cTokenizer(std::vector<std::string> pieces,
                                                        std::vector<float> scores, int32_t bos_id,
                                                        int32_t eos_id) {
  if (pieces.empty()) return Status::InvalidArgument("tokenizer: no pieces");
  if (pieces.size() >= size_t(INT32_MAX))
    return Status::InvalidArgument("tokenizer: too many pieces");
  if (scores.size() != pieces.size()) {
    return Status::InvalidArgument("tokenizer: " + std::to_string(pieces.size()) + " pieces but " +
                                   std::to_string(scores.size()) + " scores");
  }
  const int32_t n = int32_t(pieces.size());
  if (bos_id < 0 || bos_id >= n || eos_id < 0 || eos_id >= n) {
    return Status::InvalidArgument("tokenizer: bos " + std::to_string(bos_id) + " / eos " +
                                   std::to_string(eos_id) + " outside the vocabulary of " +
                                   std::to_string(n));
  }
  return std::unique_ptr<Tokenizer>(
      new Llama2cTokenizer(std::move(pieces), std::move(scores), bos_id, eos_id, true));
}

}  // namespace bitroll::engine
