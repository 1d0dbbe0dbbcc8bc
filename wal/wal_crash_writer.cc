// Test helper for wal_crash_test: appends a deterministic script of records for K trajectories,
// fsync per commit, and prints every durable point. It is kill -9'ed at random moments and
// restarted; on restart it recovers and continues each trajectory from its next sequence number.
//
// usage: wal_crash_writer DIR K TOKENS BATCH
// Each trajectory t is the script: seq 0 header, then token batches of BATCH tokens; after the
// 4th batch a tool call, its result and a turn boundary; the finish record last. One round appends
// the next record of every unfinished trajectory, then Flush()es. After each Flush it prints
//   D <next seq of traj 0> ... <next seq of traj K-1>
// (every record below those is durable), and DONE when every trajectory is finished. It prints R
// once it has opened and recovered the WAL, before the first append.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "wal/wal.h"
#include "wal/wal_test_util.h"

namespace {

using bitroll::Status;
namespace wal = bitroll::wal;

struct Script {
  uint32_t tokens, batch;
  uint32_t batches() const { return (tokens + batch - 1) / batch; }
  uint64_t records() const { return 1 + batches() + 3 + 1; }  // header, batches, tool x3, finish
};

// Appends record `seq` of trajectory t.
Status AppendStep(wal::Wal& w, const Script& s, uint64_t t, uint64_t seq) {
  if (seq == 0) return w.AppendHeader(t, wal::testing::MakeHeader(t));
  if (seq == s.records() - 1) return w.AppendFinish(t, bitroll::FinishReason::kLength, "");
  const uint64_t kToolAt = 1 + 4;  // after the 4th batch
  if (seq >= kToolAt && seq < kToolAt + 3) {
    const uint64_t k = seq - kToolAt;
    if (k == 0) {
      wal::ToolCall c;
      c.call_index = 0;
      c.tool_name = "calc";
      c.tier = bitroll::ToolTier::kProcess;
      c.input = "2+" + std::to_string(t);
      return w.AppendToolCall(t, c);
    }
    if (k == 1) {
      wal::ToolResult r;
      r.call_index = 0;
      r.stdout_bytes = std::to_string(2 + t);
      r.wall_seconds = 0.001 * static_cast<double>(t);
      return w.AppendToolResult(t, r);
    }
    wal::TurnBoundary b;
    b.turn_index = 0;
    b.injected_tokens = {7, 8, static_cast<int32_t>(t)};
    return w.AppendTurnBoundary(t, b);
  }
  const uint64_t batch_index = seq < kToolAt ? seq - 1 : seq - 4;
  const uint32_t from = static_cast<uint32_t>(batch_index) * s.batch;
  const uint32_t to = std::min(s.tokens, from + s.batch);
  return wal::testing::AppendTokenRange(w, t, from, to, s.batch, 1, nullptr);
}

int Fail(const Status& s) {
  std::fprintf(stderr, "wal_crash_writer: %s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s DIR K TOKENS BATCH\n", argv[0]);
    return 2;
  }
  const uint64_t k = std::strtoull(argv[2], nullptr, 10);
  const Script script{static_cast<uint32_t>(std::atoi(argv[3])),
                      static_cast<uint32_t>(std::atoi(argv[4]))};
  wal::WalOptions o;
  o.dir = argv[1];
  o.durability = wal::Durability::kSyncEveryCommit;
  o.background_commit = false;
  auto opened = wal::Wal::Open(o);
  if (!opened.ok()) return Fail(opened.status());
  wal::Wal& w = **opened;
  auto rec = w.Recover();
  if (!rec.ok()) return Fail(rec.status());
  if (!rec->quarantined.empty()) return Fail(rec->quarantined[0].error);
  std::vector<uint64_t> next(k);
  for (uint64_t t = 0; t < k; ++t) next[t] = w.NextSeq(t);
  std::printf("R\n");  // recovered; the work starts now
  std::fflush(stdout);
  for (;;) {
    bool any = false;
    for (uint64_t t = 0; t < k; ++t) {
      if (next[t] >= script.records()) continue;
      Status s = AppendStep(w, script, t, next[t]++);
      if (!s.ok()) return Fail(s);
      any = true;
    }
    if (!any) break;
    Status s = w.Flush();
    if (!s.ok()) return Fail(s);
    std::string line = "D";
    for (uint64_t t = 0; t < k; ++t) line += " " + std::to_string(next[t]);
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }
  std::printf("DONE\n");
  std::fflush(stdout);
  return 0;
}
