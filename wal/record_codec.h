// Internal to wal/: encoding of WAL records (value header + WalRecord FlatBuffer) and decoding of
// one trajectory's key range back into a TrajectoryLog. Used by wal.cc; tests may include it.
//
// Thread-safety: pure functions; a TrajectoryDecoder is used by one thread at a time.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>

#include "schema/status.h"
#include "wal/wal.h"
#include "wal/wal_format.h"

namespace bitroll::wal::internal {

// Each returns a complete LMDB value: the 8-byte value header (CRC32C over bytes [4, end)) and the
// FlatBuffer. The bytes are a pure function of the arguments.
// A non-empty `request_digest` (RequestDigest(h.request)) stores the digest instead of the request
// bytes, which then live in a request blob (EncodeRequestBlob) in the requests database.
std::string EncodeHeader(const TrajectoryHeader& h, std::string_view request_digest = {});
std::string EncodeRequestBlob(std::string_view digest, std::string_view request);
// XXH3-128 of the request, 16 bytes big-endian (format::kRequestDigestSize): the blob's key.
std::string RequestDigest(std::string_view request);
std::string HexDigest(std::string_view digest);
std::string EncodeTokens(uint32_t first_index, std::span<const int32_t> ids,
                         std::span<const float> logprobs, uint64_t weight_version);
std::string EncodeTurnBoundary(const TurnBoundary& b);
std::string EncodeToolCall(const ToolCall& c);
std::string EncodeToolResult(const ToolResult& r);
std::string EncodeFinish(FinishReason reason, std::string_view error,
                         const RoutingRecord* routing = nullptr);
std::string EncodeGroup(uint64_t group_id, std::string_view request);
std::string EncodeAcked(uint64_t unix_ms);

// Checks the value header and the CRC of one value. kCorruption with `where` in the message.
Status CheckValue(std::string_view value, std::string_view where);

// Decodes a request blob stored under `digest`; kCorruption naming the blob on any failure,
// including bytes that do not hash to the digest.
Result<std::string> DecodeRequestBlob(std::string_view digest, std::string_view value);

// Decodes a group value. kCorruption naming the group on any failure.
Result<PendingGroup> DecodeGroup(uint64_t group_id, std::string_view value);

// Rebuilds a TrajectoryLog from its records, fed in key order.
class TrajectoryDecoder {
 public:
  explicit TrajectoryDecoder(uint64_t traj);
  // Adds record `seq`. kCorruption naming the trajectory and the record key when the record fails
  // its CRC, its FlatBuffers verifier, or the log's rules (seq 0 is the header, sequence numbers
  // are contiguous, token indices continue, results match calls, nothing follows the finish).
  // The log's token indexes are trajectory indexes whatever the record's format version: a
  // version 1 or 2 record's index (sampled tokens before it) is moved by the injected tokens of
  // the boundaries read before it.
  Status Add(uint64_t seq, std::string_view value);
  // Trajectory tokens read so far: sampled plus injected.
  uint32_t length() const { return length_; }
  // kCorruption if no record was added (a trajectory without a header).
  Status Done() const;
  const TrajectoryLog& log() const { return log_; }
  TrajectoryLog&& TakeLog() { return std::move(log_); }
  // The header's request digest (format 2), empty when the request is inline. The caller fills
  // log().header.request from the blob.
  const std::string& request_digest() const { return request_digest_; }

 private:
  uint64_t next_seq_ = 0;
  uint32_t length_ = 0;    // trajectory tokens read: sampled + injected
  uint32_t injected_ = 0;  // injected tokens read (the version 1/2 conversion)
  std::string request_digest_;
  std::map<uint32_t, size_t> call_pos_;  // call_index -> position in log_.tool_calls
  TrajectoryLog log_;
};

}  // namespace bitroll::wal::internal
