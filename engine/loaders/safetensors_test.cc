// Tests for engine/loaders/safetensors: valid headers, every malformed-header class with its exact
// error, and a bounded mutation smoke test of the parser.
#include "engine/loaders/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace bitroll::engine {
namespace {

// A file: 8-byte length, the JSON header as given, `data_bytes` zero bytes.
std::string File(const std::string& json, size_t data_bytes) {
  std::string s(8, '\0');
  const uint64_t n = json.size();
  std::memcpy(&s[0], &n, 8);
  return s + json + std::string(data_bytes, '\0');
}

Result<SafetensorsHeader> Parse(const std::string& bytes, SafetensorsParseOptions opt = {}) {
  return ParseSafetensors(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), opt);
}

const char* kGood = R"({"__metadata__":{"format":"pt"},)"
                    R"("b":{"dtype":"BF16","shape":[2,3],"data_offsets":[16,28]},)"
                    R"("a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                    R"("s":{"dtype":"F64","shape":[],"data_offsets":[32,40]},)"
                    R"("e":{"dtype":"I64","shape":[0,5],"data_offsets":[40,40]}})";

TEST(Safetensors, ParsesAValidHeader) {
  const std::string f = File(kGood, 40);
  Result<SafetensorsHeader> h = Parse(f);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->data_offset, 8 + std::strlen(kGood));
  ASSERT_EQ(h->tensors.size(), 4u);
  EXPECT_EQ(h->tensors[0].name, "a");  // sorted by name
  const SafetensorsTensor* b = h->Find("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->dtype, "BF16");
  EXPECT_EQ(b->elem_bytes, 2);
  EXPECT_EQ(b->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(b->begin, 16u);
  EXPECT_EQ(b->end, 28u);
  EXPECT_TRUE(h->Find("s")->shape.empty());  // a scalar
  EXPECT_EQ(h->metadata.at("format"), "pt");
  EXPECT_EQ(h->Find("zz"), nullptr);
}

TEST(Safetensors, BadHeadersGiveTypedErrors) {
  struct Case {
    const char* name;
    std::string bytes;
    ErrorCode code;
    const char* part;
  };
  auto one = [](const std::string& tensor_json, size_t data) {
    return File("{\"t\":" + tensor_json + "}", data);
  };
  std::string huge_len(8, '\0');
  const uint64_t big = uint64_t(1) << 40;
  std::memcpy(&huge_len[0], &big, 8);
  std::string past_len = File("{}", 0);
  const uint64_t past = 100;
  std::memcpy(&past_len[0], &past, 8);
  const std::vector<Case> cases = {
      {"short", "abc", ErrorCode::kCorruption, "shorter than the 8-byte length"},
      {"header too large", huge_len + "{}", ErrorCode::kUnsupported, "exceeds the limit"},
      {"length past end", past_len, ErrorCode::kCorruption, "runs past the end of the file"},
      {"not json", File("{not json", 0), ErrorCode::kCorruption, "not a valid JSON object"},
      {"not an object", File("[1,2]", 0), ErrorCode::kCorruption, "JSON object"},
      {"tensor not object", File("{\"t\":5}", 0), ErrorCode::kCorruption, "t is not an object"},
      {"no dtype", one(R"({"shape":[1],"data_offsets":[0,4]})", 4), ErrorCode::kCorruption,
       "no string dtype"},
      {"unknown dtype", one(R"({"dtype":"F7","shape":[1],"data_offsets":[0,4]})", 4),
       ErrorCode::kCorruption, "unknown dtype \"F7\""},
      {"negative dim", one(R"({"dtype":"F32","shape":[-1],"data_offsets":[0,4]})", 4),
       ErrorCode::kCorruption, "not a non-negative integer"},
      {"float dim", one(R"({"dtype":"F32","shape":[1.5],"data_offsets":[0,4]})", 4),
       ErrorCode::kCorruption, "not a non-negative integer"},
      {"absurd shape",
       one(R"({"dtype":"F32","shape":[1099511627776,1099511627776],"data_offsets":[0,4]})", 4),
       ErrorCode::kCorruption, "absurd shape"},
      {"offsets arity", one(R"({"dtype":"F32","shape":[1],"data_offsets":[0]})", 4),
       ErrorCode::kCorruption, "data_offsets"},
      {"end before begin", one(R"({"dtype":"F32","shape":[1],"data_offsets":[8,4]})", 8),
       ErrorCode::kCorruption, "end before begin"},
      {"wrong dtype size", one(R"({"dtype":"F16","shape":[2],"data_offsets":[0,8]})", 8),
       ErrorCode::kCorruption, "has 8 bytes, its shape and dtype F16 need 4"},
      {"past end", one(R"({"dtype":"F32","shape":[4],"data_offsets":[0,16]})", 12),
       ErrorCode::kCorruption, "runs past the end of the data section (12 bytes)"},
      {"overlap",
       File(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
            16),
       ErrorCode::kCorruption, "tensors a and b overlap"},
      {"bad metadata", File(R"({"__metadata__":{"k":1}})", 0), ErrorCode::kCorruption,
       "__metadata__ value k is not a string"},
  };
  for (const Case& c : cases) {
    Result<SafetensorsHeader> h = Parse(c.bytes);
    ASSERT_FALSE(h.ok()) << c.name;
    EXPECT_EQ(h.status().code(), c.code) << c.name << ": " << h.status().ToString();
    EXPECT_NE(h.status().message().find(c.part), std::string::npos)
        << c.name << ": " << h.status().ToString();
  }
  // Header-only parsing skips the bounds check but not the overlap check.
  SafetensorsParseOptions header_only;
  header_only.check_data_bounds = false;
  EXPECT_TRUE(
      Parse(one(R"({"dtype":"F32","shape":[4],"data_offsets":[0,16]})", 0), header_only).ok());
  // Every strict prefix of a valid file is rejected.
  const std::string good = File(kGood, 40);
  for (size_t n = 0; n < good.size(); ++n) {
    EXPECT_FALSE(Parse(good.substr(0, n)).ok()) << "prefix of " << n << " bytes";
  }
}

// Bounded mutation smoke test (the libFuzzer target drives the same function).
TEST(Safetensors, MutatedHeadersNeverCrash) {
  const std::string seed = File(kGood, 40);
  const char* tokens[] = {"{",
                          "}",
                          "[",
                          "]",
                          ",",
                          ":",
                          "\"",
                          "-1",
                          "1e400",
                          "18446744073709551615",
                          "null",
                          "\"F32\"",
                          "\"data_offsets\"",
                          "\"shape\"",
                          "\\u0000"};
  std::mt19937_64 rng(99);
  int ok = 0, rejected = 0;
  for (int iter = 0; iter < 5000; ++iter) {
    std::string s = seed;
    const int edits = 1 + int(rng() % 4);
    for (int e = 0; e < edits && !s.empty(); ++e) {
      const size_t at = rng() % s.size();
      switch (rng() % 4) {
        case 0:
          s[at] = char(rng());
          break;
        case 1:
          s.insert(at, tokens[rng() % (sizeof(tokens) / sizeof(tokens[0]))]);
          break;
        case 2:
          s.erase(at, 1 + rng() % 4);
          break;
        default:
          s.resize(at);
          break;
      }
    }
    // Keep the length prefix consistent half of the time so the JSON parser is reached.
    if (iter % 2 == 0 && s.size() >= 8) {
      const uint64_t n = std::min<uint64_t>(s.size() - 8, std::strlen(kGood) + (rng() % 8));
      std::memcpy(&s[0], &n, 8);
    }
    Result<SafetensorsHeader> h = Parse(s);
    if (h.ok()) {
      ++ok;
    } else {
      ++rejected;
      ASSERT_TRUE(h.status().code() == ErrorCode::kCorruption ||
                  h.status().code() == ErrorCode::kUnsupported)
          << h.status().ToString();
    }
  }
  EXPECT_GT(rejected, 1000);
  std::printf("safetensors mutation smoke: %d accepted, %d rejected\n", ok, rejected);
}

}  // namespace
}  // namespace bitroll::engine
