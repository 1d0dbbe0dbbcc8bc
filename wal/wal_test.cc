// Tests for wal/wal.h: round trip of every record type, append rules, resume, durability
// tracking, group commit, compaction (bounded file) and groups.
#include "wal/wal.h"

#include <gtest/gtest.h>

#include <lmdb.h>
#include <bit>

#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>

#include "wal/wal_gtest_util.h"
#include "wal/wal_test_util.h"

namespace bitroll::wal {
namespace {

using testing::Dump;
using testing::MakeHeader;
using testing::OpenAndRecover;
using testing::SameBytes;
using testing::TempDir;
using testing::TokenId;
using testing::TokenLogprob;

WalOptions Opts(const std::string& dir, Durability d = Durability::kNone) {
  WalOptions o;
  o.dir = dir;
  o.durability = d;
  o.background_commit = false;
  o.max_coalesced_tokens = 1;  // one record per AppendTokens call: exact record counts
  return o;
}

void AppendTokenRange(Wal& w, uint64_t traj, uint32_t from, uint32_t to, uint32_t batch,
                      uint64_t wv, TrajectoryLog* expect) {
  ASSERT_TRUE(testing::AppendTokenRange(w, traj, from, to, batch, wv, expect).ok());
}

// A trajectory with every record type; `expect` is built from the inputs, not from the WAL.
void WriteRichTrajectory(Wal& w, uint64_t traj, bool finish, TrajectoryLog* expect) {
  expect->id = traj;
  expect->header = MakeHeader(traj);
  ASSERT_TRUE(w.AppendHeader(traj, expect->header).ok());
  AppendTokenRange(w, traj, 0, 37, 16, 3, expect);
  TurnBoundary tb;
  tb.turn_index = 0;
  tb.token_index = 9999;  // overwritten by the Wal
  tb.injected_tokens = {1, -2, 151935};
  ASSERT_TRUE(w.AppendTurnBoundary(traj, tb).ok());
  tb.token_index = 37;
  expect->turns.push_back(tb);
  ToolCall call;
  call.call_index = 0;
  call.tool_name = "python";
  call.tier = ToolTier::kContainer;
  call.input = std::string("print(1)\0\xfe", 10);
  ASSERT_TRUE(w.AppendToolCall(traj, call).ok());
  call.token_index = 40;  // a trajectory index: 37 sampled + 3 injected tokens before it
  ToolResult res;
  res.call_index = 0;
  res.exit_status = -9;
  res.stdout_bytes = std::string("1\n\0", 3);
  res.stderr_bytes = "killed";
  res.stdout_truncated = true;
  res.wall_seconds = 0.125;
  res.cpu_seconds = 1e-7;
  res.error_code = 9;
  res.error_message = "timeout";
  ASSERT_TRUE(w.AppendToolResult(traj, res).ok());
  expect->tool_calls.push_back({call, res});
  AppendTokenRange(w, traj, 37, 40, 16, 4, expect);  // a weight update mid-trajectory
  expect->spans.back().first_token = 40;             // sampled token 37 is trajectory token 40
  ToolCall open_call = call;
  open_call.call_index = 1;
  open_call.input = "unanswered";
  ASSERT_TRUE(w.AppendToolCall(traj, open_call).ok());
  open_call.token_index = 43;
  expect->tool_calls.push_back({open_call, std::nullopt});
  if (finish) {
    ASSERT_TRUE(w.AppendFinish(traj, FinishReason::kStop, "stop").ok());
    expect->finish = FinishRecord{FinishReason::kStop, "stop"};
  }
}

TEST(Wal, RoundTripsEveryRecordTypeBitExact) {
  TempDir dir("wal_rt");
  TrajectoryLog a, b;
  {
    auto w = OpenAndRecover(Opts(dir.path(), Durability::kSyncEveryCommit));
    ASSERT_NE(w, nullptr);
    WriteRichTrajectory(*w, 7, /*finish=*/true, &a);
    WriteRichTrajectory(*w, 1ull << 40, /*finish=*/false, &b);
    ASSERT_TRUE(w->Flush().ok());
    EXPECT_EQ(w->DurableLsn(), w->LastLsn());
  }
  RecoveryResult rr;
  auto w = OpenAndRecover(Opts(dir.path()), &rr);
  ASSERT_NE(w, nullptr);
  ASSERT_EQ(rr.finished.size(), 1u);
  ASSERT_EQ(rr.unfinished.size(), 1u);
  EXPECT_TRUE(rr.quarantined.empty());
  EXPECT_TRUE(SameBytes(Dump(rr.finished[0]), Dump(a)));
  EXPECT_TRUE(SameBytes(Dump(rr.unfinished[0]), Dump(b)));
  // Negative control: the comparison sees a single flipped logprob bit.
  TrajectoryLog c = a;
  uint32_t bits;
  std::memcpy(&bits, &c.logprobs[5], 4);
  bits ^= 1;
  std::memcpy(&c.logprobs[5], &bits, 4);
  EXPECT_FALSE(SameBytes(Dump(rr.finished[0]), Dump(c)));
  // Sequence numbers continue after recovery.
  EXPECT_EQ(w->NextSeq(1ull << 40), rr.unfinished[0].records);
  EXPECT_TRUE(w->IsDurable(7, rr.finished[0].records - 1));
  EXPECT_FALSE(w->IsDurable(7, rr.finished[0].records));
  EXPECT_EQ(w->TrajectoryBytes(7), rr.finished[0].bytes);
}

// The Finished record keeps a trajectory's routing record bit for bit (ids in one byte up to 256
// experts, two above); a trajectory without one reads back empty.
TEST(Wal, FinishedRecordKeepsTheRoutingRecord) {
  TempDir dir("wal_routing");
  std::vector<RoutingRecord> routes;
  for (int32_t experts : {8, 300}) {
    RoutingRecord r;
    r.n_layers = 3;
    r.k = 2;
    r.n_experts = experts;
    for (int i = 0; i < 5 * 6; ++i) {
      r.expert_ids.push_back(static_cast<uint16_t>((i * 7 + 1) % experts));
      r.weights.push_back(std::bit_cast<float>(0x3E800000u + uint32_t(i) * 977u));
    }
    routes.push_back(r);
  }
  {
    auto w = OpenAndRecover(Opts(dir.path(), Durability::kSyncEveryCommit));
    ASSERT_NE(w, nullptr);
    for (uint64_t traj : {1, 2, 3}) {
      TrajectoryLog expect;
      ASSERT_TRUE(w->AppendHeader(traj, MakeHeader(traj)).ok());
      AppendTokenRange(*w, traj, 0, 6, 4, 1, &expect);
      const RoutingRecord* r = traj < 3 ? &routes[traj - 1] : nullptr;
      ASSERT_TRUE(w->AppendFinish(traj, FinishReason::kLength, "", r).ok());
    }
    ASSERT_TRUE(w->Flush().ok());
  }
  RecoveryResult rr;
  auto w = OpenAndRecover(Opts(dir.path()), &rr);
  ASSERT_NE(w, nullptr);
  ASSERT_EQ(rr.finished.size(), 3u);
  for (const TrajectoryLog& t : rr.finished) {
    ASSERT_TRUE(t.finish.has_value());
    const RoutingRecord& got = t.finish->routing;
    if (t.id == 3) {
      EXPECT_TRUE(got.empty());
      continue;
    }
    const RoutingRecord& want = routes[t.id - 1];
    EXPECT_EQ(got.n_layers, want.n_layers);
    EXPECT_EQ(got.k, want.k);
    EXPECT_EQ(got.n_experts, want.n_experts);
    EXPECT_EQ(got.expert_ids, want.expert_ids);
    ASSERT_EQ(got.weights.size(), want.weights.size());
    EXPECT_EQ(std::memcmp(got.weights.data(), want.weights.data(), want.weights.size() * 4), 0);
  }
}

TEST(Wal, StatsCountExactlyTheBytesStoredInLmdb) {
  TempDir dir("wal_bytes");
  WalStats st;
  {
    auto w = OpenAndRecover(Opts(dir.path()));
    for (uint64_t t = 0; t < 8; ++t) {
      ASSERT_TRUE(w->AppendHeader(t, MakeHeader(t)).ok());
      AppendTokenRange(*w, t, 0, 200, 16, 1, nullptr);
      ASSERT_TRUE(w->AppendFinish(t, FinishReason::kNone, "").ok());
    }
    ASSERT_TRUE(w->Flush().ok());
    st = w->stats();
  }
  // Independent count: walk the traj database with raw LMDB.
  MDB_env* env;
  ASSERT_EQ(mdb_env_create(&env), 0);
  mdb_env_set_maxdbs(env, format::kMaxDbs);
  ASSERT_EQ(mdb_env_open(env, dir.path().c_str(), MDB_RDONLY, 0644), 0);
  MDB_txn* txn;
  MDB_dbi dbi;
  ASSERT_EQ(mdb_txn_begin(env, nullptr, MDB_RDONLY, &txn), 0);
  ASSERT_EQ(mdb_dbi_open(txn, format::kTrajDbName, 0, &dbi), 0);
  MDB_cursor* cur;
  ASSERT_EQ(mdb_cursor_open(txn, dbi, &cur), 0);
  MDB_val k, v;
  uint64_t bytes = 0, records = 0;
  while (mdb_cursor_get(cur, &k, &v, MDB_NEXT) == 0) {
    bytes += k.mv_size + v.mv_size;
    ++records;
  }
  mdb_cursor_close(cur);
  mdb_txn_abort(txn);
  mdb_env_close(env);
  EXPECT_EQ(records, 8u * (1 + 13 + 1));  // header + ceil(200/16) token batches + finish
  EXPECT_EQ(st.records_written, records);
  EXPECT_EQ(st.bytes_written, bytes);
  EXPECT_EQ(st.tokens_appended, 8u * 200);
  EXPECT_DOUBLE_EQ(st.bytes_per_token, static_cast<double>(bytes) / (8 * 200));
  std::printf("bytes per token (batch 16, 200 tokens, with header+finish): %.2f\n",
              st.bytes_per_token);
  EXPECT_GT(st.bytes_per_token, 8.0);   // an id and a logprob are 8 bytes
  EXPECT_LT(st.bytes_per_token, 24.0);  // batching keeps the overhead small
}

// A decode loop appends token by token; within one commit those become one record per
// trajectory, split by anything else appended to it, by a weight change and by the size cap.
TEST(Wal, CoalescesTokenAppendsWithinACommit) {
  TempDir dir("wal_coalesce"), ref("wal_coalesce_ref");
  auto write = [](Wal& w, bool flush_each) {
    ASSERT_TRUE(w.AppendHeader(1, MakeHeader(1)).ok());
    ASSERT_TRUE(w.AppendHeader(2, MakeHeader(2)).ok());
    for (uint32_t i = 0; i < 100; ++i) {  // interleaved like a batched decode step
      for (uint64_t t : {1, 2}) {
        ASSERT_TRUE(testing::AppendTokenRange(w, t, i, i + 1, 1, i < 60 ? 1 : 2, nullptr).ok());
      }
      if (flush_each) {
        ASSERT_TRUE(w.Flush().ok());
      }
    }
    ToolCall c;
    c.call_index = 0;
    ASSERT_TRUE(w.AppendToolCall(1, c).ok());
    ASSERT_TRUE(testing::AppendTokenRange(w, 1, 100, 110, 1, 2, nullptr).ok());
    ASSERT_TRUE(w.Flush().ok());
  };
  WalOptions o = Opts(dir.path());
  o.max_coalesced_tokens = 25;
  auto w = OpenAndRecover(o);
  write(*w, false);
  WalOptions ro = Opts(ref.path());  // one record per call
  auto r = OpenAndRecover(ro);
  write(*r, true);
  auto a = w->ReadTrajectory(1), b = r->ReadTrajectory(1);
  ASSERT_TRUE(a.ok() && b.ok());
  // Records: header, [0,25) [25,50) [50,60) wv1, [60,85) [85,100) wv2, tool call, [100,110).
  ASSERT_EQ(a->spans.size(), 6u);
  EXPECT_EQ(a->records, 8u);
  EXPECT_EQ(a->spans[2].first_token, 50u);
  EXPECT_EQ(a->spans[2].count, 10u);
  EXPECT_EQ(a->spans[3].weight_version, 2u);
  EXPECT_EQ(a->tool_calls[0].call.token_index, 100u);
  EXPECT_EQ(b->records, 112u);
  // Same tokens, same logprob bits, whatever the record boundaries.
  ASSERT_EQ(a->token_ids.size(), 110u);
  EXPECT_EQ(std::memcmp(a->token_ids.data(), b->token_ids.data(), 4 * 110), 0);
  EXPECT_EQ(std::memcmp(a->logprobs.data(), b->logprobs.data(), 4 * 110), 0);
  EXPECT_EQ(w->DurableLsn(), w->LastLsn());
  EXPECT_TRUE(w->IsDurable(1, 7));
  EXPECT_FALSE(w->IsDurable(1, 8));
  EXPECT_LT(w->stats().bytes_per_token, 20.0);
  EXPECT_GT(r->stats().bytes_per_token, 80.0);
  std::printf("bytes per token: coalesced %.2f, one record per token %.2f\n",
              w->stats().bytes_per_token, r->stats().bytes_per_token);
}

TEST(Wal, AppendRulesGiveTypedErrors) {
  TempDir dir("wal_rules");
  auto w0 = Wal::Open(Opts(dir.path()));
  ASSERT_TRUE(w0.ok());
  Wal& w = **w0;
  EXPECT_EQ(w.AppendHeader(1, MakeHeader(1)).code(), ErrorCode::kFailedPrecondition);
  ASSERT_TRUE(w.Recover().ok());
  EXPECT_EQ(w.Recover().status().code(), ErrorCode::kFailedPrecondition);
  const int32_t ids[2] = {1, 2};
  const float lps[2] = {-1.f, -2.f};
  EXPECT_EQ(w.AppendTokens(1, ids, lps, 0).code(), ErrorCode::kFailedPrecondition);  // no header
  ASSERT_TRUE(w.AppendHeader(1, MakeHeader(1)).ok());
  EXPECT_EQ(w.AppendHeader(1, MakeHeader(1)).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(w.AppendTokens(1, std::span(ids, 2), std::span(lps, 1), 0).code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(w.AppendTokens(1, {}, {}, 0).code(), ErrorCode::kInvalidArgument);
  ToolResult r;
  r.call_index = 3;
  EXPECT_EQ(w.AppendToolResult(1, r).code(), ErrorCode::kInvalidArgument);
  ToolCall c;
  c.call_index = 3;
  ASSERT_TRUE(w.AppendToolCall(1, c).ok());
  EXPECT_EQ(w.AppendToolCall(1, c).code(), ErrorCode::kInvalidArgument);
  ASSERT_TRUE(w.AppendToolResult(1, r).ok());
  EXPECT_EQ(w.AppendToolResult(1, r).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(w.Acknowledge(1).code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(w.Acknowledge(2).code(), ErrorCode::kNotFound);
  ASSERT_TRUE(w.AppendFinish(1, FinishReason::kNone, "").ok());
  EXPECT_EQ(w.AppendTokens(1, ids, lps, 0).code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(w.AppendFinish(1, FinishReason::kNone, "").code(), ErrorCode::kFailedPrecondition);
  EXPECT_TRUE(w.Acknowledge(1).ok());
  EXPECT_EQ(w.Acknowledge(1).code(), ErrorCode::kNotFound);
  EXPECT_TRUE(w.status().ok());
  // A second Wal on the same directory is refused while the first is open.
  auto again = Wal::Open(Opts(dir.path()));
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), ErrorCode::kBusy);
  WalOptions bad = Opts(dir.path());
  bad.max_map_bytes = bad.initial_map_bytes - 1;
  EXPECT_EQ(Wal::Open(bad).status().code(), ErrorCode::kInvalidArgument);
  bad = Opts("");
  EXPECT_EQ(Wal::Open(bad).status().code(), ErrorCode::kInvalidArgument);
}

TEST(Wal, ResumedTrajectoryContinuesAndEqualsUninterruptedRun) {
  TempDir dir("wal_resume"), ref("wal_resume_ref");
  TrajectoryLog expect;
  {
    auto w = OpenAndRecover(Opts(dir.path()));
    ASSERT_TRUE(w->AppendHeader(5, MakeHeader(5)).ok());
    AppendTokenRange(*w, 5, 0, 48, 16, 1, nullptr);
    ASSERT_TRUE(w->Flush().ok());
  }
  {
    RecoveryResult rr;
    auto w = OpenAndRecover(Opts(dir.path()), &rr);
    ASSERT_EQ(rr.unfinished.size(), 1u);
    ASSERT_EQ(rr.unfinished[0].token_ids.size(), 48u);
    AppendTokenRange(*w, 5, 48, 100, 16, 1, nullptr);
    ASSERT_TRUE(w->AppendFinish(5, FinishReason::kLength, "").ok());
    ASSERT_TRUE(w->Flush().ok());
  }
  {
    auto w = OpenAndRecover(Opts(ref.path()));
    ASSERT_TRUE(w->AppendHeader(5, MakeHeader(5)).ok());
    AppendTokenRange(*w, 5, 0, 48, 16, 1, nullptr);
    AppendTokenRange(*w, 5, 48, 100, 16, 1, nullptr);
    ASSERT_TRUE(w->AppendFinish(5, FinishReason::kLength, "").ok());
    ASSERT_TRUE(w->Flush().ok());
  }
  RecoveryResult r1, r2;
  auto w1 = OpenAndRecover(Opts(dir.path()), &r1);
  auto w2 = OpenAndRecover(Opts(ref.path()), &r2);
  ASSERT_EQ(r1.finished.size(), 1u);
  ASSERT_EQ(r2.finished.size(), 1u);
  EXPECT_EQ(r1.finished[0].token_ids.size(), 100u);
  EXPECT_TRUE(SameBytes(Dump(r1.finished[0]), Dump(r2.finished[0])));
  auto read = w1->ReadTrajectory(5);
  ASSERT_TRUE(read.ok());
  EXPECT_TRUE(SameBytes(Dump(*read), Dump(r1.finished[0])));
}

TEST(Wal, DurableLsnFollowsTheDurabilityMode) {
  for (Durability d : {Durability::kSyncEveryCommit, Durability::kWindow, Durability::kNone}) {
    SCOPED_TRACE(static_cast<int>(d));
    TempDir dir("wal_dur");
    WalOptions o = Opts(dir.path(), d);
    o.sync_window_ms = 3600 * 1000;  // kWindow: only Flush() syncs within this test
    std::vector<uint64_t> seen;
    o.on_durable = [&](uint64_t lsn) { seen.push_back(lsn); };
    auto w = OpenAndRecover(o);
    ASSERT_TRUE(w->AppendHeader(1, MakeHeader(1)).ok());
    EXPECT_EQ(w->LastLsn(), 1u);
    EXPECT_EQ(w->DurableLsn(), 0u);
    EXPECT_FALSE(w->IsDurable(1, 0));
    ASSERT_TRUE(w->Commit().ok());
    const uint64_t after_commit = d == Durability::kWindow ? 0 : 1;
    EXPECT_EQ(w->DurableLsn(), after_commit);
    EXPECT_EQ(w->IsDurable(1, 0), after_commit == 1);
    EXPECT_EQ(w->stats().committed_lsn, 1u);
    ASSERT_TRUE(w->AppendFinish(1, FinishReason::kNone, "").ok());
    EXPECT_FALSE(w->IsTrajectoryDurable(1));
    ASSERT_TRUE(w->Flush().ok());
    EXPECT_TRUE(w->IsTrajectoryDurable(1));
    EXPECT_FALSE(w->IsTrajectoryDurable(2));
    EXPECT_EQ(w->DurableLsn(), 2u);
    EXPECT_TRUE(w->IsDurable(1, 1));
    EXPECT_EQ(seen.back(), 2u);
    const WalStats st = w->stats();
    EXPECT_EQ(st.commits, 2u);
    EXPECT_EQ(st.syncs, d == Durability::kSyncEveryCommit ? 2u
                        : d == Durability::kWindow        ? 1u
                                                          : 0u);
  }
}

TEST(Wal, WindowModeSyncsOnceTheWindowHasPassed) {
  TempDir dir("wal_window");
  WalOptions o = Opts(dir.path(), Durability::kWindow);
  o.sync_window_ms = 500;  // long enough that a loaded machine cannot pass it by accident
  auto w = OpenAndRecover(o);
  ASSERT_TRUE(w->AppendHeader(1, MakeHeader(1)).ok());
  ASSERT_TRUE(w->Flush().ok());  // syncs now; the window restarts
  ASSERT_TRUE(w->AppendFinish(1, FinishReason::kNone, "").ok());
  ASSERT_TRUE(w->Commit().ok());
  EXPECT_EQ(w->DurableLsn(), 1u);  // committed, inside the window: not yet synced
  std::this_thread::sleep_for(std::chrono::milliseconds(510));
  ASSERT_TRUE(w->Commit().ok());  // nothing buffered, but the window passed: sync
  EXPECT_EQ(w->DurableLsn(), 2u);
}

TEST(Wal, BackgroundCommitterMakesAppendsDurable) {
  TempDir dir("wal_bg");
  WalOptions o = Opts(dir.path(), Durability::kSyncEveryCommit);
  o.background_commit = true;
  o.commit_interval_ms = 2;
  auto w = OpenAndRecover(o);
  for (uint64_t t = 0; t < 4; ++t) {
    ASSERT_TRUE(w->AppendHeader(t, MakeHeader(t)).ok());
    AppendTokenRange(*w, t, 0, 64, 8, 1, nullptr);
  }
  const uint64_t target = w->LastLsn();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (w->DurableLsn() < target && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(w->DurableLsn(), target);  // without calling Commit() or Flush()
  EXPECT_GE(w->stats().commits, 1u);
  auto log = w->ReadTrajectory(3);
  ASSERT_TRUE(log.ok());
  EXPECT_EQ(log->token_ids.size(), 64u);
}

// One writer thread plus readers, with the background committer growing a small map: readers see
// each trajectory's committed prefix, never a torn or shrinking one.
TEST(Wal, ReadersRunConcurrentlyWithTheWriterAndMapGrowth) {
  TempDir dir("wal_conc");
  WalOptions o = Opts(dir.path());
  o.background_commit = true;
  o.commit_interval_ms = 1;
  o.initial_map_bytes = 64 << 10;
  o.max_map_bytes = 64 << 20;
  auto w = OpenAndRecover(o);
  constexpr int kTrajs = 16, kTokens = 1024;
  std::atomic<bool> done{false};
  std::atomic<int> bad{0}, reads{0};
  auto reader = [&] {
    std::vector<size_t> seen(kTrajs, 0);
    for (bool last = false; !last;) {
      last = done.load();  // one more full pass after the writer is done
      for (int t = 0; t < kTrajs; ++t) {
        auto log = w->ReadTrajectory(t);
        if (!log.ok()) {
          if (log.status().code() != ErrorCode::kNotFound) bad++;
          continue;
        }
        const size_t n = log->token_ids.size();
        if (n < seen[t]) bad++;
        seen[t] = n;
        for (size_t i = 0; i < n; ++i) {
          const float lp = TokenLogprob(t, static_cast<uint32_t>(i));
          if (log->token_ids[i] != TokenId(t, static_cast<uint32_t>(i)) ||
              std::memcmp(&log->logprobs[i], &lp, 4) != 0) {
            bad++;
            break;
          }
        }
        reads++;
      }
      (void)w->stats();
    }
  };
  std::thread r1(reader), r2(reader);
  for (int t = 0; t < kTrajs; ++t) ASSERT_TRUE(w->AppendHeader(t, MakeHeader(t)).ok());
  for (uint32_t i = 0; i < kTokens; i += 4) {
    for (int t = 0; t < kTrajs; ++t) AppendTokenRange(*w, t, i, i + 4, 4, 1, nullptr);
  }
  ASSERT_TRUE(w->Flush().ok());
  done = true;
  r1.join();
  r2.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_GT(reads.load(), 0);
  EXPECT_GT(w->stats().map_grows, 0u);
  auto log = w->ReadTrajectory(kTrajs - 1);
  ASSERT_TRUE(log.ok());
  EXPECT_EQ(log->token_ids.size(), static_cast<size_t>(kTokens));
}

TEST(Wal, BufferedRecordsAreInvisibleUntilCommitted) {
  TempDir dir("wal_vis");
  auto w = OpenAndRecover(Opts(dir.path()));
  ASSERT_TRUE(w->AppendHeader(9, MakeHeader(9)).ok());
  EXPECT_EQ(w->ReadTrajectory(9).status().code(), ErrorCode::kNotFound);
  ASSERT_TRUE(w->Commit().ok());
  EXPECT_TRUE(w->ReadTrajectory(9).ok());
}

// Promise: the file stays bounded in a long run because LMDB reuses the pages acknowledged
// trajectories free. Negative control: without acknowledgements the same run grows the file.
TEST(Wal, AcknowledgedTrajectoriesKeepTheFileBounded) {
  auto run = [](bool ack, uint64_t* used_early, uint64_t* used_late) {
    TempDir dir("wal_bounded");
    auto w = OpenAndRecover(Opts(dir.path()));
    const int kTrajs = 1500, kLive = 16;
    for (int t = 0; t < kTrajs; ++t) {
      ASSERT_TRUE(w->AppendHeader(t, MakeHeader(t)).ok());
      AppendTokenRange(*w, t, 0, 128, 32, 1, nullptr);
      ASSERT_TRUE(w->AppendFinish(t, FinishReason::kNone, "").ok());
      if (ack && t >= kLive) {
        ASSERT_TRUE(w->Acknowledge(t - kLive).ok());
      }
      ASSERT_TRUE(w->Commit().ok());
      if (t == 150) *used_early = w->stats().map_used_bytes;
    }
    *used_late = w->stats().map_used_bytes;
    EXPECT_EQ(w->stats().live_trajectories, ack ? kLive : kTrajs);
  };
  uint64_t early = 0, late = 0, early_noack = 0, late_noack = 0;
  run(true, &early, &late);
  run(false, &early_noack, &late_noack);
  std::printf("map used: ack %llu -> %llu bytes; no ack %llu -> %llu bytes\n",
              (unsigned long long)early, (unsigned long long)late, (unsigned long long)early_noack,
              (unsigned long long)late_noack);
  EXPECT_LE(late, early + early / 4);      // 10x more trajectories, bounded file
  EXPECT_GT(late_noack, 5 * early_noack);  // the control grows with the work done
}

// Every kind of change advances LastLsn(), so a caller that commits when LastLsn() moved (the
// coordinator) also commits acknowledgements, discards and group acknowledgements; before, an
// Acknowledge on an idle log was never committed and came back after a crash.
TEST(Wal, DeletesAdvanceTheLsnAndBecomeDurable) {
  TempDir dir("wal_delete_lsn");
  {
    auto w = OpenAndRecover(Opts(dir.path()));
    for (uint64_t t = 1; t <= 3; ++t) {
      ASSERT_TRUE(w->AppendHeader(t, MakeHeader(t)).ok());
      ASSERT_TRUE(w->AppendFinish(t, FinishReason::kNone, "").ok());
    }
    ASSERT_TRUE(w->AppendGroup(9, "request").ok());
    ASSERT_TRUE(w->Commit().ok());
    uint64_t lsn = w->LastLsn();
    ASSERT_EQ(w->DurableLsn(), lsn);
    ASSERT_TRUE(w->Acknowledge(1).ok());
    EXPECT_GT(w->LastLsn(), lsn) << "an acknowledgement did not advance the LSN";
    lsn = w->LastLsn();
    ASSERT_TRUE(w->Discard(2).ok());
    EXPECT_GT(w->LastLsn(), lsn) << "a discard did not advance the LSN";
    lsn = w->LastLsn();
    ASSERT_TRUE(w->AcknowledgeGroup(9).ok());
    EXPECT_GT(w->LastLsn(), lsn) << "a group acknowledgement did not advance the LSN";
    ASSERT_TRUE(w->Commit().ok());
    EXPECT_EQ(w->DurableLsn(), w->LastLsn());
  }
  RecoveryResult rr;
  auto w = OpenAndRecover(Opts(dir.path()), &rr);
  EXPECT_TRUE(rr.groups.empty());
  ASSERT_EQ(rr.finished.size(), 1u);
  EXPECT_EQ(rr.finished[0].id, 3u);
  EXPECT_EQ(w->NextSeq(1), 0u);
  EXPECT_EQ(w->NextSeq(2), 0u);
  EXPECT_GT(w->NextSeq(3), 0u);  // the control: not acknowledged, still there
}

TEST(Wal, AcknowledgedWithRetentionStaysReadableUntilItEnds) {
  TempDir dir("wal_retain");
  WalOptions o = Opts(dir.path());
  o.ack_retention_ms = 3600 * 1000;
  {
    auto w = OpenAndRecover(o);
    ASSERT_TRUE(testing::WriteTrajectory(*w, 1, 32, true, nullptr).ok());
    ASSERT_TRUE(testing::WriteTrajectory(*w, 2, 32, true, nullptr).ok());
    ASSERT_TRUE(w->Acknowledge(1).ok());
    EXPECT_EQ(w->Acknowledge(1).code(), ErrorCode::kFailedPrecondition);
    ASSERT_TRUE(w->Flush().ok());
    auto log = w->ReadTrajectory(1);
    ASSERT_TRUE(log.ok()) << log.status().ToString();
    EXPECT_TRUE(log->acked_unix_ms.has_value());
    EXPECT_TRUE(log->finish.has_value());
  }
  {
    RecoveryResult rr;
    auto w = OpenAndRecover(o, &rr);  // still inside the retention period
    EXPECT_EQ(rr.retained, std::vector<uint64_t>{1});
    ASSERT_EQ(rr.finished.size(), 1u);
    EXPECT_EQ(rr.finished[0].id, 2u);
    ASSERT_TRUE(w->Flush().ok());
    EXPECT_TRUE(w->ReadTrajectory(1).ok());
    EXPECT_EQ(w->AppendFinish(1, FinishReason::kNone, "").code(), ErrorCode::kFailedPrecondition);
  }
  o.ack_retention_ms = 1;  // a shorter retention applies to earlier acknowledgements too
  std::this_thread::sleep_for(std::chrono::milliseconds(3));
  {
    RecoveryResult rr;
    auto w = OpenAndRecover(o, &rr);
    EXPECT_EQ(rr.retained, std::vector<uint64_t>{1});
    ASSERT_TRUE(w->Commit().ok());
    EXPECT_EQ(w->ReadTrajectory(1).status().code(), ErrorCode::kNotFound);
    EXPECT_TRUE(w->ReadTrajectory(2).ok());
  }
  RecoveryResult rr;
  auto w = OpenAndRecover(o, &rr);
  EXPECT_TRUE(rr.retained.empty());
  ASSERT_EQ(rr.finished.size(), 1u);
}

TEST(Wal, GroupsArePendingUntilAcknowledged) {
  TempDir dir("wal_groups");
  {
    auto w = OpenAndRecover(Opts(dir.path()));
    ASSERT_TRUE(w->AppendGroup(10, "group-ten").ok());
    ASSERT_TRUE(w->AppendGroup(11, std::string("g\0e", 3)).ok());
    EXPECT_EQ(w->AppendGroup(10, "x").code(), ErrorCode::kInvalidArgument);
    ASSERT_TRUE(w->Flush().ok());
  }
  {
    RecoveryResult rr;
    auto w = OpenAndRecover(Opts(dir.path()), &rr);
    ASSERT_EQ(rr.groups.size(), 2u);
    EXPECT_EQ(rr.groups[0].group_id, 10u);
    EXPECT_EQ(rr.groups[0].request, "group-ten");
    EXPECT_EQ(rr.groups[1].request, std::string("g\0e", 3));
    ASSERT_TRUE(w->AcknowledgeGroup(10).ok());
    EXPECT_EQ(w->AcknowledgeGroup(10).code(), ErrorCode::kNotFound);
    ASSERT_TRUE(w->Flush().ok());
  }
  RecoveryResult rr;
  auto w = OpenAndRecover(Opts(dir.path()), &rr);
  ASSERT_EQ(rr.groups.size(), 1u);
  EXPECT_EQ(rr.groups[0].group_id, 11u);
}

TEST(Wal, RefusesAnotherFormatVersion) {
  TempDir dir("wal_version");
  { auto w = OpenAndRecover(Opts(dir.path())); }
  MDB_env* env;
  ASSERT_EQ(mdb_env_create(&env), 0);
  mdb_env_set_maxdbs(env, format::kMaxDbs);
  ASSERT_EQ(mdb_env_open(env, dir.path().c_str(), 0, 0644), 0);
  MDB_txn* txn;
  MDB_dbi dbi;
  ASSERT_EQ(mdb_txn_begin(env, nullptr, 0, &txn), 0);
  ASSERT_EQ(mdb_dbi_open(txn, format::kMetaDbName, 0, &dbi), 0);
  const std::string key = format::kMetaVersionKey;
  uint8_t ver[4] = {99, 0, 0, 0};
  MDB_val k{key.size(), const_cast<char*>(key.data())}, v{4, ver};
  ASSERT_EQ(mdb_put(txn, dbi, &k, &v, 0), 0);
  ASSERT_EQ(mdb_txn_commit(txn), 0);
  mdb_env_close(env);
  auto w = Wal::Open(Opts(dir.path()));
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), ErrorCode::kUnsupported);
  EXPECT_NE(w.status().message().find("format version 99"), std::string::npos)
      << w.status().ToString();
}

}  // namespace
}  // namespace bitroll::wal
