// The constants of the WAL's on-disk format. docs/wal_format.md is the prose specification; every
// number it names lives here, and nowhere else.
//
// Layout summary:
//   LMDB environment = one service data directory (data.mdb, lock.mdb, LOCK).
//   named database "traj":   key = traj id (u64 BE) ++ seq (u64 BE)  -> value = record
//   named database "groups": key = group id (u64 BE)                 -> value = record
//   named database "meta":   key = "format_version"                  -> value = u32 LE
//   named database "requests": key = XXH3-128 digest (16 bytes)      -> value = record (format 2)
//   record = crc32c (u32 LE, over bytes [4, end)) ++ type (u8) ++ version (u8) ++ 0 (u16)
//            ++ WalRecord FlatBuffer (schema/wal.fbs)
//
// Thread-safety: constants and pure functions only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace bitroll::wal::format {

// Bumped when a reader of the previous version could misread a record. Open() refuses versions
// outside [kOldestReadableVersion, kFormatVersion] and upgrades an older environment's meta record
// to kFormatVersion; every record keeps the version it was written with (kVersionOffset), and the
// reader decodes each record by its own version:
//   1: the first format.
//   2: added request blobs (version 1 records read unchanged).
//   3: Tokens.first_index, TurnBoundary.token_index and ToolCall.token_index count every token
//      after the prompt (sampled and injected: the trajectory index, docs/design.md "Token
//      indexes"); versions 1 and 2 counted sampled tokens only, and the reader converts them
//      (kFirstTrajectoryIndexVersion).
inline constexpr uint32_t kFormatVersion = 3;
inline constexpr uint32_t kOldestReadableVersion = 1;
// The first version whose token indexes are trajectory indexes; older records count sampled
// tokens only.
inline constexpr uint32_t kFirstTrajectoryIndexVersion = 3;

inline constexpr const char* kTrajDbName = "traj";
inline constexpr const char* kGroupDbName = "groups";
inline constexpr const char* kMetaDbName = "meta";
inline constexpr const char* kMetaVersionKey = "format_version";
inline constexpr const char* kRequestDbName = "requests";
inline constexpr int kMaxDbs = 4;
// A plain file in the directory held with flock(LOCK_EX) while a Wal is open.
inline constexpr const char* kLockFileName = "LOCK";

// Keys are big-endian so that LMDB's byte-wise order is numeric order and one trajectory is one
// contiguous key range [ (traj, 0), (traj+1, 0) ).
inline constexpr size_t kTrajKeySize = 16;  // traj id u64 BE, seq u64 BE
inline constexpr size_t kGroupKeySize = 8;  // group id u64 BE
// Request blobs (format 2): key = XXH3-128 digest of the request bytes (high u64 BE, low u64 BE).
// A header's request of at least kBlobMinRequestBytes is stored once as a blob; shorter ones stay
// inline in the header.
inline constexpr size_t kRequestDigestSize = 16;
inline constexpr size_t kBlobMinRequestBytes = 64;

// The value header that precedes each FlatBuffer.
inline constexpr size_t kValueHeaderSize = 8;
inline constexpr size_t kCrcOffset = 0;      // u32 LE: CRC32C of bytes [4, value end)
inline constexpr size_t kTypeOffset = 4;     // u8: RecordType, equals the union tag
inline constexpr size_t kVersionOffset = 5;  // u8: kFormatVersion at write time
// bytes 6..7: zero (reserved)

// The record type tags. They equal schema/wal.fbs's RecordBody union tags; wal.cc static_asserts
// it.
enum class RecordType : uint8_t {
  kHeader = 1,        // seq 0 of every trajectory
  kTokens = 2,        // a batch of generated tokens + logprobs + weight version
  kTurnBoundary = 3,  // end of a turn, with the injected tokens that follow it
  kToolCall = 4,      // a tool call as requested by the model
  kToolResult = 5,    // the logged result of a tool call (replayed on resume)
  kFinish = 6,        // the trajectory is complete; last record of a trajectory
  kGroup = 7,         // accepted-but-unstarted work (groups database only)
  kAcked = 8,         // acknowledged, kept for the retention period; only after kFinish
  kRequestBlob = 9,   // a request shared by trajectory headers (requests database only)
};

// Map size defaults (WalOptions). LMDB's map is virtual: the file grows only as pages are used.
inline constexpr uint64_t kDefaultInitialMapBytes = 64ull << 20;  // 64 MiB
inline constexpr uint64_t kDefaultMaxMapBytes = 64ull << 30;      // 64 GiB

inline void PutBigEndian64(uint64_t v, uint8_t* out) {
  for (int i = 7; i >= 0; --i) {
    out[i] = static_cast<uint8_t>(v);
    v >>= 8;
  }
}

inline uint64_t GetBigEndian64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | p[i];
  return v;
}

inline void EncodeTrajKey(uint64_t traj, uint64_t seq, uint8_t out[kTrajKeySize]) {
  PutBigEndian64(traj, out);
  PutBigEndian64(seq, out + 8);
}

// "traj=<id> seq=<seq> key=<32 hex digits>", the way errors name a record.
inline std::string DescribeTrajKey(uint64_t traj, uint64_t seq) {
  static const char kHex[] = "0123456789abcdef";
  uint8_t key[kTrajKeySize];
  EncodeTrajKey(traj, seq, key);
  std::string hex;
  for (uint8_t b : key) {
    hex.push_back(kHex[b >> 4]);
    hex.push_back(kHex[b & 15]);
  }
  return "traj=" + std::to_string(traj) + " seq=" + std::to_string(seq) + " key=" + hex;
}

}  // namespace bitroll::wal::format
