// bench_wal: WAL append throughput and size, per durability mode (run by hand, briefly).
//
//   bench_wal [DIR]     (DIR: where the temporary WAL directories go; default: the temp dir)
//
// Workload: 64 trajectories x 200 tokens, appended the way a batched decode loop produces them:
// every step appends the next token(s) of each of the 64 trajectories; header first, finish last.
// Cases: "1tok coalesced" appends one token per call with the default token coalescing (one record
// per trajectory per commit); "1tok/8tok per record" disables coalescing (max_coalesced_tokens =
// 1); "1ms/step" sleeps 1 ms after each decode step, like an engine, so that group commit runs
// many times. The background committer commits every 10 ms / 4096 records, except in
// "sync-every-append", which calls Flush() after every append (the "sync every token" end of the
// durability range; 8 x 25 tokens only, since it costs one fsync per token).
// Reports tokens/s (until everything is durable), commits/s, commits, syncs, bytes per token
// (key + value bytes written / tokens) and file bytes per token (LMDB pages used / tokens).

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "wal/wal.h"

namespace {

using bitroll::wal::Durability;
using bitroll::wal::Wal;
using bitroll::wal::WalOptions;

constexpr int kTrajs = 64, kTokens = 200;

struct Mode {
  const char* name;
  Durability durability;
  int tokens_per_record;
  bool flush_every_append;
  bool coalesce;       // WalOptions::max_coalesced_tokens default (true) or 1
  int step_sleep_us;   // pause after each decode step (64 appends), like a real engine step
  int trajs = kTrajs;  // fewer for sync-every-append: one fsync per token is slow by design
  int tokens = kTokens;
};

int RunOne(const std::string& root, const Mode& m, int index) {
  const std::string dir =
      root + "/bench_wal_" + std::to_string(::getpid()) + "_" + std::to_string(index);
  std::filesystem::remove_all(dir);
  WalOptions o;
  o.dir = dir;
  o.durability = m.durability;
  if (!m.coalesce) o.max_coalesced_tokens = 1;
  auto opened = Wal::Open(o);
  if (!opened.ok()) {
    std::fprintf(stderr, "open: %s\n", opened.status().ToString().c_str());
    return 1;
  }
  Wal& w = **opened;
  if (!w.Recover().ok()) return 1;
  bitroll::wal::TrajectoryHeader h;
  h.request.assign(512, 'r');  // a typical serialized prompt request
  h.fingerprint.backend = "cpu";
  std::vector<int32_t> ids(m.tokens_per_record);
  std::vector<float> lps(m.tokens_per_record);
  const auto t0 = std::chrono::steady_clock::now();
  auto check = [&](const bitroll::Status& s) {
    if (!s.ok()) std::fprintf(stderr, "%s: %s\n", m.name, s.ToString().c_str());
    return s.ok();
  };
  for (int t = 0; t < m.trajs; ++t) {
    if (!check(w.AppendHeader(t, h))) return 1;
  }
  for (int pos = 0; pos < m.tokens; pos += m.tokens_per_record) {
    for (int t = 0; t < m.trajs; ++t) {
      for (int j = 0; j < m.tokens_per_record; ++j) {
        ids[j] = (t * 7919 + pos + j) % 32000;
        lps[j] = -0.001f * static_cast<float>(pos + j);
      }
      if (!check(w.AppendTokens(t, ids, lps, 1))) return 1;
      if (m.flush_every_append && !check(w.Flush())) return 1;
    }
    if (m.step_sleep_us > 0)
      std::this_thread::sleep_for(std::chrono::microseconds(m.step_sleep_us));
  }
  for (int t = 0; t < m.trajs; ++t) {
    if (!check(w.AppendFinish(t, bitroll::FinishReason::kNone, ""))) return 1;
  }
  if (!check(w.Flush())) return 1;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto st = w.stats();
  const double tokens = static_cast<double>(m.trajs) * m.tokens;
  std::printf("%-24s %-14s %12.0f %10.0f %8llu %8llu %10.2f %12.2f\n", m.name,
              m.durability == Durability::kSyncEveryCommit ? "sync-every"
              : m.durability == Durability::kWindow        ? "window-100ms"
                                                           : "none",
              tokens / secs, static_cast<double>(st.commits) / secs,
              static_cast<unsigned long long>(st.commits),
              static_cast<unsigned long long>(st.syncs), st.bytes_per_token,
              static_cast<double>(st.map_used_bytes) / tokens);
  opened = bitroll::Status::Internal("closed");  // closes the Wal before removing its files
  std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string root = argc > 1 ? argv[1] : std::filesystem::temp_directory_path().string();
  std::printf("bench_wal: %d trajectories x %d tokens\n", kTrajs, kTokens);
  std::printf("%-24s %-14s %12s %10s %8s %8s %10s %12s\n", "case", "durability", "tokens/s",
              "commits/s", "commits", "syncs", "B/token", "file B/token");
  const Mode modes[] = {
      // name, durability, tokens per append, flush every append, coalesce, sleep per step
      {"1tok coalesced", Durability::kSyncEveryCommit, 1, false, true, 0},
      {"1tok coalesced", Durability::kWindow, 1, false, true, 0},
      {"1tok coalesced", Durability::kNone, 1, false, true, 0},
      {"1tok coalesced 1ms/step", Durability::kSyncEveryCommit, 1, false, true, 1000},
      {"1tok per record", Durability::kSyncEveryCommit, 1, false, false, 0},
      {"1tok per record", Durability::kWindow, 1, false, false, 0},
      {"1tok per record", Durability::kNone, 1, false, false, 0},
      {"8tok per record", Durability::kSyncEveryCommit, 8, false, false, 0},
      {"8tok per record", Durability::kNone, 8, false, false, 0},
      {"sync-every-append 8x25", Durability::kSyncEveryCommit, 1, true, false, 0, 8, 25},
  };
  for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); ++i) {
    if (RunOne(root, modes[i], static_cast<int>(i)) != 0) return 1;
  }
  return 0;
}
