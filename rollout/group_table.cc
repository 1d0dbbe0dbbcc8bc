// GroupTable (rollout/group_table.h): groups, works and parked groups.
#include "rollout/group_table.h"

#include <algorithm>

namespace bitroll::rollout {

std::string GroupTable::Key(const std::string& owner, uint64_t group_id) {
  std::string key = owner;
  key.append(reinterpret_cast<const char*>(&group_id), sizeof(group_id));
  return key;
}

std::string GroupTable::OwnerOfKey(const std::string& key) {
  return key.substr(0, key.size() - std::min(key.size(), sizeof(uint64_t)));
}

GroupTable::Group* GroupTable::Find(const std::string& key) {
  auto it = groups_.find(key);
  return it == groups_.end() ? nullptr : it->second.get();
}

GroupTable::Group* GroupTable::Find(const std::string& owner, uint64_t group_id, bool recovered,
                                    std::string* parked_key) {
  // A group recovered from the WAL without a client_id (an anonymous or pre-owner submitter,
  // whose connection did not survive the restart) answers to any owner: its key has no owner.
  for (const std::string& o : {owner, std::string()}) {
    const std::string key = Key(o, group_id);
    if (Group* g = Find(key)) return g;
    if (parked_key != nullptr && recovered && parked_.count(key) != 0) {
      *parked_key = key;
      return nullptr;
    }
    if (!recovered) break;
  }
  return nullptr;
}

GroupTable::Group* GroupTable::Add(const std::string& client, uint64_t client_seen,
                                   const std::string& owner, const std::string& key,
                                   std::string_view request, uint64_t serial) {
  auto g = std::make_unique<Group>();
  g->client = client;
  g->client_seen = client_seen;
  g->owner = owner;
  g->detached = client.empty();
  g->key = key;
  g->buffer.assign(request.data(), request.size());  // heap: malloc-aligned
  g->submit = wire::GetEnvelope(g->buffer.data())->msg_as_SubmitRollouts();
  g->group_id = g->submit->group_id();
  g->total = g->submit->prompts()->size() * g->submit->n();
  g->serial = serial;
  Group* raw = g.get();
  groups_.emplace(key, std::move(g));
  return raw;
}

void GroupTable::CountDelivered(Group* g, bool failed, int64_t wal_bytes) {
  ++g->delivered;
  if (failed) ++g->errors;
  g->cost.wal_bytes += wal_bytes;
}

void GroupTable::Remove(Group* g) {
  groups_.erase(g->key);
}

void GroupTable::Park(Group* g, Clock::time_point now) {
  const std::string key = g->key;
  if (g->acked + g->aborted < g->total) {
    ParkedGroup& p = parked_[key];
    p.serial = g->serial;
    p.group_id = g->group_id;
    p.client_seen = g->client.empty() ? 0 : g->client_seen;
    p.n = g->submit->n();
    p.total = g->total;
    p.delivered = g->delivered;
    p.errors = g->errors;
    p.aborted = g->aborted;
    p.acked = g->acked;
    p.cost = g->cost;
    p.since = now;
    parked_order_.emplace_back(p.since, key);
  }
  groups_.erase(key);  // destroys g
}

std::vector<GroupTable::Group*> GroupTable::All() {
  std::vector<Group*> all;
  all.reserve(groups_.size());
  for (auto& [key, g] : groups_) all.push_back(g.get());
  return all;
}

Status GroupTable::CheckRoom(uint64_t samples, uint64_t max_queued) const {
  if (works_.size() + samples > max_queued) {
    return Status::Busy("coordinator queue is full (" + std::to_string(works_.size()) +
                        " samples pending, limit " + std::to_string(max_queued) + "); retry later");
  }
  return Status::Ok();
}

GroupTable::Work* GroupTable::AddWork(Work w) {
  w.group->live.insert(w.id);
  const uint64_t id = w.id;
  auto [it, inserted] = works_.emplace(id, std::move(w));
  return &it->second;
}

GroupTable::Work* GroupTable::FindWork(uint64_t id) {
  auto it = works_.find(id);
  return it == works_.end() ? nullptr : &it->second;
}

GroupTable::Work GroupTable::TakeWork(Work* w) {
  auto it = works_.find(w->id);
  Work out = std::move(it->second);
  works_.erase(it);
  out.group->live.erase(out.id);
  return out;
}

void GroupTable::AbortWorks(Group* g, const std::function<void(Work&)>& on_abort) {
  for (uint64_t id : g->live) {
    auto it = works_.find(id);
    if (it == works_.end()) continue;
    on_abort(it->second);
    works_.erase(it);
    ++g->aborted;
  }
  g->live.clear();
}

ParkedGroup* GroupTable::FindParked(const std::string& key) {
  auto it = parked_.find(key);
  return it == parked_.end() ? nullptr : &it->second;
}

ParkedGroup GroupTable::TakeParked(const std::string& key) {
  const ParkedGroup p = parked_[key];
  parked_.erase(key);
  return p;
}

std::vector<GroupTable::Expired> GroupTable::Expire(Clock::time_point now, Clock::duration max_age,
                                                    size_t max_groups) {
  std::vector<Expired> out;
  while (!parked_order_.empty()) {
    const auto [since, key] = parked_order_.front();
    auto it = parked_.find(key);
    if (it == parked_.end() || it->second.since != since) {  // re-attached or acknowledged
      parked_order_.pop_front();
      continue;
    }
    const bool too_many = parked_.size() > max_groups;
    if (!too_many && now - since <= max_age) break;
    out.push_back({it->second, too_many});
    parked_.erase(it);
    parked_order_.pop_front();
  }
  if (parked_order_.size() > 2 * parked_.size() + 1024) {  // drop stale entries
    std::erase_if(parked_order_, [&](const auto& e) {
      auto it = parked_.find(e.second);
      return it == parked_.end() || it->second.since != e.first;
    });
  }
  return out;
}

}  // namespace bitroll::rollout
