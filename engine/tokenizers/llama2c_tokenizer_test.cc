// Tests for the llama2.c tokenizer against the real tok512.bin and run.c's reference output.
#include "engine/tokenizers/llama2c_tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

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

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void WriteAll(const std::string& path, const std::string& data) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(data.data(), std::streamsize(data.size()));
}

// The ids following `label` on its line of golden/once_upon_n256.ids.txt.
std::vector<int32_t> GoldenIds(const std::string& label) {
  std::ifstream f(ModelsDir() + "/golden/once_upon_n256.ids.txt");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(label, 0) != 0) continue;
    std::istringstream in(line.substr(line.find(':') + 1));
    std::vector<int32_t> ids;
    int32_t id;
    while (in >> id) ids.push_back(id);
    return ids;
  }
  return {};
}

std::string Tok512Path() {
  return ModelsDir() + "/tok512.bin";
}

class Tok512Test : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = LoadLlama2cTokenizer(Tok512Path(), 512);
    ASSERT_TRUE(tok.ok()) << "the real test tokenizer is required (set BITROLL_MODELS_DIR): "
                          << tok.status().ToString();
    tok_ = std::move(tok).value();
  }
  std::unique_ptr<Tokenizer> tok_;
};

// An independent, literal port of run.c's encode(): linear-scan lookups and the quadratic merge
// loop, over the file parsed here.
struct ReferenceVocab {
  std::vector<std::string> pieces;
  std::vector<float> scores;
  int Lookup(const std::string& s) const {
    for (size_t i = 0; i < pieces.size(); ++i)
      if (pieces[i] == s) return int(i);
    return -1;
  }
  std::vector<int32_t> Encode(const std::string& text, bool bos) const {
    std::vector<int32_t> t;
    if (bos) t.push_back(1);
    if (!text.empty()) t.push_back(Lookup(" "));
    std::string buf;
    for (size_t c = 0; c < text.size(); ++c) {
      if ((text[c] & 0xC0) != 0x80) buf.clear();
      buf += text[c];
      if (c + 1 < text.size() && (text[c + 1] & 0xC0) == 0x80 && buf.size() < 4) continue;
      const int id = Lookup(buf);
      if (id != -1) {
        t.push_back(id);
      } else {
        for (unsigned char b : buf) t.push_back(int32_t(b) + 3);
      }
      buf.clear();
    }
    while (true) {
      float best = -1e10f;
      int best_id = -1, best_idx = -1;
      for (size_t i = 0; i + 1 < t.size(); ++i) {
        const int id = Lookup(pieces[t[i]] + pieces[t[i + 1]]);
        if (id != -1 && scores[id] > best) {
          best = scores[id];
          best_id = id;
          best_idx = int(i);
        }
      }
      if (best_idx == -1) break;
      t[best_idx] = best_id;
      t.erase(t.begin() + best_idx + 1);
    }
    return t;
  }
};

ReferenceVocab ParseTok512() {
  ReferenceVocab v;
  const std::string d = ReadAll(Tok512Path());
  size_t off = 4;
  while (off + 8 <= d.size()) {
    float s;
    int32_t len;
    std::memcpy(&s, d.data() + off, 4);
    std::memcpy(&len, d.data() + off + 4, 4);
    off += 8;
    v.pieces.push_back(d.substr(off, size_t(len)));
    v.scores.push_back(s);
    off += size_t(len);
  }
  return v;
}

TEST_F(Tok512Test, EncodesPromptLikeRunC) {
  const std::vector<int32_t> want = GoldenIds("PROMPT_TOKENS");
  ASSERT_FALSE(want.empty()) << "golden/once_upon_n256.ids.txt missing or malformed";
  auto got = tok_->Encode("Once upon a time", /*add_bos=*/true);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, want);
  EXPECT_EQ(tok_->vocab_size(), 512);
  EXPECT_EQ(tok_->bos_id(), 1);
  EXPECT_EQ(tok_->eos_id(), 2);
}

// run.c prints PrintablePiece(decode(prev, next)) for every token after BOS, then "\n".
TEST_F(Tok512Test, DecodingGoldenSequenceReproducesRunCOutput) {
  const std::vector<int32_t> prompt = GoldenIds("PROMPT_TOKENS");
  const std::vector<int32_t> seq = GoldenIds("SEQ");
  ASSERT_FALSE(prompt.empty());
  ASSERT_FALSE(seq.empty());
  const std::string want = ReadAll(ModelsDir() + "/golden/once_upon_n256.txt");
  ASSERT_FALSE(want.empty());
  std::string got;
  int32_t prev = prompt[0];
  for (int32_t next : seq) {
    auto piece = tok_->DecodePiece(prev, next);
    ASSERT_TRUE(piece.ok()) << piece.status().ToString();
    got += PrintablePiece(*piece);
    prev = next;
  }
  got += "\n";
  EXPECT_EQ(got, want);
}

TEST_F(Tok512Test, EmptyText) {
  auto with_bos = tok_->Encode("", true);
  ASSERT_TRUE(with_bos.ok());
  EXPECT_EQ(*with_bos, std::vector<int32_t>{1});
  auto without = tok_->Encode("", false);
  ASSERT_TRUE(without.ok());
  EXPECT_TRUE(without->empty());
}

TEST_F(Tok512Test, ByteFallbackForMissingCodepoint) {
  const ReferenceVocab ref = ParseTok512();
  const std::string text = "\xE4\xB8\xAD";  // U+4E2D, not in tok512
  ASSERT_EQ(ref.Lookup(text), -1);
  auto got = tok_->Encode(text, false);
  ASSERT_TRUE(got.ok());
  const std::vector<int32_t> want = {ref.Lookup(" "), 0xE4 + 3, 0xB8 + 3, 0xAD + 3};
  EXPECT_EQ(*got, want);
  auto back = tok_->Decode(std::span<const int32_t>(*got).subspan(1), -1);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, text);
}

std::string RandomText(std::mt19937* rng, bool raw_bytes) {
  static const char* const kAtoms[] = {"a",
                                       "e",
                                       "t",
                                       "o",
                                       " ",
                                       " ",
                                       "the",
                                       " and",
                                       "Lily",
                                       ".",
                                       ",",
                                       "!",
                                       "?",
                                       "\n",
                                       "\"",
                                       "'",
                                       "0",
                                       "9",
                                       "Z",
                                       "q",
                                       "x",
                                       "\t",
                                       "\xC3\xA9",
                                       "\xE4\xB8\xAD",
                                       "\xF0\x9F\x98\x80",
                                       "\xE2\x80\x8A",
                                       "ing",
                                       "ed",
                                       "once",
                                       " upon"};
  std::uniform_int_distribution<int> len(0, 60);
  std::uniform_int_distribution<int> pick(0, int(sizeof(kAtoms) / sizeof(kAtoms[0])) - 1);
  std::uniform_int_distribution<int> byte(1, 255);
  std::string s;
  const int n = len(*rng);
  for (int i = 0; i < n; ++i) {
    if (raw_bytes && (*rng)() % 4 == 0) {
      char c = char(byte(*rng));
      if (c == '<') c = '>';  // "<0xNN>" typed as text would merge into a byte token
      s += c;
    } else {
      s += kAtoms[pick(*rng)];
    }
  }
  return s;
}

TEST_F(Tok512Test, MatchesLiteralRunCEncoderOnRandomText) {
  const ReferenceVocab ref = ParseTok512();
  ASSERT_EQ(ref.pieces.size(), 512u);
  std::mt19937 rng(1234);
  for (int i = 0; i < 300; ++i) {
    const std::string text = RandomText(&rng, /*raw_bytes=*/i % 2 == 1);
    const bool bos = i % 3 != 0;
    auto got = tok_->Encode(text, bos);
    ASSERT_TRUE(got.ok());
    ASSERT_EQ(*got, ref.Encode(text, bos)) << "text: " << text;
  }
}

TEST_F(Tok512Test, RoundTripsRandomText) {
  std::mt19937 rng(99);
  for (int i = 0; i < 300; ++i) {
    const std::string text = RandomText(&rng, /*raw_bytes=*/i % 2 == 1);
    auto ids = tok_->Encode(text, /*add_bos=*/true);
    ASSERT_TRUE(ids.ok());
    ASSERT_FALSE(ids->empty());
    ASSERT_EQ((*ids)[0], 1);
    // After BOS the dummy-prefix space is stripped: the text comes back exactly.
    auto back = tok_->Decode(std::span<const int32_t>(*ids).subspan(1), (*ids)[0]);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, text);
    // Without BOS the dummy prefix stays.
    auto ids2 = tok_->Encode(text, false);
    ASSERT_TRUE(ids2.ok());
    auto back2 = tok_->Decode(*ids2, -1);
    ASSERT_TRUE(back2.ok());
    EXPECT_EQ(*back2, text.empty() ? "" : " " + text);
  }
}

TEST_F(Tok512Test, NulByteIsEncodedNotTruncated) {
  const std::string text("a\0b", 3);
  auto ids = tok_->Encode(text, true);
  ASSERT_TRUE(ids.ok());
  auto back = tok_->Decode(std::span<const int32_t>(*ids).subspan(1), 1);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, text);
}

TEST_F(Tok512Test, DecodePieceRules) {
  const ReferenceVocab ref = ParseTok512();
  const int32_t once = ref.Lookup(" Once");
  ASSERT_GE(once, 0);
  EXPECT_EQ(*tok_->DecodePiece(1, once), "Once");   // after BOS: leading space stripped
  EXPECT_EQ(*tok_->DecodePiece(5, once), " Once");  // otherwise kept
  EXPECT_EQ(*tok_->DecodePiece(-1, once), " Once");
  EXPECT_EQ(*tok_->DecodePiece(1, 0x0A + 3), "\n");  // <0x0A> -> raw byte
  EXPECT_EQ(*tok_->DecodePiece(1, 0xFF + 3), "\xFF");
  EXPECT_EQ(*tok_->DecodePiece(1, 3), std::string(1, '\0'));
  EXPECT_EQ(tok_->DecodePiece(1, 512).status().code(), ErrorCode::kOutOfRange);
  EXPECT_EQ(tok_->DecodePiece(1, -1).status().code(), ErrorCode::kOutOfRange);
  const int32_t bad[] = {400, 9999};
  EXPECT_EQ(tok_->Decode(bad, 1).status().code(), ErrorCode::kOutOfRange);
}

TEST(PrintablePieceTest, SafePrintfRule) {
  EXPECT_EQ(PrintablePiece(""), "");
  EXPECT_EQ(PrintablePiece("a"), "a");
  EXPECT_EQ(PrintablePiece(" "), " ");
  EXPECT_EQ(PrintablePiece("\n"), "\n");
  EXPECT_EQ(PrintablePiece("\t"), "\t");
  EXPECT_EQ(PrintablePiece("\x01"), "");
  EXPECT_EQ(PrintablePiece("\x7f"), "");
  EXPECT_EQ(PrintablePiece("\xC3"), "");              // a lone non-ASCII byte
  EXPECT_EQ(PrintablePiece("\xC3\xA9"), "\xC3\xA9");  // multi-byte pieces always print
  EXPECT_EQ(PrintablePiece(std::string("\0", 1)), "");
  EXPECT_EQ(PrintablePiece(std::string("ab\0cd", 5)), "ab");  // printf("%s") stops at NUL
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

class BadTokenizerFileTest : public ::testing::Test {
 protected:
  // The pid keeps concurrent runs (several build trees, ctest -j) apart.
  std::string Path(const std::string& name) {
    const std::string path =
        ::testing::TempDir() + "/tok_" + std::to_string(::getpid()) + "_" + name;
    CreatedFiles().push_back(path);
    return path;
  }
};

TEST_F(BadTokenizerFileTest, MissingFile) {
  auto r = LoadLlama2cTokenizer(Path("does_not_exist.bin"), 512);
  EXPECT_EQ(r.status().code(), ErrorCode::kNotFound) << r.status().ToString();
}

TEST_F(BadTokenizerFileTest, VocabSizeMismatch) {
  auto r = LoadLlama2cTokenizer(Tok512Path(), 32000);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("tokenizer has 512 tokens, model expects 32000"),
            std::string::npos)
      << r.status().message();
  EXPECT_TRUE(LoadLlama2cTokenizer(Tok512Path(), 0).ok());  // 0: any size
}

TEST_F(BadTokenizerFileTest, TruncatedFiles) {
  const std::string good = ReadAll(Tok512Path());
  ASSERT_GT(good.size(), 100u);
  // Cut inside the header word, inside an entry's header and inside an entry's bytes.
  for (size_t cut : {size_t(0), size_t(2), size_t(4 + 5), size_t(4 + 8 + 2), good.size() - 1}) {
    const std::string path = Path("trunc" + std::to_string(cut));
    WriteAll(path, good.substr(0, cut));
    auto r = LoadLlama2cTokenizer(path, 512);
    ASSERT_FALSE(r.ok()) << "cut " << cut;
    EXPECT_EQ(r.status().code(), ErrorCode::kCorruption) << r.status().ToString();
    if (cut > 4) {
      EXPECT_NE(r.status().message().find("truncated"), std::string::npos) << r.status().message();
      EXPECT_NE(r.status().message().find("file has " + std::to_string(cut)), std::string::npos)
          << r.status().message();
    }
  }
}

TEST_F(BadTokenizerFileTest, NegativeAndHugeLengths) {
  std::string bad = ReadAll(Tok512Path());
  int32_t neg = -5;
  std::memcpy(&bad[4 + 4], &neg, 4);  // token 0's length
  WriteAll(Path("neg"), bad);
  auto r = LoadLlama2cTokenizer(Path("neg"), 512);
  EXPECT_EQ(r.status().code(), ErrorCode::kCorruption);
  EXPECT_NE(r.status().message().find("negative length"), std::string::npos);

  int32_t huge = 0x7fffffff;
  std::memcpy(&bad[4 + 4], &huge, 4);
  WriteAll(Path("huge"), bad);
  r = LoadLlama2cTokenizer(Path("huge"), 512);
  EXPECT_EQ(r.status().code(), ErrorCode::kCorruption);
  EXPECT_NE(r.status().message().find("truncated in token 0"), std::string::npos)
      << r.status().message();
}

// Random damage never crashes the loader: every result is a value or a typed error.
TEST_F(BadTokenizerFileTest, RandomDamageGivesValueOrTypedError) {
  const std::string good = ReadAll(Tok512Path());
  ASSERT_FALSE(good.empty());
  std::mt19937 rng(21);
  int errors = 0;
  for (int i = 0; i < 200; ++i) {
    std::string bad = good.substr(0, rng() % (good.size() + 1));
    for (int k = 0; k < 4 && !bad.empty(); ++k) bad[rng() % bad.size()] = char(rng());
    WriteAll(Path("fuzz"), bad);
    auto r = LoadLlama2cTokenizer(Path("fuzz"), 512);
    if (!r.ok()) {
      ++errors;
      const ErrorCode c = r.status().code();
      EXPECT_TRUE(c == ErrorCode::kCorruption || c == ErrorCode::kInvalidArgument)
          << r.status().ToString();
      continue;
    }
    // A loaded (damaged) vocabulary still encodes and decodes without leaving the vocabulary.
    auto ids = (*r)->Encode("Once upon a time", true);
    ASSERT_TRUE(ids.ok());
    for (int32_t id : *ids) ASSERT_TRUE((*r)->DecodePiece(1, id).ok());
  }
  EXPECT_GT(errors, 100);
}

// The in-memory form (GGUF vocabularies): BOS/EOS and byte pieces wherever the vocabulary puts
// them, merges by score, and typed errors for inconsistent input.
TEST(Llama2cTokenizer, InMemoryVocabularyUsesItsOwnIdsAndBytePieces) {
  // ids: 0 "<0x61>" ('a'), 1 "<0x62>" ('b'), 2 "<eos>", 3 "<bos>", 4 " ", 5 "a", 6 " a", 7 "ab"
  std::vector<std::string> pieces = {"<0x61>", "<0x62>", "<eos>", "<bos>", " ", "a", " a", "ab"};
  std::vector<float> scores = {0, 0, 0, 0, 0, 0, -1.0f, -5.0f};
  auto t = MakeLlama2cTokenizer(pieces, scores, 3, 2);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ((*t)->bos_id(), 3);
  EXPECT_EQ((*t)->eos_id(), 2);
  // " " + "a" merge to " a" (6); "b" is not a piece: byte fallback to <0x62> (1).
  auto ids = (*t)->Encode("ab", true);
  ASSERT_TRUE(ids.ok()) << ids.status().ToString();
  EXPECT_EQ(*ids, (std::vector<int32_t>{3, 6, 1}));
  auto text = (*t)->Decode(std::vector<int32_t>{6, 1}, 3);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "ab");  // leading space stripped after this vocabulary's BOS
  // A byte without its piece is a typed error naming the piece.
  auto missing = (*t)->Encode("c", false);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), ErrorCode::kUnsupported);
  EXPECT_NE(missing.status().message().find("<0x63>"), std::string::npos)
      << missing.status().ToString();
  EXPECT_EQ(MakeLlama2cTokenizer({}, {}, 0, 0).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(MakeLlama2cTokenizer(pieces, {0.0f}, 3, 2).status().code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(MakeLlama2cTokenizer(pieces, scores, 8, 2).status().code(),
            ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace bitroll::engine
