#include "rollout/client.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>

namespace bitroll::rollout {

namespace {

using Clock = std::chrono::steady_clock;

int RemainingMs(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::max<int64_t>(0, left.count()));
}

TrajectoryResult FromWire(const wire::Trajectory& t) {
  TrajectoryResult r;
  r.group_id = t.group_id();
  r.prompt_index = t.prompt_index();
  r.sample_index = t.sample_index();
  if (t.ids()) r.ids.assign(t.ids()->begin(), t.ids()->end());
  if (t.logprobs()) r.logprobs.assign(t.logprobs()->begin(), t.logprobs()->end());
  r.finish = FinishFromWire(t.finish());
  r.turns = t.turns();
  if (t.versions()) {
    for (const wire::VersionSpan* v : *t.versions())
      r.versions.emplace_back(v->begin(), v->version());
  }
  r.fingerprint = FingerprintFromWire(t.fingerprint());
  r.cost = CostFromWire(t.cost());
  r.replica = t.replica() ? t.replica()->str() : "";
  r.client_tag = t.client_tag() ? t.client_tag()->str() : "";
  r.error = StatusFromWire(t.error());
  if (t.mask()) r.mask.assign(t.mask()->begin(), t.mask()->end());
  if (t.tool_calls()) {
    for (const wire::ToolCallInfo* c : *t.tool_calls()) {
      ToolCallResult o;
      o.name = c->name() ? c->name()->str() : "";
      o.input = c->input() ? c->input()->str() : "";
      o.tier = TierFromWire(c->tier());
      o.exit_status = c->exit_status();
      o.output = c->output() ? c->output()->str() : "";
      o.output_truncated = c->output_truncated();
      o.error = StatusFromWire(c->error());
      o.wall_seconds = c->wall_seconds();
      o.cpu_seconds = c->cpu_seconds();
      o.token_index = c->token_index();
      o.replayed = c->replayed();
      r.tool_calls.push_back(std::move(o));
    }
  }
  if (Result<RoutingRecord> routing = RoutingFromWire(t.routing()); routing.ok()) {
    r.routing = std::move(*routing);
  } else if (r.error.ok()) {
    r.error = routing.status();
  }
  return r;
}

// 128 random bits as 32 hex digits.
std::string RandomClientId() {
  std::random_device rd;
  std::string id;
  for (int i = 0; i < 4; ++i) {
    char buf[9];
    std::snprintf(buf, sizeof(buf), "%08x", static_cast<uint32_t>(rd()));
    id += buf;
  }
  return id;
}

}  // namespace

Client::Client(const ClientOptions& options)
    : options_(options), ctx_(1), sock_(ctx_, zmq::socket_type::dealer) {
  if (options_.client_id.empty()) options_.client_id = RandomClientId();
}

Client::~Client() = default;

Result<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  std::unique_ptr<Client> c(new Client(options));
  try {
    c->sock_.set(zmq::sockopt::linger, 0);
    c->sock_.set(zmq::sockopt::rcvhwm, 0);
    c->sock_.connect(options.endpoint);
  } catch (const zmq::error_t& e) {
    return Status::Unavailable("connect " + options.endpoint + ": " + e.what());
  }
  return c;
}

Status Client::SendRaw(std::string_view bytes) {
  try {
    sock_.send(zmq::buffer(bytes.data(), bytes.size()), zmq::send_flags::none);
  } catch (const zmq::error_t& e) {
    return Status::Unavailable(std::string("send: ") + e.what());
  }
  return Status::Ok();
}

std::string EncodeSubmit(const SubmitRequest& q, uint64_t request_id, std::string_view client_id) {
  flatbuffers::FlatBufferBuilder fbb(1024);
  std::vector<flatbuffers::Offset<wire::Prompt>> prompts;
  for (const auto& p : q.prompts) prompts.push_back(wire::CreatePrompt(fbb, fbb.CreateVector(p)));
  for (const auto& t : q.text_prompts) {
    prompts.push_back(wire::CreatePrompt(fbb, 0, fbb.CreateString(t)));
  }
  auto pv = fbb.CreateVector(prompts);
  auto sp = SamplingToWire(fbb, q);
  auto stop_ids = fbb.CreateVector(q.stop_ids);
  auto stop_strings = fbb.CreateVectorOfStrings(q.stop_strings);
  auto tag = fbb.CreateString(q.client_tag);
  std::vector<flatbuffers::Offset<wire::ToolSpec>> tools;
  for (const ToolSpecInput& t : q.tools) {
    auto lim = wire::CreateToolLimits(fbb, t.wall_ms, t.cpu_ms, t.memory_bytes, t.output_bytes,
                                      t.processes, t.network);
    tools.push_back(
        wire::CreateToolSpec(fbb, fbb.CreateString(t.name), TierToWire(t.tier),
                             t.command_template.empty() ? 0 : fbb.CreateString(t.command_template),
                             t.function.empty() ? 0 : fbb.CreateString(t.function), lim));
  }
  auto tv = tools.empty() ? 0 : fbb.CreateVector(tools);
  auto open = q.tool_open.empty() ? 0 : fbb.CreateString(q.tool_open);
  auto close = q.tool_close.empty() ? 0 : fbb.CreateString(q.tool_close);
  auto tmpl = q.tool_result_template.empty() ? 0 : fbb.CreateString(q.tool_result_template);
  auto m = wire::CreateSubmitRollouts(fbb, q.group_id, pv, q.n, sp, q.seed, q.max_tokens,
                                      q.max_turns, stop_ids, stop_strings, q.stop_at_eos, tv,
                                      q.priority, tag, q.stream_tokens, open, close, q.tool_open_id,
                                      q.tool_close_id, tmpl, q.return_routing);
  FinishEnvelope(fbb, request_id, wire::Message_SubmitRollouts, m.Union(), client_id);
  return std::string(BufferView(fbb));
}

Status Client::Submit(const SubmitRequest& q) {
  if (q.prompts.empty() == q.text_prompts.empty()) {
    return Status::InvalidArgument("set exactly one of prompts and text_prompts");
  }
  return SendRaw(EncodeSubmit(q, next_request_id_++, options_.client_id));
}

Result<Event> Client::Receive(int timeout_ms) {
  zmq::message_t msg;
  try {
    zmq::pollitem_t item{sock_.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(timeout_ms));
    if (!(item.revents & ZMQ_POLLIN) || !sock_.recv(msg, zmq::recv_flags::dontwait)) {
      return Status::Timeout("no message within " + std::to_string(timeout_ms) + " ms");
    }
  } catch (const zmq::error_t& e) {
    return Status::Unavailable(std::string("recv: ") + e.what());
  }
  std::vector<uint64_t> aligned;
  BR_ASSIGN_OR_RETURN(
      const wire::Envelope* env,
      DecodeEnvelope(AlignForRead(msg.data(), msg.size(), &aligned), msg.size(), options_.decode));
  Event ev;
  ev.request_id = env->request_id();
  switch (env->msg_type()) {
    case wire::Message_Trajectory:
      ev.kind = Event::Kind::kTrajectory;
      ev.trajectory = FromWire(*env->msg_as_Trajectory());
      break;
    case wire::Message_TokenChunk: {
      const auto* c = env->msg_as_TokenChunk();
      ev.kind = Event::Kind::kTokenChunk;
      ev.chunk.group_id = c->group_id();
      ev.chunk.prompt_index = c->prompt_index();
      ev.chunk.sample_index = c->sample_index();
      ev.chunk.position_begin = c->position_begin();
      if (c->ids()) ev.chunk.ids.assign(c->ids()->begin(), c->ids()->end());
      if (c->logprobs()) ev.chunk.logprobs.assign(c->logprobs()->begin(), c->logprobs()->end());
      ev.chunk.weight_version = c->weight_version();
      if (c->injected_ids()) {
        ev.chunk.injected_ids.assign(c->injected_ids()->begin(), c->injected_ids()->end());
      }
      break;
    }
    case wire::Message_GroupDone: {
      const auto* d = env->msg_as_GroupDone();
      ev.kind = Event::Kind::kGroupDone;
      ev.done = {d->group_id(), d->trajectories(), d->errors(), d->aborted(),
                 CostFromWire(d->cost())};
      break;
    }
    case wire::Message_Error:
      ev.kind = Event::Kind::kError;
      ev.error = StatusFromWire(env->msg_as_Error());
      if (ev.error.ok()) ev.error = Status::Internal("Error message with code Ok");
      ev.error_group_id = env->msg_as_Error()->group_id();
      break;
    case wire::Message_Ack:
    case wire::Message_StatusReply:
      ev.kind = Event::Kind::kReply;
      ev.reply.assign(static_cast<const char*>(msg.data()), msg.size());
      break;
    default:
      return Status::Protocol(std::string("unexpected message type ") +
                              wire::EnumNameMessage(env->msg_type()));
  }
  return ev;
}

Result<Event> Client::Next(int timeout_ms) {
  if (!pending_.empty()) {
    Event e = std::move(pending_.front());
    pending_.pop_front();
    return e;
  }
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    BR_ASSIGN_OR_RETURN(Event e, Receive(RemainingMs(deadline)));
    if (e.kind == Event::Kind::kReply) continue;  // a reply nobody waits for
    return e;
  }
}

Result<Event> Client::WaitReply(uint64_t request_id, int timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    BR_ASSIGN_OR_RETURN(Event e, Receive(RemainingMs(deadline)));
    if (e.request_id == request_id && e.kind == Event::Kind::kReply) return e;
    if (e.request_id == request_id && e.kind == Event::Kind::kError) return e.error;
    if (e.kind != Event::Kind::kReply) pending_.push_back(std::move(e));
  }
}

Result<std::vector<TrajectoryResult>> Client::Run(const SubmitRequest& request, int timeout_ms,
                                                  GroupSummary* summary) {
  BR_RETURN_IF_ERROR(Submit(request));
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  std::vector<TrajectoryResult> out;
  std::deque<Event> others;
  Status result;
  while (true) {
    auto e = Receive(RemainingMs(deadline));
    if (!e.ok()) {
      result = e.status();
      break;
    }
    Event& ev = *e;
    if (ev.kind == Event::Kind::kTrajectory && ev.trajectory.group_id == request.group_id) {
      out.push_back(std::move(ev.trajectory));
    } else if (ev.kind == Event::Kind::kGroupDone && ev.done.group_id == request.group_id) {
      if (summary) *summary = ev.done;
      break;
    } else if (ev.kind == Event::Kind::kError && !ev.error.ok() &&
               ev.error_group_id == request.group_id) {
      result = ev.error;
      break;
    } else if (ev.kind == Event::Kind::kTokenChunk && ev.chunk.group_id == request.group_id) {
      continue;  // Run() returns whole trajectories; use Next() to see chunks
    } else if (ev.kind != Event::Kind::kReply) {
      others.push_back(std::move(ev));
    }
  }
  for (auto& ev : others) pending_.push_back(std::move(ev));
  if (!result.ok()) return result;
  std::sort(out.begin(), out.end(), [](const TrajectoryResult& a, const TrajectoryResult& b) {
    return std::tie(a.prompt_index, a.sample_index) < std::tie(b.prompt_index, b.sample_index);
  });
  return out;
}

Status Client::Abort(uint64_t group_id) {
  flatbuffers::FlatBufferBuilder fbb(64);
  auto m = wire::CreateAbort(fbb, group_id);
  FinishEnvelope(fbb, next_request_id_++, wire::Message_Abort, m.Union(), options_.client_id);
  return SendRaw(BufferView(fbb));
}

Result<uint64_t> Client::UpdateWeights(const std::string& path, uint64_t version, bool drain,
                                       int timeout_ms) {
  flatbuffers::FlatBufferBuilder fbb(256);
  auto m = wire::CreateUpdateWeights(fbb, fbb.CreateString(path), version, drain);
  const uint64_t rid = next_request_id_++;
  FinishEnvelope(fbb, rid, wire::Message_UpdateWeights, m.Union(), options_.client_id);
  BR_RETURN_IF_ERROR(SendRaw(BufferView(fbb)));
  return WaitUpdateReply(rid, timeout_ms);
}

Result<size_t> WeightTensorBytes(const WeightTensor& t) {
  BR_ASSIGN_OR_RETURN(DType dtype, ParseDType(t.dtype));
  size_t n = 1;
  for (int64_t d : t.shape) {
    if (d < 0) return Status::InvalidArgument("tensor " + t.name + " has a negative dimension");
    n *= static_cast<size_t>(d);
  }
  return n * DTypeSize(dtype);
}

namespace {

flatbuffers::Offset<wire::TensorFrame> Frame(flatbuffers::FlatBufferBuilder& fbb,
                                             const WeightTensor& t, uint64_t offset,
                                             const uint8_t* data, size_t size) {
  auto name = fbb.CreateString(t.name);
  auto dtype = fbb.CreateString(t.dtype);
  auto shape = fbb.CreateVector(t.shape);
  auto bytes = fbb.CreateVector(data, size);
  return wire::CreateTensorFrame(fbb, name, dtype, shape, bytes, offset);
}

}  // namespace

Result<uint64_t> Client::UpdateWeightsStreamed(
    std::span<const WeightTensor> tensors, uint64_t version, bool drain, bool full, int timeout_ms,
    size_t part_bytes, const std::function<void(size_t sent_bytes, size_t total_bytes)>& on_part) {
  constexpr size_t kMaxPart = size_t{48} << 20;  // under the 64 MiB message limit
  if (part_bytes < 4096 || part_bytes > kMaxPart) {
    return Status::InvalidArgument("part_bytes must be in [4096, " + std::to_string(kMaxPart) +
                                   "], got " + std::to_string(part_bytes));
  }
  std::vector<size_t> sizes;
  for (const WeightTensor& t : tensors) {
    BR_ASSIGN_OR_RETURN(size_t n, WeightTensorBytes(t));
    if (n > 0 && t.data == nullptr) {
      return Status::InvalidArgument("tensor " + t.name + " has no data");
    }
    sizes.push_back(n);
  }
  size_t ti = 0, off = 0;  // the next byte to send: tensor ti, byte off
  size_t sent_bytes = 0, total_bytes = 0;
  for (size_t n : sizes) total_bytes += n;
  uint32_t part = 0;
  auto abort_stream = [&](Status s) -> Status {
    flatbuffers::FlatBufferBuilder fbb(128);
    auto m = wire::CreateUpdateWeights(fbb, 0, version, false, 0, false, false, 0, true);
    FinishEnvelope(fbb, next_request_id_++, wire::Message_UpdateWeights, m.Union(),
                   options_.client_id);
    (void)SendRaw(BufferView(fbb));  // best effort; the coordinator also times streams out
    return s;
  };
  while (true) {
    flatbuffers::FlatBufferBuilder fbb(std::min(part_bytes, kMaxPart) + 4096);
    std::vector<flatbuffers::Offset<wire::TensorFrame>> frames;
    size_t budget = part_bytes;
    while (ti < tensors.size() && budget > 0) {
      const size_t es = DTypeSize(*ParseDType(tensors[ti].dtype));
      size_t take = std::min(sizes[ti] - off, budget);
      if (take < sizes[ti] - off) take -= take % es;  // whole elements per slice
      if (take == 0 && sizes[ti] > 0) break;          // no room for one element: next part
      frames.push_back(
          Frame(fbb, tensors[ti], off, static_cast<const uint8_t*>(tensors[ti].data) + off, take));
      budget -= take;
      off += take;
      sent_bytes += take;
      if (off == sizes[ti]) {
        ++ti;
        off = 0;
      }
    }
    const bool last = ti == tensors.size();
    // Parts only stage; drain (wait for in-flight work) matters for the commit alone.
    auto m = wire::CreateUpdateWeights(fbb, 0, version, last && drain, fbb.CreateVector(frames),
                                       /*more=*/!last, full, 0, false, part++);
    const uint64_t rid = next_request_id_++;
    FinishEnvelope(fbb, rid, wire::Message_UpdateWeights, m.Union(), options_.client_id);
    Status sent = SendRaw(BufferView(fbb));
    if (!sent.ok()) return abort_stream(sent);
    Result<uint64_t> live = WaitUpdateReply(rid, timeout_ms);
    if (!live.ok()) return abort_stream(live.status());
    if (on_part) on_part(sent_bytes, total_bytes);
    if (last) return live;
  }
}

Result<uint64_t> Client::BeginUpdateWeightsNccl(const std::array<uint8_t, 128>& unique_id,
                                                int world_size,
                                                std::span<const WeightTensor> manifest,
                                                uint64_t version, bool drain) {
  if (world_size < 2) {
    return Status::InvalidArgument("nccl update: world_size must be >= 2 (trainer + replicas)");
  }
  flatbuffers::FlatBufferBuilder fbb(4096);
  std::vector<flatbuffers::Offset<wire::TensorFrame>> frames;
  for (const WeightTensor& t : manifest) {
    BR_RETURN_IF_ERROR(WeightTensorBytes(t).status());
    frames.push_back(Frame(fbb, t, 0, nullptr, 0));
  }
  auto id = fbb.CreateVector(unique_id.data(), unique_id.size());
  auto nccl = wire::CreateNcclWeights(fbb, id, world_size, 0, fbb.CreateVector(frames));
  auto m = wire::CreateUpdateWeights(fbb, 0, version, drain, 0, false, false, nccl);
  const uint64_t rid = next_request_id_++;
  FinishEnvelope(fbb, rid, wire::Message_UpdateWeights, m.Union(), options_.client_id);
  BR_RETURN_IF_ERROR(SendRaw(BufferView(fbb)));
  return rid;
}

Result<uint64_t> Client::WaitUpdateReply(uint64_t request_id, int timeout_ms) {
  BR_ASSIGN_OR_RETURN(Event e, WaitReply(request_id, timeout_ms));
  const auto* env = wire::GetEnvelope(e.reply.data());
  if (env->msg_type() != wire::Message_Ack) return Status::Protocol("expected Ack");
  return env->msg_as_Ack()->weight_version();
}

Status Client::Drain(bool resume, int timeout_ms) {
  flatbuffers::FlatBufferBuilder fbb(64);
  auto m = wire::CreateDrain(fbb, resume);
  const uint64_t rid = next_request_id_++;
  FinishEnvelope(fbb, rid, wire::Message_Drain, m.Union(), options_.client_id);
  BR_RETURN_IF_ERROR(SendRaw(BufferView(fbb)));
  BR_ASSIGN_OR_RETURN(Event e, WaitReply(rid, timeout_ms));
  (void)e;
  return Status::Ok();
}

Result<StatusInfo> Client::GetStatus(int timeout_ms) {
  flatbuffers::FlatBufferBuilder fbb(64);
  auto m = wire::CreateStatus(fbb);
  const uint64_t rid = next_request_id_++;
  FinishEnvelope(fbb, rid, wire::Message_Status, m.Union(), options_.client_id);
  BR_RETURN_IF_ERROR(SendRaw(BufferView(fbb)));
  BR_ASSIGN_OR_RETURN(Event e, WaitReply(rid, timeout_ms));
  const auto* env = wire::GetEnvelope(e.reply.data());
  if (env->msg_type() != wire::Message_StatusReply) return Status::Protocol("expected StatusReply");
  const auto* s = env->msg_as_StatusReply();
  StatusInfo r;
  r.queued = s->queued();
  r.inflight = s->inflight();
  r.groups = s->groups();
  if (s->replicas()) {
    for (const wire::ReplicaLoad* l : *s->replicas()) {
      r.replicas.push_back({l->name() ? l->name()->str() : "", l->queued(), l->running(),
                            l->tokens_per_s(), l->weight_version(), l->alive(), l->remote()});
    }
  }
  r.tokens_per_s = s->tokens_per_s();
  r.cache_hit_rate = s->cache_hit_rate();
  r.trajectories_done = s->trajectories_done();
  r.weight_version = s->weight_version();
  r.draining = s->draining();
  r.waiting_for_weights = s->waiting_for_weights();
  if (s->fingerprint() != nullptr) r.fingerprint = FingerprintFromWire(s->fingerprint());
  r.wal_enabled = s->wal_enabled();
  r.wal_last_lsn = s->wal_last_lsn();
  r.wal_committed_lsn = s->wal_committed_lsn();
  r.wal_durable_lsn = s->wal_durable_lsn();
  if (s->wal_error() != nullptr) r.wal_error = StatusFromWire(s->wal_error());
  return r;
}

Status Client::WaitCommitted(int timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  auto left = [&] { return RemainingMs(deadline); };
  // The first reply's wal_last_lsn covers everything sent before (one connection, in order).
  BR_ASSIGN_OR_RETURN(StatusInfo first, GetStatus(left()));
  if (!first.wal_enabled) {
    return Status::FailedPrecondition("WaitCommitted: the service runs without a WAL (--data-dir)");
  }
  StatusInfo now = first;
  while (true) {
    if (!now.wal_error.ok()) return now.wal_error;  // what came after it was not logged
    if (now.wal_committed_lsn >= first.wal_last_lsn) return Status::Ok();
    if (left() == 0) {
      return Status::Timeout("WaitCommitted: the WAL committed up to " +
                             std::to_string(now.wal_committed_lsn) + " of " +
                             std::to_string(first.wal_last_lsn) + " within " +
                             std::to_string(timeout_ms) + " ms");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    BR_ASSIGN_OR_RETURN(now, GetStatus(left()));
  }
}

Status Client::Ack(uint64_t group_id, const std::vector<std::pair<uint32_t, uint32_t>>& samples) {
  std::vector<uint32_t> p, s;
  for (auto [a, b] : samples) {
    p.push_back(a);
    s.push_back(b);
  }
  flatbuffers::FlatBufferBuilder fbb(128);
  auto m = wire::CreateAck(fbb, group_id, fbb.CreateVector(p), fbb.CreateVector(s), 0);
  FinishEnvelope(fbb, next_request_id_++, wire::Message_Ack, m.Union(), options_.client_id);
  return SendRaw(BufferView(fbb));
}

}  // namespace bitroll::rollout
