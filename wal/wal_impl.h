// Internal to wal/: the state behind Wal (wal.h), shared by wal.cc (open, group commit, appends)
// and wal_read.cc (recovery scan and read-side queries). Not a public header.
//
// Thread-safety: see the lock comments on Wal::Impl; Op and TrajState are plain values guarded by
// Impl::mu.
#pragma once

#include <lmdb.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "wal/wal_format.h"

#include "wal/wal.h"

namespace bitroll::wal {
namespace internal {

using Clock = std::chrono::steady_clock;

inline Status LmdbError(int rc, std::string_view what) {
  std::string msg =
      std::string(what) + ": " + mdb_strerror(rc) + " (rc=" + std::to_string(rc) + ")";
  if (rc == MDB_MAP_FULL || rc == ENOSPC || rc == EDQUOT) return Status::NoSpace(std::move(msg));
  if (rc == MDB_CORRUPTED || rc == MDB_PAGE_NOTFOUND || rc == MDB_INVALID ||
      rc == MDB_VERSION_MISMATCH) {
    return Status::Corruption(std::move(msg));
  }
  return Status::IoError(std::move(msg));
}

// LMDB reports a short write() as EIO ("TODO: Use which error code?" in mdb.c); on a full disk
// that is what a multi-page commit gets instead of ENOSPC. An EIO while the WAL's filesystem has
// less than kFullDiskSlackBytes available is reported as kNoSpace, naming the free space.
constexpr uint64_t kFullDiskSlackBytes = 1ull << 20;
inline Status LmdbWriteError(int rc, std::string_view what, const std::string& dir) {
  Status s = LmdbError(rc, what);
  struct statvfs fs {};
  if (rc == EIO && statvfs(dir.c_str(), &fs) == 0) {
    const uint64_t avail = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
    if (avail < kFullDiskSlackBytes) {
      return Status::NoSpace(std::string(what) +
                             ": No space left on device (LMDB reported a short write as EIO; " +
                             std::to_string(avail) + " bytes available on the WAL's filesystem)");
    }
  }
  return s;
}

inline MDB_val Val(const void* p, size_t n) {
  return MDB_val{n, const_cast<void*>(p)};
}
inline std::string_view View(const MDB_val& v) {
  return {static_cast<const char*>(v.mv_data), v.mv_size};
}

inline uint64_t RoundUpToPage(uint64_t n) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  return (n + page - 1) / page * page;
}

// One buffered mutation, applied in append order inside one write transaction.
struct Op {
  enum Kind : uint8_t {
    kPutTraj,
    kDelTraj,
    kPutGroup,
    kDelGroup,
    kPutRequest,  // key = digest, value = request blob
    kDelRequest,  // key = digest
  } kind = kPutTraj;
  std::string digest;  // kPutRequest / kDelRequest
  uint64_t id = 0;     // trajectory or group id
  uint64_t seq = 0;    // kPutTraj only
  uint64_t lsn = 0;    // every op (a coalesced token op: its latest append's)
  std::string value;
  // A token record still open for coalescing: encoded into `value` at commit time.
  bool lazy_tokens = false;
  uint32_t first_token = 0;
  uint64_t weight_version = 0;
  std::vector<int32_t> ids;
  std::vector<float> logprobs;
};

// Wall-clock milliseconds since the Unix epoch (acknowledgement times survive restarts).
inline uint64_t UnixMs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

inline Op MakeOp(Op::Kind kind, uint64_t id, uint64_t seq, std::string value = {}) {
  Op op;
  op.kind = kind;
  op.id = id;
  op.seq = seq;
  op.value = std::move(value);
  return op;
}

struct TrajState {
  uint64_t next_seq = 0;
  uint64_t committed_next = 0;  // records with seq < this are committed
  uint64_t durable_next = 0;    // records with seq < this are durable
  uint32_t tokens = 0;          // trajectory tokens logged (sampled + injected)
  bool finished = false;
  bool quarantined = false;
  bool acked = false;  // acknowledged with a retention period; deleted when it ends
  uint64_t bytes = 0;
  std::map<uint32_t, bool> calls;  // call_index -> has a result
  std::string request_digest;      // its header's request blob (format 2), or empty
  int64_t open_tokens_op = -1;     // index in Impl::buffer of its coalescable token op, or -1
};

}  // namespace internal

struct Wal::Impl {
  using Op = internal::Op;
  using TrajState = internal::TrajState;
  using Clock = internal::Clock;

  WalOptions opt;
  int lock_fd = -1;
  MDB_env* env = nullptr;
  MDB_dbi traj_dbi = 0, group_dbi = 0, meta_dbi = 0, request_dbi = 0;

  // Lock order: commit_mu -> mu -> env_mu. Readers take env_mu shared; a map resize takes it
  // exclusively (LMDB requires that no transaction is active in this process).
  std::mutex commit_mu;  // serializes Commit()
  mutable std::mutex mu;
  mutable std::shared_mutex env_mu;
  std::condition_variable cv;

  // Guarded by mu.
  Status sticky;
  bool recovered = false;
  bool stop = false;
  std::vector<Op> buffer;
  size_t buffered_puts = 0;
  std::unordered_map<uint64_t, TrajState> trajs;
  std::set<uint64_t> groups;
  std::set<uint64_t> unsynced_trajs;           // committed but not yet synced (kWindow)
  std::vector<uint64_t> open_token_trajs;      // trajectories with open_tokens_op >= 0
  std::multimap<uint64_t, uint64_t> retained;  // deletion time (unix ms) -> acked trajectory
  // Request blobs: digest -> number of live trajectories whose header names it. The blob is
  // written with the first such header and deleted (in the same commit as the last trajectory's
  // deletion) when the count drops to 0.
  std::unordered_map<std::string, uint64_t> request_refs;
  uint64_t last_lsn = 0, committed_lsn = 0, durable_lsn = 0;
  WalStats st;
  uint64_t map_bytes = 0;
  Clock::time_point last_sync = Clock::now();

  std::thread committer;

  ~Impl() {
    if (env != nullptr) mdb_env_close(env);
    if (lock_fd >= 0) close(lock_fd);  // releases the flock
  }

  Status OpenEnv();
  Status CheckAppendable(uint64_t traj, TrajState** state);  // REQUIRES: mu held
  uint64_t Push(Op op);                                      // REQUIRES: mu held
  void PushDelete(Op op);                                    // REQUIRES: mu held
  std::vector<Op> TakeBuffer();                              // REQUIRES: mu held
  void ExpireRetained();                                     // REQUIRES: mu held
  // Deletes trajectory `it` (kDelTraj) and releases its request blob.   REQUIRES: mu held
  void EraseTrajectory(std::unordered_map<uint64_t, TrajState>::iterator it);
  Status CommitLocked(bool force_sync);                      // REQUIRES: commit_mu held
  Status WriteBatch(const std::vector<Op>& batch);           // REQUIRES: commit_mu held
  int ApplyOps(MDB_txn* txn, const std::vector<Op>& batch);  // an LMDB return code
  Status GrowMap();
  Status Sync();
  Status SetSticky(const Status& s);
  void CommitterLoop();
  Status ScanTrajectory(MDB_txn* txn, uint64_t traj, TrajectoryLog* out) const;
  // The request blob `digest` named by trajectory traj's header; kCorruption naming both when it
  // is missing or fails its checks.
  Result<std::string> ReadRequestBlob(MDB_txn* txn, uint64_t traj, const std::string& digest) const;
};

}  // namespace bitroll::wal
