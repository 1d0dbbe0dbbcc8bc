// The Journal alone (rollout/coordinator_journal.h), over a GroupTable, a WeightsGate and a WAL
// in a temporary directory, without a socket: without a data directory nothing is logged or
// held; a finished trajectory is held until its finish record is durable and then delivered
// once (not at all when its group was aborted meanwhile); the group record is acknowledged with
// the group's last header; the records of the live weights bring a path update back after a
// restart; a later turn's tokens are logged at their trajectory indexes.
#include "rollout/coordinator_journal.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>

namespace bitroll::rollout {
namespace {

std::string TempDir() {
  std::string t = (std::filesystem::temp_directory_path() / "br_journal_XXXXXX").string();
  return mkdtemp(t.data()) != nullptr ? t : "";
}

std::string Request(uint64_t group_id, uint32_t n) {
  flatbuffers::FlatBufferBuilder fbb(512);
  std::vector<flatbuffers::Offset<wire::Prompt>> ps = {
      wire::CreatePrompt(fbb, fbb.CreateVector(std::vector<int32_t>{1, 2, 3}))};
  auto m = wire::CreateSubmitRollouts(fbb, group_id, fbb.CreateVector(ps), n);
  FinishEnvelope(fbb, 1, wire::Message_SubmitRollouts, m.Union());
  return std::string(BufferView(fbb));
}

// A replica's finished Trajectory of `ids` (logprob -0.5 each).
struct Finished {
  flatbuffers::FlatBufferBuilder fbb{256};
  const wire::Trajectory* t = nullptr;
  explicit Finished(const std::vector<int32_t>& ids) {
    auto i = fbb.CreateVector(ids);
    auto l = fbb.CreateVector(std::vector<float>(ids.size(), -0.5f));
    wire::TrajectoryBuilder b(fbb);
    b.add_ids(i);
    b.add_logprobs(l);
    b.add_finish(wire::FinishReason_Length);
    fbb.Finish(b.Finish());
    t = flatbuffers::GetRoot<wire::Trajectory>(fbb.GetBufferPointer());
  }
};

// The client envelope a replica builds (a slot for every Cost field).
std::string Envelope(const wire::Trajectory& t, uint32_t flat) {
  flatbuffers::FlatBufferBuilder fbb(256);
  FinalTurn ft;
  ft.ids = {t.ids()->data(), t.ids()->size()};
  ft.lps = {t.logprobs()->data(), t.logprobs()->size()};
  ft.finish = t.finish();
  BuildClientTrajectory(fbb, ft, TurnPrefix{}, {42, 0, flat}, "replica", nullptr);
  return std::string(BufferView(fbb));
}

struct Delivered {
  uint64_t group_id;
  uint32_t flat;
  std::string envelope;
  bool failed;
  int64_t wal_bytes;
};

// A journal and the parts it reads, logging to `dir` (empty: no data directory).
struct Fixture {
  ReplicaSet replicas;
  GroupTable table;
  WeightsGate weights{
      replicas, DecodeLimits{}, 1000,
      WeightsGate::Hooks{[](int, std::string_view) {},
                         [](const std::string&, uint64_t, const Status&, uint64_t) {},
                         [](const WeightsGate::Installed&) {}}};
  std::optional<NumericsFingerprint> fingerprint = NumericsFingerprint{};
  std::vector<Delivered> delivered;
  std::vector<Status> failures;
  Journal journal;

  explicit Fixture(const std::string& dir)
      : journal(
            Journal::Options{dir}, table, weights, fingerprint,
            Journal::Hooks{
                [this](GroupEntry* g, uint32_t flat, std::string env, bool failed, int64_t bytes) {
                  delivered.push_back({g->group_id, flat, std::move(env), failed, bytes});
                },
                [this](const Status& s) { failures.push_back(s); }}) {
    if (dir.empty()) return;
    WalServiceOptions o;
    o.dir = dir;
    o.durability = wal::Durability::kNone;
    o.commit_interval_ms = 0;
    auto wal = WalLog::Open(o);
    EXPECT_TRUE(wal.ok()) << wal.status().ToString();
    if (!wal.ok()) return;
    journal.Attach(std::move(wal).value());
    EXPECT_TRUE(journal.log()->Recover().ok());  // the coordinator recovers before logging
  }

  // Admits a group of `n` samples as the coordinator does, with its works.
  GroupEntry* Admit(uint64_t group_id, uint32_t n) {
    const std::string request = Request(group_id, n);
    uint64_t serial = 0;
    bool pending = false;
    EXPECT_TRUE(journal.OnGroupAdmitted(request, &serial, &pending).ok());
    GroupEntry* g =
        table.Add("conn", 1, "cowner", GroupTable::Key("cowner", group_id), request, serial);
    g->group_pending = pending;
    for (uint32_t j = 0; j < n; ++j) {
      WorkEntry w;
      w.id = journal.on() ? WalTrajId(serial, j) : table.NextWorkId();
      w.group = g;
      w.sample_index = j;
      table.AddWork(std::move(w));
    }
    g->unheadered = g->total;
    return g;
  }
};

TEST(Journal, WithoutADataDirectoryNothingIsLoggedOrHeld) {
  Fixture f("");
  EXPECT_FALSE(f.journal.on());
  EXPECT_TRUE(f.journal.Healthy().ok());
  EXPECT_TRUE(f.journal.CheckGroupSize(uint64_t{1} << 30).ok());
  GroupEntry* g = f.Admit(1, 1);
  EXPECT_EQ(g->serial, 0u);
  EXPECT_FALSE(g->group_pending);
  WorkEntry* w = f.table.FindWork(*g->live.begin());
  f.journal.OnDispatched(w);
  EXPECT_FALSE(w->header_logged);
  Finished t({5, 6});
  std::string envelope = "trajectory";
  EXPECT_FALSE(f.journal.OnTrajectoryFinished(*w, &envelope));
  EXPECT_EQ(envelope, "trajectory");  // the caller delivers it
  EXPECT_EQ(f.journal.PollWaitMs(20), 20);
  f.journal.DeliverDurable();
  EXPECT_TRUE(f.delivered.empty());
}

TEST(Journal, AFinishedTrajectoryIsHeldUntilDurableThenDeliveredOnce) {
  const std::string dir = TempDir();
  ASSERT_FALSE(dir.empty());
  {
    Fixture f(dir);
    ASSERT_TRUE(f.journal.on());
    EXPECT_EQ(f.journal.CheckGroupSize(kWalMaxSamples + 1).code(), ErrorCode::kInvalidArgument);
    GroupEntry* g = f.Admit(42, 2);
    EXPECT_EQ(g->serial, 1u);
    EXPECT_TRUE(g->group_pending);
    WorkEntry* w0 = f.table.FindWork(WalTrajId(1, 0));
    WorkEntry* w1 = f.table.FindWork(WalTrajId(1, 1));
    ASSERT_NE(w0, nullptr);
    ASSERT_NE(w1, nullptr);
    f.journal.OnDispatched(w0);
    EXPECT_TRUE(w0->header_logged);
    EXPECT_TRUE(g->group_pending);  // the second sample has no header yet
    f.journal.OnDispatched(w1);
    EXPECT_FALSE(g->group_pending);
    Finished t({7, 8, 9});
    std::string envelope = Envelope(*t.t, 0);
    ASSERT_TRUE(f.journal.OnTrajectoryFinished(*w0, &envelope));
    EXPECT_TRUE(f.delivered.empty());  // held: nothing committed yet
    f.journal.DeliverDurable();
    ASSERT_EQ(f.delivered.size(), 1u);
    EXPECT_EQ(f.delivered[0].group_id, 42u);
    EXPECT_EQ(f.delivered[0].flat, 0u);
    EXPECT_FALSE(f.delivered[0].failed);
    EXPECT_GT(f.delivered[0].wal_bytes, 0);
    // The envelope carries the committed bytes, set in place.
    auto env = DecodeEnvelope(f.delivered[0].envelope.data(), f.delivered[0].envelope.size(),
                              DecodeLimits{});
    ASSERT_TRUE(env.ok());
    EXPECT_EQ((*env)->msg_as_Trajectory()->cost()->wal_bytes(), f.delivered[0].wal_bytes);
    f.journal.DeliverDurable();
    EXPECT_EQ(f.delivered.size(), 1u);  // once
    auto log = f.journal.log()->Read(WalTrajId(1, 0));
    ASSERT_TRUE(log.ok()) << log.status().ToString();
    EXPECT_EQ(log->token_ids, (std::vector<int32_t>{7, 8, 9}));
    EXPECT_TRUE(log->finish.has_value());
    // A group aborted before its trajectory is durable gets nothing delivered.
    std::string second = Envelope(*t.t, 1);
    ASSERT_TRUE(f.journal.OnTrajectoryFinished(*w1, &second));
    f.table.Remove(g);
    f.journal.DeliverDurable();
    EXPECT_EQ(f.delivered.size(), 1u);
    EXPECT_TRUE(f.failures.empty());
  }
  std::filesystem::remove_all(dir);
}

// A replica's TokenChunk for work `work_id`: `ids` (logprob -0.5 each) at trajectory index `at`.
struct Chunk {
  flatbuffers::FlatBufferBuilder fbb{256};
  const wire::TokenChunk* c = nullptr;
  Chunk(uint64_t work_id, int32_t at, const std::vector<int32_t>& ids) {
    auto i = fbb.CreateVector(ids);
    auto l = fbb.CreateVector(std::vector<float>(ids.size(), -0.5f));
    fbb.Finish(wire::CreateTokenChunk(fbb, 42, 0, 0, at, i, l, 0, work_id));
    c = flatbuffers::GetRoot<wire::TokenChunk>(fbb.GetBufferPointer());
  }
};

// Token indexes (docs/design.md "Token indexes"): a later turn's chunks come at trajectory
// indexes (earlier turns and injected ids counted) and are logged at those indexes; a chunk
// before the turn's first token or past a gap is not logged; a re-dispatch forces the turn's
// logged tokens, and re-scored ones are compared with the log at the same indexes.
TEST(Journal, ALaterTurnIsLoggedAtItsTrajectoryIndexes) {
  const std::string dir = TempDir();
  ASSERT_FALSE(dir.empty());
  {
    Fixture f(dir);
    ASSERT_TRUE(f.journal.on());
    GroupEntry* g = f.Admit(42, 1);
    WorkEntry* w = f.table.FindWork(WalTrajId(g->serial, 0));
    ASSERT_NE(w, nullptr);
    f.journal.OnDispatched(w);
    // Turn 1: two tokens streamed, the third only in the finished turn; then a call.
    f.journal.OnChunk(w, *Chunk(w->id, 0, {10, 11}).c);
    Finished turn1({10, 11, 12});
    f.journal.OnTurnEnded(w, *turn1.t);
    EXPECT_TRUE(w->tokens.empty());  // they joined the context
    w->ctx_ids = {10, 11, 12};       // as ContinueToolLoop does
    w->ctx_mask = {1, 1, 1};
    f.journal.OnToolCallStarted(*w, ToolOutcome{}, 0);
    f.journal.OnToolCallFinished(*w, ToolOutcome{}, 0);
    const std::vector<int32_t> injected = {7, 8};
    flatbuffers::FlatBufferBuilder ib;
    ib.Finish(ib.CreateVector(injected));
    f.journal.OnTurnBoundary(
        *w, *flatbuffers::GetRoot<flatbuffers::Vector<int32_t>>(ib.GetBufferPointer()));
    w->ctx_ids.insert(w->ctx_ids.end(), injected.begin(), injected.end());  // as OnInjected
    w->ctx_mask.resize(5, 0);
    // Turn 2 starts at index 5 (3 sampled + 2 injected).
    f.journal.OnChunk(w, *Chunk(w->id, 3, {99}).c);  // before the turn: refused
    f.journal.OnChunk(w, *Chunk(w->id, 5, {20}).c);
    f.journal.OnChunk(w, *Chunk(w->id, 7, {98}).c);  // a gap: refused
    f.journal.OnChunk(w, *Chunk(w->id, 6, {21}).c);
    EXPECT_EQ(w->tokens, (std::vector<int32_t>{20, 21}));
    EXPECT_EQ(w->SampledInContext(), 3u);
    f.journal.DeliverDurable();  // commits
    auto log = f.journal.log()->Read(w->id);
    ASSERT_TRUE(log.ok()) << log.status().ToString();
    EXPECT_EQ(log->token_ids, (std::vector<int32_t>{10, 11, 12, 20, 21}));
    ASSERT_EQ(log->turns.size(), 1u);
    EXPECT_EQ(log->turns[0].token_index, 3u);
    ASSERT_EQ(log->tool_calls.size(), 1u);
    EXPECT_EQ(log->tool_calls[0].call.token_index, 3u);
    ASSERT_FALSE(log->spans.empty());
    EXPECT_EQ(log->spans.back().first_token, 5u);
    EXPECT_EQ(log->spans.back().count, 2u);
    // Failover: the turn's logged tokens are forced; the replica re-scores them at 5 and 6.
    f.journal.OnDispatched(w);
    EXPECT_EQ(w->forced, 2u);
    f.journal.OnChunk(w, *Chunk(w->id, 5, {20}).c);
    EXPECT_EQ(f.journal.log()->counters.forced_mismatches, 0u);
    f.journal.OnChunk(w, *Chunk(w->id, 6, {22}).c);  // the control: another token at 6
    EXPECT_EQ(f.journal.log()->counters.forced_mismatches, 1u);
    EXPECT_EQ(w->tokens, (std::vector<int32_t>{20, 21}));
    EXPECT_TRUE(f.failures.empty());
  }
  std::filesystem::remove_all(dir);
}

// The held envelope's wal_bytes is filled in place; bytes that are no Trajectory envelope (garbage,
// empty, another message) are refused and left as they were, never read out of bounds.
TEST(Journal, SetTrajectoryWalBytesRefusesWhatIsNoTrajectory) {
  Finished t({5, 6, 7});
  std::string good = Envelope(*t.t, 0);
  ASSERT_TRUE(SetTrajectoryWalBytes(good, 4321));
  auto env = DecodeEnvelope(good.data(), good.size(), DecodeLimits{});
  ASSERT_TRUE(env.ok()) << env.status().ToString();
  EXPECT_EQ((*env)->msg_as_Trajectory()->cost()->wal_bytes(), 4321);
  for (std::string bad : {std::string(), std::string("not a flatbuffer at all"),
                          std::string(3, '\xff'), Request(7, 2), good.substr(0, good.size() / 2)}) {
    const std::string before = bad;
    EXPECT_FALSE(SetTrajectoryWalBytes(bad, 99)) << bad.size() << " bytes";
    EXPECT_EQ(bad, before);
  }
}

// The coordinator sets every Cost field of the replica's envelope in place, nothing else; an
// envelope whose Cost lacks slots (built without them) or that is no Trajectory is refused.
TEST(Journal, SetTrajectoryCostSetsEveryFieldInPlace) {
  Finished t({5, 6, 7});
  const std::string built = Envelope(*t.t, 0);
  std::string got = built;
  Cost c;
  c.prefill_computed = 1;
  c.prefill_cached = 2;
  c.decode_tokens = 3;
  c.engine_seconds = 4.5;
  c.queue_seconds = 5.5;
  c.sandbox_seconds = 6.5;
  c.sandbox_cpu_seconds = 7.5;
  c.wal_bytes = 8;
  c.price_usd = 9.5;
  ASSERT_TRUE(SetTrajectoryCost(got, c));
  ASSERT_EQ(got.size(), built.size());
  EXPECT_NE(got, built);  // the control: the fields did change
  auto env = DecodeEnvelope(got.data(), got.size(), DecodeLimits{});
  ASSERT_TRUE(env.ok()) << env.status().ToString();
  const Cost back = CostFromWire((*env)->msg_as_Trajectory()->cost());
  EXPECT_EQ(std::memcmp(&back, &c, sizeof(Cost)), 0);
  ASSERT_TRUE(SetTrajectoryCost(got, Cost{}));
  EXPECT_EQ(got, built);  // only the Cost's scalars were touched
  std::string plain;      // a Cost without slots for its zeros
  {
    flatbuffers::FlatBufferBuilder fbb(256);
    auto cost = CostToWire(fbb, Cost{});
    wire::TrajectoryBuilder b(fbb);
    b.add_cost(cost);
    FinishEnvelope(fbb, 0, wire::Message_Trajectory, b.Finish().Union());
    plain.assign(BufferView(fbb));
  }
  const std::string before = plain;
  EXPECT_FALSE(SetTrajectoryCost(plain, c));
  EXPECT_EQ(plain, before);
  std::string other = Request(7, 2);
  EXPECT_FALSE(SetTrajectoryCost(other, c));
  // Verified bytes (a copy of a message's nested envelope): the same result, no second verifier.
  std::string want = built;
  ASSERT_TRUE(SetTrajectoryCost(want, c));
  std::string verified = built;
  ASSERT_TRUE(SetVerifiedTrajectoryCost(verified, c));
  EXPECT_EQ(verified, want);
  EXPECT_NE(verified, built);
  std::string none;
  EXPECT_FALSE(SetVerifiedTrajectoryCost(none, c));
  EXPECT_FALSE(SetVerifiedTrajectoryCost(other, c));
  EXPECT_FALSE(SetVerifiedTrajectoryCost(plain, c));
}

TEST(Journal, APathUpdateIsLiveAgainAfterARestart) {
  const std::string dir = TempDir();
  ASSERT_FALSE(dir.empty());
  {
    Fixture f(dir);
    f.journal.OnWeightsInstalled({7, "path", "/weights/v7", 0xabc});
  }
  {
    Fixture f(dir);
    f.journal.RestoreLiveWeights();
    EXPECT_EQ(f.weights.version(), 7u);
    EXPECT_EQ(f.weights.live_weights_hash(), 0xabcu);
    f.journal.OnWeightsInstalled({8, "tensors", "", 0});
  }
  {
    Fixture f(dir);  // streamed weights cannot be reloaded: the replicas' own stay live
    f.journal.RestoreLiveWeights();
    EXPECT_EQ(f.weights.version(), 0u);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace bitroll::rollout
