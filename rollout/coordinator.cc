// The coordinator: clients, groups, dispatch and the event loop (see coordinator_state.h).
#include "rollout/coordinator_state.h"

namespace bitroll::rollout {

Coordinator::State::State(zmq::context_t& ctx, const CoordinatorOptions& o)
    : options(o),
      front(ctx, zmq::socket_type::router),
      back(ctx, zmq::socket_type::router),
      outbox([this](const std::string& c, std::string_view b) { return SendFront(c, b); },
             o.max_client_buffer_bytes,
             o.wal.dir.empty() ? "aborted" : "detached (re-attach to get them)"),
      connections(kMaxTrackedConnections,
                  [this] {
                    std::vector<std::string> held;
                    for (const Group* g : table.All()) held.push_back(g->client);
                    return held;
                  }),
      weights(replicas, o.decode, o.stream_timeout_ms,
              WeightsGate::Hooks{
                  [this](int r, std::string_view b) { SendReplicaBytes(r, b); },
                  [this](const std::string& c, uint64_t id, const Status& st, uint64_t v) {
                    if (st.ok()) return SendAck(c, id, v);
                    SendError(c, id, st);
                  },
                  [this](const WeightsGate::Installed& w) {
                    journal->OnWeightsInstalled(w);
                    ReleaseWaitingWork();
                  }}),
      journal(std::make_unique<Journal>(
          Journal::Options{o.wal.dir, std::chrono::seconds(o.retention.max_age_s),
                           o.retention.max_groups},
          table, weights, fingerprint,
          Journal::Hooks{[this](Group* g, uint32_t flat, std::string envelope, bool failed,
                                int64_t wal_bytes) {
                           Deliver(g, flat, std::move(envelope), failed, wal_bytes);
                         },
                         [this](const Status& s) { ReportWalError(s); }})) {}

void Coordinator::State::SendClient(const std::string& client, std::string_view bytes) {
  outbox.Send(client, bytes);
}

ClientOutbox::SendResult Coordinator::State::SendFront(const std::string& client,
                                                       std::string_view bytes) {
  try {
    if (!front.send(zmq::buffer(client), zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
      return ClientOutbox::SendResult::kWouldBlock;
    }
    front.send(zmq::buffer(bytes.data(), bytes.size()), zmq::send_flags::none);
  } catch (const zmq::error_t& e) {
    if (e.num() == EHOSTUNREACH) return ClientOutbox::SendResult::kGone;
    spdlog::error("coordinator: send to client failed: {}", e.what());
    return ClientOutbox::SendResult::kFailed;
  }
  return ClientOutbox::SendResult::kSent;
}

void Coordinator::State::FlushOutbox() {
  outbox.Flush();
  PumpRedelivery();
}

void Coordinator::State::SendError(const std::string& client, uint64_t request_id, const Status& s,
                                   uint64_t group_id) {
  spdlog::warn("coordinator: error to client group={} request={}: {}", group_id, request_id,
               s.ToString());
  SendClient(client, EncodeError(request_id, s, group_id));
}

void Coordinator::State::SendAck(const std::string& client, uint64_t request_id, uint64_t version) {
  flatbuffers::FlatBufferBuilder fbb(128);
  auto ack = wire::CreateAck(fbb, 0, 0, 0, version);
  FinishEnvelope(fbb, request_id, wire::Message_Ack, ack.Union());
  SendClient(client, BufferView(fbb));
}

void Coordinator::State::OnClient(const std::string& client, const zmq::message_t& msg) {
  const void* data = AlignForRead(msg.data(), msg.size(), &align_buf);
  auto env = DecodeEnvelope(data, msg.size(), options.decode);
  if (!env.ok()) {
    SendError(client, 0, env.status());
    return;
  }
  const wire::Envelope* e = *env;
  if (outbox.ConsumeDropped(client)) {
    SendError(
        client, 0,
        Status::ResourceExhausted(
            "this connection was dropped for not reading its replies (more than " +
            std::to_string(options.max_client_buffer_bytes) + " bytes unread); its groups were " +
            (wal() ? "detached: re-submit a group id with the same client_id to re-attach"
                   : "aborted")));
  }
  if (e->client_id() && e->client_id()->size() > kMaxClientIdBytes) {
    return SendError(client, e->request_id(),
                     Status::InvalidArgument("client_id is longer than " +
                                             std::to_string(kMaxClientIdBytes) + " bytes"));
  }
  if (wal()) (void)ConnectionSeen(client);  // a connection's age counts from its first message
  const std::string owner = OwnerOf(client, *e);
  switch (e->msg_type()) {
    case wire::Message_SubmitRollouts:
      return OnSubmit(client, owner, e, data, msg.size());
    case wire::Message_Abort:
      return OnAbort(client, owner, e->msg_as_Abort()->group_id(), e->request_id());
    case wire::Message_Status:
      return OnStatus(client, e->request_id());
    case wire::Message_UpdateWeights:
      return OnUpdateWeights(client, e, data, msg.size());
    case wire::Message_Drain:
      return OnDrain(client, e->request_id(), e->msg_as_Drain()->resume());
    case wire::Message_Ack:
      return OnClientAck(client, owner, e);
    default:
      SendError(
          client, e->request_id(),
          Status::Protocol(std::string("message type ") + wire::EnumNameMessage(e->msg_type()) +
                           " is not accepted from clients"));
  }
}

Coordinator::State::Group* Coordinator::State::FindGroup(const std::string& owner,
                                                         uint64_t group_id,
                                                         std::string* parked_key) {
  return table.Find(owner, group_id, /*recovered=*/wal() != nullptr, parked_key);
}

void Coordinator::State::OnSubmit(const std::string& client, const std::string& owner,
                                  const wire::Envelope* e, const void* data, size_t size) {
  const wire::SubmitRollouts* m = e->msg_as_SubmitRollouts();
  const uint64_t gid = m->group_id();
  Status s = ValidateSubmit(*m, options.submit);
  if (!s.ok()) return SendError(client, e->request_id(), s, gid);
  std::string parked_key;
  Group* g = FindGroup(owner, gid, &parked_key);
  const Parked* parked =
      g == nullptr && !parked_key.empty() ? table.FindParked(parked_key) : nullptr;
  // The connection the group was last attached to, live or parked (0: none, or this one).
  const uint64_t holder_seen = g != nullptr
                                   ? (g->client.empty() || g->client == client ? 0 : g->client_seen)
                                   : (parked != nullptr ? parked->client_seen : 0);
  if (wal() && holder_seen != 0 && ConnectionSeen(client) < holder_seen) {
    // ZeroMQ orders messages per connection only: this Submit of an older connection (one that
    // may be closed, its Submit still in flight) arrived after a newer connection of the owner
    // attached the group (which may have finished since). Moving the group back would send its
    // results to the old one; the group stays where it is.
    return SendError(client, e->request_id(),
                     Status::FailedPrecondition("group " + std::to_string(gid) +
                                                " is attached to a newer connection of this owner"),
                     gid);
  }
  if (g != nullptr) {
    if (wal() && g->client != client) return Reattach(g, client);
    return SendError(client, e->request_id(),
                     Status::InvalidArgument("group " + std::to_string(gid) + " is still live"),
                     gid);
  }
  if (!parked_key.empty()) return ReattachParked(parked_key, client);
  // The request travels to each replica that runs work of the group, verbatim, once (Dispatch);
  // one that could not travel with an item is refused here rather than lost on the way.
  if (size > ReplicaMessageLimit(options.decode) / 2) {
    return SendError(client, e->request_id(),
                     Status::ResourceExhausted(
                         "request of " + std::to_string(size) +
                         " bytes: a group's request may use at most half of max_message_bytes (" +
                         std::to_string(ReplicaMessageLimit(options.decode) / 2) +
                         "), so that each sample's work item fits a replica message"),
                     gid);
  }
  std::string key = GroupTable::Key(owner, gid);
  if (Status hs = journal->Healthy(); !hs.ok()) {
    return SendError(client, e->request_id(), hs, gid);
  }
  const uint64_t samples = uint64_t{m->prompts()->size()} * m->n();
  if (Status rs = table.CheckRoom(samples, options.max_queued); !rs.ok()) {
    return SendError(client, e->request_id(), rs, gid);
  }
  if (Status gs = journal->CheckGroupSize(samples); !gs.ok()) {
    return SendError(client, e->request_id(), gs, gid);
  }
  std::string_view bytes(static_cast<const char*>(data), size);
  uint64_t serial = 0;
  bool pending = false;
  Status ls = journal->OnGroupAdmitted(bytes, &serial, &pending);
  if (!ls.ok()) return SendError(client, e->request_id(), ls, gid);
  g = NewGroup(client, owner, key, bytes, serial);
  g->group_pending = pending;
  for (uint32_t i = 0; i < m->prompts()->size(); ++i) {
    for (uint32_t j = 0; j < m->n(); ++j) AddWork(g, i, j);
  }
  g->unheadered = g->total;
  spdlog::debug("coordinator: submit group={} prompts={} n={} tag={}", gid, m->prompts()->size(),
                m->n(), m->client_tag() ? m->client_tag()->str() : "");
}

Coordinator::State::Group* Coordinator::State::NewGroup(const std::string& client,
                                                        const std::string& owner,
                                                        const std::string& key,
                                                        std::string_view bytes, uint64_t serial) {
  Group* g = table.Add(client, wal() && !client.empty() ? ConnectionSeen(client) : 0, owner, key,
                       bytes, serial);
  g->request_key = next_request_key++;
  return g;
}

void Coordinator::State::AddWork(Group* g, uint32_t i, uint32_t j, const wal::TrajectoryLog* log,
                                 uint64_t needs_version) {
  const wire::Prompt* p = g->submit->prompts()->Get(i);
  Work w;
  w.id = wal() ? WalTrajId(g->serial, i * g->submit->n() + j) : table.NextWorkId();
  w.group = g;
  w.prompt_index = i;
  w.sample_index = j;
  w.affinity = p->ids() ? HashBytes(p->ids()->data(), p->ids()->size() * 4)
                        : HashBytes(p->text()->data(), p->text()->size(), 7);
  w.enqueued = Clock::now();
  w.needs_version = needs_version;
  bool rerun = false;  // a logged call without a logged result: run it again
  if (log != nullptr) {
    w.header_logged = true;
    const LoggedTurns lt = RebuildTurns(*log);
    w.tokens = lt.turn_ids;
    w.logprobs = lt.turn_lps;
    w.ctx_ids = lt.ids;
    w.ctx_lps = lt.lps;
    w.ctx_mask = lt.mask;
    w.ctx_versions = lt.versions;
    w.turn = lt.turns;
    w.boundaries = static_cast<uint32_t>(log->turns.size());
    w.calls = lt.calls;
    w.cost.sandbox_seconds = lt.sandbox_seconds;
    w.cost.sandbox_cpu_seconds = lt.sandbox_cpu_seconds;
    // The weights of its last logged tokens, or those it was started with (a header, no token).
    w.needs_version =
        log->spans.empty() ? log->header.weight_version : log->spans.back().weight_version;
    if (lt.pending_call && !w.calls.back().replayed) {
      rerun = true;
    } else if (lt.pending_call) {
      w.inject = FormatResult(*g->submit, w.calls.back());  // replayed, never re-run
    }
  }
  Work* added = table.AddWork(std::move(w));
  if (rerun) {
    spdlog::info("coordinator: trajectory {} call {} has no logged result; running it again",
                 added->id, added->calls.size() - 1);
    StartCall(added, static_cast<uint32_t>(added->calls.size() - 1));
    return;
  }
  Enqueue(added);
}

void Coordinator::State::FinishGroupIfDone(Group* g) {
  if (!GroupTable::Done(*g)) return;
  ForgetRequest(g);  // no more work of it goes anywhere
  if (g->detached) {
    // Nobody to tell: with a WAL it waits, out of memory, for a re-attach or its Acks.
    if (wal()) Park(g);
    return;
  }
  flatbuffers::FlatBufferBuilder fbb(256);
  auto done = wire::CreateGroupDone(fbb, g->group_id, g->delivered, g->errors, g->aborted,
                                    CostToWire(fbb, g->cost));
  FinishEnvelope(fbb, 0, wire::Message_GroupDone, done.Union());
  std::string client = g->client;
  if (wal()) {
    Park(g);  // destroys g
  } else {
    table.Remove(g);  // destroys g
  }
  if (!client.empty()) SendClient(client, BufferView(fbb));
}

void Coordinator::State::AbortGroup(Group* g) {
  std::map<int, std::vector<uint64_t>> per_replica;
  table.AbortWorks(g, [&](Work& w) {
    journal->OnWorkAborted(w);
    if (w.replica >= 0) {
      per_replica[w.replica].push_back(w.id);
      replicas[w.replica].inflight.erase(w.id);
    } else if (!w.tool_running) {
      table.CountDequeued();  // its queue entry is skipped lazily
    } else {
      // A running tool call finishes on its own; OnToolsDone drops its result.
    }
  });
  if (g->redelivering) {  // a re-attach in progress: its GroupDone comes now
    g->redelivering = false;
    redelivering.erase(g->key);
  }
  journal->OnGroupAborted(g);
  for (auto& [r, ids] : per_replica) {
    if (!replicas[r].alive) continue;
    flatbuffers::FlatBufferBuilder fbb(64 + ids.size() * 8);
    auto a = wire::CreateReplicaAbort(fbb, fbb.CreateVector(ids));
    FinishEnvelope(fbb, 0, wire::Message_ReplicaAbort, a.Union());
    SendReplica(r, fbb);
  }
  FinishGroupIfDone(g);
}

void Coordinator::State::OnAbort(const std::string& client, const std::string& owner, uint64_t gid,
                                 uint64_t request_id) {
  Group* g = FindGroup(owner, gid);
  if (g == nullptr) {
    return SendError(client, request_id,
                     Status::NotFound("group " + std::to_string(gid) + " is not live"), gid);
  }
  spdlog::info("coordinator: abort group={}", gid);
  if (g->client.empty()) {  // a detached group: the aborting owner gets its GroupDone
    g->client = client;
    g->client_seen = ConnectionSeen(client);
    g->detached = false;
  }
  AbortGroup(g);
}

void Coordinator::State::ClientGone(const std::string& client) {
  std::vector<Group*> gone;
  for (Group* g : table.All()) {
    if (g->client == client) gone.push_back(g);
  }
  if (!gone.empty()) {
    spdlog::warn("coordinator: client vanished; {} its {} live group(s)",
                 wal() ? "detaching" : "aborting", gone.size());
  }
  outbox.Forget(client);
  connections.Forget(client);
  for (Group* g : gone) {
    g->client.clear();  // GroupDone goes nowhere
    if (wal()) {
      g->detached = true;  // work goes on; a re-attach gets the results
      if (g->redelivering) {
        g->redelivering = false;
        redelivering.erase(g->key);
      }
      FinishGroupIfDone(g);  // a finished group leaves memory
    } else {
      AbortGroup(g);
    }
  }
}

void Coordinator::State::OnStatus(const std::string& client, uint64_t request_id) {
  const auto now = Clock::now();
  flatbuffers::FlatBufferBuilder fbb(1024);
  std::vector<flatbuffers::Offset<wire::ReplicaLoad>> loads;
  for (Replica& r : replicas) {
    loads.push_back(wire::CreateReplicaLoad(
        fbb, fbb.CreateString(r.name), static_cast<uint32_t>(r.inflight.size()), r.running,
        r.rate.PerSecond(now), r.weight_version, r.alive, r.remote));
  }
  const double denom = static_cast<double>(total_cached + total_computed);
  uint32_t waiting = 0;
  for (const auto& [id, needs] : weights.held()) {
    const Work* w = table.FindWork(id);
    waiting += w != nullptr && w->replica < 0 && !w->tool_running ? 1 : 0;
  }
  flatbuffers::Offset<wire::Fingerprint> fp = 0;
  if (fingerprint) {
    NumericsFingerprint live = *fingerprint;
    // The hash of the live version once an update installed it.
    if (weights.live_weights_hash() != 0) live.weights_hash = weights.live_weights_hash();
    fp = FingerprintToWire(fbb, live);
  }
  const WalLog* log = wal();
  const wal::WalStats ws = log ? log->stats() : wal::WalStats{};
  auto reply = wire::CreateStatusReply(
      fbb, kProtocolVersion, static_cast<uint32_t>(table.queued()),
      static_cast<uint32_t>(table.InFlight()), static_cast<uint32_t>(table.size()),
      fbb.CreateVector(loads), rate.PerSecond(now),
      denom > 0 ? static_cast<double>(total_cached) / denom : 0.0, trajectories_done,
      weights.version(), paused || weights.draining(), log != nullptr,
      log ? log->counters.tokens_logged : 0, log ? log->counters.recovered_tokens : 0,
      log ? log->counters.forced_tokens : 0, log ? log->counters.resumed : 0,
      log ? log->counters.forced_mismatches : 0, ws.bytes_written,
      log && !log->status().ok() ? ErrorToWire(fbb, log->status()) : 0, waiting, fp, ws.last_lsn,
      ws.committed_lsn, ws.durable_lsn);
  FinishEnvelope(fbb, request_id, wire::Message_StatusReply, reply.Union());
  SendClient(client, BufferView(fbb));
}

void Coordinator::State::ForgetRequest(Group* g) {
  for (Replica& rep : replicas) rep.Drop(g->request_key, /*tell=*/rep.alive);
}

bool Coordinator::State::MakeRoom(int r, size_t bytes) {
  Replica& rep = replicas[r];
  auto fits = [&] {
    return rep.held.size() < kMaxHeldRequests && rep.held_bytes + bytes <= kMaxHeldRequestBytes;
  };
  if (fits()) return true;
  std::unordered_set<uint64_t> busy;  // requests of the work in flight there
  for (uint64_t id : rep.inflight) {
    if (const Work* w = table.FindWork(id)) busy.insert(w->group->request_key);
  }
  std::vector<uint64_t> idle;
  for (const auto& [key, n] : rep.held) {
    if (busy.count(key) == 0) idle.push_back(key);
  }
  std::sort(idle.begin(), idle.end());  // the oldest groups' first
  for (uint64_t key : idle) {
    rep.Drop(key, /*tell=*/true);
    if (fits()) return true;
  }
  return false;
}

void Coordinator::State::SendForgets() {
  for (int r = 0; r < replicas.size(); ++r) {
    Replica& rep = replicas[r];
    if (rep.forget.empty()) continue;
    if (rep.alive) {
      ReplicaWorkBuilder b;
      for (uint64_t key : rep.forget) b.Forget(key);
      SendReplicaBytes(r, b.Finish());
    }
    rep.forget.clear();
  }
}

void Coordinator::State::Dispatch() {
  if (paused || weights.HoldsDispatch() || table.queued() == 0) {
    SendForgets();
    return;
  }
  const auto now = Clock::now();
  std::unordered_map<int, std::unique_ptr<ReplicaWorkBuilder>> batches;
  // One ReplicaWork message per replica and pass. A group's request goes in only when the
  // replica does not keep it already (it keeps what it is sent: replica protocol 3), so a group
  // whose samples go out a few at a time sends it once per replica. A message is cut when it
  // reaches half of what a replica accepts, and before a request that would take it past half:
  // a request is at most half (OnSubmit), so no message is refused.
  const size_t half = ReplicaMessageLimit(options.decode) / 2;
  auto send_batch = [&](int r) {
    SendReplicaBytes(r, batches[r]->Finish());
    batches.erase(r);
  };
  // The replica's open message, with the forgets pending for it (they go before its requests).
  auto open_batch = [&](int r) -> ReplicaWorkBuilder& {
    auto& batch = batches[r];
    if (!batch) batch = std::make_unique<ReplicaWorkBuilder>();
    for (uint64_t key : replicas[r].forget) batch->Forget(key);
    replicas[r].forget.clear();
    return *batch;
  };
  queue.Drain([&](uint64_t id) {
    Work* found = table.FindWork(id);
    if (found == nullptr || found->replica >= 0) return FairQueue::Take::kStale;  // aborted
    Work& w = *found;
    const int r = replicas.Choose(w.affinity);
    if (r < 0) return FairQueue::Take::kFull;
    table.CountDequeued();
    w.replica = r;
    w.needs_version = 0;
    w.queue_seconds += Seconds(now - w.enqueued);
    replicas[r].inflight.insert(id);
    journal->OnDispatched(&w);
    const uint64_t key = w.group->request_key;
    const std::string_view request = w.group->buffer;
    auto it = batches.find(r);
    const bool send = !replicas[r].Holds(key) && (it == batches.end() || !it->second->Holds(key));
    if (send && it != batches.end() && it->second->size() + request.size() > half) {
      send_batch(r);
    }
    const bool transient = send && !MakeRoom(r, request.size());
    ReplicaWorkBuilder& batch = open_batch(r);
    if (send) {
      batch.AddRequest(key, request, transient);
      if (!transient) replicas[r].Keep(key, request.size());
    }
    const std::span<const int32_t> forced(w.tokens);  // the current turn's logged tokens
    TurnInput turn{w.ctx_ids, w.inject,   static_cast<int32_t>(w.SampledInContext()),
                   w.ctx_lps, w.ctx_mask, w.ctx_versions,
                   w.calls,   w.turn};
    const bool later = !w.ctx_ids.empty() || !w.inject.empty();
    batch.Add(key, w.id, {w.group->group_id, w.prompt_index, w.sample_index}, forced,
              wal() != nullptr, later ? &turn : nullptr);
    if (batch.size() >= half) send_batch(r);
    return FairQueue::Take::kTaken;
  });
  std::vector<int> open;
  for (auto& [r, batch] : batches) open.push_back(r);
  for (int r : open) send_batch(r);
  SendForgets();
}

void Coordinator::State::HandleFailures() {
  while (replicas.AnyUnreachable() || outbox.AnyFailed()) {
    for (const std::string& c : outbox.TakeSlow()) {
      ClientGone(c);
      outbox.MarkDropped(c);
    }
    for (int r : replicas.TakeUnreachable()) ReplicaDead(r, "unreachable");
    for (const std::string& c : outbox.TakeGone()) ClientGone(c);
  }
}

void Coordinator::State::CheckTimeouts() {
  for (int r :
       replicas.Silent(Clock::now(), std::chrono::milliseconds(options.replica_timeout_ms))) {
    ReplicaDead(r, "timed out");
  }
}

void Coordinator::State::Run() {
  zmq::pollitem_t items[3] = {{front.handle(), 0, ZMQ_POLLIN, 0},
                              {back.handle(), 0, ZMQ_POLLIN, 0},
                              {nullptr, tools ? tools->wake_fd() : -1, ZMQ_POLLIN, 0}};
  const int n_items = tools ? 3 : 2;
  auto last_check = Clock::now();
  zmq::message_t id, body;
  while (!stop->load(std::memory_order_relaxed)) {
    try {
      int wait_ms = outbox.Empty() && redelivering.empty() ? 20 : 1;
      wait_ms = journal->PollWaitMs(wait_ms);
      zmq::poll(items, n_items, std::chrono::milliseconds(wait_ms));
      if (n_items == 3 && (items[2].revents & ZMQ_POLLIN)) OnToolsDone();
      // Replica results first: they free capacity and finish groups.
      for (int k = 0; k < 4096 && back.recv(id, zmq::recv_flags::dontwait); ++k) {
        if (!id.more() || !back.recv(body, zmq::recv_flags::none)) continue;
        while (body.more()) (void)back.recv(body, zmq::recv_flags::none);  // extra frames
        OnReplica(id.to_string(), body);
      }
      for (int k = 0; k < 4096 && front.recv(id, zmq::recv_flags::dontwait); ++k) {
        if (!id.more() || !front.recv(body, zmq::recv_flags::none)) continue;
        if (body.more()) {
          while (body.more()) (void)front.recv(body, zmq::recv_flags::none);
          SendError(id.to_string(), 0, Status::Protocol("expected one frame per message"));
          continue;
        }
        OnClient(id.to_string(), body);
      }
      journal->DeliverDurable();
      FlushOutbox();
      HandleFailures();
      const auto now = Clock::now();
      if (now - last_check > std::chrono::milliseconds(20)) {
        CheckTimeouts();
        if (options.metrics) PublishMetrics(now);
        last_check = now;
      }
      journal->OnHousekeeping(now);
      Dispatch();
      weights.MaybeSend(table.InFlight());
      MaybeFinishDrain();
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) return;
      spdlog::error("coordinator: {}", e.what());
    }
  }
}

Result<std::unique_ptr<Coordinator>> Coordinator::Start(
    const CoordinatorOptions& options, std::vector<std::unique_ptr<engine::Engine>> engines) {
  std::unique_ptr<Coordinator> c(new Coordinator());
  c->ctx_ = std::make_unique<zmq::context_t>(1);
  c->state_ = std::make_unique<State>(*c->ctx_, options);
  c->self_test_ = options.self_test;
  State& s = *c->state_;
  s.stop = &c->stop_;
  if (!engines.empty()) {
    // The first in-process engine fixes the vocabulary and the numerics fingerprint.
    if (s.options.submit.vocab_size == 0) {
      s.options.submit.vocab_size = engines[0]->info().vocab_size;
    }
    for (const auto& e : engines) {
      const int32_t len = e->info().max_seq_len;
      if (len > 0 && (s.options.submit.max_seq_len == 0 || len < s.options.submit.max_seq_len)) {
        s.options.submit.max_seq_len = len;
      }
    }
    s.fingerprint = engines[0]->info().fingerprint;  // pinned: remote replicas must match it
  }
  try {
    s.front.set(zmq::sockopt::router_mandatory, 1);
    s.front.set(zmq::sockopt::linger, 0);
    s.front.set(zmq::sockopt::sndhwm, options.client_sndhwm);
    s.front.set(zmq::sockopt::rcvhwm, 0);
    // ZeroMQ's own cap sits well above ours, so oversized messages still get a typed error.
    s.front.set(zmq::sockopt::maxmsgsize,
                static_cast<int64_t>(
                    std::max<size_t>(options.decode.max_message_bytes * 4, size_t{1} << 20)));
    s.front.bind(options.bind);
    c->endpoint_ = s.front.get(zmq::sockopt::last_endpoint);
    s.back.set(zmq::sockopt::router_mandatory, 1);
    s.back.set(zmq::sockopt::linger, 0);
    s.back.set(zmq::sockopt::sndhwm, 0);
    s.back.set(zmq::sockopt::rcvhwm, 0);
    char name[64];
    std::snprintf(name, sizeof(name), "inproc://bitroll-replicas-%p", static_cast<void*>(c.get()));
    c->inproc_endpoint_ = name;
    s.back.bind(c->inproc_endpoint_);
    if (!options.replica_bind.empty()) {
      s.back.bind(options.replica_bind);
      c->replica_endpoint_ = s.back.get(zmq::sockopt::last_endpoint);
    }
  } catch (const zmq::error_t& e) {
    return Status::Unavailable(std::string("coordinator bind: ") + e.what());
  }
  spdlog::info("coordinator: clients at {} replicas at {} {}", c->endpoint_, c->inproc_endpoint_,
               c->replica_endpoint_);
  BR_ASSIGN_OR_RETURN(s.tools, ToolRunner::Start(options.tools));
  if (!options.wal.dir.empty()) {
    BR_ASSIGN_OR_RETURN(std::unique_ptr<WalLog> wal, WalLog::Open(options.wal));
    wal->metrics = options.metrics;
    s.journal->Attach(std::move(wal));
    if (!engines.empty()) s.eos_id = engines[0]->info().eos_id;
    s.journal->RestoreLiveWeights();
    BR_RETURN_IF_ERROR(s.RecoverFromWal());
  }
  c->engines_ = std::move(engines);
  for (size_t i = 0; i < c->engines_.size(); ++i) {
    auto ro = std::make_unique<ReplicaOptions>(options.local_replica);
    ro->name = options.local_replica.name + "-" + std::to_string(i);
    ro->remote = false;
    engine::Engine* eng = c->engines_[i].get();
    const ReplicaOptions* rop = ro.get();
    c->replica_options_.push_back(std::move(ro));
    Coordinator* self = c.get();
    c->replica_threads_.emplace_back([self, eng, rop] {
      Status st = RunReplica(*eng, *self->ctx_, self->inproc_endpoint_, *rop, self->stop_replicas_);
      if (!st.ok()) spdlog::error("replica {} stopped: {}", rop->name, st.ToString());
    });
  }
  c->thread_ = std::thread([st = c->state_.get()] { st->Run(); });
  // The service is ready once its in-process replicas have joined: an UpdateWeights sent as
  // soon as Start returns (`serve` then prints its endpoint) would otherwise find no replica
  // and fail with Unavailable. Bounded: a replica that cannot say hello is logged, not waited
  // for.
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  const int want = static_cast<int>(c->engines_.size());
  while (s.local_replicas_joined.load() < want && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (s.local_replicas_joined.load() < want) {
    spdlog::warn("coordinator: {} of {} in-process replicas joined within 10 s",
                 s.local_replicas_joined.load(), want);
  }
  return c;
}

void Coordinator::Stop() {
  stop_replicas_.store(true);
  for (auto& t : replica_threads_) {
    if (t.joinable()) t.join();
  }
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  if (state_) {
    state_->front.close();
    state_->back.close();
  }
}

Coordinator::~Coordinator() {
  Stop();
}

}  // namespace bitroll::rollout
