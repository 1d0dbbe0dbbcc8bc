// engine/scheduler.h: continuous batching. Plans which rows of which sequences run in one step.
//
// Policy, in order:
//   1. Running sequences that need exactly one row (decode) each get it, highest priority first,
//      then earliest arrival. A decode that needs a new KV block and finds none preempts the
//      running sequence with the lowest priority and latest arrival (possibly itself): its blocks
//      are released and it returns to the queue; later it is re-prefilled from its known tokens
//      (recompute), which reproduces the same K/V bits, so its continuation is unchanged.
//   2. The remaining token budget goes to prefill chunks: running sequences with pending rows
//      first, then waiting sequences (admitted while fewer than max_running run). A chunk that
//      does not finish a sequence's pending rows ends on a KV-block boundary.
//   3. A waiting sequence is admitted only if the blocks for its chunk are free; running work is
//      never preempted to admit new work.
// Scheduling never changes a bit of any sequence: it only chooses which rows run when.
//
// Thread-safety: not thread-safe; owned by one engine.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/kv_cache.h"
#include "engine/sequence.h"

namespace bitroll::engine {

struct SchedulerOptions {
  int32_t max_step_tokens = 512;  // rows per step; bounds step latency
  int32_t max_running = 256;      // sequences holding KV blocks at once
};

struct ScheduledChunk {
  Sequence* seq = nullptr;
  int32_t begin = 0;  // first position
  int32_t count = 0;  // rows
};

struct SchedulerStats {
  int64_t preemptions = 0;
};

class Scheduler {
 public:
  explicit Scheduler(const SchedulerOptions& options) : opt_(options) {}

  // Plans one step over `live` (unfinished sequences). Allocates the chunks' KV blocks from
  // `cache` and may preempt (release) running sequences. Returns chunks in `live` order.
  std::vector<ScheduledChunk> Plan(const std::vector<Sequence*>& live, KvCache* cache);

  // Releases every block of `seq` and marks it not running (preemption, finish, abort).
  static void ReleaseBlocks(Sequence* seq, KvCache* cache);

  const SchedulerStats& stats() const { return stats_; }

 private:
  // Makes sure seq's block table covers positions [0, end). False when blocks ran out.
  static bool Reserve(Sequence* seq, int32_t end, KvCache* cache);

  SchedulerOptions opt_;
  SchedulerStats stats_;
};

}  // namespace bitroll::engine
