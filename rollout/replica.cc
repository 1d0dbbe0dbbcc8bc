#include "rollout/replica.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <system_error>
#include <thread>
#include <unordered_map>

#include <spdlog/spdlog.h>

#include "engine/model_loader.h"
#include "rollout/messages.h"
#include "rollout/metrics.h"
#include "rollout/protocol.h"
#include "rollout/replica_weights.h"
#include "rollout/request_store.h"
#include "rollout/tool_detect.h"

#if __has_include("engine/tokenizer.h")
#include "engine/tokenizer.h"
#define BITROLL_HAVE_TOKENIZER_H 1
#endif

namespace bitroll::rollout {

namespace {

using Clock = std::chrono::steady_clock;

struct ItemMeta {
  uint64_t group_id = 0;
  uint32_t prompt_index = 0;
  uint32_t sample_index = 0;
  bool stream = false;
  // Token indexes (docs/design.md "Token indexes"): what the replica reports counts every token
  // after the request's prompt, earlier turns included: trajectory index = engine position -
  // prompt_len. The turn's first token is trajectory token turn_begin (context + injected ids).
  int32_t prompt_len = 0;
  int32_t turn_begin = 0;
  // Tool loop (rollout/tool_detect.h): the turn ends on a complete call or a stop string.
  std::optional<ToolDetector> detector;
  DetectEvent event = DetectEvent::kNone;
  int64_t cut = 0;  // generated tokens (forced included) up to and including the event's token
  std::vector<int32_t> injected;  // encoded WorkItem.inject_text
  // The client's trajectory, built here when the turn is the last (replica protocol 4): the
  // request's tag and limits, and the earlier turns (WorkItem context_*; the tool calls kept as a
  // Trajectory buffer holding only tool_calls).
  std::optional<std::string> client_tag;
  int32_t turn = 1, max_turns = 1, max_tokens = 0, sampled_before = 0;
  std::vector<int32_t> ctx_ids;
  std::vector<float> ctx_lps;
  std::vector<uint8_t> ctx_mask;
  std::vector<wire::VersionSpan> ctx_versions;
  std::string calls;
};

// Timed-out loads of one replica whose threads still run: with this many, a new path update is
// refused (kUnavailable) rather than leaving yet another thread behind.
constexpr int kMaxStuckLoads = 3;

// Refuses a weights path that is not a regular file or a directory before anything reads it:
// open() of a FIFO blocks until a writer comes, a device may never end. stat() first, so that
// nothing else is ever opened; then open(O_NONBLOCK) + fstat() for what was actually opened.
// Runs on the loader thread: on a hung filesystem even stat() may block.
Status CheckWeightsPath(const std::string& path) {
  auto kind = [](mode_t m) {
    return S_ISFIFO(m)   ? "a FIFO"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
           : S_ISSOCK(m) ? "a socket"
                         : "not a regular file";
  };
  auto refuse = [&](mode_t m) {
    return Status::InvalidArgument("weights path " + path +
                                   " is not a regular file or a directory (" + kind(m) +
                                   "): refused, reading it could block forever");
  };
  auto os_error = [&](int err) {
    const std::string m = "weights path " + path + ": " + std::strerror(err);
    if (err == ENOENT || err == ENOTDIR) return Status::NotFound(m);
    if (err == ENXIO) return Status::InvalidArgument(m + " (not a regular file)");
    return Status::IoError(m);
  };
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return os_error(errno);
  if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) return refuse(st.st_mode);
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) return os_error(errno);
  const int rc = ::fstat(fd, &st);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return os_error(err);
  if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) return refuse(st.st_mode);
  return Status::Ok();
}

// What a loader thread hands back. Shared by the thread and the replica loop: a timed-out load's
// thread keeps it alive alone, and its result is dropped with it.
struct LoadJob {
  std::mutex mu;
  std::optional<Result<engine::ModelWeights>> result;  // set once, when the load ends
};

class ReplicaLoop {
 public:
  ReplicaLoop(engine::Engine& engine, zmq::context_t& ctx, const ReplicaOptions& options)
      : engine_(engine),
        sock_(ctx, zmq::socket_type::dealer),
        options_(options),
        weights_(engine, options.name),
        loaders_(std::make_shared<std::atomic<int>>(0)),
        metrics_(options.metrics ? options.metrics->ForReplica(options.name) : nullptr) {}

  Status Run(const std::string& endpoint, const std::atomic<bool>& stop) {
    try {
      sock_.set(zmq::sockopt::linger, 0);
      sock_.set(zmq::sockopt::sndhwm, 0);
      sock_.set(zmq::sockopt::rcvhwm, 0);
      sock_.connect(endpoint);
      SendHello();
    } catch (const zmq::error_t& e) {
      return Status::Unavailable(std::string("replica connect: ") + e.what());
    }
    auto last_beat = Clock::now();
    while (!stop.load(std::memory_order_relaxed)) {
      try {
        const bool busy = engine_.HasWork();
        zmq::pollitem_t item{sock_.handle(), 0, ZMQ_POLLIN, 0};
        // While a weights load runs, look at it every few ms (it is no socket event).
        const int idle_ms =
            load_ ? std::min(options_.heartbeat_ms, 5) : std::min(options_.heartbeat_ms, 50);
        zmq::poll(&item, 1, std::chrono::milliseconds(busy ? 0 : idle_ms));
        while (true) {
          zmq::message_t msg;
          if (!sock_.recv(msg, zmq::recv_flags::dontwait)) break;
          // Behind a running load, messages wait in order (work may need the new weights).
          if (load_ || !deferred_.empty()) {
            deferred_.push_back(std::move(msg));
          } else {
            Handle(msg);
          }
        }
        PollLoad();
        while (!load_ && !deferred_.empty()) {
          zmq::message_t msg = std::move(deferred_.front());
          deferred_.pop_front();
          Handle(msg);
        }
        if (!refused_.ok()) return refused_;
        if (engine_.HasWork()) BR_RETURN_IF_ERROR(StepOnce());
        if (Clock::now() - last_beat >= std::chrono::milliseconds(options_.heartbeat_ms)) {
          SendHeartbeat();
          last_beat = Clock::now();
        }
      } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) continue;  // a signal; `stop` says whether to leave
        return Status::Unavailable(std::string("replica socket: ") + e.what());
      }
    }
    return Status::Ok();
  }

 private:
  void Send(flatbuffers::FlatBufferBuilder& fbb) {
    sock_.send(zmq::buffer(fbb.GetBufferPointer(), fbb.GetSize()), zmq::send_flags::none);
  }

  void SendHello() {
    const engine::ModelInfo& info = engine_.info();
    flatbuffers::FlatBufferBuilder fbb(512);
    auto hello = wire::CreateReplicaHello(
        fbb, fbb.CreateString(options_.name), info.vocab_size, info.max_seq_len,
        FingerprintToWire(fbb, info.fingerprint), options_.capacity, version_, options_.remote,
        info.eos_id, kReplicaProtocolVersion);
    FinishEnvelope(fbb, 0, wire::Message_ReplicaHello, hello.Union());
    Send(fbb);
  }

  void SendHeartbeat() {
    const engine::EngineStats s = engine_.stats();
    flatbuffers::FlatBufferBuilder fbb(128);
    auto hb =
        wire::CreateReplicaHeartbeat(fbb, s.running, s.waiting, version_, s.prefill_tokens_computed,
                                     s.prefill_tokens_cached, s.decode_tokens);
    if (metrics_) metrics_->Update(s, engine_.info().max_seq_len);
    FinishEnvelope(fbb, 0, wire::Message_ReplicaHeartbeat, hb.Union());
    Send(fbb);
  }

  void Handle(const zmq::message_t& msg) {
    auto env = DecodeEnvelope(AlignForRead(msg.data(), msg.size(), &align_buf_), msg.size(),
                              DecodeLimits{});
    if (!env.ok()) {
      spdlog::warn("replica={} dropped a message from the coordinator: {}", options_.name,
                   env.status().ToString());
      return;
    }
    const wire::Envelope* e = *env;
    switch (e->msg_type()) {
      case wire::Message_ReplicaWork: {
        const wire::ReplicaWork* work = e->msg_as_ReplicaWork();
        // Forgets, then the requests to keep (rollout/request_store.h).
        if (Status kept = requests_.Apply(*work); !kept.ok()) {
          spdlog::warn("replica={} {}", options_.name, kept.message());
        }
        if (work->items() == nullptr) return;
        std::vector<uint64_t> refused, unknown;
        for (const wire::WorkItem* w : *work->items()) {
          if (requests_.Knows(*work, w->request_key())) {
            AddWork(*work, *w);
            continue;
          }
          refused.push_back(w->work_id());
          if (std::find(unknown.begin(), unknown.end(), w->request_key()) == unknown.end()) {
            unknown.push_back(w->request_key());
          }
        }
        if (!refused.empty()) SendRefused(refused, unknown);
        return;
      }
      case wire::Message_Error: {
        // The coordinator refused this replica (another replica protocol version).
        Status s = StatusFromWire(e->msg_as_Error());
        spdlog::error("replica={} refused by the coordinator: {}", options_.name, s.ToString());
        if (s.code() == ErrorCode::kProtocol) refused_ = std::move(s);
        return;
      }
      case wire::Message_ReplicaAbort: {
        const auto* ids = e->msg_as_ReplicaAbort()->work_ids();
        if (ids == nullptr) return;
        for (uint64_t id : *ids) {
          if (meta_.count(id)) (void)engine_.Abort(id);
        }
        return;
      }
      case wire::Message_UpdateWeights: {
        const auto* u = e->msg_as_UpdateWeights();
        if (StartLoad(*u, e->request_id())) return;  // answered when the load ends
        const uint64_t before = weights_.version();
        Status s = weights_.Apply(*u);
        if (s.ok()) {
          version_ = weights_.version();
          if (version_ != before || u->path() != nullptr) {
            spdlog::info("replica={} weights version={} live", options_.name, version_);
          }
        }
        SendUpdateReply(e->request_id(), s);
        return;
      }
      default:
        spdlog::warn("replica={} ignores message type {}", options_.name,
                     wire::EnumNameMessage(e->msg_type()));
    }
  }

  // Items naming requests this replica does not hold: never started, handed back with a
  // kProtocol error (the coordinator queues them again with their requests).
  void SendRefused(const std::vector<uint64_t>& work_ids, const std::vector<uint64_t>& keys) {
    std::string list;
    for (uint64_t k : keys) list += (list.empty() ? "" : ", ") + std::to_string(k);
    const Status s = Status::Protocol("replica " + options_.name + " holds no request " + list +
                                      " (" + std::to_string(work_ids.size()) + " item(s))");
    spdlog::warn("replica={} {}", options_.name, s.message());
    flatbuffers::FlatBufferBuilder fbb(256 + 8 * (work_ids.size() + keys.size()));
    auto ids = fbb.CreateVector(work_ids);
    auto ks = fbb.CreateVector(keys);
    auto err = ErrorToWire(fbb, s);
    auto m = wire::CreateReplicaRefused(fbb, ids, ks, err);
    FinishEnvelope(fbb, 0, wire::Message_ReplicaRefused, m.Union());
    Send(fbb);
  }

  void SendUpdateReply(uint64_t request_id, const Status& s) {
    flatbuffers::FlatBufferBuilder fbb(256);
    if (s.ok()) {
      auto ack = wire::CreateAck(fbb, 0, 0, 0, version_, engine_.info().fingerprint.weights_hash);
      FinishEnvelope(fbb, request_id, wire::Message_Ack, ack.Union());
    } else {
      auto err = ErrorToWire(fbb, s);
      FinishEnvelope(fbb, request_id, wire::Message_Error, err.Union());
    }
    Send(fbb);
  }

  // UpdateWeights {path} on an engine with weights (or with options_.load_weights): starts the
  // loader thread and returns true; the reply follows from PollLoad(). False: Apply() it here.
  bool StartLoad(const wire::UpdateWeights& u, uint64_t request_id) {
    const bool path_only = u.path() != nullptr && u.path()->size() > 0 && u.tensors() == nullptr &&
                           !u.more() && u.nccl() == nullptr && !u.abort();
    if (!path_only || (!options_.load_weights && engine_.weights() == nullptr)) return false;
    if (loaders_->load() >= kMaxStuckLoads) {  // no load is pending here: all are stuck
      SendUpdateReply(
          request_id,
          Status::Unavailable("replica " + options_.name + ": " + std::to_string(loaders_->load()) +
                              " earlier weight loads are still stuck (a hung filesystem?)"));
      return true;
    }
    auto job = std::make_shared<LoadJob>();
    std::string path = u.path()->str();
    loaders_->fetch_add(1);
    try {
      // Owns copies of everything: it may outlive this loop (a timed-out load is detached).
      std::thread([job, path, load = options_.load_weights, loaders = loaders_] {
        Status checked = CheckWeightsPath(path);
        Result<engine::ModelWeights> w = !checked.ok() ? Result<engine::ModelWeights>(checked)
                                         : load        ? load(path)
                                                       : engine::LoadModelWeights(path);
        {
          std::lock_guard<std::mutex> lock(job->mu);
          job->result.emplace(std::move(w));
        }
        loaders->fetch_sub(1);
      }).detach();
    } catch (const std::system_error& ex) {
      loaders_->fetch_sub(1);
      SendUpdateReply(request_id, Status::ResourceExhausted(
                                      std::string("cannot start a weights loader: ") + ex.what()));
      return true;
    }
    PendingLoad p;
    p.job = std::move(job);
    p.request_id = request_id;
    p.version = u.version();
    p.path = std::move(path);
    p.started = Clock::now();
    spdlog::info("replica={} loading weights version={} from {}", options_.name, p.version, p.path);
    load_ = std::move(p);
    return true;
  }

  // Installs and answers a finished load, or answers kTimeout for one past its deadline (its
  // thread is left to finish alone; what it loads is dropped).
  void PollLoad() {
    if (!load_) return;
    std::optional<Result<engine::ModelWeights>> r;
    {
      std::lock_guard<std::mutex> lock(load_->job->mu);
      if (load_->job->result) r = std::move(load_->job->result);
    }
    const int limit_ms = options_.weights_load_timeout_ms;
    if (!r) {
      if (limit_ms <= 0 || Clock::now() - load_->started < std::chrono::milliseconds(limit_ms)) {
        return;
      }
      Status s =
          Status::Timeout("replica " + options_.name + ": loading weights version=" +
                          std::to_string(load_->version) + " from " + load_->path +
                          " took longer than weights_load_timeout_ms=" + std::to_string(limit_ms) +
                          "; abandoned, the old weights keep serving");
      spdlog::error("{}", s.message());
      const uint64_t id = load_->request_id;
      load_.reset();
      SendUpdateReply(id, s);
      return;
    }
    const PendingLoad done = std::move(*load_);
    load_.reset();
    Status s = r->status();
    if (s.ok()) {
      s = weights_.Install(std::make_shared<const engine::ModelWeights>(std::move(*r).value()),
                           done.version);
    }
    if (s.ok()) {
      version_ = weights_.version();
      spdlog::info("replica={} weights version={} live", options_.name, version_);
    } else {
      spdlog::error("replica={} weights version={} from {}: {}", options_.name, done.version,
                    done.path, s.ToString());
    }
    SendUpdateReply(done.request_id, s);
  }

  void AddWork(const wire::ReplicaWork& work, const wire::WorkItem& w) {
    engine::SequenceRequest req;
    req.id = w.work_id();
    req.group_id = w.group_id();
    req.sample_index = w.sample_index();
    // Resume (WAL): the logged tokens are re-prefilled and re-scored, then decoding continues.
    if (w.forced_ids()) req.forced.assign(w.forced_ids()->begin(), w.forced_ids()->end());
    Result<const wire::SubmitRollouts*> found = requests_.Find(work, w);
    const wire::SubmitRollouts* m = found.ok() ? *found : nullptr;
    if (m != nullptr) {
      req.priority = m->priority();
      req.sampling = SamplingFromWire(*m);
      req.stop.max_tokens = m->max_tokens() - w.sampled_before();
      req.stop.stop_at_eos = m->stop_at_eos();
      if (m->stop_ids()) req.stop.stop_ids.assign(m->stop_ids()->begin(), m->stop_ids()->end());
      req.return_routing = m->return_routing();
    }
    ItemMeta meta;
    meta.group_id = w.group_id();
    meta.prompt_index = w.prompt_index();
    meta.sample_index = w.sample_index();
    meta.stream = w.stream_tokens() || (m != nullptr && m->stream_tokens());
    KeepContext(w, m, &meta);
    Status s = found.status();  // the item's trajectory ends with it when not OK
    const wire::Prompt* p = m != nullptr ? m->prompts()->Get(w.prompt_index()) : nullptr;
    if (p != nullptr && p->ids() != nullptr) {
      req.prompt.assign(p->ids()->begin(), p->ids()->end());
    } else if (p != nullptr && p->text() != nullptr) {
      Result<std::vector<int32_t>> ids = EncodeText(p->text()->string_view());
      if (ids.ok()) {
        req.prompt = std::move(ids).value();
      } else {
        s = ids.status();
      }
    }
    // Tool loop: earlier turns, then the injected tool result, are part of the prompt.
    if (s.ok() && w.context_ids()) {
      req.prompt.insert(req.prompt.end(), w.context_ids()->begin(), w.context_ids()->end());
    }
    if (s.ok() && w.inject_text() && w.inject_text()->size() > 0) {
      Result<std::vector<int32_t>> ids = EncodeInjected(w.inject_text()->string_view());
      if (ids.ok()) {
        meta.injected = std::move(ids).value();
        req.prompt.insert(req.prompt.end(), meta.injected.begin(), meta.injected.end());
      } else {
        s = ids.status();
      }
    }
    if (s.ok()) s = MakeDetector(*m, req.prompt.empty() ? -1 : req.prompt.back(), &meta);
    const auto prompt_len = static_cast<int32_t>(req.prompt.size());
    const bool later_turn =
        !meta.injected.empty() || (w.context_ids() && w.context_ids()->size() > 0);
    if (s.ok() && later_turn && prompt_len >= engine_.info().max_seq_len) {
      // The context is full before this turn starts: the trajectory ends (finish Length)
      // without the result, which did not fit.
      engine::SequenceOutput out;
      out.id = w.work_id();
      out.finish = FinishReason::kLength;
      meta.injected.clear();
      SendAlone(out, meta);
      return;
    }
    if (s.ok()) s = engine_.Add(std::move(req));
    if (!s.ok()) {
      engine::SequenceOutput out;
      out.id = w.work_id();
      out.finish = FinishReason::kError;
      out.error = s;
      SendAlone(out, meta);
      return;
    }
    meta.turn_begin = static_cast<int32_t>((w.context_ids() ? w.context_ids()->size() : 0) +
                                           meta.injected.size());
    meta.prompt_len = prompt_len - meta.turn_begin;
    if (!meta.injected.empty()) SendInjected(w.work_id(), meta);
    if (meta.stream) ++streaming_;
    if (meta.detector) ++detecting_;
    meta_[w.work_id()] = std::move(meta);
  }

  // What BuildTrajectory needs besides the engine's output: the request's tag and limits, the
  // earlier turns.
  static void KeepContext(const wire::WorkItem& w, const wire::SubmitRollouts* m, ItemMeta* meta) {
    if (m != nullptr) {
      if (m->client_tag()) meta->client_tag = m->client_tag()->str();
      meta->max_turns = m->max_turns();
      meta->max_tokens = m->max_tokens();
    }
    meta->turn = w.turn();
    meta->sampled_before = w.sampled_before();
    if (w.context_ids()) meta->ctx_ids.assign(w.context_ids()->begin(), w.context_ids()->end());
    if (w.context_logprobs()) {
      meta->ctx_lps.assign(w.context_logprobs()->begin(), w.context_logprobs()->end());
    }
    if (w.context_mask()) meta->ctx_mask.assign(w.context_mask()->begin(), w.context_mask()->end());
    if (w.context_versions()) {
      for (const wire::VersionSpan* v : *w.context_versions()) meta->ctx_versions.push_back(*v);
    }
    if (w.tool_calls() && w.tool_calls()->size() > 0) {
      flatbuffers::FlatBufferBuilder fbb(256);
      std::vector<flatbuffers::Offset<wire::ToolCallInfo>> cv;
      for (const wire::ToolCallInfo* c : *w.tool_calls()) cv.push_back(CopyToolCallInfo(fbb, *c));
      auto calls = fbb.CreateVector(cv);
      wire::TrajectoryBuilder b(fbb);
      b.add_tool_calls(calls);
      fbb.Finish(b.Finish());
      meta->calls.assign(BufferView(fbb));
    }
  }

  // A trajectory that never reached the engine.
  void SendAlone(const engine::SequenceOutput& out, const ItemMeta& meta) {
    {
      flatbuffers::FlatBufferBuilder fbb(256);
      std::vector<flatbuffers::Offset<wire::FinishedTrajectory>> fin;
      std::vector<flatbuffers::Offset<wire::Trajectory>> t{BuildTrajectory(fbb, out, meta, &fin)};
      auto res = wire::CreateReplicaResults(fbb, fbb.CreateVector(t), 0, 0, fbb.CreateVector(fin));
      FinishEnvelope(fbb, 0, wire::Message_ReplicaResults, res.Union());
      Send(fbb);
    }
  }

  // The injected ids go out before any token of the turn, so that the coordinator can log the
  // turn boundary ahead of the turn's tokens. They start at the end of the context.
  void SendInjected(uint64_t work_id, const ItemMeta& m) {
    flatbuffers::FlatBufferBuilder fbb(256 + m.injected.size() * 4);
    auto inj = fbb.CreateVector(m.injected);
    const auto at = m.turn_begin - static_cast<int32_t>(m.injected.size());
    std::vector<flatbuffers::Offset<wire::TokenChunk>> chunks{wire::CreateTokenChunk(
        fbb, m.group_id, m.prompt_index, m.sample_index, at, 0, 0, version_, work_id, inj)};
    auto res = wire::CreateReplicaResults(fbb, 0, fbb.CreateVector(chunks), 0);
    FinishEnvelope(fbb, 0, wire::Message_ReplicaResults, res.Union());
    Send(fbb);
  }

  Status MakeDetector(const wire::SubmitRollouts& m, int32_t prev, ItemMeta* meta) {
    DetectConfig dc;
    if (m.tool_open()) dc.open = m.tool_open()->str();
    if (m.tool_close()) dc.close = m.tool_close()->str();
    dc.open_id = m.tool_open_id();
    dc.close_id = m.tool_close_id();
    if (m.stop_strings()) {
      for (const auto* ss : *m.stop_strings()) dc.stop_strings.push_back(ss->str());
    }
    if (dc.empty()) return Status::Ok();
    PieceDecoder dec;
#ifdef BITROLL_HAVE_TOKENIZER_H
    if (const engine::Tokenizer* tk = engine_.tokenizer()) {
      dec = [tk](int32_t p, int32_t t) { return tk->DecodePiece(p, t); };
    }
#endif
    BR_ASSIGN_OR_RETURN(ToolDetector d, ToolDetector::Create(dc, std::move(dec), prev));
    meta->detector.emplace(std::move(d));
    return Status::Ok();
  }

  // Tool results: the engine's tokenizer without BOS (they continue the sequence).
  Result<std::vector<int32_t>> EncodeInjected(std::string_view text) {
#ifdef BITROLL_HAVE_TOKENIZER_H
    if (const engine::Tokenizer* tk = engine_.tokenizer()) return tk->Encode(text, false);
#endif
    if (options_.encode_text) return options_.encode_text(text);
    return Status::Unsupported("this replica has no tokenizer to encode a tool result");
  }

  // Text prompts: the options' encoder, else the engine's tokenizer (with BOS, as
  // `bitroll generate` does), else kUnsupported.
  Result<std::vector<int32_t>> EncodeText(std::string_view text) {
    if (options_.encode_text) return options_.encode_text(text);
#ifdef BITROLL_HAVE_TOKENIZER_H
    if (const engine::Tokenizer* tk = engine_.tokenizer()) return tk->Encode(text, true);
#endif
    return Status::Unsupported("this replica has no tokenizer for text prompts");
  }

  // The turn's Trajectory for the coordinator (its tool loop and log), and when the trajectory
  // ends with this turn the client's envelope, built once here, appended to *finished.
  flatbuffers::Offset<wire::Trajectory> BuildTrajectory(
      flatbuffers::FlatBufferBuilder& fbb, const engine::SequenceOutput& out, const ItemMeta& m,
      std::vector<flatbuffers::Offset<wire::FinishedTrajectory>>* finished) {
    // The engine's spans begin at offsets in this turn's tokens; the wire's at trajectory indexes.
    std::vector<wire::VersionSpan> spans;
    spans.reserve(out.versions.size());
    for (const auto& v : out.versions) spans.emplace_back(m.turn_begin + v.begin, v.version);
    const Cost& c = out.cost;  // the engine's four fields; queue, sandbox, WAL, price are added
                               // by the coordinator
    flatbuffers::Offset<wire::Error> err;
    if (!out.error.ok()) {
      err = ErrorToWire(fbb, out.error, m.group_id);
    }
    std::span<const int32_t> toks(out.tokens);
    std::span<const float> lpv(out.logprobs);
    wire::FinishReason finish = FinishToWire(out.finish);
    flatbuffers::Offset<flatbuffers::String> call;
    if (m.event != DetectEvent::kNone && out.error.ok()) {
      // The turn ends exactly on the token that completed the call / stop string.
      const auto cut = static_cast<size_t>(m.cut);
      toks = toks.first(std::min(toks.size(), cut));
      lpv = lpv.first(std::min(lpv.size(), cut));
      if (m.event == DetectEvent::kToolCall) {
        finish = wire::FinishReason_ToolCall;
        call = fbb.CreateString(m.detector->call_text());
      } else {
        finish = wire::FinishReason_Stop;
      }
    }
    std::optional<RoutingRecord> route;
    flatbuffers::Offset<wire::Routing> routing;
    if (!out.routing.empty()) {
      // A turn cut at a tool call or stop string keeps the routes of the positions it keeps.
      RoutingRecord& r = route.emplace(out.routing);
      const int64_t drop = static_cast<int64_t>(out.tokens.size() - toks.size());
      const size_t keep = static_cast<size_t>(std::max<int64_t>(0, r.positions() - drop));
      r.expert_ids.resize(keep * r.n_layers * r.k);
      r.weights.resize(keep * r.n_layers * r.k);
    }
    // The coordinator runs a tool call when the request allows another turn (its ContinueToolLoop
    // checks the same); any other turn ends the trajectory.
    const bool last = finish != wire::FinishReason_ToolCall || m.turn >= m.max_turns ||
                      m.sampled_before + static_cast<int64_t>(toks.size()) >= m.max_tokens;
    if (last) {
      flatbuffers::FlatBufferBuilder efbb(512 + (m.ctx_ids.size() + toks.size()) * 9);
      FinalTurn ft;
      ft.ids = toks;
      ft.lps = lpv;
      ft.finish = finish;
      ft.versions = spans;
      ft.fingerprint = &engine_.info().fingerprint;
      ft.routing = route ? &*route : nullptr;
      ft.error = out.error;
      ft.cost = c;
      TurnPrefix p;
      p.ids = m.ctx_ids;
      p.lps = m.ctx_lps;
      p.mask = m.ctx_mask;
      p.versions = m.ctx_versions;
      p.injected = m.injected;
      p.turns = m.turn;
      if (!m.calls.empty())
        p.calls = flatbuffers::GetRoot<wire::Trajectory>(m.calls.data())->tool_calls();
      BuildClientTrajectory(efbb, ft, p, {m.group_id, m.prompt_index, m.sample_index},
                            options_.name, m.client_tag ? &*m.client_tag : nullptr);
      finished->push_back(CreateFinished(fbb, out.id, BufferView(efbb)));
    }
    // A last turn's ids, logprobs, versions and routing are in the envelope only.
    flatbuffers::Offset<flatbuffers::Vector<int32_t>> ids;
    flatbuffers::Offset<flatbuffers::Vector<float>> lps;
    flatbuffers::Offset<flatbuffers::Vector<const wire::VersionSpan*>> vs;
    if (!last) {
      ids = fbb.CreateVector(toks.data(), toks.size());
      lps = fbb.CreateVector(lpv.data(), lpv.size());
      vs = fbb.CreateVectorOfStructs(spans);
      if (route) routing = RoutingToWire(fbb, *route);
    }
    flatbuffers::Offset<flatbuffers::Vector<int32_t>> inj;
    if (!m.injected.empty()) inj = fbb.CreateVector(m.injected);
    auto fp = FingerprintToWire(fbb, engine_.info().fingerprint);
    auto cost = CostToWire(fbb, c);
    auto name = fbb.CreateString(options_.name);
    wire::TrajectoryBuilder b(fbb);
    b.add_group_id(m.group_id);
    b.add_prompt_index(m.prompt_index);
    b.add_sample_index(m.sample_index);
    if (!last) {
      b.add_ids(ids);
      b.add_logprobs(lps);
      b.add_versions(vs);
    }
    b.add_finish(finish);
    b.add_turns(1);
    b.add_fingerprint(fp);
    b.add_cost(cost);
    b.add_replica(name);
    if (!out.error.ok()) b.add_error(err);
    b.add_work_id(out.id);
    if (!call.IsNull()) b.add_tool_call(call);
    if (!inj.IsNull()) b.add_injected_ids(inj);
    if (!routing.IsNull()) b.add_routing(routing);
    return b.Finish();
  }

  // Feeds the step's tokens to the detectors; a detected call or stop string aborts the sequence
  // (the engine reports it on the next step, with no further token).
  Status Detect(const engine::StepResult& r) {
    for (const engine::TokenEvent& t : r.tokens) {
      auto it = meta_.find(t.id);
      if (it == meta_.end() || !it->second.detector || it->second.detector->done()) continue;
      ItemMeta& m = it->second;
      Result<DetectEvent> ev = m.detector->Feed(t.token);
      if (!ev.ok()) {
        spdlog::warn("replica={} work {}: tool detection: {}", options_.name, t.id,
                     ev.status().ToString());
        m.detector.reset();
        --detecting_;
        continue;
      }
      if (*ev == DetectEvent::kNone) continue;
      m.event = *ev;
      m.cut = m.detector->fed();
      (void)engine_.Abort(t.id);  // NotFound when it also finished in this step: fine
    }
    return Status::Ok();
  }

  Status StepOnce() {
    auto step = engine_.Step();
    if (!step.ok()) {
      spdlog::error("replica={} engine step failed: {}", options_.name, step.status().ToString());
      return step.status();
    }
    const engine::StepResult& r = *step;
    tokens_processed_ += r.tokens_processed;
    if (detecting_ > 0) BR_RETURN_IF_ERROR(Detect(r));
    if (r.finished.empty() && streaming_ == 0) return Status::Ok();
    flatbuffers::FlatBufferBuilder fbb(1024);
    std::vector<flatbuffers::Offset<wire::TokenChunk>> chunks;
    if (streaming_ > 0) {
      for (const engine::TokenEvent& t : r.tokens) {
        auto it = meta_.find(t.id);
        if (it == meta_.end() || !it->second.stream) continue;
        const ItemMeta& m = it->second;
        // The one place an engine position becomes a trajectory index.
        const int32_t index = t.position - m.prompt_len;
        // Past a detected call (forced tokens of one step only): never reported.
        if (m.event != DetectEvent::kNone && index - m.turn_begin >= m.cut) continue;
        auto ids = fbb.CreateVector(&t.token, 1);
        auto lps = fbb.CreateVector(&t.logprob, 1);
        chunks.push_back(wire::CreateTokenChunk(fbb, m.group_id, m.prompt_index, m.sample_index,
                                                index, ids, lps, t.weight_version, t.id));
      }
    }
    std::vector<flatbuffers::Offset<wire::Trajectory>> trajs;
    std::vector<flatbuffers::Offset<wire::FinishedTrajectory>> fin;
    trajs.reserve(r.finished.size());
    for (const engine::SequenceOutput& out : r.finished) {
      auto it = meta_.find(out.id);
      if (it == meta_.end()) continue;
      trajs.push_back(BuildTrajectory(fbb, out, it->second, &fin));
      if (it->second.stream) --streaming_;
      if (it->second.detector) --detecting_;
      meta_.erase(it);
    }
    if (trajs.empty() && chunks.empty()) return Status::Ok();
    auto res = wire::CreateReplicaResults(fbb, fbb.CreateVector(trajs), fbb.CreateVector(chunks),
                                          tokens_processed_, fbb.CreateVector(fin));
    tokens_processed_ = 0;
    FinishEnvelope(fbb, 0, wire::Message_ReplicaResults, res.Union());
    Send(fbb);
    return Status::Ok();
  }

  engine::Engine& engine_;
  zmq::socket_t sock_;
  const ReplicaOptions& options_;
  ReplicaWeights weights_;  // applies UpdateWeights messages
  // A path update being loaded on its loader thread (StartLoad / PollLoad).
  struct PendingLoad {
    std::shared_ptr<LoadJob> job;
    uint64_t request_id = 0;
    uint64_t version = 0;
    std::string path;
    Clock::time_point started;
  };
  std::optional<PendingLoad> load_;
  std::deque<zmq::message_t> deferred_;          // arrived during the load, handled after it
  std::shared_ptr<std::atomic<int>> loaders_;    // this replica's loader threads still running
  std::unordered_map<uint64_t, ItemMeta> meta_;  // live work items by work_id
  RequestStore requests_;                        // the group requests kept for the coordinator
  int64_t streaming_ = 0;                        // live items with stream_tokens
  int64_t detecting_ = 0;                        // live items with a tool/stop detector
  uint64_t version_ = 0;
  Status refused_;  // the coordinator's kProtocol refusal of this replica: Run returns it
  int64_t tokens_processed_ = 0;
  std::vector<uint64_t> align_buf_;  // AlignForRead storage
  // Null without ReplicaOptions::metrics.
  std::unique_ptr<ReplicaMetrics> metrics_;
};

}  // namespace

Status RunReplica(engine::Engine& engine, zmq::context_t& ctx, const std::string& endpoint,
                  const ReplicaOptions& options, const std::atomic<bool>& stop) {
  ReplicaLoop loop(engine, ctx, options);
  return loop.Run(endpoint, stop);
}

}  // namespace bitroll::rollout
