// rollout/replica.h: a replica is an Engine plus one thread driving Step().
//
// RunReplica() connects a ZeroMQ DEALER to the coordinator's replica endpoint (inproc:// for an
// in-process worker, tcp:// or ipc:// for `bitroll replica`), says ReplicaHello, then loops:
// take ReplicaWork / ReplicaAbort / UpdateWeights messages, run one engine Step() while there is
// work, send finished trajectories (and token chunks of streaming samples) as ReplicaResults, and a
// ReplicaHeartbeat every heartbeat_ms. Weight updates are applied between two Step() calls.
//
// UpdateWeights {path} (docs/weights.md "Loading from a path"): the path is checked and loaded on a
// loader thread, never on this one, so a FIFO, a device or a hung filesystem cannot stop the
// heartbeats. A path that is not a regular file or a directory is refused (kInvalidArgument)
// before any read; a load past weights_load_timeout_ms is answered kTimeout and its thread
// detached. Meanwhile the running sequences keep stepping; messages that arrive wait, in order,
// until the load ends (so a replayed update still precedes the work that needs it). Engines
// without weights of their own (the NullEngine) apply the path on this thread, as before.
//
// The replica never decides anything numerical: each WorkItem names its group's request by key,
// and its prompt and sample index; the request travels verbatim once per connection
// (ReplicaWork.requests) and the replica keeps it until told to forget it (RequestStore,
// rollout/request_store.h). An item naming a request it does not keep is sent back unstarted
// (ReplicaRefused, kProtocol). The replica reads the prompt, the sampling params (seed
// included), max_tokens and the stops from that request. The engine's results are a pure
// function of those and the item's forced tokens. A resumed item (WorkItem.forced_ids, from the
// coordinator's WAL) is added with SequenceRequest::forced:
// the engine re-prefills and re-scores the logged tokens and continues; their TokenEvents are
// streamed like sampled ones (the coordinator skips positions it already logged).
//
// Tool loop: the engine's prompt is prompt + WorkItem.context_ids + the tokenizer's encoding of
// WorkItem.inject_text (no BOS); the injected ids are sent first, as a TokenChunk with
// injected_ids. Each item with tool delimiters or stop strings gets a ToolDetector
// (rollout/tool_detect.h) fed with its tokens; on a complete call / stop string the replica
// aborts the sequence and reports it ending exactly on that token, finish ToolCall (with the
// call text in Trajectory.tool_call) or Stop. A prompt + context + result that fills the
// context ends the item with finish Length and no result.
//
// Token indexes (replica protocol 2, docs/design.md "Token indexes"): every index the replica
// reports (TokenChunk.position_begin, Trajectory.versions) is a trajectory index, the engine
// position minus the request's prompt length: context_ids and injected ids count.
//
// Ownership: the caller owns `engine` and `ctx`; both must outlive the call.
// Thread-safety: RunReplica() uses `engine` from the calling thread only; `stop` may be set from
// any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <zmq.hpp>

#include "engine/engine.h"
#include "engine/model_weights.h"
#include "schema/status.h"

namespace bitroll::rollout {

class Metrics;  // rollout/metrics.h

struct ReplicaOptions {
  std::string name = "replica";  // shown in Status and in each Trajectory
  bool remote = false;           // informational: a separate process / host
  uint32_t capacity = 256;       // work items the coordinator may keep in flight here
  int heartbeat_ms = 100;        // liveness signal; the coordinator's timeout is several of these
  // UpdateWeights {path}: a load that takes longer is abandoned and answered kTimeout; the old
  // weights keep serving. <= 0: no deadline.
  int weights_load_timeout_ms = 120000;
  // Loads the weights of an UpdateWeights {path} on the loader thread, after the path was found
  // to be a regular file or a directory. Unset: engine::LoadModelWeights. It may outlive the
  // replica (a timed-out load is detached), so it must own what it uses. For tests (a slow
  // filesystem) and custom loaders.
  std::function<Result<engine::ModelWeights>(const std::string&)> load_weights;
  // Encodes a text prompt into token ids. Unset: the engine's tokenizer (BOS prepended, as
  // `bitroll generate` does); an engine without one finishes text prompts with kUnsupported.
  std::function<Result<std::vector<int32_t>>(std::string_view)> encode_text;
  // Engine counters exported at each heartbeat (rollout/metrics.h); null: none. Not owned.
  Metrics* metrics = nullptr;
};

// Runs the replica loop until `stop` is true. Returns OK on a clean stop, the socket error
// (kUnavailable) that ended it, or the coordinator's kProtocol error when it refused this
// replica's protocol version (kReplicaProtocolVersion, rollout/protocol.h).
Status RunReplica(engine::Engine& engine, zmq::context_t& ctx, const std::string& endpoint,
                  const ReplicaOptions& options, const std::atomic<bool>& stop);

}  // namespace bitroll::rollout
