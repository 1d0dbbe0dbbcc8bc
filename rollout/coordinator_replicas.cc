// The coordinator's replica side: hello, results, failures and drain (weight updates:
// coordinator_weights.cc).
#include "rollout/coordinator_state.h"

namespace bitroll::rollout {

void Coordinator::State::SendReplica(int r, flatbuffers::FlatBufferBuilder& fbb) {
  SendReplicaBytes(r, BufferView(fbb));
}

void Coordinator::State::SendReplicaBytes(int r, std::string_view bytes) {
  try {
    back.send(zmq::buffer(replicas[r].identity), zmq::send_flags::sndmore);
    back.send(zmq::buffer(bytes), zmq::send_flags::none);
  } catch (const zmq::error_t& e) {
    spdlog::warn("coordinator: send to replica {} failed: {}", replicas[r].name, e.what());
    if (e.num() == EHOSTUNREACH) replicas.MarkUnreachable(r);
  }
}

void Coordinator::State::OnDrain(const std::string& client, uint64_t request_id, bool resume) {
  if (resume) {
    paused = false;
    spdlog::info("coordinator: resume dispatch");
    return SendAck(client, request_id, weights.version());
  }
  paused = true;
  spdlog::info("coordinator: drain: dispatch paused");
  drain_waiters.emplace_back(client, request_id);
  MaybeFinishDrain();
}

void Coordinator::State::MaybeFinishDrain() {
  if (drain_waiters.empty() || table.InFlight() > 0) return;
  for (auto& [c, id] : drain_waiters) SendAck(c, id, weights.version());
  drain_waiters.clear();
}

void Coordinator::State::OnReplica(const std::string& identity, const zmq::message_t& msg) {
  // A replica's results of one step can be large (every sequence that finished, each up to the
  // context length): replicas are the service's own peers, so their messages get a wider size
  // limit than clients' instead of being dropped with their trajectories.
  DecodeLimits limits = options.decode;
  limits.max_message_bytes = std::max(limits.max_message_bytes, kMaxReplicaMessageBytes);
  limits.max_tables = std::max<uint32_t>(limits.max_tables, 64'000'000);
  auto env = DecodeEnvelope(AlignForRead(msg.data(), msg.size(), &align_buf), msg.size(), limits);
  if (!env.ok()) {
    spdlog::warn("coordinator: bad message from a replica: {}", env.status().ToString());
    return;
  }
  const wire::Envelope* e = *env;
  if (e->msg_type() == wire::Message_ReplicaHello) return OnHello(identity, e);
  const int r = replicas.Find(identity);
  if (r < 0 || !replicas[r].alive) return;  // stale
  replicas[r].last_seen = Clock::now();
  switch (e->msg_type()) {
    case wire::Message_ReplicaHeartbeat:
      replicas[r].running = e->msg_as_ReplicaHeartbeat()->running();
      return;
    case wire::Message_ReplicaResults:
      return OnResults(r, e->msg_as_ReplicaResults());
    case wire::Message_ReplicaRefused:
      return OnRefused(r, e->msg_as_ReplicaRefused());
    case wire::Message_Ack:
      replicas[r].weight_version = e->msg_as_Ack()->weight_version();
      return weights.OnReplicaAck(r, e->request_id(), e->msg_as_Ack()->weights_hash());
    case wire::Message_Error:
      return weights.OnReplicaError(r, e->request_id(), StatusFromWire(e->msg_as_Error()));
    default:
      spdlog::warn("coordinator: replica {} sent unexpected {}", replicas[r].name,
                   wire::EnumNameMessage(e->msg_type()));
  }
}

void Coordinator::State::OnHello(const std::string& identity, const wire::Envelope* e) {
  const wire::ReplicaHello* h = e->msg_as_ReplicaHello();
  const NumericsFingerprint fp = FingerprintFromWire(h->fingerprint());
  const std::string name = h->name() ? h->name()->str() : "replica";
  if (Status v = CheckReplicaHello(*h); !v.ok()) {
    spdlog::error("coordinator: replica {} refused: {}", name, v.message());
    try {
      back.send(zmq::buffer(identity), zmq::send_flags::sndmore);
      back.send(zmq::buffer(EncodeError(0, v)), zmq::send_flags::none);
    } catch (const zmq::error_t&) {
      // gone already: nothing to tell
    }
    return;
  }
  if (fingerprint &&
      (fingerprint->weights_hash != fp.weights_hash ||
       fingerprint->kernel_version != fp.kernel_version ||
       fingerprint->attention_chunk != fp.attention_chunk || fingerprint->backend != fp.backend)) {
    spdlog::error("coordinator: replica {} refused: numerics fingerprint differs", name);
    return;
  }
  if (!fingerprint) fingerprint = fp;
  if (options.submit.vocab_size == 0) options.submit.vocab_size = h->vocab_size();
  if (h->max_seq_len() > 0 &&
      (options.submit.max_seq_len == 0 || h->max_seq_len() < options.submit.max_seq_len)) {
    options.submit.max_seq_len = h->max_seq_len();
  }
  if (eos_id < 0) eos_id = h->eos_id();
  bool rejoined = false;
  const int r = replicas.Join(identity, &rejoined);
  if (rejoined && replicas[r].alive) ReplicaDead(r, "said hello again");
  Replica& rep = replicas[r];
  rep.name = name;
  rep.remote = h->remote();
  rep.capacity = std::max<uint32_t>(1, h->capacity());
  rep.alive = true;
  rep.last_seen = Clock::now();
  rep.weight_version = h->weight_version();
  rep.stale = false;
  rep.catchup.clear();
  rep.ForgetHeld();  // a new connection keeps no request yet
  spdlog::info("coordinator: replica {} joined (remote={} capacity={} vocab={})", rep.name,
               rep.remote, rep.capacity, h->vocab_size());
  weights.CatchUp(r);
  if (!rep.remote) local_replicas_joined.fetch_add(1);
}

void Coordinator::State::ReplicaDead(int r, const char* why) {
  Replica& rep = replicas[r];
  if (!rep.alive) return;
  rep.alive = false;
  spdlog::warn("coordinator: replica {} is dead ({}); re-queueing {} sample(s)", rep.name, why,
               rep.inflight.size());
  std::vector<uint64_t> ids(rep.inflight.begin(), rep.inflight.end());
  std::sort(ids.begin(), ids.end(), std::greater<>());
  for (uint64_t id : ids) {
    Work* found = table.FindWork(id);
    if (found == nullptr) continue;
    Work& w = *found;
    w.replica = -1;
    w.enqueued = Clock::now();
    Enqueue(&w, /*front=*/true);
  }
  rep.inflight.clear();
  rep.ForgetHeld();  // should it come back, it is another connection
  weights.OnReplicaGone(r);
}

void Coordinator::State::OnRefused(int r, const wire::ReplicaRefused* m) {
  Replica& rep = replicas[r];
  const Status why = m->error() ? StatusFromWire(m->error()) : Status::Protocol("refused");
  spdlog::warn("coordinator: replica {} refused {} item(s): {}", rep.name,
               m->work_ids() ? m->work_ids()->size() : 0, why.ToString());
  // It does not keep these: the next work of them carries them again.
  if (m->request_keys()) {
    for (uint64_t key : *m->request_keys()) rep.Drop(key, /*tell=*/false);
  }
  std::vector<uint64_t> ids;
  if (m->work_ids()) {
    for (uint64_t id : *m->work_ids()) {
      const Work* w = table.FindWork(id);
      if (w != nullptr && w->replica == r) ids.push_back(id);  // else aborted or moved
    }
  }
  std::sort(ids.begin(), ids.end(), std::greater<>());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  for (uint64_t id : ids) {  // never started there: queued again, at the front
    Work& w = *table.FindWork(id);
    rep.inflight.erase(id);
    w.replica = -1;
    w.enqueued = Clock::now();
    Enqueue(&w, /*front=*/true);
  }
  if (++rep.refusals > kMaxReplicaRefusals) ReplicaDead(r, "refused work too often");
}

void Coordinator::State::OnResults(int r, const wire::ReplicaResults* res) {
  const auto now = Clock::now();
  if (const auto* chunks = res->chunks()) {
    for (const wire::TokenChunk* c : *chunks) {
      Work* found = table.FindWork(c->work_id());
      if (found == nullptr || found->replica != r) continue;
      Work& w = *found;
      Group* g = w.group;
      // position_begin is a trajectory index on both sides: forwarded as it is.
      if (c->injected_ids()) {
        OnInjected(&w, *c->injected_ids());
      } else {
        journal->OnChunk(&w, *c);
      }
      if (g->client.empty() || !g->submit->stream_tokens()) continue;
      flatbuffers::FlatBufferBuilder fbb(256);
      BuildClientTokenChunk(fbb, *c, {g->group_id, w.prompt_index, w.sample_index});
      SendClient(g->client, BufferView(fbb));
    }
  }
  const auto* trajs = res->trajectories();
  if (trajs == nullptr) return;
  // The client envelopes the replica built for the trajectories that end here (replica protocol
  // 4), by work id: forwarded as they are, only their Cost set in place.
  // The turn's Trajectory then carries no ids of its own: they end the envelope's.
  std::unordered_map<uint64_t, const flatbuffers::Vector<uint8_t>*> built;
  if (const auto* fin = res->finished()) {
    for (const wire::FinishedTrajectory* f : *fin) {
      if (f->envelope()) built[f->work_id()] = f->envelope();
    }
  }
  // The client trajectory in `bytes` (verified with the message: DecodeEnvelope).
  auto client_of = [](const flatbuffers::Vector<uint8_t>* bytes) {
    return wire::GetEnvelope(bytes->data())->msg_as_Trajectory();
  };
  for (const wire::Trajectory* t : *trajs) {
    Work* found = table.FindWork(t->work_id());
    if (found == nullptr || found->replica != r) continue;  // aborted or re-dispatched
    replicas[r].inflight.erase(found->id);
    found->replica = -1;
    const auto env = built.find(found->id);
    const wire::Trajectory* client = env != built.end() ? client_of(env->second) : nullptr;
    // Not streamed (a replica that sends no chunks): the injected ids ride on the trajectory.
    if (t->injected_ids()) OnInjected(found, *t->injected_ids());
    if (options.metrics) {  // sampled tokens: those forced on a resume are not new
      size_t n = t->ids() ? t->ids()->size() : 0;
      if (client != nullptr && client->ids()) {
        n = client->ids()->size() - std::min<size_t>(client->ids()->size(), found->ctx_ids.size());
      }
      options.metrics->TurnFinished(n - std::min<size_t>(n, found->forced));
    }
    if (ContinueToolLoop(found, *t)) continue;  // a tool call runs; the next turn follows
    const Work w = table.TakeWork(found);
    Group* g = w.group;
    const Cost turn_cost = CostFromWire(t->cost());
    Cost cost = w.cost;
    cost.Add(turn_cost);
    cost.queue_seconds = w.queue_seconds;
    cost.price_usd = cost.engine_seconds * options.price.replica_hour_usd / 3600.0 +
                     cost.sandbox_cpu_seconds * options.price.sandbox_cpu_hour_usd / 3600.0;
    bool failed = t->finish() == wire::FinishReason_Error;
    if (options.metrics) options.metrics->TrajectoryFinished(cost, w.turn);
    g->cost.Add(cost);
    ++trajectories_done;
    total_cached += turn_cost.prefill_cached;
    total_computed += turn_cost.prefill_computed;
    rate.Add(turn_cost.decode_tokens, now);
    replicas[r].rate.Add(turn_cost.decode_tokens, now);
    // Encoded once, by the replica: these bytes get their Cost set in place, and with a WAL they
    // are held until the finish record is durable (Journal::DeliverDurable), which only sets
    // their cost.wal_bytes in place.
    std::string envelope;
    if (env != built.end()) {
      envelope.assign(reinterpret_cast<const char*>(env->second->data()), env->second->size());
    }
    // None, or not a Trajectory: the replica's fault, a typed error for the client.
    if (!SetVerifiedTrajectoryCost(envelope, cost)) {
      spdlog::error("coordinator: replica {} sent no client trajectory for work {}",
                    replicas[r].name, w.id);
      const std::string tag =
          g->submit->client_tag() ? g->submit->client_tag()->str() : std::string();
      envelope =
          BuildErrorTrajectory({g->group_id, w.prompt_index, w.sample_index},
                               Status::Protocol("the replica sent no client trajectory"), tag);
      failed = true;
    }
    if (journal->OnTrajectoryFinished(w, &envelope)) continue;
    GroupTable::CountDelivered(g, failed, 0);
    if (!g->client.empty()) SendClient(g->client, envelope);
    FinishGroupIfDone(g);
  }
}

}  // namespace bitroll::rollout
