// The service's reading of the log (rollout/wal_log.h) over an old directory: the committed
// format-2 fixture (wal/testdata/format2, written before the log's token indexes became trajectory
// indexes) rebuilds the same tool-loop trajectory as the same records written by today's code
// (format 3). Shows: RebuildTurns places the turns, the injected tokens, the call and the version
// spans at the client's indexes; the client envelope built from either log is byte-identical;
// negative control: a log whose indexes were left unconverted gives another envelope.
#include "rollout/wal_log.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>
#include <vector>

#include "rollout/protocol.h"
#include "wal/wal.h"

namespace bitroll::rollout {
namespace {

constexpr uint64_t kT10 = (uint64_t{1} << 24) | 0;  // the fixture's finished tool-loop trajectory

std::string TempDir() {
  std::string t = (std::filesystem::temp_directory_path() / "br_wallog_XXXXXX").string();
  return mkdtemp(t.data()) != nullptr ? t : "";
}

wal::WalOptions Options(const std::string& dir) {
  wal::WalOptions o;
  o.dir = dir;
  o.durability = wal::Durability::kNone;
  o.background_commit = false;
  return o;
}

// Recovers `dir` and returns trajectory kT10 (finished).
wal::TrajectoryLog ReadT10(const std::string& dir) {
  auto w = wal::Wal::Open(Options(dir));
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  if (!w.ok()) return {};
  auto rr = (*w)->Recover();
  EXPECT_TRUE(rr.ok());
  if (rr.ok()) {
    for (wal::TrajectoryLog& l : rr->finished) {
      if (l.id == kT10) return std::move(l);
    }
  }
  ADD_FAILURE() << "no finished trajectory " << kT10;
  return {};
}

// Writes `log`'s records again with today's code, in the order the coordinator logs them.
void Rewrite(const wal::TrajectoryLog& log, const std::string& dir) {
  auto opened = wal::Wal::Open(Options(dir));
  ASSERT_TRUE(opened.ok());
  wal::Wal& w = **opened;
  ASSERT_TRUE(w.Recover().ok());
  ASSERT_TRUE(w.AppendHeader(log.id, log.header).ok());
  ASSERT_EQ(log.spans.size(), 2u);
  ASSERT_EQ(log.turns.size(), 1u);
  ASSERT_EQ(log.tool_calls.size(), 1u);
  const wal::TokenSpan& a = log.spans[0];
  ASSERT_TRUE(w.AppendTokens(log.id, {log.token_ids.data(), a.count},
                             {log.logprobs.data(), a.count}, a.weight_version)
                  .ok());
  ASSERT_TRUE(w.AppendToolCall(log.id, log.tool_calls[0].call).ok());
  ASSERT_TRUE(w.AppendToolResult(log.id, *log.tool_calls[0].result).ok());
  ASSERT_TRUE(w.AppendTurnBoundary(log.id, log.turns[0]).ok());
  const wal::TokenSpan& b = log.spans[1];
  ASSERT_TRUE(w.AppendTokens(log.id, {log.token_ids.data() + a.count, b.count},
                             {log.logprobs.data() + a.count, b.count}, b.weight_version)
                  .ok());
  ASSERT_TRUE(w.AppendFinish(log.id, log.finish->reason, log.finish->error).ok());
  ASSERT_TRUE(w.Flush().ok());
}

TEST(WalLog, AFormat2ToolLoopRebuildsAsToday) {
  const std::string old_dir = TempDir(), new_dir = TempDir();
  ASSERT_FALSE(old_dir.empty());
  ASSERT_FALSE(new_dir.empty());
  std::filesystem::copy_file(
      std::filesystem::path(BITROLL_SOURCE_DIR) / "wal" / "testdata" / "format2" / "data.mdb",
      std::filesystem::path(old_dir) / "data.mdb");
  const wal::TrajectoryLog old_log = ReadT10(old_dir);
  ASSERT_TRUE(old_log.finish.has_value());

  // 5 sampled tokens (v3), a call, 3 injected, 3 sampled (v4): the client's indexes.
  const LoggedTurns lt = RebuildTurns(old_log);
  EXPECT_EQ(lt.ids, (std::vector<int32_t>{11, 22, 33, 44, 55, 7, 8, 9}));
  EXPECT_EQ(lt.mask, (std::vector<uint8_t>{1, 1, 1, 1, 1, 0, 0, 0}));
  EXPECT_EQ(lt.turn_ids, (std::vector<int32_t>{66, 77, 2}));
  EXPECT_EQ(lt.turns, 2);
  ASSERT_EQ(lt.calls.size(), 1u);
  EXPECT_EQ(lt.calls[0].token_index, 5);
  ASSERT_EQ(lt.versions.size(), 2u);
  EXPECT_EQ(lt.versions[0].begin(), 0);
  EXPECT_EQ(lt.versions[0].version(), 3u);
  EXPECT_EQ(lt.versions[1].begin(), 8);
  EXPECT_EQ(lt.versions[1].version(), 4u);

  Rewrite(old_log, new_dir);
  const wal::TrajectoryLog new_log = ReadT10(new_dir);
  const SampleAddress at{7, 0, 0};
  const std::string from_old = BuildLoggedTrajectory(old_log, at, Cost{}, "tag");
  const std::string from_new = BuildLoggedTrajectory(new_log, at, Cost{}, "tag");
  EXPECT_EQ(from_old.size(), from_new.size());
  EXPECT_TRUE(from_old == from_new) << "the envelopes differ";
  auto env = DecodeEnvelope(from_old.data(), from_old.size(), DecodeLimits{});
  ASSERT_TRUE(env.ok());
  const wire::Trajectory* t = (*env)->msg_as_Trajectory();
  ASSERT_NE(t, nullptr);
  ASSERT_EQ(t->ids()->size(), 11u);
  EXPECT_EQ(t->ids()->Get(8), 66);
  EXPECT_EQ(t->versions()->Get(1)->begin(), 8);

  // Negative control: the second span at its format-2 index (sampled tokens only).
  wal::TrajectoryLog unconverted = old_log;
  unconverted.spans[1].first_token = 5;
  EXPECT_FALSE(BuildLoggedTrajectory(unconverted, at, Cost{}, "tag") == from_old);

  std::filesystem::remove_all(old_dir);
  std::filesystem::remove_all(new_dir);
}

}  // namespace
}  // namespace bitroll::rollout
