// The WAL's read side: the recovery scan, ReadTrajectory() and the const queries.
#include <algorithm>
#include <optional>

#include "wal/record_codec.h"
#include "wal/wal.h"
#include "wal/wal_impl.h"

namespace bitroll::wal {

using internal::LmdbError;
using internal::Val;
using internal::View;
using Op = internal::Op;
using TrajState = internal::TrajState;
using Clock = internal::Clock;

Status Wal::Impl::ScanTrajectory(MDB_txn* txn, uint64_t traj, TrajectoryLog* out) const {
  MDB_cursor* cur = nullptr;
  int rc = mdb_cursor_open(txn, traj_dbi, &cur);
  if (rc != 0) return LmdbError(rc, "mdb_cursor_open");
  internal::TrajectoryDecoder dec(traj);
  uint8_t key[format::kTrajKeySize];
  format::EncodeTrajKey(traj, 0, key);
  MDB_val k = Val(key, sizeof(key)), v;
  Status s;
  for (rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE); rc == 0 && s.ok();
       rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    const auto* kp = static_cast<const uint8_t*>(k.mv_data);
    if (k.mv_size != format::kTrajKeySize || format::GetBigEndian64(kp) != traj) break;
    s = dec.Add(format::GetBigEndian64(kp + 8), View(v));
  }
  mdb_cursor_close(cur);
  if (!s.ok()) return s;
  if (rc != 0 && rc != MDB_NOTFOUND) return LmdbError(rc, "WAL read");
  if (dec.log().records == 0) {
    return Status::NotFound("trajectory " + std::to_string(traj) + " has no committed records");
  }
  std::string request;
  if (!dec.request_digest().empty()) {
    BR_ASSIGN_OR_RETURN(request, ReadRequestBlob(txn, traj, dec.request_digest()));
  }
  *out = dec.TakeLog();
  if (!request.empty()) out->header.request = std::move(request);
  return Status::Ok();
}

Result<std::string> Wal::Impl::ReadRequestBlob(MDB_txn* txn, uint64_t traj,
                                               const std::string& digest) const {
  MDB_val k = Val(digest.data(), digest.size()), v;
  const int rc = mdb_get(txn, request_dbi, &k, &v);
  if (rc == MDB_NOTFOUND) {
    return Status::Corruption(format::DescribeTrajKey(traj, 0) + ": its request blob " +
                              internal::HexDigest(digest) + " is missing");
  }
  if (rc != 0) return LmdbError(rc, "WAL read (request blob)");
  Result<std::string> r = internal::DecodeRequestBlob(digest, View(v));
  if (!r.ok()) return r.status().WithContext(format::DescribeTrajKey(traj, 0));
  return r;
}

Result<RecoveryResult> Wal::Recover() {
  Impl& w = *impl_;
  std::lock_guard<std::mutex> c(w.commit_mu);
  {
    std::lock_guard<std::mutex> l(w.mu);
    if (w.recovered) return Status::FailedPrecondition("Wal::Recover() already ran");
  }
  RecoveryResult out;
  std::shared_lock<std::shared_mutex> el(w.env_mu);
  MDB_txn* txn = nullptr;
  int rc = mdb_txn_begin(w.env, nullptr, MDB_RDONLY, &txn);
  if (rc != 0) return LmdbError(rc, "mdb_txn_begin(read)");
  MDB_cursor* cur = nullptr;
  if ((rc = mdb_cursor_open(txn, w.traj_dbi, &cur)) != 0) {
    mdb_txn_abort(txn);
    return LmdbError(rc, "mdb_cursor_open");
  }
  std::unordered_map<uint64_t, TrajState> states;
  std::multimap<uint64_t, uint64_t> retained;
  std::optional<internal::TrajectoryDecoder> dec;
  uint64_t cur_id = 0, last_seq = 0;
  bool bad = false;
  std::unordered_map<std::string, uint64_t> refs;
  auto finish_one = [&]() {
    if (!dec.has_value()) return;
    TrajState& s = states[cur_id];
    s.next_seq = s.committed_next = s.durable_next = last_seq + 1;
    if (!dec->request_digest().empty()) {  // the blob lives while any header names it
      s.request_digest = dec->request_digest();
      ++refs[s.request_digest];
    }
    std::string request;
    if (!bad && !s.request_digest.empty()) {
      Result<std::string> r = w.ReadRequestBlob(txn, cur_id, s.request_digest);
      if (r.ok()) {
        request = std::move(r).value();
      } else {
        bad = true;
        s.quarantined = true;
        out.quarantined.push_back({cur_id, 0, r.status()});
      }
    }
    if (!bad) {
      s.tokens = dec->length();
      TrajectoryLog log = dec->TakeLog();
      if (!request.empty()) log.header.request = std::move(request);
      s.finished = log.finish.has_value();
      s.bytes = log.bytes;
      for (const ToolCallLog& t : log.tool_calls) s.calls[t.call.call_index] = t.result.has_value();
      if (log.acked_unix_ms.has_value()) {
        s.acked = true;
        retained.emplace(*log.acked_unix_ms + static_cast<uint64_t>(w.opt.ack_retention_ms),
                         cur_id);
        out.retained.push_back(cur_id);
      } else {
        (s.finished ? out.finished : out.unfinished).push_back(std::move(log));
      }
    }
    dec.reset();
  };
  MDB_val k, v;
  for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
       rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    const auto* kp = static_cast<const uint8_t*>(k.mv_data);
    if (k.mv_size != format::kTrajKeySize) {
      out.quarantined.push_back(
          {0, 0,
           Status::Corruption("traj db holds a key of " + std::to_string(k.mv_size) + " bytes")});
      continue;
    }
    const uint64_t id = format::GetBigEndian64(kp), seq = format::GetBigEndian64(kp + 8);
    if (!dec.has_value() || id != cur_id) {
      finish_one();
      dec.emplace(id);
      cur_id = id;
      bad = false;
    }
    last_seq = seq;
    if (bad) continue;
    Status s = dec->Add(seq, View(v));
    if (!s.ok()) {
      bad = true;
      states[id].quarantined = true;
      out.quarantined.push_back({id, seq, s});
    }
  }
  finish_one();
  mdb_cursor_close(cur);
  if (rc != MDB_NOTFOUND) {
    mdb_txn_abort(txn);
    return LmdbError(rc, "WAL recovery scan");
  }
  std::set<uint64_t> groups;
  if ((rc = mdb_cursor_open(txn, w.group_dbi, &cur)) == 0) {
    for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
         rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
      if (k.mv_size != format::kGroupKeySize) continue;
      const uint64_t gid = format::GetBigEndian64(static_cast<const uint8_t*>(k.mv_data));
      groups.insert(gid);
      Result<PendingGroup> g = internal::DecodeGroup(gid, View(v));
      if (g.ok()) {
        out.groups.push_back(std::move(g).value());
      } else {
        out.quarantined_groups.push_back({gid, 0, g.status()});
      }
    }
    mdb_cursor_close(cur);
  }
  if (rc != MDB_NOTFOUND) {
    mdb_txn_abort(txn);
    return LmdbError(rc, "WAL recovery scan (groups)");
  }
  // Blobs no header names (their last trajectory's deletion was interrupted by nothing durable:
  // cannot happen within one commit, but a quarantined header may have named them) are deleted.
  std::vector<std::string> orphans;
  if ((rc = mdb_cursor_open(txn, w.request_dbi, &cur)) == 0) {
    for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
         rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
      std::string digest(View(k));
      if (refs.count(digest) == 0) orphans.push_back(std::move(digest));
    }
    mdb_cursor_close(cur);
  }
  mdb_txn_abort(txn);
  if (rc != MDB_NOTFOUND) return LmdbError(rc, "WAL recovery scan (requests)");

  std::lock_guard<std::mutex> l(w.mu);
  w.request_refs = std::move(refs);
  for (std::string& d : orphans) {
    Op del = internal::MakeOp(Op::kDelRequest, 0, 0);
    del.digest = std::move(d);
    w.PushDelete(std::move(del));
  }
  for (auto& [id, s] : states) w.trajs[id] = std::move(s);
  w.groups = std::move(groups);
  w.retained = std::move(retained);
  w.recovered = true;
  return out;
}

uint64_t Wal::LastLsn() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  return impl_->last_lsn;
}

uint64_t Wal::DurableLsn() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  return impl_->durable_lsn;
}

bool Wal::IsDurable(uint64_t traj, uint64_t seq) const {
  std::lock_guard<std::mutex> l(impl_->mu);
  auto it = impl_->trajs.find(traj);
  return it != impl_->trajs.end() && seq < it->second.durable_next;
}

bool Wal::IsTrajectoryDurable(uint64_t traj) const {
  std::lock_guard<std::mutex> l(impl_->mu);
  auto it = impl_->trajs.find(traj);
  return it != impl_->trajs.end() && it->second.durable_next == it->second.next_seq;
}

uint64_t Wal::NextSeq(uint64_t traj) const {
  std::lock_guard<std::mutex> l(impl_->mu);
  auto it = impl_->trajs.find(traj);
  return it == impl_->trajs.end() ? 0 : it->second.next_seq;
}

uint64_t Wal::TrajectoryBytes(uint64_t traj) const {
  std::lock_guard<std::mutex> l(impl_->mu);
  auto it = impl_->trajs.find(traj);
  return it == impl_->trajs.end() ? 0 : it->second.bytes;
}

Result<TrajectoryLog> Wal::ReadTrajectory(uint64_t traj) const {
  const Impl& w = *impl_;
  std::shared_lock<std::shared_mutex> el(w.env_mu);
  MDB_txn* txn = nullptr;
  int rc = mdb_txn_begin(w.env, nullptr, MDB_RDONLY, &txn);
  if (rc != 0) return LmdbError(rc, "mdb_txn_begin(read)");
  TrajectoryLog log;
  Status s = w.ScanTrajectory(txn, traj, &log);
  mdb_txn_abort(txn);
  if (!s.ok()) return s;
  return log;
}

Status Wal::status() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  return impl_->sticky;
}

WalStats Wal::stats() const {
  const Impl& w = *impl_;
  MDB_envinfo info;
  MDB_stat mst;
  {
    std::shared_lock<std::shared_mutex> el(w.env_mu);
    mdb_env_info(w.env, &info);
    mdb_env_stat(w.env, &mst);
  }
  std::lock_guard<std::mutex> l(w.mu);
  WalStats s = w.st;
  s.last_lsn = w.last_lsn;
  s.committed_lsn = w.committed_lsn;
  s.durable_lsn = w.durable_lsn;
  s.map_bytes = w.map_bytes;
  s.map_used_bytes = (info.me_last_pgno + 1) * uint64_t{mst.ms_psize};
  s.live_trajectories = w.trajs.size();
  s.bytes_per_token =
      s.tokens_appended ? static_cast<double>(s.bytes_written) / s.tokens_appended : 0.0;
  return s;
}

}  // namespace bitroll::wal
