// Old WAL directories open as before: wal/testdata/format2/ is a data directory written by the
// code of commit 4c50a81 (WAL format version 2, before the shared vocabulary of issue 13). This
// test opens a COPY of it and checks what Recover() and ReadTrajectory() return, field by field,
// against literal values (never against helpers that a refactor could change along with the
// reader). Any change to the reader, the record codec or the types they fill must keep it green.
// Format 3 changed one literal: the reader returns trajectory indexes (sampled + injected tokens
// before), so traj 1<<24|0's second token span, logged at sampled index 5 after a boundary with 3
// injected tokens, reads as first_token 8 (docs/wal_format.md "Token indexes"); every index
// before the first injection reads as written.
//
// The fixture holds (trajectory ids as the coordinator makes them: serial << 24 | flat sample):
//   group serial 1, acknowledged group record; two samples sharing one request (a request blob):
//     traj 1<<24|0: header, 5 tokens (weights v3), a tool call + its result, a turn boundary with
//                   3 injected ids, 3 tokens (v4), finished Stop            -> finished
//     traj 1<<24|1: header, 4 tokens, finished Length, acknowledged        -> retained
//   group serial 2, pending group record (never acknowledged):
//     traj 2<<24|0: greedy header (seed UINT64_MAX), 6 tokens with odd logprob bits, no finish
//                                                                          -> unfinished
//     traj 2<<24|1: header, finished Error "boom"                          -> finished
//   group serial 3: a pending group record only.
// The WAL has no weights record (weights are logged as the weight_version of headers and token
// spans), so none is here.
//
// To regenerate (only ever with the code the fixture claims to come from; today's code writes
// format 3, so DISABLED_Write no longer reproduces it):
//   BITROLL_WRITE_WAL_FIXTURE=/path/to/new/dir build/wal/wal_fixture_test
//     --gtest_filter=WalFixture.DISABLED_Write --gtest_also_run_disabled_tests
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "wal/wal.h"
#include "wal/wal_test_util.h"

namespace bitroll::wal {
namespace {

constexpr uint64_t kT10 = (uint64_t{1} << 24) | 0;
constexpr uint64_t kT11 = (uint64_t{1} << 24) | 1;
constexpr uint64_t kT20 = (uint64_t{2} << 24) | 0;
constexpr uint64_t kT21 = (uint64_t{2} << 24) | 1;

const std::string kRequest1("submit-rollouts-envelope-1\0\x01\xff", 29);
const std::string kRequest2("submit-rollouts-envelope-2", 26);
const std::string kRequest3("submit-rollouts-envelope-3", 26);

float Bits(uint32_t b) {
  return std::bit_cast<float>(b);
}
uint32_t BitsOf(float f) {
  return std::bit_cast<uint32_t>(f);
}

const std::vector<int32_t> kIds10a = {11, 22, 33, 44, 55};
const std::vector<uint32_t> kLps10a = {0xBF800000u, 0xC0000000u, 0xBE99999Au, 0x80000000u,
                                       0xC2C80001u};
const std::vector<int32_t> kIds10b = {66, 77, 2};
const std::vector<uint32_t> kLps10b = {0xBF000000u, 0xBD800000u, 0xC1200000u};
const std::vector<int32_t> kIds11 = {5, 6, 7, 8};
const std::vector<uint32_t> kLps11 = {0xBF800001u, 0xBF800002u, 0xBF800003u, 0xBF800004u};
const std::vector<int32_t> kIds20 = {0, 1, 151935, 42, 42, 9};
// -0.0, the smallest denormal, -inf, -FLT_MAX, a NaN payload, -1.5
const std::vector<uint32_t> kLps20 = {0x80000000u, 0x80000001u, 0xFF800000u,
                                      0xFF7FFFFFu, 0xFFC00123u, 0xBFC00000u};

std::vector<float> Floats(const std::vector<uint32_t>& bits) {
  std::vector<float> out;
  for (uint32_t b : bits) out.push_back(Bits(b));
  return out;
}

WalOptions FixtureOptions(const std::string& dir) {
  WalOptions o;
  o.dir = dir;
  o.durability = Durability::kSyncEveryCommit;
  o.background_commit = false;
  o.ack_retention_ms = int64_t{100} * 365 * 24 * 3600 * 1000;  // keep the acknowledged one
  return o;
}

// Writes the fixture with the code of the day. Run by hand only (see the file comment).
TEST(WalFixture, DISABLED_Write) {
  const char* dir = std::getenv("BITROLL_WRITE_WAL_FIXTURE");
  if (dir == nullptr) GTEST_SKIP() << "BITROLL_WRITE_WAL_FIXTURE is not set";
  auto opened = Wal::Open(FixtureOptions(dir));
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  Wal& w = **opened;
  ASSERT_TRUE(w.Recover().ok());

  ASSERT_TRUE(w.AppendGroup(1, kRequest1).ok());
  TrajectoryHeader h;
  h.request = kRequest1;
  h.group_id = 1;
  h.sample_index = 0;
  h.sampling.seed = 0x0123456789ABCDEFull;
  h.sampling.temperature = 0.7f;
  h.sampling.top_k = 40;
  h.sampling.top_p = 0.95f;
  h.sampling.min_p = 0.05f;
  h.max_tokens = 64;
  h.weight_version = 3;
  h.fingerprint.weights_hash = 0xFEEDFACECAFEBEEFull;
  h.fingerprint.kernel_version = 2;
  h.fingerprint.attention_chunk = 64;
  h.fingerprint.backend = "cpu";
  ASSERT_TRUE(w.AppendHeader(kT10, h).ok());
  h.sample_index = 1;
  ASSERT_TRUE(w.AppendHeader(kT11, h).ok());
  ASSERT_TRUE(w.AcknowledgeGroup(1).ok());
  ASSERT_TRUE(w.AppendTokens(kT10, kIds10a, Floats(kLps10a), 3).ok());
  ToolCall call;
  call.call_index = 0;
  call.tool_name = "calc";
  call.tier = ToolTier::kProcess;
  call.input = "1+2";
  ASSERT_TRUE(w.AppendToolCall(kT10, call).ok());
  ToolResult result;
  result.call_index = 0;
  result.exit_status = 0;
  result.stdout_bytes = "3\n";
  result.stderr_bytes = std::string("warn\0", 5);
  result.stdout_truncated = false;
  result.stderr_truncated = true;
  result.wall_seconds = 0.25;
  result.cpu_seconds = 0.125;
  result.error_code = 9;
  result.error_message = "timeout";
  ASSERT_TRUE(w.AppendToolResult(kT10, result).ok());
  TurnBoundary tb;
  tb.turn_index = 1;
  tb.injected_tokens = {7, 8, 9};
  ASSERT_TRUE(w.AppendTurnBoundary(kT10, tb).ok());
  ASSERT_TRUE(w.AppendTokens(kT10, kIds10b, Floats(kLps10b), 4).ok());
  ASSERT_TRUE(w.AppendFinish(kT10, FinishReason::kStop, "").ok());
  ASSERT_TRUE(w.AppendTokens(kT11, kIds11, Floats(kLps11), 3).ok());
  ASSERT_TRUE(w.AppendFinish(kT11, FinishReason::kLength, "").ok());
  ASSERT_TRUE(w.Flush().ok());
  ASSERT_TRUE(w.Acknowledge(kT11).ok());

  ASSERT_TRUE(w.AppendGroup(2, kRequest2).ok());
  TrajectoryHeader g;
  g.request = kRequest2;
  g.group_id = 2;
  g.sample_index = 0;
  g.sampling.seed = std::numeric_limits<uint64_t>::max();
  g.sampling.temperature = 0.0f;
  g.sampling.top_k = 0;
  g.sampling.top_p = 1.0f;
  g.sampling.min_p = 0.0f;
  g.max_tokens = 4096;
  g.weight_version = 5;
  g.fingerprint.weights_hash = 0x1122334455667788ull;
  g.fingerprint.kernel_version = 3;
  g.fingerprint.attention_chunk = 128;
  g.fingerprint.backend = "cuda";
  ASSERT_TRUE(w.AppendHeader(kT20, g).ok());
  ASSERT_TRUE(w.AppendTokens(kT20, kIds20, Floats(kLps20), 5).ok());
  g.sample_index = 1;
  ASSERT_TRUE(w.AppendHeader(kT21, g).ok());
  ASSERT_TRUE(w.AppendFinish(kT21, FinishReason::kError, "boom").ok());
  ASSERT_TRUE(w.AppendGroup(3, kRequest3).ok());
  ASSERT_TRUE(w.Flush().ok());
}

const TrajectoryLog* Find(const std::vector<TrajectoryLog>& logs, uint64_t id) {
  for (const TrajectoryLog& l : logs) {
    if (l.id == id) return &l;
  }
  return nullptr;
}

void ExpectTokens(const TrajectoryLog& l, const std::vector<int32_t>& ids,
                  const std::vector<uint32_t>& lp_bits) {
  ASSERT_EQ(l.token_ids, ids);
  ASSERT_EQ(l.logprobs.size(), lp_bits.size());
  for (size_t i = 0; i < lp_bits.size(); ++i) {
    EXPECT_EQ(BitsOf(l.logprobs[i]), lp_bits[i]) << "logprob " << i;
  }
}

class WalFixtureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::filesystem::path src =
        std::filesystem::path(BITROLL_SOURCE_DIR) / "wal" / "testdata" / "format2";
    ASSERT_TRUE(std::filesystem::exists(src / "data.mdb")) << src;
    for (const auto& e : std::filesystem::directory_iterator(src)) {
      if (e.path().filename() != "data.mdb") continue;  // lock files are never needed
      std::filesystem::copy_file(e.path(),
                                 std::filesystem::path(dir_.path()) / e.path().filename());
    }
  }
  testing::TempDir dir_{"wal_fixture"};
};

TEST_F(WalFixtureTest, RecoversEveryFieldAsWritten) {
  auto opened = Wal::Open(FixtureOptions(dir_.path()));
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  Wal& w = **opened;
  auto rec = w.Recover();
  ASSERT_TRUE(rec.ok()) << rec.status().ToString();
  const RecoveryResult& r = *rec;
  EXPECT_TRUE(r.quarantined.empty());
  EXPECT_TRUE(r.quarantined_groups.empty());

  // Pending groups: 2 and 3 (1 was acknowledged), with their request bytes.
  ASSERT_EQ(r.groups.size(), 2u);
  EXPECT_EQ(r.groups[0].group_id, 2u);
  EXPECT_EQ(r.groups[0].request, kRequest2);
  EXPECT_EQ(r.groups[1].group_id, 3u);
  EXPECT_EQ(r.groups[1].request, kRequest3);

  ASSERT_EQ(r.retained, std::vector<uint64_t>{kT11});
  ASSERT_EQ(r.unfinished.size(), 1u);
  ASSERT_EQ(r.finished.size(), 2u);

  // The unfinished greedy trajectory.
  const TrajectoryLog& u = r.unfinished[0];
  EXPECT_EQ(u.id, kT20);
  EXPECT_EQ(u.header.request, kRequest2);
  EXPECT_EQ(u.header.group_id, 2u);
  EXPECT_EQ(u.header.sample_index, 0u);
  EXPECT_EQ(u.header.sampling.seed, std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(BitsOf(u.header.sampling.temperature), BitsOf(0.0f));
  EXPECT_EQ(u.header.sampling.top_k, 0);
  EXPECT_EQ(BitsOf(u.header.sampling.top_p), BitsOf(1.0f));
  EXPECT_EQ(BitsOf(u.header.sampling.min_p), BitsOf(0.0f));
  EXPECT_EQ(u.header.max_tokens, 4096u);
  EXPECT_EQ(u.header.weight_version, 5u);
  EXPECT_EQ(u.header.fingerprint.weights_hash, 0x1122334455667788ull);
  EXPECT_EQ(u.header.fingerprint.kernel_version, 3u);
  EXPECT_EQ(u.header.fingerprint.attention_chunk, 128u);
  EXPECT_EQ(u.header.fingerprint.backend, "cuda");
  ExpectTokens(u, kIds20, kLps20);
  ASSERT_EQ(u.spans.size(), 1u);
  EXPECT_EQ(u.spans[0].first_token, 0u);
  EXPECT_EQ(u.spans[0].count, 6u);
  EXPECT_EQ(u.spans[0].weight_version, 5u);
  EXPECT_TRUE(u.turns.empty());
  EXPECT_TRUE(u.tool_calls.empty());
  EXPECT_FALSE(u.finish.has_value());
  EXPECT_FALSE(u.acked_unix_ms.has_value());

  // The finished tool-loop trajectory (its request is in a shared request blob).
  const TrajectoryLog* f = Find(r.finished, kT10);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->header.request, kRequest1);
  EXPECT_EQ(f->header.group_id, 1u);
  EXPECT_EQ(f->header.sample_index, 0u);
  EXPECT_EQ(f->header.sampling.seed, 0x0123456789ABCDEFull);
  EXPECT_EQ(BitsOf(f->header.sampling.temperature), BitsOf(0.7f));
  EXPECT_EQ(f->header.sampling.top_k, 40);
  EXPECT_EQ(BitsOf(f->header.sampling.top_p), BitsOf(0.95f));
  EXPECT_EQ(BitsOf(f->header.sampling.min_p), BitsOf(0.05f));
  EXPECT_EQ(f->header.max_tokens, 64u);
  EXPECT_EQ(f->header.weight_version, 3u);
  EXPECT_EQ(f->header.fingerprint.weights_hash, 0xFEEDFACECAFEBEEFull);
  EXPECT_EQ(f->header.fingerprint.kernel_version, 2u);
  EXPECT_EQ(f->header.fingerprint.attention_chunk, 64u);
  EXPECT_EQ(f->header.fingerprint.backend, "cpu");
  std::vector<int32_t> ids = kIds10a;
  ids.insert(ids.end(), kIds10b.begin(), kIds10b.end());
  std::vector<uint32_t> lps = kLps10a;
  lps.insert(lps.end(), kLps10b.begin(), kLps10b.end());
  ExpectTokens(*f, ids, lps);
  ASSERT_EQ(f->spans.size(), 2u);
  EXPECT_EQ(f->spans[0].first_token, 0u);
  EXPECT_EQ(f->spans[0].count, 5u);
  EXPECT_EQ(f->spans[0].weight_version, 3u);
  EXPECT_EQ(f->spans[1].first_token, 8u);  // logged as 5 (format 2); + 3 injected before it
  EXPECT_EQ(f->spans[1].count, 3u);
  EXPECT_EQ(f->spans[1].weight_version, 4u);
  ASSERT_EQ(f->turns.size(), 1u);
  EXPECT_EQ(f->turns[0].turn_index, 1u);
  EXPECT_EQ(f->turns[0].token_index, 5u);
  EXPECT_EQ(f->turns[0].injected_tokens, (std::vector<int32_t>{7, 8, 9}));
  ASSERT_EQ(f->tool_calls.size(), 1u);
  const ToolCall& c = f->tool_calls[0].call;
  EXPECT_EQ(c.call_index, 0u);
  EXPECT_EQ(c.token_index, 5u);
  EXPECT_EQ(c.tool_name, "calc");
  EXPECT_EQ(static_cast<int>(c.tier), 1);
  EXPECT_EQ(c.input, "1+2");
  ASSERT_TRUE(f->tool_calls[0].result.has_value());
  const ToolResult& res = *f->tool_calls[0].result;
  EXPECT_EQ(res.call_index, 0u);
  EXPECT_EQ(res.exit_status, 0);
  EXPECT_EQ(res.stdout_bytes, "3\n");
  EXPECT_EQ(res.stderr_bytes, std::string("warn\0", 5));
  EXPECT_FALSE(res.stdout_truncated);
  EXPECT_TRUE(res.stderr_truncated);
  EXPECT_EQ(res.wall_seconds, 0.25);
  EXPECT_EQ(res.cpu_seconds, 0.125);
  EXPECT_EQ(res.error_code, 9);
  EXPECT_EQ(res.error_message, "timeout");
  ASSERT_TRUE(f->finish.has_value());
  EXPECT_EQ(static_cast<int>(f->finish->reason), 2);
  EXPECT_EQ(f->finish->error, "");

  // The finished error trajectory.
  const TrajectoryLog* e = Find(r.finished, kT21);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->header.request, kRequest2);
  EXPECT_EQ(e->header.sample_index, 1u);
  EXPECT_EQ(e->header.sampling.seed, std::numeric_limits<uint64_t>::max());
  EXPECT_TRUE(e->token_ids.empty());
  ASSERT_TRUE(e->finish.has_value());
  EXPECT_EQ(static_cast<int>(e->finish->reason), 5);
  EXPECT_EQ(e->finish->error, "boom");

  // The acknowledged one is still readable (retention), with its ack time.
  auto kept = w.ReadTrajectory(kT11);
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  EXPECT_EQ(kept->header.request, kRequest1);
  EXPECT_EQ(kept->header.sample_index, 1u);
  EXPECT_EQ(kept->header.sampling.seed, 0x0123456789ABCDEFull);
  ExpectTokens(*kept, kIds11, kLps11);
  ASSERT_TRUE(kept->finish.has_value());
  EXPECT_EQ(static_cast<int>(kept->finish->reason), 1);
  EXPECT_TRUE(kept->acked_unix_ms.has_value());

  // The log goes on from where it stopped: resume the unfinished one and finish it.
  const std::vector<int32_t> more = {3, 4};
  const std::vector<float> more_lps = {-0.5f, -0.25f};
  ASSERT_TRUE(w.AppendTokens(kT20, more, more_lps, 6).ok());
  ASSERT_TRUE(w.AppendFinish(kT20, FinishReason::kEos, "").ok());
  ASSERT_TRUE(w.Flush().ok());
  auto resumed = w.ReadTrajectory(kT20);
  ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
  ASSERT_EQ(resumed->token_ids.size(), 8u);
  EXPECT_EQ(resumed->token_ids[6], 3);
  ASSERT_EQ(resumed->spans.size(), 2u);
  EXPECT_EQ(resumed->spans[1].first_token, 6u);
  EXPECT_EQ(resumed->spans[1].weight_version, 6u);
  ASSERT_TRUE(resumed->finish.has_value());
  EXPECT_EQ(static_cast<int>(resumed->finish->reason), 3);
}

}  // namespace
}  // namespace bitroll::wal
