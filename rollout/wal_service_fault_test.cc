// The WAL's failure rules at the service level: the coordinator's WAL lives on a real 320 KiB
// tmpfs that a rollout fills up.
//   - The WAL enters its sticky error state: the client gets a typed NoSpace error naming the WAL,
//     Status reports it, and a new submission is refused with the same error.
//   - Nothing that was not durable was delivered: every trajectory the client received has its
//     finish record in the log (read back with wal::Wal::Recover after the service stopped).
//   - Nothing accepted is lost: once space is freed (the tmpfs is remounted larger) a restarted
//     service on the same directory finishes the group, and every trajectory is bit-identical
//     (memcmp) to an uninterrupted run on the engine alone; the ones delivered before the error
//     are delivered again unchanged.
// Mounting a tmpfs needs CAP_SYS_ADMIN (root in CI); without it the test says so and skips.
//
// Also at the service level: a corrupted record quarantines exactly its trajectory (delivered as a
// typed Corruption error naming the record) while every other one resumes bit-identical; and the
// trainer's acknowledgements compact the WAL (a long run's file stays bounded, and acknowledged
// trajectories are not delivered again after a restart while unacknowledged ones are).
#include <lmdb.h>
#include <sys/mount.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "rollout/client.h"
#include "rollout/coordinator.h"
#include "rollout/null_engine.h"
#include "rollout/service_test_util.h"
#include "wal/wal.h"

namespace bitroll::rollout {
namespace {

using Key = SampleKey;
using Traj = SampleOutput;

constexpr uint32_t kPrompts = 4, kN = 8;

NullEngineOptions EngineOpts() {
  NullEngineOptions o;
  o.step_delay_us = 2000;
  o.eos_period = 400;  // lengths spread around 400 tokens: some finish before the disk fills
  return o;
}

SubmitRequest Group(uint64_t gid, uint64_t seed) {
  SubmitRequest r;
  r.group_id = gid;
  for (uint32_t p = 0; p < kPrompts; ++p) r.prompts.push_back({1, 5 + static_cast<int>(p), 9});
  r.n = kN;
  r.temperature = 1.0f;
  r.seed = seed;
  r.max_tokens = 2000;
  return r;
}

std::map<Key, Traj> Reference(const SubmitRequest& r) {
  NullEngineOptions o = EngineOpts();
  o.step_delay_us = 0;  // a delay changes no token, only the time
  NullEngine e(o);
  return RunDirect(e, r);
}

// An in-process coordinator with a WAL in `wal_dir` and two NullEngine replicas, and a client
// connected to it. `coord` is null (with a test failure) if either failed.
struct Service {
  std::unique_ptr<Coordinator> coord;
  std::unique_ptr<Client> client;
  void Stop() {
    client.reset();
    if (coord) coord->Stop();
  }
};
Service StartService(const std::string& wal_dir, int64_t delay_us = 2000) {
  CoordinatorOptions co;
  co.bind = "tcp://127.0.0.1:*";
  co.wal.dir = wal_dir;
  co.wal.durability = wal::Durability::kSyncEveryCommit;
  std::vector<std::unique_ptr<engine::Engine>> engines;
  NullEngineOptions eo = EngineOpts();
  eo.step_delay_us = delay_us;
  for (int i = 0; i < 2; ++i) engines.push_back(std::make_unique<NullEngine>(eo));
  Service s;
  auto c = Coordinator::Start(co, std::move(engines));
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  if (!c.ok()) return s;
  ClientOptions clo;
  clo.client_id = "trainer";  // re-attaching needs the same owner
  clo.endpoint = (*c)->endpoint();
  auto client = Client::Connect(clo);
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  if (!client.ok()) return s;
  s.coord = std::move(c).value();
  s.client = std::move(client).value();
  return s;
}

struct TempMount {
  std::string root, mnt;
  bool mounted = false;
  TempMount() {
    std::string t = (std::filesystem::temp_directory_path() / "br_walsvc_XXXXXX").string();
    if (mkdtemp(t.data()) != nullptr) root = t;
    mnt = root + "/mnt";
    std::filesystem::create_directories(mnt);
  }
  ~TempMount() {
    if (mounted) umount2(mnt.c_str(), MNT_DETACH);
    std::error_code ec;
    std::filesystem::remove_all(root, ec);
  }
};

TEST(WalServiceFault, FullDiskIsStickyDeliversOnlyDurableAndLosesNothingAccepted) {
  TempMount m;
  ASSERT_FALSE(m.root.empty());
  if (mount("tmpfs", m.mnt.c_str(), "tmpfs", 0, "size=320k") != 0) {
    GTEST_SKIP() << "SKIPPED LOUDLY: cannot mount a 320 KiB tmpfs (" << std::strerror(errno)
                 << "); the full-disk service test needs CAP_SYS_ADMIN (root)";
  }
  m.mounted = true;
  const std::string dir = m.mnt + "/wal";
  const SubmitRequest req = Group(501, 11);
  const auto want = Reference(req);
  ASSERT_EQ(want.size(), size_t{kPrompts * kN});
  size_t shortest = SIZE_MAX, total = 0;
  for (const auto& [k, t] : want) {
    shortest = std::min(shortest, t.ids.size());
    total += t.ids.size();
  }
  std::printf("the group: %zu tokens, shortest trajectory %zu\n", total, shortest);

  // 1. Fill the disk.
  std::map<Key, Traj> before;
  Status first_error;
  WalStatus ws;
  Status refused, waited;
  {
    Service sv = StartService(dir);
    ASSERT_NE(sv.coord, nullptr);
    Client* c = sv.client.get();
    ASSERT_TRUE(c->Submit(req).ok());
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    bool done = false;
    while (first_error.ok() && !done && std::chrono::steady_clock::now() < deadline) {
      auto ev = c->Next(20);
      if (!ev.ok()) continue;
      if (ev->kind == Event::Kind::kTrajectory) {
        before[{ev->trajectory.prompt_index, ev->trajectory.sample_index}] = {
            ev->trajectory.ids, ev->trajectory.logprobs};
      } else if (ev->kind == Event::Kind::kError) {
        first_error = ev->error;
      } else if (ev->kind == Event::Kind::kGroupDone) {
        done = true;
      }
    }
    ASSERT_FALSE(done) << "the group fit in 320 KiB; the test needs a bigger rollout";
    ASSERT_FALSE(first_error.ok()) << "no error reached the client within 60 s";
    EXPECT_EQ(first_error.code(), ErrorCode::kNoSpace) << first_error.ToString();
    EXPECT_NE(first_error.message().find("WAL"), std::string::npos) << first_error.ToString();
    ws = QueryWal(sv.coord->endpoint());
    // A trainer that waits for its messages to be committed gets the WAL's error, not a hang.
    waited = c->WaitCommitted(3000);
    // A new group is refused with the sticky error.
    SubmitRequest other = Group(502, 12);
    auto r = c->Run(other, 3000);
    refused = r.ok() ? Status::Ok() : r.status();
    sv.Stop();
  }
  ASSERT_TRUE(ws.replied);
  EXPECT_EQ(ws.error_code, static_cast<uint16_t>(ErrorCode::kNoSpace)) << ws.error_message;
  EXPECT_EQ(waited.code(), ErrorCode::kNoSpace) << waited.ToString();
  EXPECT_EQ(refused.code(), ErrorCode::kNoSpace) << refused.ToString();
  EXPECT_NE(refused.message().find("not accepting new work"), std::string::npos)
      << refused.ToString();
  EXPECT_GT(before.size(), 0u) << "nothing was delivered before the disk filled";
  std::printf("full disk: %zu of %zu trajectories delivered before the WAL failed: %s\n",
              before.size(), want.size(), first_error.ToString().c_str());

  // 2. Free space, then check what the log holds: every delivered trajectory is finished there.
  ASSERT_EQ(mount("tmpfs", m.mnt.c_str(), "tmpfs", MS_REMOUNT, "size=64m"), 0)
      << std::strerror(errno);
  {
    wal::WalOptions wo;
    wo.dir = dir;
    auto w = wal::Wal::Open(wo);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    auto rec = (*w)->Recover();
    ASSERT_TRUE(rec.ok()) << rec.status().ToString();
    std::set<Key> finished;
    for (const auto& t : rec->finished) {
      const uint32_t flat = WalFlatOf(t.id);
      finished.insert({flat / kN, flat % kN});
    }
    for (const auto& [k, t] : before) {
      EXPECT_TRUE(finished.count(k)) << "trajectory (" << k.first << ", " << k.second
                                     << ") was delivered but its finish record is not in the log";
    }
    EXPECT_TRUE(rec->quarantined.empty());
  }

  // 3. Restart on the same directory: the accepted group finishes, bit-identical.
  Service sv = StartService(dir);
  ASSERT_NE(sv.coord, nullptr);
  Client* c = sv.client.get();
  auto r = c->Run(req, 60000);  // the same group id: a re-attach
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::map<Key, Traj> after;
  for (const auto& t : *r) after[{t.prompt_index, t.sample_index}] = {t.ids, t.logprobs};
  const WalStatus ws2 = QueryWal(sv.coord->endpoint());
  sv.Stop();
  EXPECT_EQ(ws2.error_code, 0) << ws2.error_message;
  EXPECT_GT(ws2.forced, 0u) << "the restart did not resume logged tokens";
  EXPECT_EQ(ws2.mismatches, 0u);
  ASSERT_EQ(after.size(), want.size());
  size_t differ = 0;
  for (const auto& [k, t] : want) differ += after[k] == t ? 0 : 1;
  EXPECT_EQ(differ, 0u);
  for (const auto& [k, t] : before) EXPECT_TRUE(after[k] == t);
  // Negative control: another seed's run differs from what was delivered.
  const auto other = Reference(Group(501, 99));
  size_t other_differ = 0;
  for (const auto& [k, t] : other) other_differ += after[k] == t ? 0 : 1;
  EXPECT_GT(other_differ, want.size() / 2);
}

// Flips one byte in the value of the first token record (seq 1) found in the WAL; returns the
// trajectory's flat index (its sample address), or -1.
int CorruptOneTokenRecord(const std::string& dir) {
  MDB_env* env = nullptr;
  if (mdb_env_create(&env) != 0) return -1;
  mdb_env_set_maxdbs(env, 8);
  int flat = -1;
  if (mdb_env_open(env, dir.c_str(), 0, 0644) == 0) {
    MDB_txn* txn = nullptr;
    MDB_dbi dbi;
    if (mdb_txn_begin(env, nullptr, 0, &txn) == 0 && mdb_dbi_open(txn, "traj", 0, &dbi) == 0) {
      MDB_cursor* cur = nullptr;
      mdb_cursor_open(txn, dbi, &cur);
      MDB_val k, v;
      for (int rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
           rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        const auto* kp = static_cast<const uint8_t*>(k.mv_data);
        uint64_t traj = 0, seq = 0;
        for (int i = 0; i < 8; ++i) traj = (traj << 8) | kp[i];
        for (int i = 8; i < 16; ++i) seq = (seq << 8) | kp[i];
        if (seq != 1) continue;
        std::string value(static_cast<const char*>(v.mv_data), v.mv_size);
        value[value.size() - 5] ^= 0x40;  // inside the FlatBuffer: the CRC no longer matches
        MDB_val nv{value.size(), value.data()};
        if (mdb_cursor_put(cur, &k, &nv, MDB_CURRENT) == 0)
          flat = static_cast<int>(WalFlatOf(traj));
        break;
      }
      mdb_cursor_close(cur);
      if (flat >= 0 && mdb_txn_commit(txn) != 0) flat = -1;
      if (flat < 0) mdb_txn_abort(txn);
    }
    mdb_env_close(env);
  }
  return flat;
}

std::string NewTempDir(const char* tag) {
  std::string t =
      (std::filesystem::temp_directory_path() / (std::string(tag) + "_XXXXXX")).string();
  return mkdtemp(t.data()) != nullptr ? t : std::string();
}

TEST(WalServiceFault, CorruptRecordQuarantinesOnlyItsTrajectory) {
  const std::string root = NewTempDir("br_walq");
  ASSERT_FALSE(root.empty());
  const std::string dir = root + "/wal";
  SubmitRequest req = Group(601, 21);
  const auto want = Reference(req);
  {  // run part of the group, then stop the service with every trajectory unfinished
    Service sv = StartService(dir, 20000);
    ASSERT_NE(sv.coord, nullptr);
    Client* c = sv.client.get();
    ASSERT_TRUE(c->Submit(req).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    sv.Stop();
  }
  const int bad = CorruptOneTokenRecord(dir);
  ASSERT_GE(bad, 0) << "no token record found to corrupt";
  const Key bad_key{static_cast<uint32_t>(bad) / kN, static_cast<uint32_t>(bad) % kN};
  Service sv = StartService(dir, 0);
  ASSERT_NE(sv.coord, nullptr);
  Client* c = sv.client.get();
  auto r = c->Run(req, 60000);  // re-attach
  sv.Stop();
  std::filesystem::remove_all(root);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), want.size());
  size_t errors = 0, differ = 0;
  for (const auto& t : *r) {
    const Key k{t.prompt_index, t.sample_index};
    if (k == bad_key) {
      ++errors;
      EXPECT_EQ(t.finish, FinishReason::kError);
      EXPECT_EQ(t.error.code(), ErrorCode::kCorruption) << t.error.ToString();
      EXPECT_NE(t.error.message().find("seq=1"), std::string::npos) << t.error.ToString();
      EXPECT_NE(t.error.message().find("checksum mismatch"), std::string::npos)
          << t.error.ToString();
      continue;
    }
    EXPECT_TRUE(t.error.ok()) << t.error.ToString();
    differ += Traj{t.ids, t.logprobs} == want.at(k) ? 0 : 1;
  }
  EXPECT_EQ(errors, 1u);
  EXPECT_EQ(differ, 0u) << "a trajectory other than the corrupted one changed";
}

// Runs `groups` groups through a WAL service, acknowledging all but the last; returns data.mdb's
// size afterwards.
uint64_t RunAckedGroups(const std::string& dir, int groups, uint64_t first_gid) {
  Service sv = StartService(dir, 0);
  if (sv.coord == nullptr) return 0;
  Client* c = sv.client.get();
  for (int g = 0; g < groups; ++g) {
    SubmitRequest req = Group(first_gid + g, 31 + g);
    req.max_tokens = 200;
    auto r = c->Run(req, 60000);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok() || g + 1 == groups) continue;
    std::vector<std::pair<uint32_t, uint32_t>> acks;
    for (const auto& t : *r) acks.emplace_back(t.prompt_index, t.sample_index);
    EXPECT_TRUE(c->Ack(req.group_id, acks).ok());
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the last acks' commit
  sv.Stop();
  return std::filesystem::file_size(dir + "/data.mdb");
}

TEST(WalServiceFault, AcknowledgementsCompactTheWal) {
  const std::string root = NewTempDir("br_walack");
  ASSERT_FALSE(root.empty());
  const std::string dir = root + "/wal";
  const uint64_t after_3 = RunAckedGroups(dir, 3, 700);
  const uint64_t after_33 = RunAckedGroups(dir, 30, 800);
  std::printf("data.mdb: %llu bytes after 3 groups, %llu after 33 (32 acknowledged)\n",
              static_cast<unsigned long long>(after_3), static_cast<unsigned long long>(after_33));
  // 32 groups x 32 trajectories x ~200 tokens were logged; without compaction the file would
  // grow about tenfold between the two points.
  EXPECT_LT(after_33, 3 * after_3);
  // After a restart only the unacknowledged groups (700 + 2 and 800 + 29) come back.
  wal::WalOptions wo;
  wo.dir = dir;
  auto w = wal::Wal::Open(wo);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  auto rec = (*w)->Recover();
  ASSERT_TRUE(rec.ok());
  std::set<uint64_t> serials;
  for (const auto& t : rec->finished) serials.insert(WalSerialOf(t.id));
  EXPECT_EQ(rec->finished.size(), size_t{2 * kPrompts * kN});
  EXPECT_EQ(serials.size(), 2u);
  EXPECT_TRUE(rec->unfinished.empty());
  w->reset();
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace bitroll::rollout
