// Units of the tool-call / stop-string matcher (rollout/tool_detect.h), with a fake piece table
// so that delimiters can be split across tokens at will.
#include "rollout/tool_detect.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

namespace bitroll::rollout {
namespace {

// Token i decodes to kPieces[i].
const std::vector<std::string> kPieces = {"<s>",    " was",    "<to",   "ol>", "echo",
                                          " hi",    "</",      "tool>", ".",   " x",
                                          "<tool>", "</tool>", "DONE",  "yz"};

PieceDecoder Decoder() {
  return [](int32_t, int32_t t) -> Result<std::string> {
    if (t < 0 || t >= static_cast<int32_t>(kPieces.size())) {
      return Status::OutOfRange("token " + std::to_string(t));
    }
    return kPieces[t];
  };
}

// Feeds tokens; returns the index of the first event (or -1) and the event.
std::pair<int, DetectEvent> FeedAll(ToolDetector& d, const std::vector<int32_t>& toks) {
  for (size_t i = 0; i < toks.size(); ++i) {
    auto ev = d.Feed(toks[i]);
    EXPECT_TRUE(ev.ok()) << ev.status().ToString();
    if (ev.ok() && *ev != DetectEvent::kNone) return {static_cast<int>(i), *ev};
  }
  return {-1, DetectEvent::kNone};
}

TEST(ToolDetect, StringDelimitersInOneToken) {
  DetectConfig c;
  c.open = "<tool>";
  c.close = "</tool>";
  auto d = ToolDetector::Create(c, Decoder(), 0);
  ASSERT_TRUE(d.ok());
  auto [at, ev] = FeedAll(*d, {9, 10, 4, 5, 11, 9});
  EXPECT_EQ(at, 4);
  EXPECT_EQ(ev, DetectEvent::kToolCall);
  EXPECT_EQ(d->call_text(), "echo hi");
  EXPECT_EQ(d->fed(), 5);
  EXPECT_TRUE(d->done());
  auto again = d->Feed(10);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, DetectEvent::kNone) << "inert after the event";
}

TEST(ToolDetect, DelimitersSplitAcrossTokens) {
  DetectConfig c;
  c.open = "<tool>";
  c.close = "</tool>";
  auto d = ToolDetector::Create(c, Decoder(), 0);
  ASSERT_TRUE(d.ok());
  // "<to" + "ol>" opens, "</" + "tool>" closes.
  auto [at, ev] = FeedAll(*d, {9, 2, 3, 4, 5, 6, 7, 9});
  EXPECT_EQ(at, 6);
  EXPECT_EQ(ev, DetectEvent::kToolCall);
  EXPECT_EQ(d->call_text(), "echo hi");
}

TEST(ToolDetect, CloseBeforeOpenDoesNotCount) {
  DetectConfig c;
  c.open = " was";
  c.close = ".";
  auto d = ToolDetector::Create(c, Decoder(), 0);
  ASSERT_TRUE(d.ok());
  // "." first (no open yet), then " was x." -> call " x".
  auto [at, ev] = FeedAll(*d, {8, 9, 1, 9, 8});
  EXPECT_EQ(at, 4);
  EXPECT_EQ(ev, DetectEvent::kToolCall);
  EXPECT_EQ(d->call_text(), " x");
}

TEST(ToolDetect, OpenAndCloseInTheSameTokenText) {
  DetectConfig c;
  c.open = "y";
  c.close = "z";
  auto d = ToolDetector::Create(c, Decoder(), 0);
  ASSERT_TRUE(d.ok());
  auto [at, ev] = FeedAll(*d, {9, 13});
  EXPECT_EQ(at, 1);
  EXPECT_EQ(ev, DetectEvent::kToolCall);
  EXPECT_EQ(d->call_text(), "");
}

TEST(ToolDetect, IdDelimitersWithAndWithoutDecoder) {
  DetectConfig c;
  c.open_id = 10;
  c.close_id = 11;
  auto d = ToolDetector::Create(c, Decoder(), 0);
  ASSERT_TRUE(d.ok());
  auto [at, ev] = FeedAll(*d, {11, 9, 10, 4, 5, 11});
  EXPECT_EQ(at, 5);
  EXPECT_EQ(ev, DetectEvent::kToolCall);
  EXPECT_EQ(d->call_text(), "echo hi");
  auto n = ToolDetector::Create(c, nullptr, 0);
  ASSERT_TRUE(n.ok());
  auto [at2, ev2] = FeedAll(*n, {10, 4, 5, 11});
  EXPECT_EQ(at2, 3);
  EXPECT_EQ(ev2, DetectEvent::kToolCall);
  EXPECT_EQ(n->call_text(), "4 5") << "without a tokenizer: the ids in decimal";
}

TEST(ToolDetect, StopStringsSplitAcrossTokensAndPrecedence) {
  DetectConfig c;
  c.stop_strings = {"ol></"};
  auto d = ToolDetector::Create(c, Decoder(), 0);
  ASSERT_TRUE(d.ok());
  auto [at, ev] = FeedAll(*d, {2, 3, 6, 7});
  EXPECT_EQ(at, 2);
  EXPECT_EQ(ev, DetectEvent::kStop);
  // A call completed by the same token as a stop string wins.
  DetectConfig both;
  both.open = "<tool>";
  both.close = "</tool>";
  both.stop_strings = {"DONE", "l>"};
  auto e = ToolDetector::Create(both, Decoder(), 0);
  ASSERT_TRUE(e.ok());
  auto [at3, ev3] = FeedAll(*e, {10, 4, 11});
  EXPECT_EQ(at3, 0) << "'<tool>' itself contains the stop string 'l>'";
  EXPECT_EQ(ev3, DetectEvent::kStop);
  DetectConfig both2 = both;
  both2.stop_strings = {"DONE", "ool>"};
  auto f = ToolDetector::Create(both2, Decoder(), 0);
  ASSERT_TRUE(f.ok());
  auto [at4, ev4] = FeedAll(*f, {4, 11});
  EXPECT_EQ(at4, 1);
  EXPECT_EQ(ev4, DetectEvent::kStop) << "no open yet: '</tool>' is only a stop string here";
}

TEST(ToolDetect, ConfigErrors) {
  DetectConfig half;
  half.open = "<tool>";
  EXPECT_EQ(ToolDetector::Create(half, Decoder(), 0).status().code(), ErrorCode::kInvalidArgument);
  DetectConfig half_id;
  half_id.close_id = 3;
  EXPECT_EQ(ToolDetector::Create(half_id, Decoder(), 0).status().code(),
            ErrorCode::kInvalidArgument);
  DetectConfig both;
  both.open = "a";
  both.close = "b";
  both.open_id = 1;
  both.close_id = 2;
  EXPECT_EQ(ToolDetector::Create(both, Decoder(), 0).status().code(), ErrorCode::kInvalidArgument);
  DetectConfig strings;
  strings.open = "a";
  strings.close = "b";
  EXPECT_EQ(ToolDetector::Create(strings, nullptr, 0).status().code(), ErrorCode::kUnsupported)
      << "string delimiters need a tokenizer";
  DetectConfig stops;
  stops.stop_strings = {"x"};
  EXPECT_EQ(ToolDetector::Create(stops, nullptr, 0).status().code(), ErrorCode::kUnsupported);
}

TEST(ToolDetect, DecoderErrorsPropagate) {
  DetectConfig c;
  c.open = "a";
  c.close = "b";
  auto d = ToolDetector::Create(c, Decoder(), 0);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->Feed(999).status().code(), ErrorCode::kOutOfRange);
}

}  // namespace
}  // namespace bitroll::rollout
