// Internal to sandbox/: the pre-warmed helpers of the process and container tiers
// (SandboxOptions::prewarm) and the run slots they share with cold runs.
//
// Contract: a tier's pool fills from its first use on (PoolStart, called once the tier's probe
// run succeeded), from one refill thread, so that every parked helper's parent thread (its
// PR_SET_PDEATHSIG anchor) lives until the Sandbox is destroyed. A parked helper holds a slot
// (uid), an empty workdir and a cgroup with default limits; it serves exactly one run
// (PoolTake hands it out, the run reaps it). Dead parked helpers are dropped when found (at take
// and on each refill pass) and replaced. Parked helpers never keep a cold run from a slot: the
// refill thread only takes a slot when no cold run waits, and a waiting cold run evicts one.
// PoolShutdown (the Sandbox's destructor) stops the thread, kills and reaps every parked helper.
//
// Thread-safety: WarmPool::mu guards the pool; slot_mu the slots. Never both held in the order
// slot_mu -> mu.
#include <chrono>
#include <utility>

#include "sandbox/sandbox_internal.h"

namespace bitroll::sandbox {
namespace {

int TierIndex(Tier tier) {
  return tier == Tier::kContainer ? 1 : 0;
}

uint32_t Target(const SandboxOptions& o, int t) {
  return t == 0 ? o.prewarm.process : o.prewarm.container;
}

}  // namespace

RunSlot::~RunSlot() {
  cgroup.reset();  // kills what is left in it, removes it
  wd.reset();
  if (release) release(slot);
}

uint32_t Sandbox::Impl::AcquireSlot() {
  std::unique_lock<std::mutex> lock(slot_mu);
  ++slot_waiters;
  for (;;) {
    for (size_t i = 0; i < slot_used.size(); ++i) {
      if (!slot_used[i]) {
        slot_used[i] = true;
        --slot_waiters;
        return static_cast<uint32_t>(i);
      }
    }
    lock.unlock();
    const bool evicted = PoolEvictOne();
    lock.lock();
    // Every slot busy with a run: wait for one to end (re-checking for parked helpers, which
    // the refill thread may have made before this call registered as a waiter).
    if (!evicted) slot_cv.wait_for(lock, std::chrono::milliseconds(20));
  }
}

bool Sandbox::Impl::TryAcquireSlotForPool(uint32_t* slot) {
  std::lock_guard<std::mutex> lock(slot_mu);
  if (slot_waiters > 0) return false;
  for (size_t i = 0; i < slot_used.size(); ++i) {
    if (!slot_used[i]) {
      slot_used[i] = true;
      *slot = static_cast<uint32_t>(i);
      return true;
    }
  }
  return false;
}

void Sandbox::Impl::ReleaseSlot(uint32_t s) {
  {
    std::lock_guard<std::mutex> lock(slot_mu);
    slot_used[s] = false;
  }
  slot_cv.notify_one();
  warm.cv.notify_all();  // the refill thread may use it
}

void Sandbox::Impl::PoolCount(Tier tier, uint64_t PoolStats::*counter) {
  std::lock_guard<std::mutex> lock(warm.mu);
  ++(warm.stats[TierIndex(tier)].*counter);
}

void Sandbox::Impl::PoolStart(Tier tier) {
  const int t = TierIndex(tier);
  if (Target(opt, t) == 0) return;
  std::lock_guard<std::mutex> lock(warm.mu);
  if (warm.started[t] || warm.stop) return;
  warm.started[t] = true;
  if (!warm.thread.joinable()) warm.thread = std::thread([this] { PoolLoop(); });
  warm.cv.notify_all();
}

std::unique_ptr<Parked> Sandbox::Impl::PoolTake(const Request& req) {
  const int t = TierIndex(req.tier);
  // Process-tier helpers were parked inside a private network namespace: a run with the network
  // on needs a cold helper. (Container helpers leave the network to bwrap: they serve both.)
  if (req.tier == Tier::kProcess && req.limits.allow_network) return nullptr;
  std::vector<std::unique_ptr<Parked>> dead;
  std::unique_ptr<Parked> taken;
  {
    std::lock_guard<std::mutex> lock(warm.mu);
    auto& q = warm.parked[t];
    while (!q.empty()) {
      std::unique_ptr<Parked> p = std::move(q.front());
      q.pop_front();
      if (ParkedAlive(p->helper)) {
        taken = std::move(p);
        break;
      }
      ++warm.stats[t].lost;
      dead.push_back(std::move(p));
    }
    warm.stats[t].parked = static_cast<uint32_t>(q.size());
  }
  warm.cv.notify_all();  // refill
  return taken;          // `dead` is reaped and its slots freed here, outside the lock
}

bool Sandbox::Impl::PoolEvictOne() {
  std::unique_ptr<Parked> victim;
  {
    std::lock_guard<std::mutex> lock(warm.mu);
    const int t = warm.parked[1].size() > warm.parked[0].size() ? 1 : 0;
    if (warm.parked[t].empty()) return false;
    victim = std::move(warm.parked[t].back());
    warm.parked[t].pop_back();
    ++warm.stats[t].evicted;
    warm.stats[t].parked = static_cast<uint32_t>(warm.parked[t].size());
  }
  victim.reset();  // kills and reaps the helper, frees the slot
  return true;
}

std::unique_ptr<Parked> Sandbox::Impl::MakeParked(int t, uint32_t slot) {
  auto p = std::make_unique<Parked>();
  p->rs.release = [this](uint32_t s) { ReleaseSlot(s); };
  p->rs.slot = slot;
  p->rs.uid = opt.uid_base + slot;
  auto wd = Workdir::Create(work_root, p->rs.uid, p->rs.uid, {}, opt.work_disk_bytes);
  if (!wd.ok()) return nullptr;
  p->rs.wd = std::move(wd).value();
  if (cg.version > 0) {
    const Limits defaults;
    auto c = RunCgroup::Create(cg, RunName(), defaults.memory_bytes, defaults.max_processes);
    if (!c.ok()) return nullptr;
    p->rs.cgroup = std::move(c).value();
  }
  std::vector<std::string> argv = {helper, "park"};
  std::vector<std::string> sa = SlotArgs(p->rs, /*netns=*/t == 0);
  argv.insert(argv.end(), sa.begin(), sa.end());
  if (!SpawnParked(argv, &p->helper).empty()) return nullptr;
  return p;
}

void Sandbox::Impl::PoolLoop() {
  std::unique_lock<std::mutex> lock(warm.mu);
  int failures = 0;
  while (!warm.stop) {
    // Drop parked helpers that died (killed from outside); they are replaced below.
    std::vector<std::unique_ptr<Parked>> dead;
    for (int t = 0; t < 2; ++t) {
      auto& q = warm.parked[t];
      for (auto it = q.begin(); it != q.end();) {
        if (ParkedAlive((*it)->helper)) {
          ++it;
        } else {
          ++warm.stats[t].lost;
          dead.push_back(std::move(*it));
          it = q.erase(it);
        }
      }
      warm.stats[t].parked = static_cast<uint32_t>(q.size());
    }
    if (!dead.empty()) {
      lock.unlock();
      dead.clear();
      lock.lock();
      continue;
    }
    int need = -1;
    for (int t = 0; t < 2 && need < 0; ++t) {
      if (warm.started[t] && warm.parked[t].size() < Target(opt, t)) need = t;
    }
    uint32_t slot = 0;
    if (need < 0 || !TryAcquireSlotForPool(&slot)) {
      warm.cv.wait_for(lock, std::chrono::milliseconds(need < 0 ? 200 : 20));
      continue;
    }
    lock.unlock();
    std::unique_ptr<Parked> p = MakeParked(need, slot);  // frees the slot on failure
    lock.lock();
    if (p == nullptr) {
      // Cannot make one (out of processes, disk, ...): back off, cold runs still work.
      failures = std::min(failures + 1, 10);
      warm.cv.wait_for(lock, std::chrono::milliseconds(10 << failures));
      continue;
    }
    failures = 0;
    warm.parked[need].push_back(std::move(p));
    warm.stats[need].parked = static_cast<uint32_t>(warm.parked[need].size());
  }
}

void Sandbox::Impl::PoolShutdown() {
  std::deque<std::unique_ptr<Parked>> all[2];
  {
    std::lock_guard<std::mutex> lock(warm.mu);
    warm.stop = true;
  }
  warm.cv.notify_all();
  if (warm.thread.joinable()) warm.thread.join();
  {
    std::lock_guard<std::mutex> lock(warm.mu);
    for (int t = 0; t < 2; ++t) {
      all[t].swap(warm.parked[t]);
      warm.stats[t].parked = 0;
    }
  }
  // ~Parked: SIGKILL, reap, remove workdir and cgroup, free the slot.
}

}  // namespace bitroll::sandbox
