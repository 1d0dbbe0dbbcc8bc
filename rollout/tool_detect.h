// rollout/tool_detect.h: finds tool calls and stop strings in a sequence's generated tokens.
//
// A ToolDetector is fed the tokens of one model turn, one at a time, in order. It reports:
//   kToolCall  once a complete call has been generated: the closing delimiter appeared after an
//              opening one. String delimiters (DetectConfig::open/close) are matched on the
//              decoded text, so a delimiter may span several tokens (or a token may hold more
//              than one); id delimiters (open_id/close_id) match single tokens. call_text() is
//              what lies between them (the decoded text; without a decoder the ids as decimal
//              numbers separated by spaces).
//   kStop      once one of DetectConfig::stop_strings appears in the decoded text (the string
//              and the whole token that completed it stay in the output).
// A tool call takes precedence over a stop string completed by the same token. After an event
// the detector is inert (the caller ends the turn on that token).
//
// String matching needs a decoder (the replica's tokenizer); Create() refuses string delimiters
// or stop strings without one (kUnsupported). The first piece is decoded as following
// `prev_token` (the last prompt token), as the tokenizer's DecodePiece() rule requires.
//
// Thread-safety: one detector per sequence, used from one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "schema/status.h"

namespace bitroll::rollout {

struct DetectConfig {
  std::string open, close;  // string delimiters: both set, or neither
  int32_t open_id = -1;     // token delimiters: both >= 0, or neither
  int32_t close_id = -1;
  std::vector<std::string> stop_strings;

  bool has_strings() const { return !open.empty() || !stop_strings.empty(); }
  bool empty() const { return open.empty() && open_id < 0 && stop_strings.empty(); }
};

// The bytes `token` contributes after `prev` (engine::Tokenizer::DecodePiece).
using PieceDecoder = std::function<Result<std::string>(int32_t prev, int32_t token)>;

enum class DetectEvent : uint8_t { kNone = 0, kToolCall = 1, kStop = 2 };

class ToolDetector {
 public:
  // Errors: kInvalidArgument (only one of a delimiter pair), kUnsupported (strings without a
  // decoder).
  static Result<ToolDetector> Create(const DetectConfig& config, PieceDecoder decoder,
                                     int32_t prev_token);

  // Feeds the next generated token. Errors: the decoder's (a token outside the vocabulary).
  Result<DetectEvent> Feed(int32_t token);

  const std::string& call_text() const { return call_text_; }
  // Tokens fed so far (the event, if any, happened on the last one).
  int64_t fed() const { return fed_; }
  bool done() const { return done_; }

 private:
  ToolDetector() = default;
  DetectEvent CheckStrings(size_t old_len);

  DetectConfig config_;
  PieceDecoder decoder_;
  int32_t prev_ = -1;
  std::string text_;               // decoded text of the turn so far (string matching only)
  size_t open_end_ = 0;            // text_ index past the opening string, when in_call_
  bool in_call_ = false;           // an opening delimiter (string or id) has been seen
  std::vector<int32_t> call_ids_;  // id delimiters: tokens after the opening id
  std::string call_text_;
  int64_t fed_ = 0;
  bool done_ = false;
};

}  // namespace bitroll::rollout
