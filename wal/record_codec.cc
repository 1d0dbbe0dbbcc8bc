// WAL record encoding and trajectory decoding (see docs/wal_format.md).
#include "wal/record_codec.h"

#include <flatbuffers/flatbuffers.h>

#include <cstring>
#include <vector>

#include <xxhash.h>

#include "schema/wal_generated.h"
#include "schema/wal_translate.h"
#include "wal/crc32c.h"

namespace bitroll::wal::internal {
namespace fb = bitroll::wal::fb;
using format::RecordType;

static_assert(static_cast<uint8_t>(fb::RecordBody::Header) ==
              static_cast<uint8_t>(RecordType::kHeader));
static_assert(static_cast<uint8_t>(fb::RecordBody::Tokens) ==
              static_cast<uint8_t>(RecordType::kTokens));
static_assert(static_cast<uint8_t>(fb::RecordBody::TurnBoundary) ==
              static_cast<uint8_t>(RecordType::kTurnBoundary));
static_assert(static_cast<uint8_t>(fb::RecordBody::ToolCall) ==
              static_cast<uint8_t>(RecordType::kToolCall));
static_assert(static_cast<uint8_t>(fb::RecordBody::ToolResult) ==
              static_cast<uint8_t>(RecordType::kToolResult));
static_assert(static_cast<uint8_t>(fb::RecordBody::Finished) ==
              static_cast<uint8_t>(RecordType::kFinish));
static_assert(static_cast<uint8_t>(fb::RecordBody::Group) ==
              static_cast<uint8_t>(RecordType::kGroup));
static_assert(static_cast<uint8_t>(fb::RecordBody::Acked) ==
              static_cast<uint8_t>(RecordType::kAcked));
static_assert(static_cast<uint8_t>(fb::RecordBody::RequestBlob) ==
              static_cast<uint8_t>(RecordType::kRequestBlob));

namespace {

flatbuffers::Offset<flatbuffers::Vector<uint8_t>> Bytes(flatbuffers::FlatBufferBuilder& b,
                                                        std::string_view s) {
  return b.CreateVector(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

std::string_view View(const flatbuffers::Vector<uint8_t>* v) {
  if (v == nullptr) return {};
  return {reinterpret_cast<const char*>(v->data()), v->size()};
}

std::string Str(const flatbuffers::String* s) {
  return s ? s->str() : std::string();
}

// Frames a finished builder: value header + FlatBuffer bytes.
std::string Frame(RecordType type, flatbuffers::FlatBufferBuilder& b,
                  flatbuffers::Offset<void> body) {
  auto rec = fb::CreateWalRecord(b, static_cast<fb::RecordBody>(type), body);
  fb::FinishWalRecordBuffer(b, rec);
  std::string v(format::kValueHeaderSize + b.GetSize(), '\0');
  v[format::kTypeOffset] = static_cast<char>(type);
  v[format::kVersionOffset] = static_cast<char>(format::kFormatVersion);
  std::memcpy(v.data() + format::kValueHeaderSize, b.GetBufferPointer(), b.GetSize());
  const uint32_t crc = crc32c::Value(v.data() + 4, v.size() - 4);
  for (int i = 0; i < 4; ++i) v[format::kCrcOffset + i] = static_cast<char>(crc >> (8 * i));
  return v;
}

}  // namespace

std::string EncodeHeader(const TrajectoryHeader& h, std::string_view request_digest) {
  const bool blob = !request_digest.empty();
  flatbuffers::FlatBufferBuilder b(256 + (blob ? 0 : h.request.size()));
  auto request = Bytes(b, blob ? std::string_view() : std::string_view(h.request));
  auto digest = blob ? Bytes(b, request_digest) : 0;
  auto fp = FingerprintToLog(b, h.fingerprint);
  const fb::SamplingParams sp = SamplingToLog(h.sampling);
  auto body = fb::CreateHeader(b, request, h.group_id, h.sample_index, h.sampling.seed, &sp,
                               h.max_tokens, h.weight_version, fp, digest);
  return Frame(RecordType::kHeader, b, body.Union());
}

std::string EncodeRequestBlob(std::string_view digest, std::string_view request) {
  flatbuffers::FlatBufferBuilder b(64 + request.size());
  auto d = Bytes(b, digest);
  auto r = Bytes(b, request);
  auto body = fb::CreateRequestBlob(b, d, r);
  return Frame(RecordType::kRequestBlob, b, body.Union());
}

std::string RequestDigest(std::string_view request) {
  const XXH128_hash_t h = XXH3_128bits(request.data(), request.size());
  std::string d(format::kRequestDigestSize, '\0');
  format::PutBigEndian64(h.high64, reinterpret_cast<uint8_t*>(d.data()));
  format::PutBigEndian64(h.low64, reinterpret_cast<uint8_t*>(d.data()) + 8);
  return d;
}

std::string EncodeTokens(uint32_t first_index, std::span<const int32_t> ids,
                         std::span<const float> logprobs, uint64_t weight_version) {
  flatbuffers::FlatBufferBuilder b(64 + 8 * ids.size());
  auto vi = b.CreateVector(ids.data(), ids.size());
  auto vl = b.CreateVector(logprobs.data(), logprobs.size());
  auto body = fb::CreateTokens(b, first_index, weight_version, vi, vl);
  return Frame(RecordType::kTokens, b, body.Union());
}

std::string EncodeTurnBoundary(const TurnBoundary& t) {
  flatbuffers::FlatBufferBuilder b(64 + 4 * t.injected_tokens.size());
  auto inj = b.CreateVector(t.injected_tokens);
  auto body = fb::CreateTurnBoundary(b, t.turn_index, t.token_index, inj);
  return Frame(RecordType::kTurnBoundary, b, body.Union());
}

std::string EncodeToolCall(const ToolCall& c) {
  flatbuffers::FlatBufferBuilder b(128 + c.input.size());
  auto name = b.CreateString(c.tool_name);
  auto input = Bytes(b, c.input);
  auto body = fb::CreateToolCall(b, c.call_index, c.token_index, name, TierToLog(c.tier), input);
  return Frame(RecordType::kToolCall, b, body.Union());
}

std::string EncodeToolResult(const ToolResult& r) {
  flatbuffers::FlatBufferBuilder b(128 + r.stdout_bytes.size() + r.stderr_bytes.size());
  auto out = Bytes(b, r.stdout_bytes);
  auto err = Bytes(b, r.stderr_bytes);
  auto msg = b.CreateString(r.error_message);
  auto body =
      fb::CreateToolResult(b, r.call_index, r.exit_status, out, err, r.stdout_truncated,
                           r.stderr_truncated, r.wall_seconds, r.cpu_seconds, r.error_code, msg);
  return Frame(RecordType::kToolResult, b, body.Union());
}

std::string EncodeFinish(FinishReason reason, std::string_view error,
                         const RoutingRecord* routing) {
  const bool routed = routing != nullptr && !routing->empty();
  flatbuffers::FlatBufferBuilder b(64 + error.size() + (routed ? routing->weights.size() * 6 : 0));
  auto e = b.CreateString(error.data(), error.size());
  flatbuffers::Offset<fb::Routing> r;
  if (routed) r = RoutingToLog(b, *routing);
  auto body = fb::CreateFinished(b, FinishToLog(reason), e, r);
  return Frame(RecordType::kFinish, b, body.Union());
}

std::string EncodeGroup(uint64_t group_id, std::string_view request) {
  flatbuffers::FlatBufferBuilder b(64 + request.size());
  auto req = Bytes(b, request);
  auto body = fb::CreateGroup(b, group_id, req);
  return Frame(RecordType::kGroup, b, body.Union());
}

std::string EncodeAcked(uint64_t unix_ms) {
  flatbuffers::FlatBufferBuilder b(64);
  auto body = fb::CreateAcked(b, unix_ms);
  return Frame(RecordType::kAcked, b, body.Union());
}

Status CheckValue(std::string_view value, std::string_view where) {
  if (value.size() < format::kValueHeaderSize + 8) {
    return Status::Corruption(std::string(where) + ": record too short (" +
                              std::to_string(value.size()) + " bytes)");
  }
  uint32_t stored = 0;
  for (int i = 0; i < 4; ++i) {
    stored |= static_cast<uint32_t>(static_cast<uint8_t>(value[format::kCrcOffset + i])) << (8 * i);
  }
  const uint32_t actual = crc32c::Value(value.data() + 4, value.size() - 4);
  if (stored != actual) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "checksum mismatch (stored %08x, computed %08x)", stored,
                  actual);
    return Status::Corruption(std::string(where) + ": " + buf);
  }
  const uint8_t version = static_cast<uint8_t>(value[format::kVersionOffset]);
  if (version < format::kOldestReadableVersion || version > format::kFormatVersion) {
    return Status::Corruption(std::string(where) + ": record format version " +
                              std::to_string(version) + ", expected " +
                              std::to_string(format::kOldestReadableVersion) + ".." +
                              std::to_string(format::kFormatVersion));
  }
  return Status::Ok();
}

namespace {

// Verifies value's FlatBuffer and returns its root. `aligned` receives an aligned copy (LMDB
// values are only 2-byte aligned; the verifier checks alignment).
Result<const fb::WalRecord*> Parse(std::string_view value, std::string_view where,
                                   std::vector<uint64_t>& aligned) {
  BR_RETURN_IF_ERROR(CheckValue(value, where));
  const size_t n = value.size() - format::kValueHeaderSize;
  aligned.assign((n + 7) / 8, 0);
  std::memcpy(aligned.data(), value.data() + format::kValueHeaderSize, n);
  const auto* p = reinterpret_cast<const uint8_t*>(aligned.data());
  flatbuffers::Verifier verifier(p, n);
  if (!fb::VerifyWalRecordBuffer(verifier)) {
    return Status::Corruption(std::string(where) + ": record fails the FlatBuffers verifier");
  }
  const fb::WalRecord* rec = fb::GetWalRecord(p);
  if (static_cast<uint8_t>(rec->body_type()) != static_cast<uint8_t>(value[format::kTypeOffset])) {
    return Status::Corruption(std::string(where) + ": record type tag disagrees with its body");
  }
  return rec;
}

}  // namespace

Result<PendingGroup> DecodeGroup(uint64_t group_id, std::string_view value) {
  const std::string where = "group=" + std::to_string(group_id);
  std::vector<uint64_t> aligned;
  BR_ASSIGN_OR_RETURN(const fb::WalRecord* rec, Parse(value, where, aligned));
  const fb::Group* g = rec->body_as_Group();
  if (g == nullptr || g->group_id() != group_id) {
    return Status::Corruption(where + ": not a group record for this key");
  }
  return PendingGroup{group_id, std::string(View(g->request()))};
}

Result<std::string> DecodeRequestBlob(std::string_view digest, std::string_view value) {
  const std::string where = "request blob " + HexDigest(digest);
  std::vector<uint64_t> aligned;
  BR_ASSIGN_OR_RETURN(const fb::WalRecord* rec, Parse(value, where, aligned));
  const fb::RequestBlob* r = rec->body_as_RequestBlob();
  if (r == nullptr || View(r->digest()) != digest) {
    return Status::Corruption(where + ": not a request blob for this key");
  }
  std::string bytes(View(r->bytes()));
  if (RequestDigest(bytes) != digest) {
    return Status::Corruption(where + ": the bytes do not hash to the key");
  }
  return bytes;
}

std::string HexDigest(std::string_view digest) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : digest) {
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

TrajectoryDecoder::TrajectoryDecoder(uint64_t traj) {
  log_.id = traj;
}

Status TrajectoryDecoder::Add(uint64_t seq, std::string_view value) {
  const std::string where = format::DescribeTrajKey(log_.id, seq);
  auto bad = [&](const std::string& why) { return Status::Corruption(where + ": " + why); };
  if (seq != next_seq_) {
    return bad("sequence gap: expected seq " + std::to_string(next_seq_));
  }
  if (log_.acked_unix_ms.has_value()) return bad("record after the acknowledgement");
  std::vector<uint64_t> aligned;
  BR_ASSIGN_OR_RETURN(const fb::WalRecord* rec, Parse(value, where, aligned));
  const auto type = rec->body_type();
  // Versions 1 and 2 count sampled tokens only: their index + the injected tokens before it.
  const uint8_t version = static_cast<uint8_t>(value[format::kVersionOffset]);
  const uint32_t shift = version < format::kFirstTrajectoryIndexVersion ? injected_ : 0;
  // A record's index must be the tokens logged before it, counted the way its version counts.
  auto at_index = [&](const char* what, uint32_t index) {
    if (uint64_t{index} + shift == length_) return Status::Ok();
    return bad(std::string(what) + " " + std::to_string(index) + ", expected " +
               std::to_string(length_ - shift) + " (format version " + std::to_string(version) +
               ")");
  };
  if (log_.finish.has_value() != (type == fb::RecordBody::Acked)) {
    return bad(log_.finish.has_value() ? "record after the finish record"
                                       : "acknowledgement of an unfinished trajectory");
  }
  if ((seq == 0) != (type == fb::RecordBody::Header)) {
    return bad(seq == 0 ? "seq 0 is not a header record" : "header record after seq 0");
  }
  switch (type) {
    case fb::RecordBody::Header: {
      const fb::Header* h = rec->body_as_Header();
      TrajectoryHeader& o = log_.header;
      o.request = std::string(View(h->request()));
      request_digest_ = std::string(View(h->request_digest()));
      if (!request_digest_.empty() &&
          (request_digest_.size() != format::kRequestDigestSize || !o.request.empty())) {
        return bad("header has a malformed request digest");
      }
      o.group_id = h->group_id();
      o.sample_index = h->sample_index();
      o.sampling = SamplingFromLog(*h);
      o.max_tokens = h->max_tokens();
      o.weight_version = h->weight_version();
      o.fingerprint = FingerprintFromLog(h->fingerprint());
      break;
    }
    case fb::RecordBody::Tokens: {
      const fb::Tokens* t = rec->body_as_Tokens();
      const auto* ids = t->ids();
      const auto* lps = t->logprobs();
      const size_t n = ids ? ids->size() : 0;
      if (n == 0 || lps == nullptr || lps->size() != n) return bad("token record is malformed");
      BR_RETURN_IF_ERROR(at_index("token record starts at", t->first_index()));
      if (uint64_t{length_} + n > UINT32_MAX) return bad("trajectory exceeds 2^32 tokens");
      log_.spans.push_back({length_, static_cast<uint32_t>(n), t->weight_version()});
      length_ += static_cast<uint32_t>(n);
      log_.token_ids.resize(log_.token_ids.size() + n);
      log_.logprobs.resize(log_.logprobs.size() + n);
      std::memcpy(log_.token_ids.data() + log_.token_ids.size() - n, ids->data(), 4 * n);
      std::memcpy(log_.logprobs.data() + log_.logprobs.size() - n, lps->data(), 4 * n);
      break;
    }
    case fb::RecordBody::TurnBoundary: {
      const fb::TurnBoundary* t = rec->body_as_TurnBoundary();
      TurnBoundary o;
      o.turn_index = t->turn_index();
      BR_RETURN_IF_ERROR(at_index("turn boundary at", t->token_index()));
      o.token_index = length_;
      if (const auto* inj = t->injected_tokens())
        o.injected_tokens.assign(inj->begin(), inj->end());
      if (uint64_t{length_} + o.injected_tokens.size() > UINT32_MAX) {
        return bad("trajectory exceeds 2^32 tokens");
      }
      length_ += static_cast<uint32_t>(o.injected_tokens.size());
      injected_ += static_cast<uint32_t>(o.injected_tokens.size());
      log_.turns.push_back(std::move(o));
      break;
    }
    case fb::RecordBody::ToolCall: {
      const fb::ToolCall* c = rec->body_as_ToolCall();
      ToolCallLog o;
      o.call.call_index = c->call_index();
      BR_RETURN_IF_ERROR(at_index("tool call at", c->token_index()));
      o.call.token_index = length_;
      o.call.tool_name = Str(c->tool_name());
      o.call.tier = TierFromLog(c->tier());
      o.call.input = std::string(View(c->input()));
      if (!call_pos_.emplace(o.call.call_index, log_.tool_calls.size()).second) {
        return bad("duplicate tool call index " + std::to_string(o.call.call_index));
      }
      log_.tool_calls.push_back(std::move(o));
      break;
    }
    case fb::RecordBody::ToolResult: {
      const fb::ToolResult* r = rec->body_as_ToolResult();
      auto it = call_pos_.find(r->call_index());
      if (it == call_pos_.end() || log_.tool_calls[it->second].result.has_value()) {
        return bad("tool result for unknown or answered call " + std::to_string(r->call_index()));
      }
      ToolResult o;
      o.call_index = r->call_index();
      o.exit_status = r->exit_status();
      o.stdout_bytes = std::string(View(r->stdout_bytes()));
      o.stderr_bytes = std::string(View(r->stderr_bytes()));
      o.stdout_truncated = r->stdout_truncated();
      o.stderr_truncated = r->stderr_truncated();
      o.wall_seconds = r->wall_seconds();
      o.cpu_seconds = r->cpu_seconds();
      o.error_code = r->error_code();
      o.error_message = Str(r->error_message());
      log_.tool_calls[it->second].result = std::move(o);
      break;
    }
    case fb::RecordBody::Finished: {
      const fb::Finished* f = rec->body_as_Finished();
      Result<RoutingRecord> routing = RoutingFromLog(f->routing());
      if (!routing.ok()) return bad(routing.status().message());
      log_.finish = FinishRecord{FinishFromLog(f->reason()), Str(f->error()), std::move(*routing)};
      break;
    }
    case fb::RecordBody::Acked:
      log_.acked_unix_ms = rec->body_as_Acked()->unix_ms();
      break;
    default:
      return bad("record type " + std::to_string(static_cast<int>(type)) +
                 " does not belong in a trajectory");
  }
  ++next_seq_;
  ++log_.records;
  log_.bytes += format::kTrajKeySize + value.size();
  return Status::Ok();
}

Status TrajectoryDecoder::Done() const {
  if (next_seq_ == 0) {
    return Status::Corruption(format::DescribeTrajKey(log_.id, 0) + ": trajectory has no records");
  }
  return Status::Ok();
}

}  // namespace bitroll::wal::internal
