// The WAL: LMDB environment, group commit, durability tracking, appends and compaction.
// (The recovery scan and the read-side queries are in wal_read.cc.)
#include "wal/wal.h"

#include <fcntl.h>
#include <sys/file.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "wal/record_codec.h"
#include "wal/wal_impl.h"

namespace bitroll::wal {

using internal::LmdbError;
using internal::LmdbWriteError;
using internal::MakeOp;
using internal::RoundUpToPage;
using internal::Val;
using internal::View;
using Op = internal::Op;
using TrajState = internal::TrajState;
using Clock = internal::Clock;

Status Wal::Impl::OpenEnv() {
  std::error_code ec;
  std::filesystem::create_directory(opt.dir, ec);
  if (ec) return Status::IoError("cannot create WAL directory " + opt.dir + ": " + ec.message());
  const std::string lock_path = opt.dir + "/" + format::kLockFileName;
  lock_fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd < 0) return Status::IoError("cannot open " + lock_path + ": " + strerror(errno));
  if (flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    return Status::Busy("WAL directory " + opt.dir + " is open in another Wal or process");
  }
  int rc = mdb_env_create(&env);
  if (rc != 0) return LmdbError(rc, "mdb_env_create");
  if ((rc = mdb_env_set_maxdbs(env, format::kMaxDbs)) != 0) return LmdbError(rc, "set_maxdbs");
  if ((rc = mdb_env_set_mapsize(env, RoundUpToPage(opt.initial_map_bytes))) != 0) {
    return LmdbError(rc, "mdb_env_set_mapsize");
  }
  unsigned flags = MDB_NOTLS;
  if (opt.durability != Durability::kSyncEveryCommit) flags |= MDB_NOSYNC;
  if ((rc = mdb_env_open(env, opt.dir.c_str(), flags, 0644)) != 0) {
    return LmdbError(rc, "mdb_env_open " + opt.dir);
  }
  int dead = 0;
  mdb_reader_check(env, &dead);  // clear reader slots of killed processes
  MDB_envinfo info;
  mdb_env_info(env, &info);
  map_bytes = info.me_mapsize;
  if (map_bytes > opt.max_map_bytes) opt.max_map_bytes = map_bytes;  // the file is already larger

  MDB_txn* txn = nullptr;
  if ((rc = mdb_txn_begin(env, nullptr, 0, &txn)) != 0) return LmdbError(rc, "mdb_txn_begin");
  auto fail = [&](int code, const char* what) {
    mdb_txn_abort(txn);
    return LmdbError(code, what);
  };
  if ((rc = mdb_dbi_open(txn, format::kTrajDbName, MDB_CREATE, &traj_dbi)) != 0) {
    return fail(rc, "open traj db");
  }
  if ((rc = mdb_dbi_open(txn, format::kGroupDbName, MDB_CREATE, &group_dbi)) != 0) {
    return fail(rc, "open groups db");
  }
  if ((rc = mdb_dbi_open(txn, format::kMetaDbName, MDB_CREATE, &meta_dbi)) != 0) {
    return fail(rc, "open meta db");
  }
  if ((rc = mdb_dbi_open(txn, format::kRequestDbName, MDB_CREATE, &request_dbi)) != 0) {
    return fail(rc, "open requests db");
  }
  const std::string_view vkey = format::kMetaVersionKey;
  MDB_val k = Val(vkey.data(), vkey.size()), v;
  rc = mdb_get(txn, meta_dbi, &k, &v);
  uint32_t ver = 0;
  if (rc == MDB_NOTFOUND) {
    ver = 0;  // a new environment
  } else if (rc != 0) {
    return fail(rc, "read format version");
  } else {
    const auto* p = static_cast<const uint8_t*>(v.mv_data);
    for (size_t i = 0; i < std::min<size_t>(v.mv_size, 4); ++i) ver |= uint32_t{p[i]} << (8 * i);
    if (v.mv_size != 4 || ver < format::kOldestReadableVersion || ver > format::kFormatVersion) {
      mdb_txn_abort(txn);
      return Status::Unsupported("WAL in " + opt.dir + " has format version " +
                                 std::to_string(ver) + "; this build reads versions " +
                                 std::to_string(format::kOldestReadableVersion) + " to " +
                                 std::to_string(format::kFormatVersion));
    }
  }
  if (ver != format::kFormatVersion) {  // new, or an older version upgraded in place
    uint8_t bytes[4];
    for (int i = 0; i < 4; ++i) bytes[i] = static_cast<uint8_t>(format::kFormatVersion >> (8 * i));
    v = Val(bytes, 4);
    if ((rc = mdb_put(txn, meta_dbi, &k, &v, 0)) != 0) return fail(rc, "write format version");
  }
  if ((rc = mdb_txn_commit(txn)) != 0) return LmdbError(rc, "commit WAL metadata");
  if (opt.durability != Durability::kSyncEveryCommit && (rc = mdb_env_sync(env, 1)) != 0) {
    return LmdbError(rc, "mdb_env_sync");
  }
  return Status::Ok();
}

Status Wal::Impl::SetSticky(const Status& s) {
  std::lock_guard<std::mutex> l(mu);
  if (sticky.ok()) sticky = s;
  (void)TakeBuffer();  // never written; never reported durable
  return sticky;
}

Status Wal::Impl::CheckAppendable(uint64_t traj, TrajState** state) {
  if (!sticky.ok()) return sticky;
  if (!recovered) return Status::FailedPrecondition("Wal::Recover() must run before appending");
  auto it = trajs.find(traj);
  if (it == trajs.end()) {
    return Status::FailedPrecondition("trajectory " + std::to_string(traj) + " has no header");
  }
  if (it->second.quarantined) {
    return Status::FailedPrecondition("trajectory " + std::to_string(traj) + " is quarantined");
  }
  if (it->second.finished) {
    return Status::FailedPrecondition("trajectory " + std::to_string(traj) + " is finished");
  }
  *state = &it->second;
  return Status::Ok();
}

uint64_t Wal::Impl::Push(Op op) {
  op.lsn = ++last_lsn;
  buffer.push_back(std::move(op));
  if (++buffered_puts >= static_cast<size_t>(opt.commit_max_records)) cv.notify_one();
  return last_lsn;
}

void Wal::Impl::PushDelete(Op op) {
  // A delete gets an LSN like a put: LastLsn() then moves, so a caller that commits when
  // LastLsn() changed (the coordinator) also commits acknowledgements and discards.
  op.lsn = ++last_lsn;
  buffer.push_back(std::move(op));
}

void Wal::Impl::ExpireRetained() {
  const uint64_t now = internal::UnixMs();
  while (!retained.empty() && retained.begin()->first <= now) {
    const uint64_t id = retained.begin()->second;
    retained.erase(retained.begin());
    auto it = trajs.find(id);
    if (it == trajs.end() || !it->second.acked) continue;  // discarded, or the id was reused
    EraseTrajectory(it);
  }
}

void Wal::Impl::EraseTrajectory(std::unordered_map<uint64_t, TrajState>::iterator it) {
  const uint64_t id = it->first;
  const std::string digest = std::move(it->second.request_digest);
  trajs.erase(it);
  unsynced_trajs.erase(id);
  PushDelete(MakeOp(Op::kDelTraj, id, 0));
  if (digest.empty()) return;
  auto r = request_refs.find(digest);
  if (r != request_refs.end() && --r->second == 0) {
    request_refs.erase(r);
    Op del = MakeOp(Op::kDelRequest, 0, 0);
    del.digest = digest;
    PushDelete(std::move(del));
  }
}

std::vector<Op> Wal::Impl::TakeBuffer() {
  std::vector<Op> batch;
  batch.swap(buffer);
  buffered_puts = 0;
  for (uint64_t id : open_token_trajs) {
    auto it = trajs.find(id);
    if (it != trajs.end()) it->second.open_tokens_op = -1;
  }
  open_token_trajs.clear();
  return batch;
}

int Wal::Impl::ApplyOps(MDB_txn* txn, const std::vector<Op>& batch) {
  uint8_t key[format::kTrajKeySize];
  for (const Op& op : batch) {
    int rc = 0;
    switch (op.kind) {
      case Op::kPutTraj: {
        format::EncodeTrajKey(op.id, op.seq, key);
        MDB_val k = Val(key, sizeof(key)), v = Val(op.value.data(), op.value.size());
        rc = mdb_put(txn, traj_dbi, &k, &v, 0);
        break;
      }
      case Op::kPutGroup:
      case Op::kDelGroup: {
        format::PutBigEndian64(op.id, key);
        MDB_val k = Val(key, format::kGroupKeySize), v = Val(op.value.data(), op.value.size());
        rc = op.kind == Op::kPutGroup ? mdb_put(txn, group_dbi, &k, &v, 0)
                                      : mdb_del(txn, group_dbi, &k, nullptr);
        if (rc == MDB_NOTFOUND) rc = 0;  // deleted before it was ever committed
        break;
      }
      case Op::kPutRequest:
      case Op::kDelRequest: {
        MDB_val k = Val(op.digest.data(), op.digest.size());
        MDB_val v = Val(op.value.data(), op.value.size());
        rc = op.kind == Op::kPutRequest ? mdb_put(txn, request_dbi, &k, &v, 0)
                                        : mdb_del(txn, request_dbi, &k, nullptr);
        if (rc == MDB_NOTFOUND) rc = 0;  // deleted before it was ever committed
        break;
      }
      case Op::kDelTraj: {
        MDB_cursor* cur = nullptr;
        if ((rc = mdb_cursor_open(txn, traj_dbi, &cur)) != 0) break;
        for (;;) {  // re-seek after each delete: simple and robust at page boundaries
          format::EncodeTrajKey(op.id, 0, key);
          MDB_val k = Val(key, sizeof(key)), v;
          rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
          if (rc == MDB_NOTFOUND) {
            rc = 0;
            break;
          }
          if (rc != 0) break;
          if (k.mv_size != format::kTrajKeySize ||
              format::GetBigEndian64(static_cast<const uint8_t*>(k.mv_data)) != op.id) {
            break;
          }
          if ((rc = mdb_cursor_del(cur, 0)) != 0) break;
        }
        mdb_cursor_close(cur);
        break;
      }
    }
    if (rc != 0) return rc;
  }
  return 0;
}

Status Wal::Impl::GrowMap() {
  if (map_bytes >= opt.max_map_bytes) {
    return Status::NoSpace("WAL map is full: " + std::to_string(map_bytes) +
                           " bytes in use and max_map_bytes is " +
                           std::to_string(opt.max_map_bytes) + " (" + opt.dir +
                           "); acknowledge finished trajectories or raise max_map_bytes");
  }
  const uint64_t next = std::min(opt.max_map_bytes, RoundUpToPage(map_bytes * 2));
  std::unique_lock<std::shared_mutex> l(env_mu);  // no transaction may be active
  const int rc = mdb_env_set_mapsize(env, next);
  if (rc != 0) return LmdbError(rc, "mdb_env_set_mapsize(" + std::to_string(next) + ")");
  MDB_envinfo info;
  mdb_env_info(env, &info);
  std::lock_guard<std::mutex> m(mu);
  map_bytes = info.me_mapsize;
  st.map_grows++;
  return Status::Ok();
}

Status Wal::Impl::WriteBatch(const std::vector<Op>& batch) {
  for (;;) {
    {
      std::shared_lock<std::shared_mutex> l(env_mu);
      MDB_txn* txn = nullptr;
      int rc = mdb_txn_begin(env, nullptr, 0, &txn);
      if (rc != 0) return LmdbError(rc, "mdb_txn_begin");
      rc = ApplyOps(txn, batch);
      if (rc != 0) {
        mdb_txn_abort(txn);
        if (rc != MDB_MAP_FULL) return LmdbWriteError(rc, "WAL write", opt.dir);
      } else {
        if (opt.fault_hook) {
          Status s = opt.fault_hook(IoOp::kWrite);
          if (!s.ok()) {
            mdb_txn_abort(txn);
            return s;
          }
        }
        rc = mdb_txn_commit(txn);  // frees txn whatever the result
        if (rc == 0) return Status::Ok();
        if (rc != MDB_MAP_FULL) return LmdbWriteError(rc, "mdb_txn_commit", opt.dir);
      }
    }
    BR_RETURN_IF_ERROR(GrowMap());  // MDB_MAP_FULL: grow and retry the whole transaction
  }
}

Status Wal::Impl::Sync() {
  if (opt.fault_hook) BR_RETURN_IF_ERROR(opt.fault_hook(IoOp::kSync));
  const int rc = mdb_env_sync(env, 1);
  if (rc != 0) return LmdbWriteError(rc, "mdb_env_sync", opt.dir);
  return Status::Ok();
}

Status Wal::Impl::CommitLocked(bool force_sync) {
  std::vector<Op> batch;
  {
    std::lock_guard<std::mutex> l(mu);
    if (!sticky.ok()) return sticky;
    ExpireRetained();
    batch = TakeBuffer();
  }
  if (!batch.empty()) {
    for (Op& op : batch) {  // encode coalesced token records, outside the lock
      if (!op.lazy_tokens) continue;
      op.value = internal::EncodeTokens(op.first_token, op.ids, op.logprobs, op.weight_version);
    }
    Status s = WriteBatch(batch);
    if (!s.ok()) return SetSticky(s);
    std::lock_guard<std::mutex> l(mu);
    st.commits++;
    for (const Op& op : batch) {
      if (op.lsn != 0) committed_lsn = std::max(committed_lsn, op.lsn);
      if (op.kind != Op::kPutTraj && op.kind != Op::kPutGroup && op.kind != Op::kPutRequest) {
        continue;
      }
      const uint64_t key_bytes = op.kind == Op::kPutTraj    ? format::kTrajKeySize
                                 : op.kind == Op::kPutGroup ? format::kGroupKeySize
                                                            : op.digest.size();
      const uint64_t bytes = op.value.size() + key_bytes;
      st.records_written++;
      st.bytes_written += bytes;
      if (op.kind != Op::kPutTraj) continue;
      auto it = trajs.find(op.id);
      if (it == trajs.end()) continue;  // acknowledged since
      it->second.bytes += bytes;
      it->second.committed_next = std::max(it->second.committed_next, op.seq + 1);
      unsynced_trajs.insert(op.id);
    }
  }
  bool sync = false;
  {
    std::lock_guard<std::mutex> l(mu);
    if (committed_lsn == durable_lsn && unsynced_trajs.empty()) return Status::Ok();
    switch (opt.durability) {
      case Durability::kSyncEveryCommit:  // mdb_txn_commit already synced
      case Durability::kNone:
        break;
      case Durability::kWindow:
        sync =
            force_sync || Clock::now() - last_sync >= std::chrono::milliseconds(opt.sync_window_ms);
        if (!sync) return Status::Ok();
        break;
    }
  }
  if (opt.durability == Durability::kSyncEveryCommit && opt.fault_hook) {
    Status s = opt.fault_hook(IoOp::kSync);
    if (!s.ok()) return SetSticky(s);
  }
  if (sync) {
    Status s = Sync();
    if (!s.ok()) return SetSticky(s);
  }
  uint64_t durable = 0;
  {
    std::lock_guard<std::mutex> l(mu);
    if (opt.durability != Durability::kNone) st.syncs++;
    last_sync = Clock::now();
    durable_lsn = committed_lsn;
    for (uint64_t id : unsynced_trajs) {
      auto it = trajs.find(id);
      if (it != trajs.end()) it->second.durable_next = it->second.committed_next;
    }
    unsynced_trajs.clear();
    durable = durable_lsn;
  }
  if (opt.on_durable) opt.on_durable(durable);
  return Status::Ok();
}

void Wal::Impl::CommitterLoop() {
  const auto interval = std::chrono::milliseconds(std::max(1, opt.commit_interval_ms));
  for (;;) {
    {
      std::unique_lock<std::mutex> l(mu);
      cv.wait_for(l, interval, [&] {
        return stop || buffered_puts >= static_cast<size_t>(opt.commit_max_records);
      });
      if (stop) return;
    }
    std::lock_guard<std::mutex> c(commit_mu);
    (void)CommitLocked(false);  // a failure is sticky and reported by every later call
  }
}

// ---- Wal ----

Wal::Wal(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<Wal>> Wal::Open(const WalOptions& options) {
  if (options.dir.empty()) return Status::InvalidArgument("WalOptions::dir is empty");
  if (options.initial_map_bytes < (64u << 10)) {
    return Status::InvalidArgument("WalOptions::initial_map_bytes must be at least 64 KiB");
  }
  if (options.ack_retention_ms < 0) {
    return Status::InvalidArgument("WalOptions::ack_retention_ms < 0");
  }
  if (options.max_map_bytes < options.initial_map_bytes) {
    return Status::InvalidArgument("WalOptions::max_map_bytes < initial_map_bytes");
  }
  if (options.commit_interval_ms < 1 || options.commit_max_records < 1 ||
      options.sync_window_ms < 0 || options.max_coalesced_tokens < 1) {
    return Status::InvalidArgument(
        "WalOptions: commit_interval_ms, commit_max_records and max_coalesced_tokens must be >= 1, "
        "sync_window_ms >= 0");
  }
  auto impl = std::make_unique<Impl>();
  impl->opt = options;
  impl->opt.max_map_bytes = RoundUpToPage(options.max_map_bytes);
  BR_RETURN_IF_ERROR(impl->OpenEnv().WithContext("Wal::Open"));
  Impl* raw = impl.get();
  if (options.background_commit) raw->committer = std::thread([raw] { raw->CommitterLoop(); });
  return std::unique_ptr<Wal>(new Wal(std::move(impl)));
}

Wal::~Wal() {
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  if (impl_->committer.joinable()) impl_->committer.join();
  (void)Flush();
}

Status Wal::AppendHeader(uint64_t traj, const TrajectoryHeader& header) {
  Impl& w = *impl_;
  // A long request (a group's prompts) is stored once as a blob shared by every header naming it.
  std::string digest;
  if (header.request.size() >= format::kBlobMinRequestBytes) {
    digest = internal::RequestDigest(header.request);
  }
  std::string value = internal::EncodeHeader(header, digest);
  std::lock_guard<std::mutex> l(w.mu);
  if (!w.sticky.ok()) return w.sticky;
  if (!w.recovered) return Status::FailedPrecondition("Wal::Recover() must run before appending");
  if (w.trajs.count(traj) != 0) {
    return Status::InvalidArgument("trajectory " + std::to_string(traj) + " already exists");
  }
  if (!digest.empty() && w.request_refs[digest]++ == 0) {
    Op put = MakeOp(Op::kPutRequest, 0, 0, internal::EncodeRequestBlob(digest, header.request));
    put.digest = digest;
    w.Push(std::move(put));
  }
  TrajState& s = w.trajs[traj];
  s.next_seq = 1;
  s.request_digest = std::move(digest);
  w.Push(MakeOp(Op::kPutTraj, traj, 0, std::move(value)));
  return Status::Ok();
}

Status Wal::AppendTokens(uint64_t traj, std::span<const int32_t> ids,
                         std::span<const float> logprobs, uint64_t weight_version) {
  if (ids.empty() || ids.size() != logprobs.size()) {
    return Status::InvalidArgument("AppendTokens: " + std::to_string(ids.size()) + " ids and " +
                                   std::to_string(logprobs.size()) + " logprobs");
  }
  Impl& w = *impl_;
  std::lock_guard<std::mutex> l(w.mu);
  TrajState* s = nullptr;
  BR_RETURN_IF_ERROR(w.CheckAppendable(traj, &s));
  if (uint64_t{s->tokens} + ids.size() > UINT32_MAX) {
    return Status::OutOfRange("trajectory " + std::to_string(traj) + " exceeds 2^32 tokens");
  }
  const uint32_t first = s->tokens;
  s->tokens += static_cast<uint32_t>(ids.size());
  w.st.tokens_appended += ids.size();
  if (s->open_tokens_op >= 0) {  // coalesce into this trajectory's last, still buffered record
    Op& open = w.buffer[static_cast<size_t>(s->open_tokens_op)];
    if (open.seq + 1 == s->next_seq && open.weight_version == weight_version &&
        open.ids.size() + ids.size() <= static_cast<size_t>(w.opt.max_coalesced_tokens)) {
      open.ids.insert(open.ids.end(), ids.begin(), ids.end());
      open.logprobs.insert(open.logprobs.end(), logprobs.begin(), logprobs.end());
      open.lsn = ++w.last_lsn;
      return Status::Ok();
    }
  }
  Op op = MakeOp(Op::kPutTraj, traj, s->next_seq++);
  op.lazy_tokens = true;
  op.first_token = first;
  op.weight_version = weight_version;
  op.ids.assign(ids.begin(), ids.end());
  op.logprobs.assign(logprobs.begin(), logprobs.end());
  if (w.opt.max_coalesced_tokens > 1) {
    if (s->open_tokens_op < 0) w.open_token_trajs.push_back(traj);
    s->open_tokens_op = static_cast<int64_t>(w.buffer.size());
  }
  w.Push(std::move(op));
  return Status::Ok();
}

Status Wal::AppendTurnBoundary(uint64_t traj, const TurnBoundary& b) {
  Impl& w = *impl_;
  std::lock_guard<std::mutex> l(w.mu);
  TrajState* s = nullptr;
  BR_RETURN_IF_ERROR(w.CheckAppendable(traj, &s));
  if (uint64_t{s->tokens} + b.injected_tokens.size() > UINT32_MAX) {
    return Status::OutOfRange("trajectory " + std::to_string(traj) + " exceeds 2^32 tokens");
  }
  TurnBoundary copy = b;
  copy.token_index = s->tokens;
  s->tokens += static_cast<uint32_t>(b.injected_tokens.size());
  w.st.tokens_appended += b.injected_tokens.size();
  w.Push(MakeOp(Op::kPutTraj, traj, s->next_seq++, internal::EncodeTurnBoundary(copy)));
  return Status::Ok();
}

Status Wal::AppendToolCall(uint64_t traj, const ToolCall& call) {
  Impl& w = *impl_;
  std::lock_guard<std::mutex> l(w.mu);
  TrajState* s = nullptr;
  BR_RETURN_IF_ERROR(w.CheckAppendable(traj, &s));
  if (!s->calls.emplace(call.call_index, false).second) {
    return Status::InvalidArgument("trajectory " + std::to_string(traj) + ": tool call " +
                                   std::to_string(call.call_index) + " already logged");
  }
  ToolCall copy = call;
  copy.token_index = s->tokens;
  w.Push(MakeOp(Op::kPutTraj, traj, s->next_seq++, internal::EncodeToolCall(copy)));
  return Status::Ok();
}

Status Wal::AppendToolResult(uint64_t traj, const ToolResult& result) {
  Impl& w = *impl_;
  std::lock_guard<std::mutex> l(w.mu);
  TrajState* s = nullptr;
  BR_RETURN_IF_ERROR(w.CheckAppendable(traj, &s));
  auto it = s->calls.find(result.call_index);
  if (it == s->calls.end() || it->second) {
    return Status::InvalidArgument("trajectory " + std::to_string(traj) + ": tool call " +
                                   std::to_string(result.call_index) +
                                   (it == s->calls.end() ? " was never logged" : " has a result"));
  }
  it->second = true;
  w.Push(MakeOp(Op::kPutTraj, traj, s->next_seq++, internal::EncodeToolResult(result)));
  return Status::Ok();
}

Status Wal::AppendFinish(uint64_t traj, FinishReason reason, std::string_view error,
                         const RoutingRecord* routing) {
  Impl& w = *impl_;
  std::lock_guard<std::mutex> l(w.mu);
  TrajState* s = nullptr;
  BR_RETURN_IF_ERROR(w.CheckAppendable(traj, &s));
  s->finished = true;
  w.Push(MakeOp(Op::kPutTraj, traj, s->next_seq++, internal::EncodeFinish(reason, error, routing)));
  return Status::Ok();
}

Status Wal::AppendGroup(uint64_t group_id, std::string_view request) {
  Impl& w = *impl_;
  std::string value = internal::EncodeGroup(group_id, request);
  std::lock_guard<std::mutex> l(w.mu);
  if (!w.sticky.ok()) return w.sticky;
  if (!w.recovered) return Status::FailedPrecondition("Wal::Recover() must run before appending");
  if (!w.groups.insert(group_id).second) {
    return Status::InvalidArgument("group " + std::to_string(group_id) + " is already pending");
  }
  w.Push(MakeOp(Op::kPutGroup, group_id, 0, std::move(value)));
  return Status::Ok();
}

Status Wal::AcknowledgeGroup(uint64_t group_id) {
  Impl& w = *impl_;
  std::lock_guard<std::mutex> l(w.mu);
  if (!w.sticky.ok()) return w.sticky;
  if (w.groups.erase(group_id) == 0) {
    return Status::NotFound("group " + std::to_string(group_id) + " is not pending");
  }
  w.PushDelete(MakeOp(Op::kDelGroup, group_id, 0));
  return Status::Ok();
}

Status Wal::Acknowledge(uint64_t traj) {
  Impl& w = *impl_;
  std::lock_guard<std::mutex> l(w.mu);
  if (!w.sticky.ok()) return w.sticky;
  auto it = w.trajs.find(traj);
  if (it == w.trajs.end()) {
    return Status::NotFound("trajectory " + std::to_string(traj) + " is not in the WAL");
  }
  if (!it->second.finished || it->second.acked) {
    return Status::FailedPrecondition("trajectory " + std::to_string(traj) + " is " +
                                      (it->second.acked ? "already acknowledged" : "not finished"));
  }
  if (w.opt.ack_retention_ms > 0) {
    const uint64_t now = internal::UnixMs();
    it->second.acked = true;
    w.retained.emplace(now + static_cast<uint64_t>(w.opt.ack_retention_ms), traj);
    w.Push(MakeOp(Op::kPutTraj, traj, it->second.next_seq++, internal::EncodeAcked(now)));
    return Status::Ok();
  }
  w.EraseTrajectory(it);
  return Status::Ok();
}

Status Wal::Discard(uint64_t traj) {
  Impl& w = *impl_;
  std::lock_guard<std::mutex> l(w.mu);
  if (!w.sticky.ok()) return w.sticky;
  auto it = w.trajs.find(traj);
  if (it == w.trajs.end()) {
    return Status::NotFound("trajectory " + std::to_string(traj) + " is not in the WAL");
  }
  w.EraseTrajectory(it);
  return Status::Ok();
}

Status Wal::Commit() {
  std::lock_guard<std::mutex> c(impl_->commit_mu);
  return impl_->CommitLocked(false);
}

Status Wal::Flush() {
  std::lock_guard<std::mutex> c(impl_->commit_mu);
  return impl_->CommitLocked(true);
}

}  // namespace bitroll::wal
