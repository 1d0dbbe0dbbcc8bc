// bitroll::wal::Wal: the token-level write-ahead log (docs/design.md "Promises", 3: no lost work).
//
// One Wal owns one LMDB environment in one service data directory. The coordinator appends, for
// every trajectory, a header, its generated tokens (in batches), turn boundaries, tool calls, tool
// results and a finish record; the WAL makes them durable in group commits; after a crash Recover()
// returns every unfinished trajectory so that it resumes where it stopped, and every finished one
// the trainer has not acknowledged. The format is specified in docs/wal_format.md (constants in
// wal/wal_format.h).
//
// Group commit. Appends only buffer a record in memory and give it a log sequence number (LSN,
// 1, 2, ... in append order, per Open()); so do deletions (Acknowledge, Discard,
// AcknowledgeGroup), so that LastLsn() moves with every change a commit must write. Buffered
// records are written in ONE LMDB write transaction by Commit(): either the caller's loop drives
// Commit() (WalOptions::background_commit = false), or a background committer thread calls it every
// commit_interval_ms, or as soon as commit_max_records are buffered (background_commit = true, the
// default). Flush() commits and makes everything appended so far durable, on the caller's thread,
// before it returns.
//
// Durability. DurableLsn() is the largest LSN such that every record with an LSN <= it is durable
// in the sense of WalOptions::durability:
//   kSyncEveryCommit: LMDB's default: every commit is fsync'ed before it is reported.
//   kWindow:          commits use MDB_NOSYNC; mdb_env_sync runs at most every sync_window_ms (and
//                     on Flush()). A power loss can lose at most the last sync_window_ms (plus one
//                     commit interval) of records; a process crash (kill -9) loses none that were
//                     committed, since they are in the OS page cache. DurableLsn() counts synced
//                     records only.
//   kNone:            MDB_NOSYNC and never sync (tests, benchmarks): committed == "durable".
// The coordinator reports a trajectory to its client only once IsTrajectoryDurable() holds after
// its AppendFinish() (or DurableLsn() passed the LastLsn() read right after it), and can be woken
// by WalOptions::on_durable.
//
// Token coalescing. Consecutive AppendTokens() of one trajectory within one commit become one
// record (WalOptions::max_coalesced_tokens), so a decode loop may append token by token.
//
// Failure (leveldb's rule). A failed LMDB write, commit or sync makes the Wal's state unknown, so
// it becomes STICKY: status() returns that error and every later append, Commit(), Flush() and
// Acknowledge() returns the same Status (code kIoError, kNoSpace or kCorruption). DurableLsn()
// stops advancing: nothing appended after the last successful durable point is ever reported
// durable. MDB_MAP_FULL first grows the map (doubling, up to max_map_bytes) and retries the whole
// transaction; at max_map_bytes it is a sticky kNoSpace. LMDB's commits are atomic, so a failure
// never corrupts what was committed before; reopening the directory recovers it.
//
// Ownership. Every append copies what it is given; the caller keeps its buffers.
//
// Thread-safety. Appends, Recover(), Acknowledge(), Discard(), Commit() and Flush() may be called
// from any thread (internally serialized), though the intended use is one writer thread. Const
// methods and ReadTrajectory() may be called concurrently from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "schema/status.h"
#include "schema/vocab.h"
#include "wal/wal_format.h"

namespace bitroll::wal {

enum class Durability : uint8_t {
  kSyncEveryCommit = 0,  // fsync per commit; nothing committed is ever lost
  kWindow = 1,           // sync at most every sync_window_ms; bounded loss window on power loss
  kNone = 2,             // never sync; for tests and benchmarks only
};

// What a test's fault hook is asked about (leveldb's FaultInjection idea).
enum class IoOp : uint8_t {
  kWrite = 0,  // just before mdb_txn_commit: an error aborts the transaction (nothing is written)
  kSync = 1,   // just after a successful commit in kSyncEveryCommit mode (the commit's fsync), or
               // just before mdb_env_sync in kWindow mode: an error means "the sync failed", so
               // the records may be on disk but are never reported durable
};

// A test seam: called by the committer before/after the named operation; a non-OK Status is
// treated exactly as if LMDB had returned that error. Unset in production.
using FaultHook = std::function<Status(IoOp op)>;

struct WalOptions {
  // Directory of the LMDB environment; created (one level) if missing. REQUIRED.
  std::string dir;
  // See the header comment. Stronger is slower: kSyncEveryCommit costs one fsync per commit.
  Durability durability = Durability::kSyncEveryCommit;
  // true: a background committer thread commits every commit_interval_ms or commit_max_records.
  // false: nothing is committed until the caller calls Commit() or Flush() (its loop drives it).
  bool background_commit = true;
  // Group-commit interval. Larger batches fewer fsyncs per token but delays durability.
  int commit_interval_ms = 10;
  // A commit starts early when this many records are buffered (background_commit only).
  int commit_max_records = 4096;
  // Consecutive AppendTokens() of one trajectory that land in the same commit (same weight
  // version, nothing appended to that trajectory in between) are written as ONE token record of up
  // to this many tokens: a decode loop may append token by token and still pay ~12 bytes/token
  // (bench_wal) instead of ~108. 1 disables coalescing (one record per call). Record boundaries
  // then depend on commit timing; the logged tokens never do.
  int max_coalesced_tokens = 1024;
  // kWindow only: the longest a committed record waits for mdb_env_sync (the power-loss window).
  int sync_window_ms = 100;
  // LMDB map size at open (the file grows only as pages are used). Raised to the size the
  // environment already has on disk.
  uint64_t initial_map_bytes = format::kDefaultInitialMapBytes;
  // MDB_MAP_FULL grows the map up to this; beyond it appends fail with a sticky kNoSpace. Set it
  // equal to initial_map_bytes to disable growth.
  uint64_t max_map_bytes = format::kDefaultMaxMapBytes;
  // Called on the committing thread each time DurableLsn() advances, with the new value. It runs
  // under the commit lock only: it may append and call const methods, but must not call
  // Commit(), Flush() or Recover() (deadlock).
  std::function<void(uint64_t durable_lsn)> on_durable;
  // 0: Acknowledge() deletes a trajectory in the next commit. > 0: Acknowledge() logs an Acked
  // record and the trajectory stays readable (ReadTrajectory, audits) until this many ms of wall
  // clock after the acknowledgement; then a commit deletes it. Recover() applies the current
  // value to acknowledgements logged by earlier runs. Longer retention = a larger file.
  int64_t ack_retention_ms = 0;
  // Test seam; see FaultHook.
  FaultHook fault_hook;
};

// SamplingParams (seed included), NumericsFingerprint, FinishReason, ToolTier: schema/vocab.h.

// Record sequence 0 of a trajectory.
struct TrajectoryHeader {
  std::string request;  // opaque bytes: the wire request as serialized by the protocol layer
  uint64_t group_id = 0;
  uint32_t sample_index = 0;
  SamplingParams sampling;  // seed included
  uint32_t max_tokens = 0;
  uint64_t weight_version = 0;
  NumericsFingerprint fingerprint;
};

// Every index below is a trajectory index: it counts the tokens after the prompt, sampled
// (TrajectoryLog::token_ids) and injected (TurnBoundary::injected_tokens), in log order
// (docs/design.md "Token indexes"). Records of format versions 1 and 2 are converted on read.

// Trajectory tokens [first_token, first_token + count) were sampled with weights weight_version.
struct TokenSpan {
  uint32_t first_token = 0;
  uint32_t count = 0;
  uint64_t weight_version = 0;
};

struct TurnBoundary {
  uint32_t turn_index = 0;
  uint32_t token_index = 0;  // set by the Wal on append: trajectory tokens logged before it
  std::vector<int32_t> injected_tokens;  // tokens the coordinator inserts after the boundary
};

struct ToolCall {
  uint32_t call_index = 0;   // unique within the trajectory
  uint32_t token_index = 0;  // set by the Wal on append: trajectory tokens logged before it
  std::string tool_name;
  ToolTier tier = ToolTier::kFunction;
  std::string input;
};

struct ToolResult {
  uint32_t call_index = 0;
  int32_t exit_status = 0;
  std::string stdout_bytes;
  std::string stderr_bytes;
  bool stdout_truncated = false;
  bool stderr_truncated = false;
  double wall_seconds = 0;
  double cpu_seconds = 0;
  uint16_t error_code = 0;  // bitroll::ErrorCode of the tool run; 0 = ok
  std::string error_message;
};

struct FinishRecord {
  FinishReason reason = FinishReason::kNone;
  std::string error;
  RoutingRecord routing{};  // the trajectory's routing record (MoE, when asked); empty otherwise
};

struct ToolCallLog {
  ToolCall call;
  std::optional<ToolResult> result;  // set: replay it on resume instead of re-running the tool
};

// Everything logged for one trajectory, in log order.
struct TrajectoryLog {
  uint64_t id = 0;
  TrajectoryHeader header;
  std::vector<int32_t> token_ids;  // sampled tokens, in order (the injected ones are in `turns`)
  std::vector<float> logprobs;     // one per token, bit-exact
  std::vector<TokenSpan> spans;    // one per logged token batch
  std::vector<TurnBoundary> turns;
  std::vector<ToolCallLog> tool_calls;  // in call order
  std::optional<FinishRecord> finish;
  // Set when acknowledged and kept for WalOptions::ack_retention_ms (wall-clock ms of the ack).
  std::optional<uint64_t> acked_unix_ms;
  uint64_t records = 0;  // records read, header included
  uint64_t bytes = 0;    // key + value bytes of those records
};

struct QuarantinedTrajectory {
  uint64_t id = 0;
  uint64_t seq = 0;  // the first bad record
  Status error;      // kCorruption; the message names the trajectory and the record key
};

struct PendingGroup {
  uint64_t group_id = 0;
  std::string request;
};

struct RecoveryResult {
  std::vector<TrajectoryLog> unfinished;           // resume these (ascending id)
  std::vector<TrajectoryLog> finished;             // finished, not yet acknowledged: deliver again
  std::vector<QuarantinedTrajectory> quarantined;  // left in place until Discard()
  std::vector<PendingGroup> groups;                // groups appended and not yet acknowledged
  std::vector<QuarantinedTrajectory> quarantined_groups;  // id = group id; left in place
  std::vector<uint64_t> retained;  // acknowledged, kept until their retention ends (ascending)
};

struct WalStats {
  uint64_t records_written = 0;  // records committed since Open (deletes not counted)
  uint64_t bytes_written = 0;    // key + value bytes of those records
  uint64_t tokens_appended = 0;  // generated + injected tokens appended since Open
  uint64_t commits = 0;          // LMDB write transactions committed
  uint64_t syncs = 0;            // fsyncs: commits in kSyncEveryCommit, mdb_env_sync otherwise
  uint64_t map_grows = 0;        // MDB_MAP_FULL recoveries
  uint64_t last_lsn = 0;
  uint64_t committed_lsn = 0;
  uint64_t durable_lsn = 0;
  uint64_t map_bytes = 0;       // current LMDB map size
  uint64_t map_used_bytes = 0;  // (last used page + 1) * page size: the file's high-water mark
  uint64_t live_trajectories = 0;
  // bytes_written / tokens_appended (0 when no tokens): the benchmark's "bytes per token".
  double bytes_per_token = 0;
};

class Wal {
 public:
  // Opens (creating if needed) the environment in options.dir and takes its LOCK file.
  // Errors: kInvalidArgument (bad options), kBusy (the directory is open elsewhere), kUnsupported
  // (another format version), kIoError / kNoSpace (LMDB or the OS refused).
  static Result<std::unique_ptr<Wal>> Open(const WalOptions& options);

  // Flushes (best effort; a sticky error is not cleared), stops the committer, closes LMDB.
  ~Wal();
  Wal(const Wal&) = delete;
  Wal& operator=(const Wal&) = delete;

  // Scans the log. REQUIRES: called once, after Open and before any append (appends return
  // kFailedPrecondition until it ran). Corrupt trajectories are quarantined, never fatal; an
  // error return means the scan itself failed (LMDB read error).
  Result<RecoveryResult> Recover();

  // Starts trajectory `traj` (its seq 0). REQUIRES: traj is not live in this Wal.
  Status AppendHeader(uint64_t traj, const TrajectoryHeader& header);
  // REQUIRES: ids.size() == logprobs.size() > 0; traj has a header and no finish.
  Status AppendTokens(uint64_t traj, std::span<const int32_t> ids, std::span<const float> logprobs,
                      uint64_t weight_version);
  // token_index of `b` is overwritten with the trajectory's current length (sampled + injected
  // tokens logged); its injected tokens then follow at that index.
  Status AppendTurnBoundary(uint64_t traj, const TurnBoundary& b);
  // token_index of `call` is overwritten. REQUIRES: call.call_index not used yet in traj.
  Status AppendToolCall(uint64_t traj, const ToolCall& call);
  // REQUIRES: a logged call with this call_index and no result yet.
  Status AppendToolResult(uint64_t traj, const ToolResult& result);
  // The last record of a trajectory; afterwards only Acknowledge/Discard apply. `routing` (may be
  // null or empty) is stored in it: a recovered trajectory keeps its full routing record.
  Status AppendFinish(uint64_t traj, FinishReason reason, std::string_view error,
                      const RoutingRecord* routing = nullptr);

  // Accepted-but-unstarted work. REQUIRES: group_id not pending.
  Status AppendGroup(uint64_t group_id, std::string_view request);
  // Deletes a pending group record (its trajectories now carry their own headers).
  Status AcknowledgeGroup(uint64_t group_id);

  // The trainer has the finished trajectory: delete its records in the next commit, or once
  // ack_retention_ms have passed (LMDB reuses the freed pages). Recover() no longer returns it.
  // REQUIRES: traj finished and not yet acknowledged (kFailedPrecondition otherwise; kNotFound if
  // unknown).
  Status Acknowledge(uint64_t traj);
  // Deletes a trajectory in any state (aborted, quarantined). kNotFound if unknown.
  Status Discard(uint64_t traj);

  // Writes everything buffered in one transaction; syncs when the durability mode says so.
  Status Commit();
  // Commit() and then make everything appended so far durable (kWindow: mdb_env_sync now).
  // Returns OK only if DurableLsn() >= the LastLsn() seen at entry.
  Status Flush();

  // The LSN of the latest change: append or deletion (0 before any).
  uint64_t LastLsn() const;
  // Every record with LSN <= DurableLsn() is durable. Never advances after a sticky error.
  uint64_t DurableLsn() const;
  // True when record (traj, seq) of this Wal's lifetime, or a recovered one, is durable.
  bool IsDurable(uint64_t traj, uint64_t seq) const;
  // True when every record appended so far for traj is durable (false if traj is unknown, e.g.
  // acknowledged).
  bool IsTrajectoryDurable(uint64_t traj) const;
  // The next sequence number traj will use (0 if unknown to this Wal).
  uint64_t NextSeq(uint64_t traj) const;
  // Key + value bytes committed for traj since it started, recovered records included (the cost
  // report's "WAL bytes"). 0 if unknown.
  uint64_t TrajectoryBytes(uint64_t traj) const;

  // Reads a trajectory's committed records (buffered ones are not visible). kNotFound if none;
  // kCorruption naming the record if a checksum fails.
  Result<TrajectoryLog> ReadTrajectory(uint64_t traj) const;

  // The sticky error, or OK.
  Status status() const;
  WalStats stats() const;

 private:
  struct Impl;
  explicit Wal(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace bitroll::wal
