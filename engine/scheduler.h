// engine/scheduler.h: continuous batching. Plans which rows of which sequences run in one step.
//
// Order. Live sequences are ranked by (priority desc, rank in group asc, arrival asc), where a
// sequence's rank in group is the number of earlier-arrived live members of its group (group_id
// 0: every request is its own group). Groups of equal priority are thus served round-robin: the
// k-th member of a huge group comes after the first k members of every other group, so one big
// GRPO group cannot starve a small one.
//
// Policy, in order:
//   0. Test hook: every `preempt_every_steps` steps one running sequence is preempted.
//   1. Running sequences that need exactly one row (decode) each get it, in rank order. A decode
//      that needs a KV block and finds none preempts the lowest-ranked running sequence not yet
//      planned (possibly itself).
//   2. Prefill, round one: running sequences with pending rows, then waiting ones (admitted while
//      fewer than max_running run), each get at most max_prefill_chunk rows, so a short prompt
//      gets in beside a long prefill. A running prefill that finds no block preempts lower-ranked
//      unplanned sequences, so prefills holding every block never deadlock: the top-ranked one
//      always advances (the pool holds at least one full-context sequence).
//   3. Prefill, round two: what is left of the token budget extends round-one chunks in order.
//   A chunk that does not finish a sequence's pending rows ends on a KV-block boundary.
//
// Admission reuses K/V: the longest chain of prefix-cache blocks (prefix_cache.h), or, when
// longer, the blocks of a running member of the same group that already computed the common
// prefix (GRPO: the n samples of a prompt share its blocks, including the partial last block).
// While a group member is still prefilling the group's prompt, its siblings wait for it, so the
// prompt is prefilled once. A hit covers at most FirstLogitsRow() positions: the row that must
// produce logits always runs.
//
// Copy-on-write: before a chunk runs, every block it writes that has more than one reference
// (shared with a sibling, or named by the prefix cache) is copied into a fresh block. Shared K/V
// is therefore never overwritten, and writes go only to private blocks. (The alternative, never
// sharing the block that holds the last prompt token, would make every GRPO sample recompute up
// to a block of prompt; copy-on-write costs one block copy per sample instead.)
//
// Preemption releases a sequence's blocks; it returns to the queue and is re-admitted through the
// same prefix lookup, so its full blocks usually hit the cache and only the tail is recomputed.
// Recompute reproduces the same K/V bits, so the continuation is unchanged.
//
// Sliding-window layers (a KvCache with a sliding pool): a sequence also holds a sliding block
// table (Sequence::sblocks). Reserve() makes valid every sliding block the chunk's rows read (their
// windows) and private every one they write; after each step Commit() releases the sliding blocks
// that no window of a later row reads (block k once (k + 1) * block_size <= n_cached - W + 1, W
// the widest window), so a long sequence holds about W tokens of sliding K/V. A hit of n tokens
// (prefix cache or sibling) resumes the sliding state at the larger of
//   r: the largest block boundary (or n) <= n whose window's sliding blocks are all held, and
//   s: max(0, n - L * (W - 1)) rounded down to a block (L sliding layers), started without the
//      window before it: the sliding K/V of the l-th sliding layer is exact from s + (l - 1) *
//      (W - 1) on, so every window that a row at n or later reads is exact;
// rows [start, n) then run with the full layers reading the cached blocks, not writing them
// (ForwardRow::write_full_kv), and count in SchedulerStats::swa_recomputed_tokens. Sliding blocks
// of a rebuild's inexact stretch are never offered to the prefix cache (Sequence::swa_exact_from).
//
// Scheduling never changes a bit of any sequence: it only chooses which rows run when, and where
// their K/V lives.
//
// Thread-safety: not thread-safe; owned by one engine.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/kv_cache.h"
#include "engine/prefix_cache.h"
#include "engine/sequence.h"

namespace bitroll::engine {

struct SchedulerOptions {
  int32_t max_step_tokens = 512;    // rows per step; bounds step latency
  int32_t max_running = 256;        // sequences holding KV blocks at once
  int32_t max_prefill_chunk = 256;  // rows per sequence in prefill round one; smaller lets short
                                    // prompts in sooner beside long ones, larger favours one long
                                    // prefill (round two hands out the rest of the budget anyway)
  int32_t preempt_every_steps = 0;  // test hook: > 0 preempts one running sequence every that
                                    // many steps (exercises recompute); 0 in production
  int32_t swa_window = 0;           // a split cache: the widest sliding window
  int32_t swa_layers = 0;           // a split cache: the number of sliding layers
  // Test hook (BITROLL_TEST_BREAK_INVARIANCE=late_rebuild): a rebuild starts one token after
  // n - L * (W - 1) instead of at or before it. false in production.
  bool test_late_rebuild = false;
};

struct ScheduledChunk {
  Sequence* seq = nullptr;
  int32_t begin = 0;  // first position
  int32_t count = 0;  // rows
};

struct SchedulerStats {
  int64_t preemptions = 0;            // includes forced ones
  int64_t forced_preemptions = 0;     // by preempt_every_steps
  int64_t cow_copies = 0;             // shared blocks copied before a write
  int64_t prefill_tokens_cached = 0;  // positions admitted with K/V already present
  int64_t group_shared_tokens = 0;    // of those, taken from a running sibling's blocks
  int64_t swa_rebuilds = 0;           // hits that resumed the sliding state before the hit's end
  int64_t swa_recomputed_tokens = 0;  // rows those hits ran again for the sliding layers
};

class Scheduler {
 public:
  // `cache` and `prefix` must outlive the scheduler.
  Scheduler(const SchedulerOptions& options, KvCache* cache, PrefixCache* prefix)
      : opt_(options), kv_(cache), prefix_(prefix) {}

  // Plans one step over `live` (unfinished sequences). Allocates and copies the chunks' KV blocks
  // and may preempt running sequences. Returns chunks in planning order.
  std::vector<ScheduledChunk> Plan(const std::vector<Sequence*>& live);

  // After a step ran: offers the sequence's newly full blocks to the prefix cache and releases
  // the sliding blocks no later window reads.
  // REQUIRES: seq->n_cached was advanced past the rows that ran.
  void Commit(Sequence* seq);

  // Releases every block of `seq` (both pools) and marks it not running (preemption, finish,
  // abort).
  static void ReleaseBlocks(Sequence* seq, KvCache* cache);

  const SchedulerStats& stats() const { return stats_; }

 private:
  // Live sequences in rank order (see the header comment).
  std::vector<Sequence*> Rank(const std::vector<Sequence*>& live) const;
  // Makes seq's block table cover [0, end) and copies shared blocks written by [begin, end).
  // False when blocks ran out (blocks allocated by this call are returned).
  bool Reserve(Sequence* seq, int32_t begin, int32_t end);
  // Rows of a chunk of at most `want` rows from seq->n_cached (block-aligned unless it finishes).
  int32_t Align(const Sequence* seq, int32_t want) const;
  // Gives a waiting sequence its cached prefix (prefix cache or a running sibling).
  void Attach(Sequence* seq, const std::vector<Sequence*>& order);
  // True while a running member of seq's group is still prefilling the same prompt.
  bool WaitForSibling(const Sequence* seq, const std::vector<Sequence*>& order) const;
  void Preempt(Sequence* seq);
  // A split cache: chooses where the sliding state of a sequence given n cached positions resumes
  // (see the header comment) and sets n_cached, n_full_cached and its sliding table.
  void ResumeSliding(Sequence* seq, int32_t n);
  // The first block a row at `position` reads in a sliding layer.
  int32_t WindowFirstBlock(int32_t position) const;

  SchedulerOptions opt_;
  KvCache* kv_;
  PrefixCache* prefix_;
  uint64_t steps_ = 0;
  SchedulerStats stats_;
};

}  // namespace bitroll::engine
