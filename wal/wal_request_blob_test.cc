// Request blobs (format 2): a request shared by many trajectory headers (the samples of a GRPO
// group all carry the group's request) is stored once, in the "requests" database, and deleted
// with the last trajectory that names it. Recovery puts the exact bytes back into every header; a
// missing blob quarantines exactly the trajectories that name it; a format-1 directory opens and
// is upgraded.
#include <gtest/gtest.h>
#include <lmdb.h>

#include <map>
#include <string>

#include "wal/wal.h"
#include "wal/wal_gtest_util.h"
#include "wal/wal_test_util.h"

namespace bitroll::wal {
namespace {

using testing::MakeHeader;
using testing::RawDb;
using testing::TempDir;
using testing::WithRawTxn;

constexpr int kSamples = 64;

WalOptions Opts(const std::string& dir) {
  WalOptions o;
  o.dir = dir;
  o.durability = Durability::kNone;
  o.background_commit = false;
  return o;
}

std::unique_ptr<Wal> OpenAndRecover(const std::string& dir, RecoveryResult* rr = nullptr) {
  return testing::OpenAndRecover(Opts(dir), rr);
}

// A 20 KB request whose bytes depend on `group` (every byte value, NULs included).
std::string Request(int group) {
  std::string r(20000, '\0');
  for (size_t i = 0; i < r.size(); ++i) r[i] = static_cast<char>(testing::Mix(group * 7 + i));
  return r;
}

// Writes kSamples trajectories of `group` (ids group*1000 + j) sharing Request(group).
void WriteGroup(Wal& w, int group, bool finish) {
  for (int j = 0; j < kSamples; ++j) {
    const uint64_t id = static_cast<uint64_t>(group) * 1000 + j;
    TrajectoryHeader h = MakeHeader(id);
    h.request = Request(group);
    ASSERT_TRUE(w.AppendHeader(id, h).ok());
    const int32_t tok = 7;
    const float lp = -0.5f;
    ASSERT_TRUE(w.AppendTokens(id, {&tok, 1}, {&lp, 1}, 1).ok());
    if (finish) {
      ASSERT_TRUE(w.AppendFinish(id, FinishReason::kLength, "").ok());
    }
  }
}

// Number of entries in the requests database (the Wal must be closed).
size_t CountBlobs(const std::string& dir) {
  size_t n = 0;
  WithRawTxn(dir, false, [&](MDB_txn* txn, const RawDb& db) {
    MDB_stat st;
    mdb_stat(txn, db(format::kRequestDbName), &st);
    n = st.ms_entries;
  });
  return n;
}

TEST(WalRequestBlob, SharedRequestIsStoredOnceAndRecoveredExactly) {
  TempDir dir("walblob_once");
  uint64_t bytes = 0;
  {
    auto w = OpenAndRecover(dir.path());
    ASSERT_NE(w, nullptr);
    WriteGroup(*w, 1, false);
    WriteGroup(*w, 2, false);
    ASSERT_TRUE(w->Flush().ok());
    bytes = w->stats().bytes_written;
  }
  // Two 20 KB blobs plus 128 small headers and token records, not 128 copies (2.5 MB).
  EXPECT_LT(bytes, 2 * 20000 + 2 * kSamples * 400) << bytes;
  EXPECT_EQ(CountBlobs(dir.path()), 2u);
  RecoveryResult rr;
  auto w = OpenAndRecover(dir.path(), &rr);
  ASSERT_EQ(rr.unfinished.size(), size_t{2 * kSamples});
  EXPECT_TRUE(rr.quarantined.empty());
  for (const TrajectoryLog& t : rr.unfinished) {
    const std::string want = Request(static_cast<int>(t.id / 1000));
    ASSERT_EQ(t.header.request.size(), want.size());
    EXPECT_EQ(std::memcmp(t.header.request.data(), want.data(), want.size()), 0) << t.id;
    EXPECT_EQ(t.header.sampling.seed, MakeHeader(t.id).sampling.seed);
    auto read = w->ReadTrajectory(t.id);
    ASSERT_TRUE(read.ok()) << read.status().ToString();
    EXPECT_EQ(read->header.request, want);
  }
  // Negative control: the two groups' requests differ, so the check above can fail.
  EXPECT_NE(Request(1), Request(2));
}

TEST(WalRequestBlob, BlobIsDeletedWithTheLastTrajectoryNamingIt) {
  TempDir dir("walblob_gc");
  {
    auto w = OpenAndRecover(dir.path());
    WriteGroup(*w, 3, true);
    for (int j = 0; j + 1 < kSamples; ++j) ASSERT_TRUE(w->Acknowledge(3000 + j).ok());
    ASSERT_TRUE(w->Flush().ok());
  }
  EXPECT_EQ(CountBlobs(dir.path()), 1u) << "one trajectory still names the blob";
  {
    RecoveryResult rr;
    auto w = OpenAndRecover(dir.path(), &rr);  // the reference count is rebuilt by recovery
    ASSERT_EQ(rr.finished.size(), 1u);
    EXPECT_EQ(rr.finished[0].header.request, Request(3));
    ASSERT_TRUE(w->Acknowledge(3000 + kSamples - 1).ok());
    ASSERT_TRUE(w->Flush().ok());
  }
  EXPECT_EQ(CountBlobs(dir.path()), 0u);
}

TEST(WalRequestBlob, MissingBlobQuarantinesExactlyItsTrajectories) {
  TempDir dir("walblob_missing");
  {
    auto w = OpenAndRecover(dir.path());
    WriteGroup(*w, 4, false);
    WriteGroup(*w, 5, false);
    ASSERT_TRUE(w->AppendHeader(9, MakeHeader(9)).ok());  // a short request stays inline
    ASSERT_TRUE(w->Flush().ok());
  }
  int deleted = 0;
  WithRawTxn(dir.path(), true, [&](MDB_txn* txn, const RawDb& db) {  // behind the WAL's back
    MDB_cursor* cur = nullptr;
    ASSERT_EQ(mdb_cursor_open(txn, db(format::kRequestDbName), &cur), 0);
    MDB_val k, v;
    for (int rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
         rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
      const std::string_view val(static_cast<const char*>(v.mv_data), v.mv_size);
      if (val.find(Request(4).substr(0, 64)) != std::string_view::npos) {
        ASSERT_EQ(mdb_cursor_del(cur, 0), 0);
        ++deleted;
      }
    }
    mdb_cursor_close(cur);
  });
  ASSERT_EQ(deleted, 1) << "group 4's blob";
  RecoveryResult rr;
  auto w = OpenAndRecover(dir.path(), &rr);
  ASSERT_EQ(rr.quarantined.size(), size_t{kSamples});
  for (const QuarantinedTrajectory& q : rr.quarantined) {
    EXPECT_EQ(q.id / 1000, 4u);
    EXPECT_EQ(q.error.code(), ErrorCode::kCorruption);
    EXPECT_NE(q.error.message().find("request blob"), std::string::npos) << q.error.ToString();
    EXPECT_NE(q.error.message().find("missing"), std::string::npos) << q.error.ToString();
  }
  ASSERT_EQ(rr.unfinished.size(), size_t{kSamples + 1});
  std::map<uint64_t, std::string> got;
  for (const auto& t : rr.unfinished) got[t.id] = t.header.request;
  EXPECT_EQ(got[9], MakeHeader(9).request);
  EXPECT_EQ(got[5000], Request(5));
}

TEST(WalRequestBlob, FormatOneDirectoryOpensAndIsUpgraded) {
  TempDir dir("walblob_v1");
  {
    auto w = OpenAndRecover(dir.path());
    ASSERT_TRUE(w->AppendHeader(1, MakeHeader(1)).ok());
    ASSERT_TRUE(w->Flush().ok());
  }
  auto set_version = [&](uint32_t ver) {
    WithRawTxn(dir.path(), true, [&](MDB_txn* txn, const RawDb& db) {
      const std::string key = format::kMetaVersionKey;
      uint8_t bytes[4] = {static_cast<uint8_t>(ver), 0, 0, 0};
      MDB_val k{key.size(), const_cast<char*>(key.data())}, v{4, bytes};
      ASSERT_EQ(mdb_put(txn, db(format::kMetaDbName), &k, &v, 0), 0);
    });
  };
  set_version(1);
  {
    RecoveryResult rr;
    auto w = OpenAndRecover(dir.path(), &rr);
    ASSERT_NE(w, nullptr);
    ASSERT_EQ(rr.unfinished.size(), 1u);
    EXPECT_EQ(rr.unfinished[0].header.request, MakeHeader(1).request);
  }
  set_version(format::kFormatVersion + 1);  // negative control: a newer format is refused
  auto w = Wal::Open(Opts(dir.path()));
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), ErrorCode::kUnsupported);
}

}  // namespace
}  // namespace bitroll::wal
