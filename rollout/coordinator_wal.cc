// The coordinator's write-ahead log: what is logged when, durable delivery, re-attach, recovery.
#include "rollout/coordinator_state.h"

namespace bitroll::rollout {

void Coordinator::State::ReportWalError(const Status& s) {
  if (wal_error_reported) return;
  wal_error_reported = true;
  spdlog::error("coordinator: WAL failed, no new work is accepted: {}", s.ToString());
  for (auto& [k, g] : groups) {
    if (!g->client.empty()) {
      SendError(g->client, 0, s.WithContext("WAL failed; results not yet durable are held"),
                g->group_id);
    }
  }
}

void Coordinator::State::CheckWal(const Status& s) {
  if (!s.ok()) ReportWalError(wal->status().ok() ? s : wal->status());
}

void Coordinator::State::LogDispatch(Work* w) {
  Group* g = w->group;
  if (!w->header_logged) {
    const engine::NumericsFingerprint fp = fingerprint.value_or(engine::NumericsFingerprint{});
    CheckWal(wal->LogHeader(w->id, g->serial, w->sample_index, *g->submit, g->buffer,
                            weight_version, fp));
    w->header_logged = true;
    if (g->unheadered > 0 && --g->unheadered == 0 && g->group_pending) {
      CheckWal(wal->AckGroup(g->serial));
      g->group_pending = false;
    }
  }
  // Forced: the current turn's logged tokens (earlier turns travel as context_ids).
  w->forced =
      static_cast<uint32_t>(w->tokens.size() - std::min<size_t>(w->tokens.size(), w->sampled_base));
  if (w->forced > 0) {
    wal->counters.forced_tokens += w->forced;
    ++wal->counters.resumed;
  }
}

void Coordinator::State::LogChunk(Work* w, const wire::TokenChunk& c) {
  if (c.ids() == nullptr || c.logprobs() == nullptr || c.ids()->size() != c.logprobs()->size()) {
    return;
  }
  const auto n = static_cast<int64_t>(c.ids()->size());
  // Replicas count positions from the start of the turn; the WAL counts sampled tokens.
  const int64_t begin = c.position_begin() + static_cast<int64_t>(w->sampled_base);
  const auto have = static_cast<int64_t>(w->tokens.size());
  for (int64_t i = 0; i < n && begin + i < have; ++i) {
    const int32_t id = c.ids()->Get(static_cast<uint32_t>(i));
    const float lp = c.logprobs()->Get(static_cast<uint32_t>(i));
    const size_t at = static_cast<size_t>(begin + i);
    if (id != w->tokens[at] || std::memcmp(&lp, &w->logprobs[at], sizeof(float)) != 0) {
      ++wal->counters.forced_mismatches;
      spdlog::error("coordinator: trajectory {} token {} re-scored differently from the WAL", w->id,
                    at);
    }
  }
  const int64_t skip = std::max<int64_t>(0, have - begin);
  if (skip >= n) return;
  if (begin + skip != have) {
    spdlog::error("coordinator: trajectory {} chunk at {} leaves a gap after {} tokens", w->id,
                  begin, have);
    return;
  }
  const int32_t* ids = c.ids()->data() + skip;
  const float* lps = c.logprobs()->data() + skip;
  const auto m = static_cast<size_t>(n - skip);
  w->tokens.insert(w->tokens.end(), ids, ids + m);
  w->logprobs.insert(w->logprobs.end(), lps, lps + m);
  CheckWal(wal->LogTokens(w->id, {ids, m}, {lps, m}, c.weight_version()));
}

void Coordinator::State::LogFinish(const Work& w, const wire::Trajectory& t, std::string envelope) {
  // Tokens the replica did not stream (none when it streams every one) are logged first.
  if (t.ids() && t.logprobs() && t.ids()->size() == t.logprobs()->size() &&
      w.sampled_base + t.ids()->size() > w.tokens.size()) {
    const size_t k = w.tokens.size() - w.sampled_base, m = t.ids()->size() - k;
    CheckWal(wal->LogTokens(w.id, {t.ids()->data() + k, m}, {t.logprobs()->data() + k, m},
                            weight_version));
  }
  const std::string err = t.error() && t.error()->message() ? t.error()->message()->str() : "";
  CheckWal(wal->LogFinish(w.id, t.finish(), err));
  HeldDelivery d;
  d.traj = w.id;
  d.group_key = w.group->key;
  d.flat = WalFlatOf(w.id);
  d.envelope = std::move(envelope);
  d.failed = t.finish() == wire::FinishReason_Error;
  held.push_back(std::move(d));
}

void Coordinator::State::CommitAndDeliver() {
  CheckWal(wal->MaybeCommit());
  while (!held.empty() && wal->Durable(held.front().traj)) {
    HeldDelivery d = std::move(held.front());
    held.pop_front();
    auto git = groups.find(d.group_key);
    if (git == groups.end()) continue;  // aborted meanwhile
    Group* g = git->second.get();
    const wire::Trajectory* t = wire::GetEnvelope(d.envelope.data())->msg_as_Trajectory();
    CostInfo cost = CostFromWire(t->cost());
    cost.wal_bytes = static_cast<int64_t>(wal->Bytes(d.traj));
    flatbuffers::FlatBufferBuilder fbb(d.envelope.size() + 64);
    BuildClientTrajectory(fbb, *t, {g->group_id, t->prompt_index(), t->sample_index()}, cost,
                          t->replica() ? t->replica()->string_view() : "", g->submit->client_tag());
    Deliver(g, d.flat, std::string(BufferView(fbb)), d.failed);
  }
}

void Coordinator::State::Deliver(Group* g, uint32_t flat, std::string envelope, bool failed) {
  ++g->delivered;
  if (failed) ++g->errors;
  if (!g->client.empty()) SendClient(g->client, envelope);
  g->sent[flat] = std::move(envelope);
  FinishGroupIfDone(g);
}

void Coordinator::State::Reattach(Group* g, const std::string& client) {
  spdlog::info("coordinator: client re-attached to group={} ({} of {} delivered)", g->group_id,
               g->delivered, g->total);
  g->client = client;
  g->detached = false;
  for (const auto& [flat, env] : g->sent) SendClient(client, env);
  FinishGroupIfDone(g);
}

void Coordinator::State::OnClientAck(const wire::Ack* a) {
  if (!wal || a->prompt_index() == nullptr || a->sample_index() == nullptr) return;
  Group* g = nullptr;
  uint64_t serial = 0;
  uint32_t n = 0;
  if (auto it = groups.find(GroupKey("", a->group_id())); it != groups.end()) {
    g = it->second.get();
    serial = g->serial;
    n = g->submit->n();
  } else if (auto d = done_groups.find(a->group_id()); d != done_groups.end()) {
    std::tie(serial, n) = d->second;
  } else {
    return;
  }
  const uint32_t k = std::min(a->prompt_index()->size(), a->sample_index()->size());
  for (uint32_t i = 0; i < k; ++i) {
    const uint32_t flat = a->prompt_index()->Get(i) * n + a->sample_index()->Get(i);
    Status s = wal->Acknowledge(WalTrajId(serial, flat));
    if (!s.ok()) spdlog::debug("coordinator: ack: {}", s.ToString());
    if (g) g->sent.erase(flat);
  }
}

Status Coordinator::State::RecoverFromWal() {
  BR_ASSIGN_OR_RETURN(wal::RecoveryResult rec, wal->Recover());
  std::unordered_map<uint64_t, Group*> by_serial;
  std::unordered_map<uint64_t, const wal::TrajectoryLog*> unfinished, finished;
  std::unordered_map<uint64_t, Status> quarantined;
  auto note = [&](uint64_t serial) { next_serial = std::max(next_serial, serial + 1); };
  auto make = [&](uint64_t serial, const std::string& request, bool pending) -> Group* {
    if (auto it = by_serial.find(serial); it != by_serial.end()) return it->second;
    std::vector<uint64_t> align;
    auto env = DecodeEnvelope(request.data(), request.size(), options.decode);
    if (!env.ok() || (*env)->msg_type() != wire::Message_SubmitRollouts) {
      spdlog::error("coordinator: WAL group {} has an unreadable request", serial);
      return nullptr;
    }
    const uint64_t gid = (*env)->msg_as_SubmitRollouts()->group_id();
    if (groups.count(GroupKey("", gid))) {
      spdlog::error("coordinator: WAL holds group id {} twice; serial {} skipped", gid, serial);
      return nullptr;
    }
    Group* g = NewGroup("", GroupKey("", gid), request, serial);
    g->group_pending = pending;
    by_serial[serial] = g;
    return g;
  };
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
        wal->counters.recovered_tokens += u->second->token_ids.size();
        AddWork(g, at.prompt_index, at.sample_index, u->second);
      } else if (auto f = finished.find(id); f != finished.end()) {
        CostInfo cost;
        cost.wal_bytes = static_cast<int64_t>(f->second->bytes);
        const bool failed = f->second->finish && f->second->finish->reason ==
                                                     static_cast<uint8_t>(wire::FinishReason_Error);
        Deliver(g, flat, BuildLoggedTrajectory(*f->second, at, cost, tag), failed);
      } else if (auto q = quarantined.find(id); q != quarantined.end()) {
        Deliver(g, flat, BuildErrorTrajectory(at, q->second, tag), true);
      } else if (g->group_pending) {
        AddWork(g, at.prompt_index, at.sample_index, nullptr, group_version);
        ++g->unheadered;
      } else {
        ++g->delivered;  // acknowledged (compacted) before the restart
      }
    }
    if (g->group_pending && g->unheadered == 0) {
      BR_RETURN_IF_ERROR(wal->AckGroup(serial));
      g->group_pending = false;
    }
  }
  if (!waiting_weights.empty()) {
    spdlog::warn(
        "coordinator: {} recovered trajectories were logged under weights newer than the "
        "live version={}; they wait for an UpdateWeights bringing their version",
        waiting_weights.size(), weight_version);
  }
  spdlog::info(
      "coordinator: WAL recovered {} group(s): {} unfinished trajectories ({} logged tokens), "
      "{} finished, {} quarantined",
      by_serial.size(), rec.unfinished.size(), wal->counters.recovered_tokens, rec.finished.size(),
      rec.quarantined.size());
  return Status::Ok();
}

}  // namespace bitroll::rollout
