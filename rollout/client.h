// rollout/client.h: C++ client of the rollout service (docs/protocol.md).
//
// A Client is one ZeroMQ DEALER connected to the coordinator. Submit() sends a group and returns at
// once; Next() yields events (trajectories as they finish, token chunks when streaming, GroupDone,
// errors) for all of this client's groups in arrival order. Run() is Submit() plus waiting for that
// group's GroupDone. Control calls (UpdateWeights, Drain, GetStatus) wait for the reply with the
// same request id; events that arrive meanwhile are kept for Next().
//
// Thread-safety: a Client is NOT thread-safe; use one per thread.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <zmq.hpp>

#include "rollout/protocol.h"
#include "schema/status.h"
#include "schema/vocab.h"

namespace bitroll::rollout {

struct ClientOptions {
  std::string endpoint = "tcp://127.0.0.1:5555";
  // Owner of this client's groups (Envelope.client_id, docs/protocol.md "Owners"): only a client
  // with the same id can re-attach to, acknowledge or abort them. Empty: a random 128-bit id,
  // fixed for the Client's life (Client::client_id()); keep it to re-attach from a new process.
  std::string client_id;
  DecodeLimits decode;  // applied to replies
};

// A tool the model may call (docs/protocol.md "Tools"; wire::ToolSpec).
struct ToolSpecInput {
  std::string name;
  ToolTier tier = ToolTier::kFunction;
  std::string command_template;  // process/container/vm: argv template with "{input}"
  std::string function;          // function tier: "echo", "calc" or "append"
  uint32_t wall_ms = 10000;
  uint32_t cpu_ms = 10000;
  uint64_t memory_bytes = 256ull << 20;
  uint64_t output_bytes = 65536;
  uint32_t processes = 16;
  bool network = false;
};

// The sampling parameters (schema/vocab.h SamplingParams: temperature, top_k, top_p, min_p and
// seed) are the request's base: q.temperature, q.seed, ... .
struct SubmitRequest : SamplingParams {
  uint64_t group_id = 0;
  std::vector<std::vector<int32_t>> prompts;  // token ids ...
  std::vector<std::string> text_prompts;      // ... or text (tokenized by the replica); not both
  uint32_t n = 1;
  int32_t max_tokens = 256;
  int32_t max_turns = 1;
  std::vector<int32_t> stop_ids;
  std::vector<std::string> stop_strings;
  bool stop_at_eos = true;
  int32_t priority = 0;
  std::string client_tag;
  bool stream_tokens = false;
  // Tool loop: tools, and the delimiters of a call (strings, or token ids; -1 = none).
  std::vector<ToolSpecInput> tools;
  std::string tool_open, tool_close;
  int32_t tool_open_id = -1, tool_close_id = -1;
  std::string tool_result_template;  // empty: "\n<result>{output}</result>\n"
  // MoE models: each trajectory carries its routing record (TrajectoryResult::routing).
  bool return_routing = false;
};

// One tool call of a trajectory (wire::ToolCallInfo).
struct ToolCallResult {
  std::string name;
  std::string input;
  ToolTier tier = ToolTier::kFunction;
  int32_t exit_status = -1;
  std::string output;  // the tool's stdout
  bool output_truncated = false;
  Status error;  // typed error of the call (timeout, unknown tool, ...)
  double wall_seconds = 0, cpu_seconds = 0;
  int32_t token_index = 0;  // index in ids just past the call
  bool replayed = false;    // the result came from the WAL
};

struct TrajectoryResult {
  uint64_t group_id = 0;
  uint32_t prompt_index = 0;
  uint32_t sample_index = 0;
  std::vector<int32_t> ids;
  std::vector<float> logprobs;
  FinishReason finish = FinishReason::kNone;
  int32_t turns = 0;
  std::vector<std::pair<int32_t, uint64_t>> versions;  // (first token, weight version)
  NumericsFingerprint fingerprint;
  Cost cost;
  std::string replica;
  std::string client_tag;
  Status error;
  std::vector<uint8_t> mask;  // 1 sampled, 0 injected (tool results; logprob 0.0)
  std::vector<ToolCallResult> tool_calls;
  // SubmitRequest::return_routing on a MoE model: per position (the prompt, then every id but the
  // last) and MoE layer, the top-k expert ids and fp32 weights (schema/vocab.h).
  RoutingRecord routing;
};

struct TokenChunkResult {
  uint64_t group_id = 0;
  uint32_t prompt_index = 0;
  uint32_t sample_index = 0;
  int32_t position_begin = 0;
  std::vector<int32_t> ids;
  std::vector<float> logprobs;
  uint64_t weight_version = 0;
  std::vector<int32_t> injected_ids;  // tool loop: result tokens inserted at position_begin
};

struct GroupSummary {
  uint64_t group_id = 0;
  uint32_t trajectories = 0;
  uint32_t errors = 0;
  uint32_t aborted = 0;
  Cost cost;
};

struct ReplicaInfo {
  std::string name;
  uint32_t queued = 0;
  int64_t running = 0;
  double tokens_per_s = 0.0;
  uint64_t weight_version = 0;
  bool alive = false;
  bool remote = false;
};

struct StatusInfo {
  uint32_t queued = 0;
  uint32_t inflight = 0;
  uint32_t groups = 0;
  std::vector<ReplicaInfo> replicas;
  double tokens_per_s = 0.0;
  double cache_hit_rate = 0.0;
  uint64_t trajectories_done = 0;
  uint64_t weight_version = 0;
  bool draining = false;
  uint32_t waiting_for_weights = 0;  // recovered trajectories waiting for their weights version
  // The replicas' numerics fingerprint (weights_hash: the live weights'); empty before one joined.
  std::optional<NumericsFingerprint> fingerprint;
  // The WAL (all 0 / false without --data-dir): positions as in schema/rollout.fbs StatusReply.
  bool wal_enabled = false;
  uint64_t wal_last_lsn = 0;       // appended, up to this reply
  uint64_t wal_committed_lsn = 0;  // in a committed transaction: survives kill -9
  uint64_t wal_durable_lsn = 0;    // fsynced: survives a crash of the machine
  Status wal_error;                // the WAL's sticky error (ok: none)
};

struct Event {
  // kReply: a control reply (Ack / StatusReply); Next() never returns one.
  enum class Kind { kTrajectory, kTokenChunk, kGroupDone, kError, kReply };
  Kind kind = Kind::kError;
  uint64_t request_id = 0;
  TrajectoryResult trajectory;  // kTrajectory
  TokenChunkResult chunk;       // kTokenChunk
  GroupSummary done;            // kGroupDone
  Status error;                 // kError (error.code() mirrors the wire code)
  uint64_t error_group_id = 0;  // kError: the group concerned, 0 if none
  std::string reply;            // kReply: the verified envelope bytes
};

// The SubmitRollouts envelope for `request` (no client-side checks: tests send bad ones).
std::string EncodeSubmit(const SubmitRequest& request, uint64_t request_id,
                         std::string_view client_id = {});

// One tensor of a weight update. `data`: host memory for UpdateWeightsStreamed, a device
// pointer for an NCCL broadcast, unused in an NCCL manifest.
struct WeightTensor {
  std::string name;            // as the served model's format names it (docs/weights.md)
  std::string dtype = "f32";   // "f32" | "f16" | "bf16"
  std::vector<int64_t> shape;  // outermost first
  const void* data = nullptr;  // numel * dtype size bytes
};

// numel * dtype size. Errors: kInvalidArgument (an unknown dtype, a negative dimension).
Result<size_t> WeightTensorBytes(const WeightTensor& t);

class Client {
 public:
  // Connects (ZeroMQ connects lazily; the first send waits for the peer).
  static Result<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  ~Client();

  // Sends a group. Validation errors come back asynchronously as an Error event for group_id.
  // Errors here: kInvalidArgument (both or neither of prompts/text_prompts), kUnavailable.
  Status Submit(const SubmitRequest& request);

  // The next event, waiting up to timeout_ms. kTimeout when none arrived.
  Result<Event> Next(int timeout_ms);

  // Submit() and collect the group's trajectories (sorted by prompt, then sample index) until
  // GroupDone. An Error event for the group is returned as the error. Other groups' events are
  // kept for Next().
  Result<std::vector<TrajectoryResult>> Run(const SubmitRequest& request, int timeout_ms,
                                            GroupSummary* summary = nullptr);

  Status Abort(uint64_t group_id);
  // Waits for every replica to load `path`; returns the live version.
  Result<uint64_t> UpdateWeights(const std::string& path, uint64_t version, bool drain,
                                 int timeout_ms);
  // Streams `tensors` (host memory, names of the served model's format, docs/weights.md) in parts
  // of at most part_bytes of data (a larger tensor is sliced), each part waiting for its Ack,
  // then commits. full = true: the replicas also check every tensor of the model was sent.
  // Returns the live version. Errors: the first typed error of the coordinator or a replica
  // (nothing is installed then), kTimeout per part. on_part, when set, is called after each
  // acknowledged part with the data bytes sent so far and the total.
  Result<uint64_t> UpdateWeightsStreamed(
      std::span<const WeightTensor> tensors, uint64_t version, bool drain, bool full,
      int timeout_ms, size_t part_bytes = size_t{1} << 20,
      const std::function<void(size_t sent_bytes, size_t total_bytes)>& on_part = {});
  // Sends UpdateWeights{version, drain, nccl{unique_id, world_size, manifest}} (manifest: name,
  // dtype, shape; data unused) and returns its request id; the reply comes by WaitUpdateReply.
  // rollout/nccl_weight_sender.h drives the whole broadcast.
  Result<uint64_t> BeginUpdateWeightsNccl(const std::array<uint8_t, 128>& unique_id, int world_size,
                                          std::span<const WeightTensor> manifest, uint64_t version,
                                          bool drain);
  // The reply to an update sent earlier: the live version once every replica installed it,
  // kTimeout when none came within timeout_ms (0: poll), else the update's typed error.
  Result<uint64_t> WaitUpdateReply(uint64_t request_id, int timeout_ms);
  // resume = false: pause dispatch and wait until nothing is in flight. true: resume.
  Status Drain(bool resume, int timeout_ms);
  Result<StatusInfo> GetStatus(int timeout_ms);
  // Returns once everything this client sent before the call (Acks, Aborts, Submits) is in a
  // committed WAL transaction, so that it survives kill -9 of the service: e.g. before a trainer
  // checkpoints the trajectories it acknowledged. kTimeout after timeout_ms; FailedPrecondition
  // when the service runs without a WAL; the WAL's sticky error once it has failed (what was sent
  // after that was not logged).
  Status WaitCommitted(int timeout_ms);
  // Tells the service the trainer has stored these trajectories.
  Status Ack(uint64_t group_id, const std::vector<std::pair<uint32_t, uint32_t>>& samples);

  // Sends arbitrary bytes as one message (tests: malformed input).
  Status SendRaw(std::string_view bytes);

  const std::string& client_id() const { return options_.client_id; }

 private:
  explicit Client(const ClientOptions& options);
  Result<Event> Receive(int timeout_ms);
  // Waits for the reply to request_id (an Ack, StatusReply or Error envelope, decoded into *out).
  // The reply (kReply) or the Error for request_id; other events are kept for Next().
  Result<Event> WaitReply(uint64_t request_id, int timeout_ms);

  ClientOptions options_;
  zmq::context_t ctx_;
  zmq::socket_t sock_;
  std::deque<Event> pending_;
  uint64_t next_request_id_ = 1;
};

}  // namespace bitroll::rollout
