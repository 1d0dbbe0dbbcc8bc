#include "engine/scheduler.h"

#include <algorithm>

namespace bitroll::engine {

namespace {

// Higher priority first, then earlier arrival.
bool Before(const Sequence* a, const Sequence* b) {
  if (a->req.priority != b->req.priority) return a->req.priority > b->req.priority;
  return a->arrival < b->arrival;
}

}  // namespace

void Scheduler::ReleaseBlocks(Sequence* seq, KvCache* cache) {
  for (int32_t b : seq->blocks) cache->Release(b);
  seq->blocks.clear();
  seq->n_cached = 0;
  seq->running = false;
}

bool Scheduler::Reserve(Sequence* seq, int32_t end, KvCache* cache) {
  const int32_t bs = cache->block_size();
  const int32_t need = (end + bs - 1) / bs;
  std::vector<int32_t> got;
  while (static_cast<int32_t>(seq->blocks.size() + got.size()) < need) {
    Result<int32_t> b = cache->Allocate();
    if (!b.ok()) {
      for (int32_t x : got) cache->Release(x);
      return false;
    }
    got.push_back(*b);
  }
  seq->blocks.insert(seq->blocks.end(), got.begin(), got.end());
  return true;
}

std::vector<ScheduledChunk> Scheduler::Plan(const std::vector<Sequence*>& live, KvCache* cache) {
  std::vector<Sequence*> order(live.begin(), live.end());
  std::stable_sort(order.begin(), order.end(), Before);
  int32_t budget = opt_.max_step_tokens;
  std::vector<ScheduledChunk> chunks;
  std::vector<Sequence*> planned;

  // 1. decodes
  for (Sequence* s : order) {
    if (!s->running || s->pending() != 1 || budget == 0) continue;
    while (!Reserve(s, s->n_cached + 1, cache)) {
      // Preempt the lowest-priority, latest-arrived running sequence not yet planned.
      Sequence* victim = nullptr;
      for (auto it = order.rbegin(); it != order.rend(); ++it) {
        Sequence* v = *it;
        if (v->running && std::find(planned.begin(), planned.end(), v) == planned.end()) {
          victim = v;
          break;
        }
      }
      if (victim == nullptr) break;
      ReleaseBlocks(victim, cache);
      ++stats_.preemptions;
      if (victim == s) break;
    }
    if (!s->running) continue;  // preempted itself
    chunks.push_back({s, s->n_cached, 1});
    planned.push_back(s);
    --budget;
  }

  // 2. prefill chunks: running first, then waiting
  int64_t running = std::count_if(order.begin(), order.end(), [](Sequence* s) { return s->running; });
  const int32_t bs = cache->block_size();
  for (int pass = 0; pass < 2 && budget > 0; ++pass) {
    for (Sequence* s : order) {
      if (budget == 0) break;
      if (std::find(planned.begin(), planned.end(), s) != planned.end()) continue;
      if (pass == 0 && (!s->running || s->pending() <= 0)) continue;
      if (pass == 1) {
        if (s->running || running >= opt_.max_running) continue;
      }
      int32_t count = std::min(s->pending(), budget);
      if (count < s->pending() && count >= bs) {
        // A chunk that leaves rows for later ends on a block boundary (prefix-cache granularity).
        // Budgets under one block run unaligned chunks: alignment never changes numerics.
        count = (s->n_cached + count) / bs * bs - s->n_cached;
        if (count <= 0) continue;
      }
      if (!Reserve(s, s->n_cached + count, cache)) {
        if (pass == 1) break;  // no room for new work this step
        continue;
      }
      if (!s->running) {
        s->running = true;
        ++running;
      }
      chunks.push_back({s, s->n_cached, count});
      planned.push_back(s);
      budget -= count;
    }
  }
  return chunks;
}

}  // namespace bitroll::engine
