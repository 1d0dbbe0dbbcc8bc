#include "engine/scheduler.h"

#include <algorithm>
#include <span>
#include <unordered_map>
#include <unordered_set>

namespace bitroll::engine {

void Scheduler::ReleaseBlocks(Sequence* seq, KvCache* cache) {
  for (int32_t b : seq->blocks) cache->Release(b);
  for (int32_t b : seq->sblocks) {
    if (b >= 0) cache->Release(b, KvPool::kSliding);
  }
  seq->blocks.clear();
  seq->sblocks.clear();
  seq->n_full_cached = 0;
  seq->swa_exact_from = 0;
  seq->n_cached = 0;
  seq->n_committed = 0;
  seq->running = false;
}

void Scheduler::Preempt(Sequence* seq) {
  ReleaseBlocks(seq, kv_);
  ++stats_.preemptions;
}

std::vector<Sequence*> Scheduler::Rank(const std::vector<Sequence*>& live) const {
  std::vector<Sequence*> by_arrival(live.begin(), live.end());
  std::sort(by_arrival.begin(), by_arrival.end(),
            [](const Sequence* a, const Sequence* b) { return a->arrival < b->arrival; });
  struct Key {
    Sequence* s;
    int32_t group_rank;
  };
  std::vector<Key> keys;
  keys.reserve(by_arrival.size());
  std::unordered_map<uint64_t, int32_t> members;
  for (Sequence* s : by_arrival) {
    const int32_t r = s->req.group_id == 0 ? 0 : members[s->req.group_id]++;
    keys.push_back({s, r});
  }
  std::stable_sort(keys.begin(), keys.end(), [](const Key& a, const Key& b) {
    if (a.s->req.priority != b.s->req.priority) return a.s->req.priority > b.s->req.priority;
    if (a.group_rank != b.group_rank) return a.group_rank < b.group_rank;
    return a.s->arrival < b.s->arrival;
  });
  std::vector<Sequence*> order;
  order.reserve(keys.size());
  for (const Key& k : keys) order.push_back(k.s);
  return order;
}

int32_t Scheduler::WindowFirstBlock(int32_t position) const {
  // The kernel reads every block holding a key >= position - W + 1 (whole chunks, and blocks are
  // whole chunks): block k is read when (k + 1) * bs >= position - W + 2.
  const int32_t bs = kv_->block_size();
  const int32_t edge = position - opt_.swa_window + 2;
  return edge <= 0 ? 0 : (edge + bs - 1) / bs - 1;
}

bool Scheduler::Reserve(Sequence* seq, int32_t begin, int32_t end) {
  const int32_t bs = kv_->block_size();
  // Copy-on-write: blocks this chunk writes must be private. Rows below n_full_cached rebuild
  // sliding state only: they leave the full layers' blocks alone.
  const int32_t held = static_cast<int32_t>(seq->blocks.size());
  const int32_t wbegin = std::max(begin, seq->n_full_cached);
  for (int32_t k = wbegin / bs; wbegin < end && k < held && k * bs < end; ++k) {
    const int32_t old = seq->blocks[k];
    if (kv_->RefCount(old) == 1) continue;
    Result<int32_t> fresh = prefix_->Allocate();
    if (!fresh.ok()) return false;  // copies made so far are valid private blocks: keep them
    kv_->CopyBlock(old, *fresh);
    kv_->Release(old);
    seq->blocks[k] = *fresh;
    ++stats_.cow_copies;
  }
  const int32_t need = (end + bs - 1) / bs;
  std::vector<int32_t> got;
  while (static_cast<int32_t>(seq->blocks.size() + got.size()) < need) {
    Result<int32_t> b = prefix_->Allocate();
    if (!b.ok()) {
      for (int32_t x : got) kv_->Release(x);
      return false;
    }
    got.push_back(*b);
  }
  if (kv_->split()) {
    // Every sliding block the rows read must be held (a rebuild's window before its start gets
    // scratch blocks: what they hold only reaches rows that are never used); written ones private.
    const size_t old_size = seq->sblocks.size();
    seq->sblocks.resize(std::max(old_size, static_cast<size_t>(need)), -1);
    std::vector<int32_t> fresh;  // indices filled here (undone on failure)
    bool ok = true;
    for (int32_t k = WindowFirstBlock(begin); k < need && ok; ++k) {
      const int32_t cur = seq->sblocks[k];
      if (cur >= 0 && (k < begin / bs || kv_->RefCount(cur, KvPool::kSliding) == 1)) continue;
      Result<int32_t> b = prefix_->Allocate(KvPool::kSliding);
      if (!b.ok()) {
        ok = false;
        break;
      }
      if (cur >= 0) {  // shared and written: copy-on-write (a valid private block: kept)
        kv_->CopyBlock(cur, *b, KvPool::kSliding);
        kv_->Release(cur, KvPool::kSliding);
        ++stats_.cow_copies;
      } else {
        fresh.push_back(k);
      }
      seq->sblocks[k] = *b;
    }
    if (!ok) {
      for (int32_t k : fresh) {
        kv_->Release(seq->sblocks[k], KvPool::kSliding);
        seq->sblocks[k] = -1;
      }
      seq->sblocks.resize(std::max(old_size, seq->blocks.size()));
      for (int32_t x : got) kv_->Release(x);
      return false;
    }
  }
  seq->blocks.insert(seq->blocks.end(), got.begin(), got.end());
  return true;
}

int32_t Scheduler::Align(const Sequence* s, int32_t want) const {
  const int32_t bs = kv_->block_size();
  int32_t count = std::min(s->pending(), want);
  if (count < s->pending() && count >= bs) {
    // A chunk that leaves rows for later ends on a block boundary (prefix-cache granularity).
    // Budgets under one block run unaligned chunks: alignment never changes numerics.
    count = (s->n_cached + count) / bs * bs - s->n_cached;
  }
  return count;
}

bool Scheduler::WaitForSibling(const Sequence* s, const std::vector<Sequence*>& order) const {
  if (s->req.group_id == 0 || !prefix_->enabled()) return false;
  for (const Sequence* t : order) {
    if (t == s || !t->running || t->req.group_id != s->req.group_id) continue;
    if (t->n_cached >= t->n_prompt || t->n_prompt != s->n_prompt) continue;
    if (std::equal(s->tokens.begin(), s->tokens.begin() + s->n_prompt, t->tokens.begin()))
      return true;
  }
  return false;
}

void Scheduler::Attach(Sequence* s, const std::vector<Sequence*>& order) {
  s->n_committed = 0;
  if (!prefix_->enabled()) return;
  const int32_t bs = kv_->block_size();
  const int32_t n_tokens = static_cast<int32_t>(s->tokens.size());
  // Rows [cap, ...) must run; the block holding row `cap` may still be shared (copy-on-write).
  int32_t cap = s->FirstLogitsRow();
  // A sequence recording its routes reuses only positions it has routed itself (routing.h).
  if (s->req.return_routing) cap = std::min(cap, s->n_routed);
  const size_t max_blocks = static_cast<size_t>(cap / bs + 1);
  const bool split = kv_->split();
  std::vector<int32_t> sliding;
  std::vector<int32_t> blocks =
      prefix_->Match(s->tokens, std::min<int32_t>(n_tokens, static_cast<int32_t>(max_blocks) * bs),
                     split ? &sliding : nullptr);
  while (blocks.size() > max_blocks) {
    kv_->Release(blocks.back());
    blocks.pop_back();
    if (split && sliding.back() >= 0) kv_->Release(sliding.back(), KvPool::kSliding);
    if (split) sliding.pop_back();
  }
  int32_t avail = static_cast<int32_t>(blocks.size()) * bs;  // positions with K/V
  const Sequence* best = nullptr;
  int32_t best_len = 0;
  if (s->req.group_id != 0) {
    for (const Sequence* t : order) {
      if (t == s || !t->running || t->req.group_id != s->req.group_id) continue;
      const int32_t lim = std::min(t->n_cached, n_tokens);
      int32_t len = 0;
      while (len < lim && s->tokens[len] == t->tokens[len]) ++len;
      if (std::min(len, cap) > std::min(std::max(avail, best_len), cap)) {
        best_len = len;
        best = t;
      }
      if (best_len >= cap) break;  // nothing can do better (large groups: stay linear)
    }
  }
  if (best != nullptr) {
    for (int32_t b : blocks) kv_->Release(b);
    for (int32_t b : sliding) {
      if (b >= 0) kv_->Release(b, KvPool::kSliding);
    }
    const size_t n = std::min(static_cast<size_t>((best_len + bs - 1) / bs), max_blocks);
    blocks.assign(best->blocks.begin(), best->blocks.begin() + n);
    for (int32_t b : blocks) kv_->Retain(b);
    sliding.assign(n, -1);
    for (size_t k = 0; split && k < n && k < best->sblocks.size(); ++k) {
      // Only the sibling's exact sliding blocks (not a rebuild's inexact stretch).
      if (best->sblocks[k] < 0 || static_cast<int32_t>(k) * bs < best->swa_exact_from) continue;
      sliding[k] = best->sblocks[k];
      kv_->Retain(sliding[k], KvPool::kSliding);
    }
    avail = best_len;
    stats_.group_shared_tokens += std::min(best_len, cap);
  }
  s->blocks = std::move(blocks);
  if (!split) {
    s->n_cached = std::min(avail, cap);
    return;
  }
  s->sblocks = std::move(sliding);
  s->sblocks.resize(s->blocks.size(), -1);
  ResumeSliding(s, std::min(avail, cap));
}

void Scheduler::ResumeSliding(Sequence* s, int32_t n) {
  const int32_t bs = kv_->block_size();
  const int32_t w = opt_.swa_window;
  // True when every sliding block a row at p reads before p is held.
  auto window_held = [&](int32_t p) {
    for (int32_t k = WindowFirstBlock(p); k * bs < p; ++k) {
      if (k >= static_cast<int32_t>(s->sblocks.size()) || s->sblocks[k] < 0) return false;
    }
    return true;
  };
  int32_t r = 0;
  if (window_held(n)) {
    r = n;
  } else {
    for (int32_t p = n / bs * bs; p > 0; p -= bs) {
      if (window_held(p)) {
        r = p;
        break;
      }
    }
  }
  int32_t rebuild = std::max(0, n - opt_.swa_layers * (w - 1));
  if (opt_.test_late_rebuild && rebuild > 0) {
    rebuild += 1;  // the broken variant: one token past the exact bound
  } else {
    rebuild = rebuild / bs * bs;
  }
  const int32_t start = std::max(r, rebuild);
  s->swa_exact_from = rebuild > r ? start + opt_.swa_layers * (w - 1) : 0;
  // Keep the sliding blocks the rows from `start` read before it; the rest is released (blocks
  // wholly at or after `start` are written again into fresh blocks).
  const int32_t first = WindowFirstBlock(start);
  for (int32_t k = 0; k < static_cast<int32_t>(s->sblocks.size()); ++k) {
    if (s->sblocks[k] < 0 || (k >= first && k * bs < start)) continue;
    kv_->Release(s->sblocks[k], KvPool::kSliding);
    s->sblocks[k] = -1;
  }
  s->n_cached = start;
  s->n_full_cached = n;
  if (n > start) {
    ++stats_.swa_rebuilds;
    stats_.swa_recomputed_tokens += n - start;
  }
}

std::vector<ScheduledChunk> Scheduler::Plan(const std::vector<Sequence*>& live) {
  ++steps_;
  const std::vector<Sequence*> order = Rank(live);
  std::vector<ScheduledChunk> chunks;
  std::unordered_set<const Sequence*> planned;
  int32_t budget = opt_.max_step_tokens;

  // Lowest-ranked running sequence not yet planned, ranked at or below `floor` (nullptr: any).
  auto victim_below = [&](const Sequence* floor) -> Sequence* {
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      Sequence* v = *it;
      if (v->running && planned.count(v) == 0) return v;
      if (v == floor) break;
    }
    return nullptr;
  };

  // 0. test hook
  if (opt_.preempt_every_steps > 0 && steps_ % opt_.preempt_every_steps == 0) {
    std::vector<Sequence*> running;
    for (Sequence* s : order) {
      if (s->running) running.push_back(s);
    }
    if (!running.empty()) {
      Sequence* v = running[(steps_ / opt_.preempt_every_steps) % running.size()];
      Preempt(v);
      planned.insert(v);
      ++stats_.forced_preemptions;
    }
  }

  // 1. decodes
  for (Sequence* s : order) {
    if (budget == 0) break;
    if (!s->running || s->pending() != 1) continue;
    bool ok;
    while (!(ok = Reserve(s, s->n_cached, s->n_cached + 1))) {
      Sequence* v = victim_below(nullptr);
      if (v == nullptr) break;
      Preempt(v);
      planned.insert(v);  // not re-admitted in the step that preempted it
      if (v == s) break;
    }
    if (!ok || !s->running || planned.count(s) != 0) continue;
    chunks.push_back({s, s->n_cached, 1});
    planned.insert(s);
    --budget;
  }
  const size_t n_decodes = chunks.size();

  // 2. prefill round one: running first, then waiting
  int64_t running =
      std::count_if(order.begin(), order.end(), [](Sequence* s) { return s->running; });
  for (int pass = 0; pass < 2 && budget > 0; ++pass) {
    for (Sequence* s : order) {
      if (budget == 0) break;
      if (planned.count(s) != 0) continue;
      if (pass == 0 && (!s->running || s->pending() <= 0)) continue;
      if (pass == 1) {
        if (s->running || running >= opt_.max_running || WaitForSibling(s, order)) continue;
        Attach(s, order);
      }
      const int32_t count = Align(s, std::min(opt_.max_prefill_chunk, budget));
      bool ok = count > 0 && Reserve(s, s->n_cached, s->n_cached + count);
      while (!ok && count > 0 && pass == 0) {
        // Running prefills must not deadlock holding every block: lower-ranked ones yield.
        Sequence* v = victim_below(s);
        if (v == nullptr || v == s) break;
        Preempt(v);
        planned.insert(v);
        ok = Reserve(s, s->n_cached, s->n_cached + count);
      }
      if (!ok) {
        if (pass == 1) {
          ReleaseBlocks(s, kv_);
          if (count > 0) break;  // no room for new work this step
        }
        continue;
      }
      if (pass == 1) {
        s->running = true;
        ++running;
        s->cost.prefill_cached += s->n_cached;
        stats_.prefill_tokens_cached += s->n_cached;
      }
      chunks.push_back({s, s->n_cached, count});
      planned.insert(s);
      budget -= count;
    }
  }

  // 3. prefill round two: the rest of the budget extends round-one chunks, in rank order
  for (size_t i = n_decodes; i < chunks.size() && budget > 0; ++i) {
    ScheduledChunk& c = chunks[i];
    Sequence* s = c.seq;
    const int32_t count = Align(s, c.count + budget);
    if (count <= c.count || !Reserve(s, c.begin + c.count, c.begin + count)) continue;
    budget -= count - c.count;
    c.count = count;
  }
  return chunks;
}

void Scheduler::Commit(Sequence* s) {
  if (!s->running) return;
  s->n_full_cached = std::max(s->n_full_cached, s->n_cached);
  const int32_t bs = kv_->block_size();
  const bool split = kv_->split();
  if (prefix_->enabled()) {
    const int32_t full =
        std::min<int32_t>(s->n_cached / bs, static_cast<int32_t>(s->blocks.size()));
    const std::span<const int32_t> tokens(s->tokens);
    while (s->n_committed < full) {
      const int32_t k = s->n_committed;
      const std::span<const int32_t> bt = tokens.subspan(static_cast<size_t>(k) * bs, bs);
      if (static_cast<int32_t>(s->block_hashes.size()) <= k) {
        const uint64_t parent = k == 0 ? prefix_->seed() : s->block_hashes[k - 1];
        s->block_hashes.push_back(PrefixCache::ChainHash(parent, bt));
      }
      const int32_t sliding =
          split && k * bs >= s->swa_exact_from && k < static_cast<int32_t>(s->sblocks.size())
              ? s->sblocks[k]
              : -1;
      prefix_->Insert(s->block_hashes[k], bt, s->blocks[k], k, sliding);
      ++s->n_committed;
    }
  }
  if (!split) return;
  // Sliding blocks no row from n_cached on reads go back to the pool (the prefix cache keeps its
  // own reference on the ones its policy stores).
  const int32_t first = WindowFirstBlock(s->n_cached);
  for (int32_t k = 0; k < first && k < static_cast<int32_t>(s->sblocks.size()); ++k) {
    if (s->sblocks[k] < 0) continue;
    kv_->Release(s->sblocks[k], KvPool::kSliding);
    s->sblocks[k] = -1;
  }
}

}  // namespace bitroll::engine
