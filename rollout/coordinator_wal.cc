// The coordinator's write-ahead log readers: durable delivery, re-attach, Acks, recovery, and
// the report of a WAL failure. What is logged when: rollout/coordinator_journal.{h,cc}.
#include "rollout/coordinator_state.h"

namespace bitroll::rollout {

void Coordinator::State::ReportWalError(const Status& s) {
  if (options.metrics) options.metrics->SetWalFailed(s.ToString());
  for (Group* g : table.All()) {
    if (!g->client.empty()) {
      SendError(g->client, 0, s.WithContext("WAL failed; results not yet durable are held"),
                g->group_id);
    }
  }
}

void Coordinator::State::Deliver(Group* g, uint32_t flat, std::string envelope, bool failed,
                                 int64_t wal_bytes) {
  GroupTable::CountDelivered(g, failed, wal_bytes);
  // While a re-attach re-sends the group, trajectories at or past its cursor go out with it.
  const bool now = !g->client.empty() && !(g->redelivering && flat >= g->cursor);
  if (now) SendClient(g->client, envelope);
  g->sent[flat] = std::move(envelope);
  if (!recovering) FinishGroupIfDone(g);
}

void Coordinator::State::Reattach(Group* g, const std::string& client) {
  spdlog::info("coordinator: client re-attached to group={} ({} of {} delivered)", g->group_id,
               g->delivered, g->total);
  g->client = client;
  g->client_seen = ConnectionSeen(client);
  g->detached = false;
  g->redelivering = true;
  g->cursor = 0;
  redelivering.insert(g->key);
  PumpRedelivery();
}

void Coordinator::State::ReattachParked(const std::string& key, const std::string& client) {
  const Parked p = table.TakeParked(key);
  std::string request;  // the group's request, from any of its logged trajectories
  for (uint32_t flat = 0; flat < p.total && request.empty(); ++flat) {
    if (!wal()->Known(WalTrajId(p.serial, flat))) continue;
    auto log = wal()->Read(WalTrajId(p.serial, flat));
    if (log.ok()) request = std::move(log->header.request);
  }
  spdlog::info("coordinator: client re-attached to finished group={} ({} trajectories, {} acked)",
               p.group_id, p.delivered, p.acked);
  if (request.empty()) {  // nothing left in the WAL: just the group's end
    flatbuffers::FlatBufferBuilder fbb(256);
    auto done = wire::CreateGroupDone(fbb, p.group_id, p.delivered, p.errors, p.aborted,
                                      CostToWire(fbb, p.cost));
    FinishEnvelope(fbb, 0, wire::Message_GroupDone, done.Union());
    SendClient(client, BufferView(fbb));
    return;
  }
  Group* g = NewGroup(client, GroupTable::OwnerOfKey(key), key, request, p.serial);
  g->delivered = p.delivered;
  g->errors = p.errors;
  g->aborted = p.aborted;
  g->acked = p.acked;
  g->cost = p.cost;
  g->from_wal = true;
  g->redelivering = true;
  g->cursor = 0;
  redelivering.insert(key);
  PumpRedelivery();
}

void Coordinator::State::PumpRedelivery() {
  if (redelivering.empty()) return;
  const size_t room = options.max_client_buffer_bytes / 2;
  std::vector<std::string> keys(redelivering.begin(), redelivering.end());
  for (const std::string& key : keys) {
    Group* g = table.Find(key);
    if (g == nullptr || !g->redelivering || g->client.empty()) {
      redelivering.erase(key);
      continue;
    }
    const std::string client = g->client;
    const uint32_t n = g->submit->n();
    const std::string tag = g->submit->client_tag() ? g->submit->client_tag()->str() : "";
    bool done = false;
    while (!done && outbox.Pending(client) < room && !outbox.IsSlow(client)) {
      if (!g->from_wal) {
        auto it = g->sent.lower_bound(g->cursor);
        if (it == g->sent.end()) {
          done = true;
          break;
        }
        g->cursor = it->first + 1;
        SendClient(client, it->second);
        continue;
      }
      if (g->cursor >= g->total) {
        done = true;
        break;
      }
      const uint32_t flat = g->cursor++;
      const SampleAddress at{g->group_id, flat / n, flat % n};
      if (!wal()->Known(WalTrajId(g->serial, flat))) continue;  // acknowledged or aborted
      auto log = wal()->Read(WalTrajId(g->serial, flat));
      if (log.ok() && log->finish) {
        Cost cost;
        cost.wal_bytes = static_cast<int64_t>(log->bytes);
        SendClient(client, BuildLoggedTrajectory(*log, at, cost, tag));
      } else if (!log.ok() && log.status().code() != ErrorCode::kNotFound) {
        SendClient(client, BuildErrorTrajectory(at, log.status(), tag));
      }  // else acknowledged or aborted: not sent again
    }
    if (!done) continue;
    g->redelivering = false;
    redelivering.erase(key);
    FinishGroupIfDone(g);
  }
}

void Coordinator::State::Park(Group* g) {
  table.Park(g, Clock::now());  // destroys g
}

void Coordinator::State::OnClientAck(const std::string& client, const std::string& owner,
                                     const wire::Envelope* e) {
  const wire::Ack* a = e->msg_as_Ack();
  const auto* pis = a->prompt_index();
  const auto* sis = a->sample_index();
  if ((pis ? pis->size() : 0) != (sis ? sis->size() : 0)) {
    // A client bug; zipping the lists could acknowledge trajectories it does not have.
    return SendError(
        client, e->request_id(),
        Status::InvalidArgument("Ack: prompt_index and sample_index differ in length; nothing was "
                                "acknowledged"),
        a->group_id());
  }
  if (!wal() || pis == nullptr) return;
  std::string parked_key;  // the same lookup as a re-attach: live group, else parked
  Group* g = FindGroup(owner, a->group_id(), &parked_key);
  Parked* p = g == nullptr && !parked_key.empty() ? table.FindParked(parked_key) : nullptr;
  if (g == nullptr && p == nullptr) return;
  const uint64_t serial = g ? g->serial : p->serial;
  const uint32_t n = g ? g->submit->n() : p->n;
  const uint32_t prompts = g ? g->submit->prompts()->size() : p->total / p->n;
  for (uint32_t i = 0; i < pis->size(); ++i) {
    const uint32_t pi = pis->Get(i), si = sis->Get(i);
    if (pi >= prompts || si >= n) continue;  // names no trajectory of this group
    const uint32_t flat = pi * n + si;
    // Only what was delivered: an early Ack (before delivery) or a repeated one does nothing.
    if (g != nullptr && !g->from_wal && g->sent.erase(flat) == 0) continue;
    Status s = wal()->Acknowledge(WalTrajId(serial, flat));
    if (!s.ok()) {
      spdlog::debug("coordinator: ack: {}", s.ToString());
      continue;
    }
    ++(g ? g->acked : p->acked);
  }
  if (p != nullptr && p->acked + p->aborted >= p->total) table.ForgetParked(parked_key);
}

Status Coordinator::State::RecoverFromWal() {
  BR_ASSIGN_OR_RETURN(wal::RecoveryResult rec, wal()->Recover());
  std::unordered_map<uint64_t, Group*> by_serial;
  std::unordered_map<uint64_t, const wal::TrajectoryLog*> unfinished, finished;
  std::unordered_map<uint64_t, Status> quarantined;
  auto note = [&](uint64_t serial) { journal->NoteSerial(serial); };
  auto make = [&](uint64_t serial, const std::string& request, bool pending) -> Group* {
    if (auto it = by_serial.find(serial); it != by_serial.end()) return it->second;
    std::vector<uint64_t> align;
    auto env = DecodeEnvelope(request.data(), request.size(), options.decode);
    if (!env.ok() || (*env)->msg_type() != wire::Message_SubmitRollouts) {
      spdlog::error("coordinator: WAL group {} has an unreadable request", serial);
      return nullptr;
    }
    const uint64_t gid = (*env)->msg_as_SubmitRollouts()->group_id();
    // Its owner: the client_id it was submitted with; none: any client may re-attach.
    const auto* cid = (*env)->client_id();
    const std::string owner = cid != nullptr && cid->size() > 0 ? "c" + cid->str() : "";
    const std::string key = GroupTable::Key(owner, gid);
    if (table.Find(key) != nullptr) {
      spdlog::error("coordinator: WAL holds group id {} twice; serial {} skipped", gid, serial);
      return nullptr;
    }
    Group* g = NewGroup("", owner, key, request, serial);
    g->group_pending = pending;
    by_serial[serial] = g;
    return g;
  };
  recovering = true;
  for (const wal::PendingGroup& pg : rec.groups) {
    note(pg.group_id);
    make(pg.group_id, pg.request, true);
  }
  for (const auto* list : {&rec.unfinished, &rec.finished}) {
    for (const wal::TrajectoryLog& t : *list) {
      note(WalSerialOf(t.id));
      make(WalSerialOf(t.id), t.header.request, false);
      (list == &rec.unfinished ? unfinished : finished)[t.id] = &t;
    }
  }
  for (const auto& q : rec.quarantined) {
    note(WalSerialOf(q.id));
    quarantined[q.id] = q.error;
  }
  for (const auto& q : rec.quarantined_groups) note(q.id);
  for (uint64_t id : rec.retained) note(WalSerialOf(id));
  for (auto& [serial, g] : by_serial) {
    if (g == nullptr) continue;
    const uint32_t n = g->submit->n();
    const std::string tag = g->submit->client_tag() ? g->submit->client_tag()->str() : "";
    // The weights version the group ran under: its never-dispatched samples wait for it too.
    uint64_t group_version = 0;
    for (uint32_t flat = 0; flat < g->total; ++flat) {
      const uint64_t id = WalTrajId(serial, flat);
      for (const auto* m : {&unfinished, &finished}) {
        if (auto it = m->find(id); it != m->end()) {
          const wal::TrajectoryLog& t = *it->second;
          group_version = std::max(group_version, t.spans.empty() ? t.header.weight_version
                                                                  : t.spans.back().weight_version);
        }
      }
    }
    for (uint32_t flat = 0; flat < g->total; ++flat) {
      const uint64_t id = WalTrajId(serial, flat);
      const SampleAddress at{g->group_id, flat / n, flat % n};
      if (auto u = unfinished.find(id); u != unfinished.end()) {
        wal()->counters.recovered_tokens += u->second->token_ids.size();
        AddWork(g, at.prompt_index, at.sample_index, u->second);
      } else if (auto f = finished.find(id); f != finished.end()) {
        Cost cost;
        cost.wal_bytes = static_cast<int64_t>(f->second->bytes);
        const bool failed = f->second->finish && f->second->finish->reason == FinishReason::kError;
        Deliver(g, flat, BuildLoggedTrajectory(*f->second, at, cost, tag), failed, cost.wal_bytes);
      } else if (auto q = quarantined.find(id); q != quarantined.end()) {
        Deliver(g, flat, BuildErrorTrajectory(at, q->second, tag), true, 0);
      } else if (g->group_pending) {
        AddWork(g, at.prompt_index, at.sample_index, nullptr, group_version);
        ++g->unheadered;
      } else {
        ++g->delivered;  // acknowledged (compacted) before the restart
        ++g->acked;
      }
    }
    if (g->group_pending && g->unheadered == 0) {
      BR_RETURN_IF_ERROR(wal()->AckGroup(serial));
      g->group_pending = false;
    }
  }
  recovering = false;
  // Finished groups leave memory (parked) until a re-attach or their Acks.
  for (auto& [serial, g] : by_serial) {
    if (g != nullptr) FinishGroupIfDone(g);
  }
  if (!weights.held().empty()) {
    spdlog::warn(
        "coordinator: {} recovered trajectories were logged under weights newer than the "
        "live version={}; they wait for an UpdateWeights bringing their version",
        weights.held().size(), weights.version());
  }
  spdlog::info(
      "coordinator: WAL recovered {} group(s): {} unfinished trajectories ({} logged tokens), "
      "{} finished, {} quarantined",
      by_serial.size(), rec.unfinished.size(), wal()->counters.recovered_tokens,
      rec.finished.size(), rec.quarantined.size());
  return Status::Ok();
}

}  // namespace bitroll::rollout
