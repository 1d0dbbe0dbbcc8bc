// rollout/group_table.h: the coordinator's groups and their samples (works): who owns a group,
// which samples are still live, the counts that decide when a group is done, and (with a WAL)
// the finished groups kept out of memory until their trajectories are acknowledged. Owned by
// the coordinator thread; it holds no socket and logs nothing, so its bookkeeping is testable
// alone (group_table_test.cc).
//
// Contract:
// - A group's key is its owner (OwnerOf in coordinator_state.h: "c" + client_id, or "r" +
//   connection) followed by its 8-byte group id; Find(owner, id) also answers, with a WAL, for
//   a group recovered without an owner (key owner empty), which any owner may name.
// - Every work belongs to exactly one live group and is in that group's `live` set until it is
//   taken (finished) or aborted; an aborted work counts in its group's `aborted`.
// - A group is done when every sample was delivered or aborted and no re-delivery runs.
// - `queued` counts works waiting for a replica (in the fair queue or held by the weights gate);
//   InFlight() = works - queued are dispatched or in the tool runner.
// - Park keeps a finished group's counts only while some trajectory is unacknowledged; Expire
//   hands back parked groups past the retention bound, oldest first.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "rollout/protocol.h"
#include "rollout/rate_meter.h"
#include "rollout/tool_call.h"
#include "schema/status.h"
#include "schema/vocab.h"

namespace bitroll::rollout {

struct GroupEntry {
  std::string client;        // routing id of the DEALER that gets its results (empty: detached)
  uint64_t client_seen = 0;  // ConnectionSeen(client) when it became the group's client
  std::string owner;         // OwnerOf() of the submitter; key = owner + group id
  std::string key;
  std::string buffer;  // the SubmitRollouts envelope, kept for building work items
  const wire::SubmitRollouts* submit = nullptr;  // points into buffer
  uint64_t group_id = 0;
  // The key that names its request to the replicas (replica protocol 3; the coordinator's, never
  // 0): each replica is sent the request once and keeps it under this key.
  uint64_t request_key = 0;
  uint32_t total = 0, delivered = 0, errors = 0, aborted = 0, acked = 0;
  std::unordered_set<uint64_t> live;  // work ids not yet finished
  Cost cost;
  // WAL mode only.
  uint64_t serial = 0;         // the group's serial in the WAL (trajectory id prefix)
  bool detached = false;       // no client: deliveries wait for a re-attach (same group id)
  bool group_pending = false;  // its AppendGroup record is not yet acknowledged
  uint32_t unheadered = 0;     // samples without a trajectory header yet
  std::map<uint32_t, std::string> sent;  // flat index -> delivered envelope (until Ack)
  // Re-delivery after a re-attach, paced by the client's output buffer (PumpRedelivery):
  // flats below `cursor` were re-sent; from_wal: a parked group brought back, whose
  // trajectories are read from the WAL instead of `sent`.
  bool redelivering = false;
  bool from_wal = false;
  uint32_t cursor = 0;
};

struct WorkEntry {
  uint64_t id = 0;
  GroupEntry* group = nullptr;
  uint32_t prompt_index = 0, sample_index = 0;
  uint64_t affinity = 0;  // prompt hash
  Clock::time_point enqueued;
  double queue_seconds = 0.0;
  int replica = -1;  // index into the ReplicaSet while dispatched
  // WAL mode only: the current turn's logged tokens, trajectory indexes [ctx_ids.size(), ...)
  // once its injected ids are in ctx_ids (re-dispatched as forced on resume / failover).
  bool header_logged = false;
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  uint32_t forced = 0;  // forced tokens of the current dispatch
  // Tool loop (coordinator_tools.cc). ctx_*: every token of the finished turns, sampled and
  // injected (the injected result of the current turn once the replica reported its ids):
  // ctx_ids[i] is trajectory token i, and ctx_versions begin at trajectory indexes
  // (docs/design.md "Token indexes").
  std::vector<int32_t> ctx_ids;
  std::vector<float> ctx_lps;
  std::vector<uint8_t> ctx_mask;
  std::vector<wire::VersionSpan> ctx_versions;
  int32_t turn = 1;         // the current model turn, 1-based
  uint32_t boundaries = 0;  // turn boundaries logged (injections applied)
  std::string inject;       // the current turn's result text until the replica's ids arrive
  std::vector<ToolOutcome> calls;
  bool tool_running = false;  // in the tool runner: neither queued nor dispatched
  Cost cost;                  // engine cost of the finished turns + sandbox cost
  // WAL recovery: the weights version of its last logged tokens; it is not dispatched while
  // the live version is older (0: no constraint; cleared once dispatched).
  uint64_t needs_version = 0;

  // Sampled tokens of the finished turns (mask 1 in ctx_mask): what max_tokens counts, since
  // injected tokens do not spend the budget.
  uint32_t SampledInContext() const {
    return static_cast<uint32_t>(std::count(ctx_mask.begin(), ctx_mask.end(), uint8_t{1}));
  }
};

// A finished WAL group out of memory (its trajectories are in the WAL until acknowledged): what
// a late Ack, a re-attach and the retention bound need. A re-submit of its id by its owner
// re-attaches to it; once every trajectory is acknowledged it is forgotten (the id is free).
struct ParkedGroup {
  uint64_t serial = 0, group_id = 0;
  uint64_t client_seen = 0;  // its last connection's ConnectionSeen (0: it had none, detached)
  uint32_t n = 0, total = 0, delivered = 0, errors = 0, aborted = 0, acked = 0;
  Cost cost;
  Clock::time_point since;
};

class GroupTable {
 public:
  using Group = GroupEntry;
  using Work = WorkEntry;

  // ---- groups ----

  static std::string Key(const std::string& owner, uint64_t group_id);
  // The owner part of a key.
  static std::string OwnerOfKey(const std::string& key);

  Group* Find(const std::string& key);
  // The live group `owner` names by `group_id`; with `recovered` (WAL mode) also one recovered
  // without an owner. Null when none; then `parked_key` (optional, WAL mode) gets the key of a
  // parked one, if any.
  Group* Find(const std::string& owner, uint64_t group_id, bool recovered,
              std::string* parked_key = nullptr);
  // A group from a verified SubmitRollouts envelope `request`; no samples yet.
  Group* Add(const std::string& client, uint64_t client_seen, const std::string& owner,
             const std::string& key, std::string_view request, uint64_t serial);
  // Every sample delivered or aborted, and no re-delivery running.
  static bool Done(const Group& g) { return g.delivered + g.aborted >= g.total && !g.redelivering; }
  // Counts a delivered trajectory.
  static void CountDelivered(Group* g, bool failed, int64_t wal_bytes);
  // Forgets a group (destroys it).
  void Remove(Group* g);
  // With a WAL: a finished group leaves memory; its counts are kept (parked) while some
  // trajectory is not acknowledged. Destroys g.
  void Park(Group* g, Clock::time_point now);
  size_t size() const { return groups_.size(); }
  // The live groups (for a pass over all of them; the table must not change meanwhile).
  std::vector<Group*> All();

  // ---- admission ----

  // Busy when `samples` more would pass `max_queued` samples pending.
  Status CheckRoom(uint64_t samples, uint64_t max_queued) const;

  // ---- works ----

  uint64_t NextWorkId() { return next_work_id_++; }
  // Adds `w` (its group set) to the table and to its group's live set.
  Work* AddWork(Work w);
  Work* FindWork(uint64_t id);
  // A finished work leaves the table and its group's live set.
  Work TakeWork(Work* w);
  // Removes every live work of `g`, counting each aborted; `on_abort` sees each one first.
  void AbortWorks(Group* g, const std::function<void(Work&)>& on_abort);
  size_t works() const { return works_.size(); }

  void CountQueued() { ++queued_; }
  void CountDequeued() { --queued_; }
  uint64_t queued() const { return queued_; }
  uint64_t InFlight() const { return works_.size() - queued_; }

  // ---- parked (WAL mode) ----

  ParkedGroup* FindParked(const std::string& key);
  // Takes a parked group back out (a re-attach).
  ParkedGroup TakeParked(const std::string& key);
  void ForgetParked(const std::string& key) { parked_.erase(key); }
  size_t parked() const { return parked_.size(); }

  struct Expired {
    ParkedGroup group;
    bool too_many = false;  // past max_groups (else: older than max_age)
  };
  // Removes and returns the parked groups past the bound: more than `max_groups`, or parked for
  // longer than `max_age` at `now`; oldest first.
  std::vector<Expired> Expire(Clock::time_point now, Clock::duration max_age, size_t max_groups);

 private:
  std::unordered_map<std::string, std::unique_ptr<Group>> groups_;
  std::unordered_map<uint64_t, Work> works_;
  uint64_t queued_ = 0;
  uint64_t next_work_id_ = 1;
  std::unordered_map<std::string, ParkedGroup> parked_;
  // Oldest first, lazily pruned: an entry whose `since` no longer matches is stale.
  std::deque<std::pair<Clock::time_point, std::string>> parked_order_;
};

}  // namespace bitroll::rollout
