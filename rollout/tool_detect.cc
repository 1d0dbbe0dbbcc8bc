#include "rollout/tool_detect.h"

#include <algorithm>

namespace bitroll::rollout {

Result<ToolDetector> ToolDetector::Create(const DetectConfig& config, PieceDecoder decoder,
                                          int32_t prev_token) {
  if (config.open.empty() != config.close.empty()) {
    return Status::InvalidArgument(
        "tool delimiters: set both tool_open and tool_close, or neither");
  }
  if ((config.open_id < 0) != (config.close_id < 0)) {
    return Status::InvalidArgument(
        "tool delimiters: set both tool_open_id and tool_close_id, or neither");
  }
  if (!config.open.empty() && config.open_id >= 0) {
    return Status::InvalidArgument("tool delimiters: strings or token ids, not both");
  }
  for (const std::string& s : config.stop_strings) {
    if (s.empty()) return Status::InvalidArgument("an empty stop string");
  }
  if (config.has_strings() && !decoder) {
    return Status::Unsupported(
        "string tool delimiters and stop strings need a tokenizer; this replica has none "
        "(use tool_open_id / tool_close_id and stop_ids)");
  }
  ToolDetector d;
  d.config_ = config;
  d.decoder_ = std::move(decoder);
  d.prev_ = prev_token;
  return d;
}

DetectEvent ToolDetector::CheckStrings(size_t old_len) {
  if (!config_.open.empty()) {
    if (!in_call_) {
      const size_t from = old_len >= config_.open.size() ? old_len - config_.open.size() + 1 : 0;
      const size_t p = text_.find(config_.open, from);
      if (p != std::string::npos) {
        in_call_ = true;
        open_end_ = p + config_.open.size();
        old_len = open_end_;  // the close is searched only after the opening string
      }
    }
    if (in_call_) {
      size_t from = old_len >= config_.close.size() ? old_len - config_.close.size() + 1 : 0;
      from = std::max(from, open_end_);
      const size_t q = text_.find(config_.close, from);
      if (q != std::string::npos) {
        call_text_ = text_.substr(open_end_, q - open_end_);
        return DetectEvent::kToolCall;
      }
    }
  }
  return DetectEvent::kNone;
}

Result<DetectEvent> ToolDetector::Feed(int32_t token) {
  if (done_) return DetectEvent::kNone;
  ++fed_;
  DetectEvent ev = DetectEvent::kNone;
  const size_t old_len = text_.size();
  if (decoder_ && config_.has_strings()) {
    BR_ASSIGN_OR_RETURN(std::string piece, decoder_(prev_, token));
    text_ += piece;
  }
  if (config_.open_id >= 0) {
    if (in_call_ && token == config_.close_id) {
      if (decoder_) {
        int32_t prev = config_.open_id;
        for (int32_t id : call_ids_) {
          BR_ASSIGN_OR_RETURN(std::string piece, decoder_(prev, id));
          call_text_ += piece;
          prev = id;
        }
      } else {
        for (size_t i = 0; i < call_ids_.size(); ++i) {
          if (i > 0) call_text_ += ' ';
          call_text_ += std::to_string(call_ids_[i]);
        }
      }
      ev = DetectEvent::kToolCall;
    } else if (in_call_) {
      call_ids_.push_back(token);
    } else if (token == config_.open_id) {
      in_call_ = true;
    }
  } else {
    ev = CheckStrings(old_len);
  }
  if (ev == DetectEvent::kNone) {
    for (const std::string& s : config_.stop_strings) {
      const size_t from = old_len >= s.size() ? old_len - s.size() + 1 : 0;
      if (text_.find(s, from) != std::string::npos) {
        ev = DetectEvent::kStop;
        break;
      }
    }
  }
  prev_ = token;
  if (ev != DetectEvent::kNone) done_ = true;
  return ev;
}

}  // namespace bitroll::rollout
