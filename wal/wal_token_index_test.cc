// Token indexes in the log (docs/wal_format.md "Token indexes"): format 3 records count every
// token after the prompt (sampled and injected); format 1 and 2 records counted sampled tokens
// only and are converted by the reader. Shows: the same trajectory logged in format 2, in format
// 3, or half and half reads back as the same TrajectoryLog, byte for byte; a token record, turn
// boundary or tool call whose index leaves a gap or an overlap is still corruption in either
// format; the Wal writes format 3 (trajectory indexes) and reads its own records back.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "wal/crc32c.h"
#include "wal/record_codec.h"
#include "wal/wal.h"
#include "wal/wal_format.h"
#include "wal/wal_test_util.h"

namespace bitroll::wal {
namespace {

using testing::Dump;
using testing::MakeHeader;

// `value` (a record as the codec encodes it) with another format version byte and its CRC
// recomputed: the record as a writer of that version framed it.
std::string AsVersion(std::string value, uint8_t version) {
  value[format::kVersionOffset] = static_cast<char>(version);
  const uint32_t crc = crc32c::Value(value.data() + 4, value.size() - 4);
  for (int i = 0; i < 4; ++i) value[format::kCrcOffset + i] = static_cast<char>(crc >> (8 * i));
  return value;
}

const std::vector<int32_t> kTurn1 = {11, 22, 33, 44, 55};
const std::vector<float> kLps1 = {-1.0f, -2.0f, -0.5f, -0.25f, -3.0f};
const std::vector<int32_t> kInjected = {7, 8, 9};
const std::vector<int32_t> kTurn2 = {66, 77, 2};
const std::vector<float> kLps2 = {-0.125f, -4.0f, -1.5f};

// One tool-loop trajectory: 5 sampled tokens, a call, a boundary with 3 injected tokens, 3
// sampled tokens. `indexes` are the token indexes of the records after the header, in order
// (tokens, call, boundary, tokens); `versions` the format version of each record.
struct Script {
  uint32_t tokens1 = 0, call = 5, boundary = 5, tokens2 = 8;
  std::vector<uint8_t> versions = std::vector<uint8_t>(5, 3);
};

std::vector<std::string> Records(const Script& s) {
  ToolCall c;
  c.call_index = 0;
  c.token_index = s.call;
  c.tool_name = "calc";
  c.input = "1+2";
  TurnBoundary b;
  b.turn_index = 1;
  b.token_index = s.boundary;
  b.injected_tokens = kInjected;
  std::vector<std::string> r = {
      internal::EncodeHeader(MakeHeader(1)),
      internal::EncodeTokens(s.tokens1, kTurn1, kLps1, 3),
      internal::EncodeToolCall(c),
      internal::EncodeTurnBoundary(b),
      internal::EncodeTokens(s.tokens2, kTurn2, kLps2, 4),
  };
  for (size_t i = 0; i < r.size(); ++i) r[i] = AsVersion(r[i], s.versions[i]);
  return r;
}

// Feeds the records; the first error, or OK and the log.
Status Decode(const std::vector<std::string>& records, TrajectoryLog* out = nullptr) {
  internal::TrajectoryDecoder d(1);
  for (size_t i = 0; i < records.size(); ++i) BR_RETURN_IF_ERROR(d.Add(i, records[i]));
  if (out != nullptr) *out = d.TakeLog();
  return d.Done();
}

Script Format2() {
  Script s;
  s.tokens2 = 5;  // sampled tokens before it: the injected ones are not counted
  s.versions = {2, 2, 2, 2, 2};
  return s;
}

TEST(WalTokenIndex, Format3IndexesAreTrajectoryIndexes) {
  TrajectoryLog l;
  ASSERT_TRUE(Decode(Records(Script{}), &l).ok());
  ASSERT_EQ(l.spans.size(), 2u);
  EXPECT_EQ(l.spans[0].first_token, 0u);
  EXPECT_EQ(l.spans[1].first_token, 8u);  // 5 sampled + 3 injected before it
  ASSERT_EQ(l.turns.size(), 1u);
  EXPECT_EQ(l.turns[0].token_index, 5u);
  ASSERT_EQ(l.tool_calls.size(), 1u);
  EXPECT_EQ(l.tool_calls[0].call.token_index, 5u);
  EXPECT_EQ(l.token_ids, (std::vector<int32_t>{11, 22, 33, 44, 55, 66, 77, 2}));
}

TEST(WalTokenIndex, Format2RecordsReadAsTrajectoryIndexes) {
  TrajectoryLog v3, v2, mixed;
  ASSERT_TRUE(Decode(Records(Script{}), &v3).ok());
  ASSERT_TRUE(Decode(Records(Format2()), &v2).ok());
  Script m;  // a format 2 directory resumed by format 3 code: the boundary and what follows
  m.versions = {2, 2, 2, 3, 3};
  ASSERT_TRUE(Decode(Records(m), &mixed).ok());
  Script v1 = Format2();
  v1.versions = {1, 1, 1, 1, 1};
  TrajectoryLog old;
  ASSERT_TRUE(Decode(Records(v1), &old).ok());
  EXPECT_TRUE(testing::SameBytes(Dump(v2), Dump(v3)));
  EXPECT_TRUE(testing::SameBytes(Dump(mixed), Dump(v3)));
  EXPECT_TRUE(testing::SameBytes(Dump(old), Dump(v3)));
  // Negative control: the dump sees an index that differs.
  TrajectoryLog moved = v3;
  moved.spans[1].first_token = 5;
  EXPECT_FALSE(testing::SameBytes(Dump(moved), Dump(v3)));
}

void ExpectCorrupt(const Script& s, const std::string& what) {
  const Status st = Decode(Records(s));
  EXPECT_EQ(st.code(), ErrorCode::kCorruption) << what;
  EXPECT_NE(st.message().find(what), std::string::npos) << st.message();
}

TEST(WalTokenIndex, GapsAndOverlapsAreCorruptionInEitherFormat) {
  Script s;
  s.tokens2 = 5;  // format 3 with a sampled-token index: overlaps the injected tokens
  ExpectCorrupt(s, "token record starts at 5, expected 8 (format version 3)");
  s.tokens2 = 9;  // a gap
  ExpectCorrupt(s, "token record starts at 9, expected 8 (format version 3)");
  Script t = Format2();
  t.tokens2 = 8;  // format 2 with a trajectory index: a gap of 3 in sampled tokens
  ExpectCorrupt(t, "token record starts at 8, expected 5 (format version 2)");
  Script b;
  b.boundary = 4;
  ExpectCorrupt(b, "turn boundary at 4, expected 5");
  Script c;
  c.call = 6;
  ExpectCorrupt(c, "tool call at 6, expected 5");
  Script first;
  first.tokens1 = 1;
  ExpectCorrupt(first, "token record starts at 1, expected 0");
}

TEST(WalTokenIndex, TheWalWritesFormat3AndReadsItBack) {
  testing::TempDir dir("wal_tokidx");
  WalOptions o;
  o.dir = dir.path();
  o.durability = Durability::kNone;
  o.background_commit = false;
  TrajectoryLog expect;
  ASSERT_TRUE(Decode(Records(Script{}), &expect).ok());
  {
    auto opened = Wal::Open(o);
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    Wal& w = **opened;
    ASSERT_TRUE(w.Recover().ok());
    ASSERT_TRUE(w.AppendHeader(1, MakeHeader(1)).ok());
    ASSERT_TRUE(w.AppendTokens(1, kTurn1, kLps1, 3).ok());
    ToolCall c;
    c.call_index = 0;
    c.token_index = 999;  // set by the Wal
    c.tool_name = "calc";
    c.input = "1+2";
    ASSERT_TRUE(w.AppendToolCall(1, c).ok());
    TurnBoundary b;
    b.turn_index = 1;
    b.injected_tokens = kInjected;
    ASSERT_TRUE(w.AppendTurnBoundary(1, b).ok());
    ASSERT_TRUE(w.Flush().ok());
  }
  // Reopened: the Wal goes on counting from the recovered trajectory's length.
  auto opened = Wal::Open(o);
  ASSERT_TRUE(opened.ok());
  Wal& w = **opened;
  auto rr = w.Recover();
  ASSERT_TRUE(rr.ok());
  ASSERT_EQ(rr->unfinished.size(), 1u);
  ASSERT_TRUE(w.AppendTokens(1, kTurn2, kLps2, 4).ok());
  ASSERT_TRUE(w.Flush().ok());
  auto got = w.ReadTrajectory(1);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->spans[1].first_token, 8u);
  EXPECT_TRUE(testing::SameBytes(Dump(*got), Dump(expect)));
}

}  // namespace
}  // namespace bitroll::wal
