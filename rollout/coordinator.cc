#include "rollout/coordinator.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include <spdlog/spdlog.h>

#include "rollout/messages.h"
#include "rollout/wal_log.h"

namespace bitroll::rollout {

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

uint64_t HashBytes(const void* data, size_t n, uint64_t h = 0xCBF29CE484222325ull) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001B3ull;
  }
  return h;
}

// Decode tokens per second over a sliding window of one-second buckets.
class RateMeter {
 public:
  void Add(int64_t n, Clock::time_point now) {
    Roll(now);
    buckets_.back().second += n;
  }
  double PerSecond(Clock::time_point now) {
    Roll(now);
    int64_t sum = 0;
    for (const auto& b : buckets_) sum += b.second;
    const double span = std::max(1.0, Seconds(now - buckets_.front().first));
    return static_cast<double>(sum) / span;
  }

 private:
  void Roll(Clock::time_point now) {
    if (buckets_.empty() || now - buckets_.back().first >= std::chrono::seconds(1)) {
      buckets_.emplace_back(now, 0);
    }
    while (buckets_.size() > 1 && now - buckets_.front().first > std::chrono::seconds(5)) {
      buckets_.pop_front();
    }
  }
  std::deque<std::pair<Clock::time_point, int64_t>> buckets_;
};

}  // namespace

struct Coordinator::State {
  struct Group {
    std::string client;  // routing id of the submitting DEALER
    std::string key;     // client + group id
    std::string buffer;  // the SubmitRollouts envelope, kept for building work items
    const wire::SubmitRollouts* submit = nullptr;  // points into buffer
    uint64_t group_id = 0;
    uint32_t total = 0, delivered = 0, errors = 0, aborted = 0;
    std::unordered_set<uint64_t> live;  // work ids not yet finished
    CostInfo cost;
    // WAL mode only.
    uint64_t serial = 0;         // the group's serial in the WAL (trajectory id prefix)
    bool detached = false;       // no client: deliveries wait for a re-attach (same group id)
    bool group_pending = false;  // its AppendGroup record is not yet acknowledged
    uint32_t unheadered = 0;     // samples without a trajectory header yet
    std::map<uint32_t, std::string> sent;  // flat index -> delivered envelope (until Ack)
  };
  struct Work {
    uint64_t id = 0;
    Group* group = nullptr;
    uint32_t prompt_index = 0, sample_index = 0;
    uint64_t affinity = 0;  // prompt hash
    Clock::time_point enqueued;
    double queue_seconds = 0.0;
    int replica = -1;  // index into replicas while dispatched
    // WAL mode only: the logged tokens (re-dispatched as forced on resume / failover).
    bool header_logged = false;
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;
    uint32_t forced = 0;  // forced tokens of the current dispatch
  };
  struct HeldDelivery {  // finished, waiting for its finish record to be durable
    uint64_t traj = 0;
    std::string group_key;
    uint32_t flat = 0;
    std::string envelope;  // client Trajectory envelope (cost.wal_bytes filled on delivery)
    bool failed = false;
  };
  struct Replica {
    std::string identity;
    std::string name;
    bool remote = false, alive = true;
    uint32_t capacity = 256;
    std::unordered_set<uint64_t> inflight;
    Clock::time_point last_seen;
    uint64_t weight_version = 0;
    int64_t running = 0;
    RateMeter rate;
  };
  struct PendingUpdate {
    bool active = false;
    std::string client;
    uint64_t request_id = 0;
    std::string path;
    uint64_t version = 0;
    bool drain = false;
    bool sent = false;
    uint64_t replica_request_id = 0;
    Status error;                     // first replica failure
    std::unordered_set<int> waiting;  // replicas that have not acked
  };

  CoordinatorOptions options;
  zmq::socket_t front;
  zmq::socket_t back;
  const std::atomic<bool>* stop = nullptr;

  std::unordered_map<std::string, std::unique_ptr<Group>> groups;
  std::unordered_map<uint64_t, Work> works;
  std::map<int, std::deque<uint64_t>, std::greater<>> queue;  // priority -> work ids
  uint64_t queued = 0;
  std::vector<Replica> replicas;
  std::unordered_map<std::string, int> replica_by_identity;
  std::unordered_map<uint64_t, int> affinity;
  std::deque<std::pair<std::string, std::string>> outbox;  // client sends that hit EAGAIN
  // Found while sending; handled between loop iterations so no iteration is invalidated.
  std::unordered_set<std::string> gone_clients;
  std::unordered_set<int> dead_replicas;
  std::vector<uint64_t> align_buf;  // AlignForRead storage for the message being handled
  uint64_t next_work_id = 1;
  uint64_t next_update_id = 1;
  bool paused = false;  // Drain
  std::vector<std::pair<std::string, uint64_t>> drain_waiters;
  PendingUpdate update;
  std::string weights_path;  // current weights (sent to late-joining replicas)
  uint64_t weight_version = 0;
  std::optional<engine::NumericsFingerprint> fingerprint;
  uint64_t trajectories_done = 0;
  int64_t total_cached = 0, total_computed = 0;
  RateMeter rate;
  // WAL (null without a data dir). See rollout/wal_log.h.
  std::unique_ptr<WalLog> wal;
  std::deque<HeldDelivery> held;  // in finish-append (LSN) order
  uint64_t next_serial = 1;
  int32_t eos_id = -1;
  bool wal_error_reported = false;
  std::unordered_map<uint64_t, std::pair<uint64_t, uint32_t>> done_groups;  // gid -> (serial, n)

  State(zmq::context_t& ctx, const CoordinatorOptions& o)
      : options(o), front(ctx, zmq::socket_type::router), back(ctx, zmq::socket_type::router) {}

  // ---- sending ----

  void SendClient(const std::string& client, std::string_view bytes) {
    if (!outbox.empty()) {
      outbox.emplace_back(client, std::string(bytes));
      return;
    }
    TrySend(client, bytes);
  }

  // Returns false when the message must wait (EAGAIN); a vanished client aborts its groups.
  bool TrySend(const std::string& client, std::string_view bytes) {
    try {
      if (!front.send(zmq::buffer(client), zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
        outbox.emplace_back(client, std::string(bytes));
        return false;
      }
      front.send(zmq::buffer(bytes.data(), bytes.size()), zmq::send_flags::none);
    } catch (const zmq::error_t& e) {
      if (e.num() == EHOSTUNREACH) {
        gone_clients.insert(client);
      } else {
        spdlog::error("coordinator: send to client failed: {}", e.what());
      }
    }
    return true;
  }

  void FlushOutbox() {
    while (!outbox.empty()) {
      auto [client, bytes] = std::move(outbox.front());
      outbox.pop_front();
      try {
        if (!front.send(zmq::buffer(client),
                        zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
          outbox.emplace_front(std::move(client), std::move(bytes));
          return;
        }
        front.send(zmq::buffer(bytes), zmq::send_flags::none);
      } catch (const zmq::error_t& e) {
        if (e.num() == EHOSTUNREACH) gone_clients.insert(client);
      }
    }
  }

  void SendError(const std::string& client, uint64_t request_id, const Status& s,
                 uint64_t group_id = 0) {
    spdlog::warn("coordinator: error to client group={} request={}: {}", group_id, request_id,
                 s.ToString());
    SendClient(client, EncodeError(request_id, s, group_id));
  }

  void SendAck(const std::string& client, uint64_t request_id, uint64_t version) {
    flatbuffers::FlatBufferBuilder fbb(128);
    auto ack = wire::CreateAck(fbb, 0, 0, 0, version);
    FinishEnvelope(fbb, request_id, wire::Message_Ack, ack.Union());
    SendClient(client, BufferView(fbb));
  }

  void SendReplica(int r, flatbuffers::FlatBufferBuilder& fbb) {
    try {
      back.send(zmq::buffer(replicas[r].identity), zmq::send_flags::sndmore);
      back.send(zmq::buffer(fbb.GetBufferPointer(), fbb.GetSize()), zmq::send_flags::none);
    } catch (const zmq::error_t& e) {
      spdlog::warn("coordinator: send to replica {} failed: {}", replicas[r].name, e.what());
      if (e.num() == EHOSTUNREACH) dead_replicas.insert(r);
    }
  }

  // ---- clients ----

  void OnClient(const std::string& client, const zmq::message_t& msg) {
    const void* data = AlignForRead(msg.data(), msg.size(), &align_buf);
    auto env = DecodeEnvelope(data, msg.size(), options.decode);
    if (!env.ok()) {
      SendError(client, 0, env.status());
      return;
    }
    const wire::Envelope* e = *env;
    switch (e->msg_type()) {
      case wire::Message_SubmitRollouts:
        return OnSubmit(client, e, data, msg.size());
      case wire::Message_Abort:
        return OnAbort(client, e->msg_as_Abort()->group_id(), e->request_id());
      case wire::Message_Status:
        return OnStatus(client, e->request_id());
      case wire::Message_UpdateWeights:
        return OnUpdateWeights(client, e);
      case wire::Message_Drain:
        return OnDrain(client, e->request_id(), e->msg_as_Drain()->resume());
      case wire::Message_Ack:
        return OnClientAck(e->msg_as_Ack());
      default:
        SendError(
            client, e->request_id(),
            Status::Protocol(std::string("message type ") + wire::EnumNameMessage(e->msg_type()) +
                             " is not accepted from clients"));
    }
  }

  // Without a WAL groups are per client; with one, a group id names one group for every client,
  // so that a reconnected client can re-attach to it.
  std::string GroupKey(const std::string& client, uint64_t group_id) const {
    std::string key = wal ? std::string() : client;
    key.append(reinterpret_cast<const char*>(&group_id), sizeof(group_id));
    return key;
  }

  void OnSubmit(const std::string& client, const wire::Envelope* e, const void* data, size_t size) {
    const wire::SubmitRollouts* m = e->msg_as_SubmitRollouts();
    const uint64_t gid = m->group_id();
    Status s = ValidateSubmit(*m, options.submit);
    if (!s.ok()) return SendError(client, e->request_id(), s, gid);
    // Valid requests this build cannot honour yet get a typed error rather than a silent ignore.
    if (m->max_turns() > 1) {
      return SendError(client, e->request_id(),
                       Status::Unsupported("max_turns > 1: the multi-turn tool loop is not in "
                                           "this build yet"),
                       gid);
    }
    if (m->stop_strings() != nullptr && m->stop_strings()->size() > 0) {
      return SendError(client, e->request_id(),
                       Status::Unsupported("stop_strings are not supported yet; use stop_ids"),
                       gid);
    }
    std::string key = GroupKey(client, gid);
    if (auto it = groups.find(key); it != groups.end()) {
      if (wal && it->second->client != client) return Reattach(it->second.get(), client);
      return SendError(client, e->request_id(),
                       Status::InvalidArgument("group " + std::to_string(gid) + " is still live"),
                       gid);
    }
    if (wal && !wal->status().ok()) {
      return SendError(client, e->request_id(),
                       wal->status().WithContext("WAL failed; not accepting new work"), gid);
    }
    const uint64_t samples = uint64_t{m->prompts()->size()} * m->n();
    if (works.size() + samples > options.max_queued) {
      return SendError(client, e->request_id(),
                       Status::Busy("coordinator queue is full (" + std::to_string(works.size()) +
                                    " samples pending, limit " +
                                    std::to_string(options.max_queued) + "); retry later"),
                       gid);
    }
    if (wal && samples > kWalMaxSamples) {
      return SendError(
          client, e->request_id(),
          Status::InvalidArgument("a group has at most " + std::to_string(kWalMaxSamples) +
                                  " samples when the WAL is on"),
          gid);
    }
    std::string_view bytes(static_cast<const char*>(data), size);
    uint64_t serial = 0;
    if (wal) {
      // Logged before anything about the group is acknowledged (no trajectory is delivered
      // before its own records, which follow this one, are durable).
      serial = next_serial++;
      Status ls = wal->LogGroup(serial, bytes);
      if (!ls.ok()) return SendError(client, e->request_id(), ls.WithContext("WAL append"), gid);
    }
    Group* g = NewGroup(client, key, bytes, serial);
    g->group_pending = wal != nullptr;
    for (uint32_t i = 0; i < m->prompts()->size(); ++i) {
      for (uint32_t j = 0; j < m->n(); ++j) AddWork(g, i, j);
    }
    g->unheadered = g->total;
    spdlog::debug("coordinator: submit group={} prompts={} n={} tag={}", gid, m->prompts()->size(),
                  m->n(), m->client_tag() ? m->client_tag()->str() : "");
  }

  // A group from a verified SubmitRollouts envelope `bytes`; no samples yet.
  Group* NewGroup(const std::string& client, const std::string& key, std::string_view bytes,
                  uint64_t serial) {
    auto g = std::make_unique<Group>();
    g->client = client;
    g->detached = client.empty();
    g->key = key;
    g->buffer.assign(bytes.data(), bytes.size());  // heap: malloc-aligned
    g->submit = wire::GetEnvelope(g->buffer.data())->msg_as_SubmitRollouts();
    g->group_id = g->submit->group_id();
    g->total = g->submit->prompts()->size() * g->submit->n();
    g->serial = serial;
    Group* raw = g.get();
    groups.emplace(key, std::move(g));
    return raw;
  }

  // Queues sample (i, j) of g; `log` (WAL) resumes it from its logged tokens.
  void AddWork(Group* g, uint32_t i, uint32_t j, const wal::TrajectoryLog* log = nullptr) {
    const wire::Prompt* p = g->submit->prompts()->Get(i);
    Work w;
    w.id = wal ? WalTrajId(g->serial, i * g->submit->n() + j) : next_work_id++;
    w.group = g;
    w.prompt_index = i;
    w.sample_index = j;
    w.affinity = p->ids() ? HashBytes(p->ids()->data(), p->ids()->size() * 4)
                          : HashBytes(p->text()->data(), p->text()->size(), 7);
    w.enqueued = Clock::now();
    if (log != nullptr) {
      w.header_logged = true;
      w.tokens = log->token_ids;
      w.logprobs = log->logprobs;
    }
    g->live.insert(w.id);
    queue[g->submit->priority()].push_back(w.id);
    works.emplace(w.id, std::move(w));
    ++queued;
  }

  void FinishGroupIfDone(Group* g) {
    if (g->delivered + g->aborted < g->total || g->detached) return;
    if (wal) {
      if (done_groups.size() > 100000) done_groups.clear();
      done_groups[g->group_id] = {g->serial, g->submit->n()};
    }
    flatbuffers::FlatBufferBuilder fbb(256);
    auto done = wire::CreateGroupDone(fbb, g->group_id, g->delivered, g->errors, g->aborted,
                                      BuildCost(fbb, g->cost));
    FinishEnvelope(fbb, 0, wire::Message_GroupDone, done.Union());
    std::string client = g->client;
    groups.erase(g->key);  // destroys g
    if (!client.empty()) SendClient(client, BufferView(fbb));
  }

  // Cancels every unfinished sample of `g`, then sends GroupDone.
  void AbortGroup(Group* g) {
    std::map<int, std::vector<uint64_t>> per_replica;
    for (uint64_t id : g->live) {
      auto it = works.find(id);
      if (it == works.end()) continue;
      if (wal && it->second.header_logged) (void)wal->Discard(id);
      if (it->second.replica >= 0) {
        per_replica[it->second.replica].push_back(id);
        replicas[it->second.replica].inflight.erase(id);
      } else {
        --queued;  // its queue entry is skipped lazily
      }
      works.erase(it);
      ++g->aborted;
    }
    g->live.clear();
    if (wal && g->group_pending) {
      (void)wal->AckGroup(g->serial);
      g->group_pending = false;
    }
    for (auto& [r, ids] : per_replica) {
      if (!replicas[r].alive) continue;
      flatbuffers::FlatBufferBuilder fbb(64 + ids.size() * 8);
      auto a = wire::CreateReplicaAbort(fbb, fbb.CreateVector(ids));
      FinishEnvelope(fbb, 0, wire::Message_ReplicaAbort, a.Union());
      SendReplica(r, fbb);
    }
    FinishGroupIfDone(g);
  }

  void OnAbort(const std::string& client, uint64_t gid, uint64_t request_id) {
    auto it = groups.find(GroupKey(client, gid));
    if (it == groups.end()) {
      return SendError(client, request_id,
                       Status::NotFound("group " + std::to_string(gid) + " is not live"), gid);
    }
    spdlog::info("coordinator: abort group={}", gid);
    AbortGroup(it->second.get());
  }

  void ClientGone(const std::string& client) {
    std::vector<Group*> gone;
    for (auto& [k, g] : groups) {
      if (g->client == client) gone.push_back(g.get());
    }
    if (!gone.empty()) {
      spdlog::warn("coordinator: client vanished; {} its {} live group(s)",
                   wal ? "detaching" : "aborting", gone.size());
    }
    std::erase_if(outbox, [&](const auto& p) { return p.first == client; });
    for (Group* g : gone) {
      g->client.clear();  // GroupDone goes nowhere
      if (wal) {
        g->detached = true;  // work goes on; a re-attach gets the results
      } else {
        AbortGroup(g);
      }
    }
  }

  void OnStatus(const std::string& client, uint64_t request_id) {
    const auto now = Clock::now();
    flatbuffers::FlatBufferBuilder fbb(1024);
    std::vector<flatbuffers::Offset<wire::ReplicaLoad>> loads;
    for (Replica& r : replicas) {
      loads.push_back(wire::CreateReplicaLoad(
          fbb, fbb.CreateString(r.name), static_cast<uint32_t>(r.inflight.size()), r.running,
          r.rate.PerSecond(now), r.weight_version, r.alive, r.remote));
    }
    const double denom = static_cast<double>(total_cached + total_computed);
    auto reply = wire::CreateStatusReply(
        fbb, kProtocolVersion, static_cast<uint32_t>(queued),
        static_cast<uint32_t>(works.size() - queued), static_cast<uint32_t>(groups.size()),
        fbb.CreateVector(loads), rate.PerSecond(now),
        denom > 0 ? static_cast<double>(total_cached) / denom : 0.0, trajectories_done,
        weight_version, paused || (update.active && update.drain), wal != nullptr,
        wal ? wal->counters.tokens_logged : 0, wal ? wal->counters.recovered_tokens : 0,
        wal ? wal->counters.forced_tokens : 0, wal ? wal->counters.resumed : 0,
        wal ? wal->counters.forced_mismatches : 0, wal ? wal->stats().bytes_written : 0,
        wal && !wal->status().ok() ? wire::CreateError(fbb, ToWire(wal->status().code()),
                                                       fbb.CreateString(wal->status().message()))
                                   : 0);
    FinishEnvelope(fbb, request_id, wire::Message_StatusReply, reply.Union());
    SendClient(client, BufferView(fbb));
  }

  void OnUpdateWeights(const std::string& client, const wire::Envelope* e) {
    const wire::UpdateWeights* u = e->msg_as_UpdateWeights();
    if (u->tensors() != nullptr && u->tensors()->size() > 0) {
      return SendError(client, e->request_id(),
                       Status::Unsupported("streamed tensor updates are not implemented; "
                                           "send a path"));
    }
    if (u->path() == nullptr || u->path()->size() == 0) {
      return SendError(client, e->request_id(), Status::InvalidArgument("UpdateWeights: no path"));
    }
    if (update.active) {
      return SendError(client, e->request_id(),
                       Status::FailedPrecondition("another weight update is in progress"));
    }
    update = PendingUpdate{};
    update.active = true;
    update.client = client;
    update.request_id = e->request_id();
    update.path = u->path()->str();
    update.version = u->version();
    update.drain = u->drain();
    spdlog::info("coordinator: update weights path={} version={} drain={}", update.path,
                 update.version, update.drain);
    MaybeSendUpdate();
  }

  void SendUpdateTo(int r, const std::string& path, uint64_t version, uint64_t request_id) {
    flatbuffers::FlatBufferBuilder fbb(256);
    auto m = wire::CreateUpdateWeights(fbb, fbb.CreateString(path), version, false);
    FinishEnvelope(fbb, request_id, wire::Message_UpdateWeights, m.Union());
    SendReplica(r, fbb);
  }

  void MaybeSendUpdate() {
    if (!update.active || update.sent) return;
    if (update.drain && works.size() - queued > 0) return;  // wait for in-flight work
    update.sent = true;
    update.replica_request_id = next_update_id++;
    for (int r = 0; r < static_cast<int>(replicas.size()); ++r) {
      if (!replicas[r].alive) continue;
      update.waiting.insert(r);
      SendUpdateTo(r, update.path, update.version, update.replica_request_id);
    }
    MaybeFinishUpdate();
  }

  void MaybeFinishUpdate() {
    if (!update.active || !update.sent || !update.waiting.empty()) return;
    if (update.error.ok()) {
      weights_path = update.path;
      weight_version = update.version;
      spdlog::info("coordinator: weights version={} live on every replica", weight_version);
      SendAck(update.client, update.request_id, update.version);
    } else {
      SendError(update.client, update.request_id, update.error);
    }
    update = PendingUpdate{};
  }

  void OnDrain(const std::string& client, uint64_t request_id, bool resume) {
    if (resume) {
      paused = false;
      spdlog::info("coordinator: resume dispatch");
      return SendAck(client, request_id, weight_version);
    }
    paused = true;
    spdlog::info("coordinator: drain: dispatch paused");
    drain_waiters.emplace_back(client, request_id);
    MaybeFinishDrain();
  }

  void MaybeFinishDrain() {
    if (drain_waiters.empty() || works.size() - queued > 0) return;
    for (auto& [c, id] : drain_waiters) SendAck(c, id, weight_version);
    drain_waiters.clear();
  }

  // ---- replicas ----

  void OnReplica(const std::string& identity, const zmq::message_t& msg) {
    auto env = DecodeEnvelope(AlignForRead(msg.data(), msg.size(), &align_buf), msg.size(),
                              options.decode);
    if (!env.ok()) {
      spdlog::warn("coordinator: bad message from a replica: {}", env.status().ToString());
      return;
    }
    const wire::Envelope* e = *env;
    if (e->msg_type() == wire::Message_ReplicaHello) return OnHello(identity, e);
    auto it = replica_by_identity.find(identity);
    if (it == replica_by_identity.end() || !replicas[it->second].alive) return;  // stale
    const int r = it->second;
    replicas[r].last_seen = Clock::now();
    switch (e->msg_type()) {
      case wire::Message_ReplicaHeartbeat:
        replicas[r].running = e->msg_as_ReplicaHeartbeat()->running();
        return;
      case wire::Message_ReplicaResults:
        return OnResults(r, e->msg_as_ReplicaResults());
      case wire::Message_Ack:
        replicas[r].weight_version = e->msg_as_Ack()->weight_version();
        return OnUpdateReply(r, e->request_id(), Status::Ok());
      case wire::Message_Error:
        return OnUpdateReply(r, e->request_id(), StatusFromWire(e->msg_as_Error()));
      default:
        spdlog::warn("coordinator: replica {} sent unexpected {}", replicas[r].name,
                     wire::EnumNameMessage(e->msg_type()));
    }
  }

  void OnUpdateReply(int r, uint64_t request_id, Status s) {
    if (!s.ok()) {
      spdlog::error("coordinator: replica {} failed a weight update: {}", replicas[r].name,
                    s.ToString());
    }
    if (!update.active || !update.sent || request_id != update.replica_request_id) return;
    if (!s.ok() && update.error.ok()) update.error = s.WithContext(replicas[r].name);
    update.waiting.erase(r);
    MaybeFinishUpdate();
  }

  void OnHello(const std::string& identity, const wire::Envelope* e) {
    const wire::ReplicaHello* h = e->msg_as_ReplicaHello();
    engine::NumericsFingerprint fp;
    if (const auto* f = h->fingerprint()) {
      fp.weights_hash = f->weights_hash();
      fp.kernel_version = f->kernel_version();
      fp.attention_chunk = f->attention_chunk();
      fp.backend = f->backend() ? f->backend()->str() : "";
    }
    const std::string name = h->name() ? h->name()->str() : "replica";
    if (fingerprint && (fingerprint->weights_hash != fp.weights_hash ||
                        fingerprint->kernel_version != fp.kernel_version ||
                        fingerprint->attention_chunk != fp.attention_chunk ||
                        fingerprint->backend != fp.backend)) {
      spdlog::error("coordinator: replica {} refused: numerics fingerprint differs", name);
      return;
    }
    if (!fingerprint) fingerprint = fp;
    if (options.submit.vocab_size == 0) options.submit.vocab_size = h->vocab_size();
    if (eos_id < 0) eos_id = h->eos_id();
    auto it = replica_by_identity.find(identity);
    int r;
    if (it != replica_by_identity.end()) {
      r = it->second;
      if (replicas[r].alive) ReplicaDead(r, "said hello again");
    } else {
      r = static_cast<int>(replicas.size());
      replicas.emplace_back();
      replica_by_identity[identity] = r;
    }
    Replica& rep = replicas[r];
    rep.identity = identity;
    rep.name = name;
    rep.remote = h->remote();
    rep.capacity = std::max<uint32_t>(1, h->capacity());
    rep.alive = true;
    rep.last_seen = Clock::now();
    rep.weight_version = h->weight_version();
    spdlog::info("coordinator: replica {} joined (remote={} capacity={} vocab={})", rep.name,
                 rep.remote, rep.capacity, h->vocab_size());
    // A late joiner loads the live weights (and joins an update in progress) before any work:
    // messages on its pipe are handled in order.
    if (!weights_path.empty() && rep.weight_version != weight_version) {
      SendUpdateTo(r, weights_path, weight_version, 0);
    }
    if (update.active && update.sent) {
      update.waiting.insert(r);
      SendUpdateTo(r, update.path, update.version, update.replica_request_id);
    }
  }

  void ReplicaDead(int r, const char* why) {
    Replica& rep = replicas[r];
    if (!rep.alive) return;
    rep.alive = false;
    spdlog::warn("coordinator: replica {} is dead ({}); re-queueing {} sample(s)", rep.name, why,
                 rep.inflight.size());
    std::vector<uint64_t> ids(rep.inflight.begin(), rep.inflight.end());
    std::sort(ids.begin(), ids.end(), std::greater<>());
    for (uint64_t id : ids) {
      auto it = works.find(id);
      if (it == works.end()) continue;
      Work& w = it->second;
      w.replica = -1;
      w.enqueued = Clock::now();
      queue[w.group->submit->priority()].push_front(id);
      ++queued;
    }
    rep.inflight.clear();
    if (update.active) {
      update.waiting.erase(r);
      MaybeFinishUpdate();
    }
  }

  void OnResults(int r, const wire::ReplicaResults* res) {
    const auto now = Clock::now();
    if (const auto* chunks = res->chunks()) {
      for (const wire::TokenChunk* c : *chunks) {
        auto it = works.find(c->work_id());
        if (it == works.end() || it->second.replica != r) continue;
        Group* g = it->second.group;
        if (wal) LogChunk(&it->second, *c);
        if (g->client.empty() || !g->submit->stream_tokens()) continue;
        flatbuffers::FlatBufferBuilder fbb(256);
        BuildClientTokenChunk(fbb, *c,
                              {g->group_id, it->second.prompt_index, it->second.sample_index});
        SendClient(g->client, BufferView(fbb));
      }
    }
    const auto* trajs = res->trajectories();
    if (trajs == nullptr) return;
    for (const wire::Trajectory* t : *trajs) {
      auto it = works.find(t->work_id());
      if (it == works.end() || it->second.replica != r) continue;  // aborted or re-dispatched
      Work w = std::move(it->second);
      works.erase(it);
      replicas[r].inflight.erase(w.id);
      Group* g = w.group;
      g->live.erase(w.id);
      CostInfo cost = CostFromWire(t->cost());
      cost.queue_seconds = w.queue_seconds;
      cost.price_usd = cost.engine_seconds * options.price.replica_hour_usd / 3600.0 +
                       cost.sandbox_cpu_seconds * options.price.sandbox_cpu_hour_usd / 3600.0;
      const bool failed = t->finish() == wire::FinishReason_Error;
      if (!wal) {
        ++g->delivered;
        if (failed) ++g->errors;
      }
      g->cost.Add(cost);
      ++trajectories_done;
      total_cached += cost.prefill_cached;
      total_computed += cost.prefill_computed;
      rate.Add(cost.decode_tokens, now);
      replicas[r].rate.Add(cost.decode_tokens, now);
      if (wal) {
        // Delivered by DeliverDurable() once the finish record is durable.
        flatbuffers::FlatBufferBuilder fbb(256 + (t->ids() ? t->ids()->size() * 8 : 0));
        BuildClientTrajectory(fbb, *t, {g->group_id, w.prompt_index, w.sample_index}, cost,
                              replicas[r].name, g->submit->client_tag());
        LogFinish(w, *t, std::string(BufferView(fbb)));
        continue;
      }
      if (!g->client.empty()) {
        flatbuffers::FlatBufferBuilder fbb(256 + (t->ids() ? t->ids()->size() * 8 : 0));
        BuildClientTrajectory(fbb, *t, {g->group_id, w.prompt_index, w.sample_index}, cost,
                              replicas[r].name, g->submit->client_tag());
        SendClient(g->client, BufferView(fbb));
      }
      FinishGroupIfDone(g);
    }
  }

  // ---- WAL (rollout/wal_log.h) ----

  // Sends the WAL's sticky error once to every attached client with live groups.
  void ReportWalError(const Status& s) {
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

  void CheckWal(const Status& s) {
    if (!s.ok()) ReportWalError(wal->status().ok() ? s : wal->status());
  }

  // First dispatch logs the header; a re-dispatch (resume, failover) forces the logged tokens.
  void LogDispatch(Work* w) {
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
    w->forced = static_cast<uint32_t>(w->tokens.size());
    if (w->forced > 0) {
      wal->counters.forced_tokens += w->forced;
      ++wal->counters.resumed;
    }
  }

  // Appends the chunk's tokens past those already logged; re-scored forced tokens are compared
  // with the log bit for bit (a mismatch is counted and reported: the numerics changed).
  void LogChunk(Work* w, const wire::TokenChunk& c) {
    if (c.ids() == nullptr || c.logprobs() == nullptr || c.ids()->size() != c.logprobs()->size()) {
      return;
    }
    const auto n = static_cast<int64_t>(c.ids()->size());
    const int64_t begin = c.position_begin();
    const auto have = static_cast<int64_t>(w->tokens.size());
    for (int64_t i = 0; i < n && begin + i < have; ++i) {
      const int32_t id = c.ids()->Get(static_cast<uint32_t>(i));
      const float lp = c.logprobs()->Get(static_cast<uint32_t>(i));
      const size_t at = static_cast<size_t>(begin + i);
      if (id != w->tokens[at] || std::memcmp(&lp, &w->logprobs[at], sizeof(float)) != 0) {
        ++wal->counters.forced_mismatches;
        spdlog::error("coordinator: trajectory {} token {} re-scored differently from the WAL",
                      w->id, at);
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

  void LogFinish(const Work& w, const wire::Trajectory& t, std::string envelope) {
    // Tokens the replica did not stream (none when it streams every one) are logged first.
    if (t.ids() && t.logprobs() && t.ids()->size() == t.logprobs()->size() &&
        t.ids()->size() > w.tokens.size()) {
      const size_t k = w.tokens.size(), m = t.ids()->size() - k;
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

  // Commits (group commit) and delivers the trajectories whose finish record is durable.
  void CommitAndDeliver() {
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
                            t->replica() ? t->replica()->string_view() : "",
                            g->submit->client_tag());
      Deliver(g, d.flat, std::string(BufferView(fbb)), d.failed);
    }
  }

  void Deliver(Group* g, uint32_t flat, std::string envelope, bool failed) {
    ++g->delivered;
    if (failed) ++g->errors;
    if (!g->client.empty()) SendClient(g->client, envelope);
    g->sent[flat] = std::move(envelope);
    FinishGroupIfDone(g);
  }

  // A client (re)submitted the group id of a live or recovered group: it becomes the group's
  // client and gets every trajectory delivered so far and not acknowledged, then GroupDone.
  void Reattach(Group* g, const std::string& client) {
    spdlog::info("coordinator: client re-attached to group={} ({} of {} delivered)", g->group_id,
                 g->delivered, g->total);
    g->client = client;
    g->detached = false;
    for (const auto& [flat, env] : g->sent) SendClient(client, env);
    FinishGroupIfDone(g);
  }

  void OnClientAck(const wire::Ack* a) {
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

  // Rebuilds groups and work from the WAL (Coordinator::Start, before any thread runs).
  Status RecoverFromWal() {
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
      for (uint32_t flat = 0; flat < g->total; ++flat) {
        const uint64_t id = WalTrajId(serial, flat);
        const SampleAddress at{g->group_id, flat / n, flat % n};
        if (auto u = unfinished.find(id); u != unfinished.end()) {
          wal->counters.recovered_tokens += u->second->token_ids.size();
          AddWork(g, at.prompt_index, at.sample_index, u->second);
        } else if (auto f = finished.find(id); f != finished.end()) {
          CostInfo cost;
          cost.wal_bytes = static_cast<int64_t>(f->second->bytes);
          const bool failed =
              f->second->finish &&
              f->second->finish->reason == static_cast<uint8_t>(wire::FinishReason_Error);
          Deliver(g, flat, BuildLoggedTrajectory(*f->second, at, cost, tag), failed);
        } else if (auto q = quarantined.find(id); q != quarantined.end()) {
          Deliver(g, flat, BuildErrorTrajectory(at, q->second, tag), true);
        } else if (g->group_pending) {
          AddWork(g, at.prompt_index, at.sample_index);
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
    spdlog::info(
        "coordinator: WAL recovered {} group(s): {} unfinished trajectories ({} logged tokens), "
        "{} finished, {} quarantined",
        by_serial.size(), rec.unfinished.size(), wal->counters.recovered_tokens,
        rec.finished.size(), rec.quarantined.size());
    return Status::Ok();
  }

  // ---- dispatch ----

  // Chooses a replica for a sample: its prefix's replica when alive with room, else the least
  // loaded one with room; -1 when every replica is full.
  int Choose(uint64_t affinity_key) {
    auto it = affinity.find(affinity_key);
    if (it != affinity.end()) {
      const Replica& r = replicas[it->second];
      if (r.alive && r.inflight.size() < r.capacity) return it->second;
    }
    int best = -1;
    double best_load = 2.0;
    for (int i = 0; i < static_cast<int>(replicas.size()); ++i) {
      const Replica& r = replicas[i];
      if (!r.alive || r.inflight.size() >= r.capacity) continue;
      const double load = static_cast<double>(r.inflight.size()) / r.capacity;
      if (load < best_load) {
        best = i;
        best_load = load;
      }
    }
    if (best >= 0) {
      if (affinity.size() > 100000) affinity.clear();
      affinity[affinity_key] = best;
    }
    return best;
  }

  void Dispatch() {
    if (paused || (update.active && update.drain) || queued == 0) return;
    const auto now = Clock::now();
    std::unordered_map<int, std::pair<std::unique_ptr<flatbuffers::FlatBufferBuilder>,
                                      std::vector<flatbuffers::Offset<wire::WorkItem>>>>
        batches;
    for (auto qit = queue.begin(); qit != queue.end();) {
      auto& dq = qit->second;
      bool full = false;
      while (!dq.empty()) {
        const uint64_t id = dq.front();
        auto wit = works.find(id);
        if (wit == works.end() || wit->second.replica >= 0) {  // aborted: lazy removal
          dq.pop_front();
          continue;
        }
        Work& w = wit->second;
        const int r = Choose(w.affinity);
        if (r < 0) {
          full = true;
          break;
        }
        dq.pop_front();
        --queued;
        w.replica = r;
        w.queue_seconds += Seconds(now - w.enqueued);
        replicas[r].inflight.insert(id);
        if (wal) LogDispatch(&w);
        auto& batch = batches[r];
        if (!batch.first) batch.first = std::make_unique<flatbuffers::FlatBufferBuilder>(4096);
        batch.second.push_back(BuildWorkItem(*batch.first, *w.group->submit, w.id,
                                             {w.group->group_id, w.prompt_index, w.sample_index},
                                             w.tokens, wal != nullptr));
      }
      if (full) break;
      if (dq.empty()) {
        qit = queue.erase(qit);
      } else {
        ++qit;
      }
    }
    for (auto& [r, batch] : batches) {
      auto& fbb = *batch.first;
      auto work = wire::CreateReplicaWork(fbb, fbb.CreateVector(batch.second));
      FinishEnvelope(fbb, 0, wire::Message_ReplicaWork, work.Union());
      SendReplica(r, fbb);
    }
  }

  void HandleFailures() {
    while (!dead_replicas.empty() || !gone_clients.empty()) {
      auto dead = std::move(dead_replicas);
      dead_replicas.clear();
      for (int r : dead) ReplicaDead(r, "unreachable");
      auto gone = std::move(gone_clients);
      gone_clients.clear();
      for (const std::string& c : gone) ClientGone(c);
    }
  }

  void CheckTimeouts() {
    const auto now = Clock::now();
    const auto limit = std::chrono::milliseconds(options.replica_timeout_ms);
    for (int r = 0; r < static_cast<int>(replicas.size()); ++r) {
      if (replicas[r].alive && now - replicas[r].last_seen > limit) ReplicaDead(r, "timed out");
    }
  }

  // ---- loop ----

  void Run() {
    zmq::pollitem_t items[2] = {{front.handle(), 0, ZMQ_POLLIN, 0},
                                {back.handle(), 0, ZMQ_POLLIN, 0}};
    auto last_check = Clock::now();
    zmq::message_t id, body;
    while (!stop->load(std::memory_order_relaxed)) {
      try {
        int wait_ms = outbox.empty() ? 20 : 1;
        if (wal && !held.empty()) wait_ms = std::min(wait_ms, std::max(1, wal->MsUntilCommit()));
        zmq::poll(items, 2, std::chrono::milliseconds(wait_ms));
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
        if (wal) CommitAndDeliver();
        FlushOutbox();
        HandleFailures();
        const auto now = Clock::now();
        if (now - last_check > std::chrono::milliseconds(20)) {
          CheckTimeouts();
          last_check = now;
        }
        Dispatch();
        MaybeSendUpdate();
        MaybeFinishDrain();
      } catch (const zmq::error_t& e) {
        if (e.num() == ETERM) return;
        spdlog::error("coordinator: {}", e.what());
      }
    }
  }
};

Result<std::unique_ptr<Coordinator>> Coordinator::Start(
    const CoordinatorOptions& options, std::vector<std::unique_ptr<engine::Engine>> engines) {
  std::unique_ptr<Coordinator> c(new Coordinator());
  c->ctx_ = std::make_unique<zmq::context_t>(1);
  c->state_ = std::make_unique<State>(*c->ctx_, options);
  State& s = *c->state_;
  s.stop = &c->stop_;
  if (!engines.empty()) {
    // The first in-process engine fixes the vocabulary and the numerics fingerprint.
    if (s.options.submit.vocab_size == 0) {
      s.options.submit.vocab_size = engines[0]->info().vocab_size;
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
  if (!options.wal.dir.empty()) {
    BR_ASSIGN_OR_RETURN(s.wal, WalLog::Open(options.wal));
    if (!engines.empty()) s.eos_id = engines[0]->info().eos_id;
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
