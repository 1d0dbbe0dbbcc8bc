// Fault injection for wal/wal.h: a full map, a full disk (tmpfs), failed writes and syncs through
// the FaultHook seam, and corrupted bytes in one record. Every test asserts the exact outcome.
#include <gtest/gtest.h>
#include <lmdb.h>
#include <sys/mount.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "wal/crc32c.h"
#include "wal/wal.h"
#include "wal/wal_gtest_util.h"
#include "wal/wal_test_util.h"

namespace bitroll::wal {
namespace {

using testing::Dump;
using testing::OpenAndRecover;
using testing::SameBytes;
using testing::TempDir;
using testing::WriteTrajectory;

WalOptions Opts(const std::string& dir, Durability d = Durability::kSyncEveryCommit) {
  WalOptions o;
  o.dir = dir;
  o.durability = d;
  o.background_commit = false;
  o.max_coalesced_tokens = 1;  // one record per AppendTokens call: exact record counts
  return o;
}

void ExpectSameStatus(const Status& a, const Status& b) {
  EXPECT_EQ(a.code(), b.code());
  EXPECT_EQ(a.message(), b.message());
}

// After a sticky error every mutating call returns that exact error.
void ExpectSticky(Wal& w, const Status& err) {
  ASSERT_FALSE(err.ok());
  ExpectSameStatus(w.status(), err);
  ExpectSameStatus(w.AppendHeader(999999, testing::MakeHeader(999999)), err);
  ExpectSameStatus(w.AppendGroup(999999, "g"), err);
  ExpectSameStatus(w.Commit(), err);
  ExpectSameStatus(w.Flush(), err);
}

// Writes finished trajectories 0, 1, ... (one Flush each) until a Flush fails. Returns the error;
// *durable receives the expected logs of those whose finish record was reported durable.
Status FillUntilError(Wal& w, uint32_t tokens, std::vector<TrajectoryLog>* durable,
                      int max_trajs = 100000) {
  for (int t = 0; t < max_trajs; ++t) {
    TrajectoryLog e;
    Status s = WriteTrajectory(w, t, tokens, /*finish=*/true, &e);
    if (s.ok()) s = w.Flush();
    if (!s.ok()) {
      EXPECT_FALSE(w.IsDurable(t, e.token_ids.size() / 16 + 1)) << "failed record reported durable";
      return s;
    }
    EXPECT_TRUE(w.IsDurable(t, (tokens + 15) / 16 + 1));
    durable->push_back(std::move(e));
  }
  return Status::Ok();
}

void ExpectRecovered(const std::string& dir, const std::vector<TrajectoryLog>& durable) {
  RecoveryResult rr;
  auto w = OpenAndRecover(Opts(dir), &rr);
  ASSERT_NE(w, nullptr);
  EXPECT_TRUE(rr.quarantined.empty());
  ASSERT_GE(rr.finished.size(), durable.size());
  for (size_t i = 0; i < durable.size(); ++i) {
    ASSERT_EQ(rr.finished[i].id, durable[i].id);
    EXPECT_TRUE(SameBytes(Dump(rr.finished[i]), Dump(durable[i]))) << "traj " << durable[i].id;
  }
}

TEST(WalFault, MapFullWithoutGrowthIsStickyNoSpaceAndKeepsDurableRecords) {
  TempDir dir("walf_mapfull");
  std::vector<TrajectoryLog> durable;
  {
    WalOptions o = Opts(dir.path());
    o.initial_map_bytes = o.max_map_bytes = 256 << 10;  // growth disabled
    auto w = OpenAndRecover(o);
    Status err = FillUntilError(*w, 200, &durable);
    ASSERT_EQ(err.code(), ErrorCode::kNoSpace) << err.ToString();
    EXPECT_EQ(
        err.message().rfind("WAL map is full: 262144 bytes in use and max_map_bytes is 262144", 0),
        0u)
        << err.message();
    const uint64_t durable_lsn = w->DurableLsn();
    ExpectSticky(*w, err);
    EXPECT_EQ(w->DurableLsn(), durable_lsn);
    EXPECT_EQ(w->stats().map_grows, 0u);
    ASSERT_GT(durable.size(), 10u);
  }
  ExpectRecovered(dir.path(), durable);  // nothing committed before the error was harmed
}

TEST(WalFault, MapFullGrowsTheMapAndRetries) {
  TempDir dir("walf_grow");
  std::vector<TrajectoryLog> durable;
  {
    WalOptions o = Opts(dir.path(), Durability::kNone);
    o.initial_map_bytes = 64 << 10;
    o.max_map_bytes = 8 << 20;
    auto w = OpenAndRecover(o);
    Status err = FillUntilError(*w, 200, &durable, /*max_trajs=*/300);
    ASSERT_TRUE(err.ok()) << err.ToString();
    const WalStats st = w->stats();
    EXPECT_GE(st.map_grows, 4u);  // 64 KiB -> >= 1 MiB
    EXPECT_GT(st.map_bytes, uint64_t{1} << 20);
    EXPECT_LE(st.map_bytes, uint64_t{8} << 20);
    EXPECT_TRUE(w->status().ok());
  }
  ASSERT_EQ(durable.size(), 300u);
  ExpectRecovered(dir.path(), durable);
}

// A real full disk: a 1 MiB tmpfs. Needs CAP_SYS_ADMIN (root here); skipped loudly otherwise.
TEST(WalFault, FullDiskIsStickyNoSpaceAndKeepsDurableRecords) {
  TempDir dir("walf_tmpfs");
  const std::string mnt = dir.Sub("mnt");
  std::filesystem::create_directory(mnt);
  if (mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=1m") != 0) {
    GTEST_SKIP() << "cannot mount a 1 MiB tmpfs (" << std::strerror(errno)
                 << "): the full-disk path is not exercised on this machine";
  }
  struct Unmount {
    std::string p;
    ~Unmount() { umount2(p.c_str(), MNT_DETACH); }
  } unmount{mnt};
  const std::string wal_dir = mnt + "/wal";
  std::vector<TrajectoryLog> durable;
  {
    auto w = OpenAndRecover(Opts(wal_dir));  // 64 MiB map on a 1 MiB disk
    ASSERT_NE(w, nullptr);
    Status err = FillUntilError(*w, 200, &durable);
    ASSERT_EQ(err.code(), ErrorCode::kNoSpace) << err.ToString();
    EXPECT_NE(err.message().find("No space left on device"), std::string::npos) << err.message();
    ExpectSticky(*w, err);
    ASSERT_GT(durable.size(), 5u);
  }
  ExpectRecovered(wal_dir, durable);
}

TEST(WalFault, FailedWriteIsStickyAndNothingAfterItIsDurable) {
  TempDir dir("walf_write");
  int writes = 0;
  const Status injected = Status::IoError("injected write failure");
  TrajectoryLog expect;
  {
    WalOptions o = Opts(dir.path());
    o.fault_hook = [&](IoOp op) {
      if (op == IoOp::kWrite && ++writes == 3) return injected;
      return Status::Ok();
    };
    auto w = OpenAndRecover(o);
    expect.id = 1;
    expect.header = testing::MakeHeader(1);
    ASSERT_TRUE(w->AppendHeader(1, expect.header).ok());
    ASSERT_TRUE(testing::AppendTokenRange(*w, 1, 0, 32, 16, 1, &expect).ok());
    ASSERT_TRUE(w->Flush().ok());  // commit 1
    ASSERT_TRUE(testing::AppendTokenRange(*w, 1, 32, 48, 16, 1, &expect).ok());
    ASSERT_TRUE(w->Flush().ok());  // commit 2
    const uint64_t durable = w->DurableLsn();
    EXPECT_EQ(durable, 4u);
    ASSERT_TRUE(testing::AppendTokenRange(*w, 1, 48, 64, 16, 1, nullptr).ok());
    ASSERT_TRUE(w->AppendFinish(1, FinishReason::kNone, "").ok());
    ASSERT_TRUE(w->AppendHeader(2, testing::MakeHeader(2)).ok());
    ExpectSameStatus(w->Flush(), injected);  // commit 3 fails
    ExpectSticky(*w, injected);
    EXPECT_EQ(w->DurableLsn(), durable);
    EXPECT_TRUE(w->IsDurable(1, 3));
    EXPECT_FALSE(w->IsDurable(1, 4));
    EXPECT_FALSE(w->IsDurable(2, 0));
  }
  RecoveryResult rr;
  auto w = OpenAndRecover(Opts(dir.path()), &rr);
  ASSERT_EQ(rr.unfinished.size(), 1u);  // traj 1 without its failed tail; traj 2 never written
  EXPECT_TRUE(rr.finished.empty());
  EXPECT_TRUE(SameBytes(Dump(rr.unfinished[0]), Dump(expect)));
}

TEST(WalFault, FailedCommitSyncIsStickyAndNotReportedDurable) {
  TempDir dir("walf_sync");
  int syncs = 0;
  const Status injected = Status::IoError("injected fsync failure");
  WalOptions o = Opts(dir.path());
  o.fault_hook = [&](IoOp op) {
    if (op == IoOp::kSync && ++syncs == 2) return injected;
    return Status::Ok();
  };
  std::vector<uint64_t> reported;
  o.on_durable = [&](uint64_t lsn) { reported.push_back(lsn); };
  auto w = OpenAndRecover(o);
  ASSERT_TRUE(WriteTrajectory(*w, 1, 32, true, nullptr).ok());
  ASSERT_TRUE(w->Flush().ok());
  const uint64_t durable = w->DurableLsn();
  EXPECT_EQ(durable, 4u);
  ASSERT_TRUE(WriteTrajectory(*w, 2, 32, true, nullptr).ok());
  ExpectSameStatus(w->Flush(), injected);
  ExpectSticky(*w, injected);
  EXPECT_EQ(w->DurableLsn(), durable);
  EXPECT_FALSE(w->IsDurable(2, 0));
  EXPECT_EQ(reported, std::vector<uint64_t>{4});
}

TEST(WalFault, FailedWindowSyncIsStickyAndNothingCommittedSinceIsDurable) {
  TempDir dir("walf_window");
  const Status injected = Status::IoError("injected msync failure");
  bool fail = false;
  WalOptions o = Opts(dir.path(), Durability::kWindow);
  o.sync_window_ms = 3600 * 1000;
  o.fault_hook = [&](IoOp op) { return op == IoOp::kSync && fail ? injected : Status::Ok(); };
  auto w = OpenAndRecover(o);
  ASSERT_TRUE(WriteTrajectory(*w, 1, 32, true, nullptr).ok());
  ASSERT_TRUE(w->Flush().ok());
  EXPECT_EQ(w->DurableLsn(), 4u);
  ASSERT_TRUE(WriteTrajectory(*w, 2, 32, false, nullptr).ok());
  ASSERT_TRUE(w->Commit().ok());  // committed, inside the window
  ASSERT_TRUE(w->AppendFinish(2, FinishReason::kNone, "").ok());
  ASSERT_TRUE(w->Commit().ok());
  EXPECT_EQ(w->stats().committed_lsn, 8u);
  fail = true;
  ExpectSameStatus(w->Flush(), injected);
  ExpectSticky(*w, injected);
  EXPECT_EQ(w->DurableLsn(), 4u);
  EXPECT_FALSE(w->IsDurable(2, 0));
}

TEST(WalFault, BackgroundCommitFailureIsReportedByTheNextCall) {
  TempDir dir("walf_bg");
  const Status injected = Status::IoError("injected background write failure");
  WalOptions o = Opts(dir.path());
  o.background_commit = true;
  o.commit_interval_ms = 1;
  o.fault_hook = [&](IoOp op) { return op == IoOp::kWrite ? injected : Status::Ok(); };
  auto w = OpenAndRecover(o);
  ASSERT_TRUE(w->AppendHeader(1, testing::MakeHeader(1)).ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (w->status().ok() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ExpectSticky(*w, injected);
  EXPECT_EQ(w->DurableLsn(), 0u);
}

// Flips one byte of one stored value with a raw LMDB write.
void CorruptValue(const std::string& dir, uint64_t traj, uint64_t seq, size_t offset,
                  uint32_t* stored_crc, uint32_t* corrupt_crc) {
  MDB_env* env;
  ASSERT_EQ(mdb_env_create(&env), 0);
  mdb_env_set_maxdbs(env, format::kMaxDbs);
  ASSERT_EQ(mdb_env_open(env, dir.c_str(), 0, 0644), 0);
  MDB_txn* txn;
  MDB_dbi dbi;
  ASSERT_EQ(mdb_txn_begin(env, nullptr, 0, &txn), 0);
  ASSERT_EQ(mdb_dbi_open(txn, format::kTrajDbName, 0, &dbi), 0);
  uint8_t key[format::kTrajKeySize];
  format::EncodeTrajKey(traj, seq, key);
  MDB_val k{sizeof(key), key}, v;
  ASSERT_EQ(mdb_get(txn, dbi, &k, &v), 0);
  std::string value(static_cast<const char*>(v.mv_data), v.mv_size);
  ASSERT_LT(offset, value.size());
  std::memcpy(stored_crc, value.data(), 4);  // little-endian host
  value[offset] ^= 0x40;
  *corrupt_crc = crc32c::Value(value.data() + 4, value.size() - 4);
  MDB_val nv{value.size(), value.data()};
  ASSERT_EQ(mdb_put(txn, dbi, &k, &nv, 0), 0);
  ASSERT_EQ(mdb_txn_commit(txn), 0);
  mdb_env_close(env);
}

TEST(WalFault, CorruptRecordQuarantinesExactlyItsTrajectory) {
  TempDir dir("walf_corrupt");
  {
    auto w = OpenAndRecover(Opts(dir.path()));
    for (uint64_t t = 1; t <= 6; ++t)
      ASSERT_TRUE(WriteTrajectory(*w, t, 40, t % 2 == 0, nullptr).ok());
    ASSERT_TRUE(w->Flush().ok());
  }
  RecoveryResult clean;  // the control: before the flip everything recovers
  { auto w = OpenAndRecover(Opts(dir.path()), &clean); }
  ASSERT_TRUE(clean.quarantined.empty());
  ASSERT_EQ(clean.unfinished.size() + clean.finished.size(), 6u);

  uint32_t stored = 0, computed = 0;
  CorruptValue(dir.path(), 3, 2, 40, &stored, &computed);  // a byte inside the token payload
  char crcs[64];
  std::snprintf(crcs, sizeof(crcs), "checksum mismatch (stored %08x, computed %08x)", stored,
                computed);
  RecoveryResult rr;
  auto w = OpenAndRecover(Opts(dir.path()), &rr);
  ASSERT_EQ(rr.quarantined.size(), 1u);
  EXPECT_EQ(rr.quarantined[0].id, 3u);
  EXPECT_EQ(rr.quarantined[0].seq, 2u);
  EXPECT_EQ(rr.quarantined[0].error.code(), ErrorCode::kCorruption);
  EXPECT_EQ(rr.quarantined[0].error.message(),
            "traj=3 seq=2 key=00000000000000030000000000000002: " + std::string(crcs));
  // Everything else recovers bit for bit.
  auto all = [](const RecoveryResult& r) {
    std::vector<const TrajectoryLog*> v;
    for (auto& l : r.unfinished) v.push_back(&l);
    for (auto& l : r.finished) v.push_back(&l);
    return v;
  };
  std::vector<const TrajectoryLog*> before, after = all(rr);
  for (const TrajectoryLog* l : all(clean)) {
    if (l->id != 3) before.push_back(l);
  }
  ASSERT_EQ(after.size(), 5u);
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_TRUE(SameBytes(Dump(*after[i]), Dump(*before[i]))) << "traj " << after[i]->id;
  }
  // A quarantined trajectory takes no appends, and the reader names the same record.
  EXPECT_EQ(w->AppendFinish(3, FinishReason::kNone, "").code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(w->ReadTrajectory(3).status().message(), rr.quarantined[0].error.message());
  ASSERT_TRUE(w->Discard(3).ok());
  ASSERT_TRUE(w->Flush().ok());
  w.reset();
  RecoveryResult again;
  w = OpenAndRecover(Opts(dir.path()), &again);
  EXPECT_TRUE(again.quarantined.empty());
  EXPECT_EQ(again.unfinished.size() + again.finished.size(), 5u);
}

TEST(WalFault, CorruptCrcFieldIsDetectedToo) {
  TempDir dir("walf_crcbyte");
  {
    auto w = OpenAndRecover(Opts(dir.path()));
    ASSERT_TRUE(WriteTrajectory(*w, 8, 16, true, nullptr).ok());
    ASSERT_TRUE(w->Flush().ok());
  }
  uint32_t stored = 0, computed = 0;
  CorruptValue(dir.path(), 8, 0, 1, &stored, &computed);  // byte 1 of the stored CRC
  RecoveryResult rr;
  auto w = OpenAndRecover(Opts(dir.path()), &rr);
  ASSERT_EQ(rr.quarantined.size(), 1u);
  EXPECT_EQ(rr.quarantined[0].seq, 0u);
  EXPECT_NE(rr.quarantined[0].error.message().find("traj=8 seq=0 key="), std::string::npos);
  EXPECT_TRUE(rr.finished.empty());
}

}  // namespace
}  // namespace bitroll::wal
