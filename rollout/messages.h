// rollout/messages.h: builders of the envelopes the coordinator relays (replica -> client) and
// dispatches (coordinator -> replica). Kept apart from coordinator.cc's state machine.
//
// Thread-safety: pure functions of their arguments.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "rollout/protocol.h"
#include "rollout/tool_call.h"

namespace bitroll::rollout {

// Where a relayed message belongs on the client side.
struct SampleAddress {
  uint64_t group_id = 0;
  uint32_t prompt_index = 0;
  uint32_t sample_index = 0;
};

// The earlier turns of a trajectory (tool loop; empty on a first turn), put before the last
// turn's tokens: the WorkItem's context (ids, logprobs, mask, versions, tool calls, turn number)
// and the ids the replica injected (the formatted tool result) before the last turn.
struct TurnPrefix {
  std::span<const int32_t> ids;                 // sampled and injected tokens of the earlier turns
  std::span<const float> lps;                   // 0.0 for injected tokens
  std::span<const uint8_t> mask;                // 1 sampled, 0 injected
  std::span<const wire::VersionSpan> versions;  // begin = trajectory index
  std::span<const int32_t> injected;            // after ids: logprob 0.0, mask 0
  int32_t turns = 1;
  const flatbuffers::Vector<flatbuffers::Offset<wire::ToolCallInfo>>* calls = nullptr;
};

// The last turn of a trajectory as its replica finished it.
struct FinalTurn {
  std::span<const int32_t> ids;  // the turn's sampled tokens
  std::span<const float> lps;    // bit-exact, one per id
  wire::FinishReason finish = wire::FinishReason_None;
  std::span<const wire::VersionSpan> versions;  // begin = trajectory index
  const NumericsFingerprint* fingerprint = nullptr;
  const RoutingRecord* routing = nullptr;  // covers the whole trajectory; null: none
  Status error;                            // set when finish == Error
  Cost cost;                               // what the replica knows (the engine's fields)
};

// The client's Trajectory envelope, built once by the replica (replica protocol 4): the prefix's
// turns then t's tokens (mask 1), the client's address, the replica's name and the client tag
// (may be null). The Cost table stores every field, zeros included, so that the coordinator sets
// the fields it knows (queue time, sandbox time, price, WAL bytes) in place with
// SetTrajectoryCost instead of encoding the trajectory again.
void BuildClientTrajectory(flatbuffers::FlatBufferBuilder& fbb, const FinalTurn& t,
                           const TurnPrefix& prefix, const SampleAddress& at,
                           std::string_view replica, const std::string* client_tag);

// Sets every field of the Cost of a Trajectory envelope built by BuildClientTrajectory, in
// place. False (and nothing changed) when `envelope` is no Trajectory or its Cost lacks a slot.
bool SetTrajectoryCost(std::string& envelope, const Cost& cost);

// SetTrajectoryCost for a copy of bytes DecodeEnvelope has verified already (a ReplicaResults'
// nested envelope): the same checks but the verifier's second pass.
bool SetVerifiedTrajectoryCost(std::string& envelope, const Cost& cost);

// Sets cost.wal_bytes alone, in place (the WAL counts a record's bytes at commit). False as for
// SetTrajectoryCost.
bool SetTrajectoryWalBytes(std::string& envelope, int64_t wal_bytes);

// A ReplicaResults entry carrying `envelope` (a finished Trajectory Envelope) for `work_id`,
// copied as bytes.
flatbuffers::Offset<wire::FinishedTrajectory> CreateFinished(flatbuffers::FlatBufferBuilder& fbb,
                                                             uint64_t work_id,
                                                             std::string_view envelope);

// A TokenChunk envelope for the client: the replica's chunk with the client's address; its
// position_begin (a trajectory index on both sides) and injected_ids are copied.
void BuildClientTokenChunk(flatbuffers::FlatBufferBuilder& fbb, const wire::TokenChunk& c,
                           const SampleAddress& at);

// Deep copy of a ToolCallInfo into another builder.
flatbuffers::Offset<wire::ToolCallInfo> CopyToolCallInfo(flatbuffers::FlatBufferBuilder& fbb,
                                                         const wire::ToolCallInfo& c);

// The tool loop's part of a WorkItem: a later turn (docs/protocol.md "Tools").
struct TurnInput {
  std::span<const int32_t> context;  // every token of the earlier turns
  std::string_view inject;           // formatted tool result to encode and append
  int32_t sampled_before = 0;        // tokens sampled in the earlier turns (they use the budget)
  // What the replica needs to build the whole trajectory (replica protocol 4): per context token
  // its logprob and mask, the earlier turns' version spans, tool calls and this turn's number.
  std::span<const float> lps;
  std::span<const uint8_t> mask;
  std::span<const wire::VersionSpan> versions;
  std::span<const ToolOutcome> calls;
  int32_t turn = 1;
};

// One ReplicaWork message on its way to a replica (replica protocol 3 and 4). A group's request
// goes in, when the replica does not hold it, as the bytes of its SubmitRollouts envelope that the
// coordinator keeps (never parsed or re-encoded here), under the group's key; every item names
// its request by key. Forgotten keys ride along (ReplicaWork.forget).
class ReplicaWorkBuilder {
 public:
  // Puts `request` in the message under `key` (once: a key already in it is skipped).
  // `transient`: the replica uses it for this message's items only and does not keep it.
  void AddRequest(uint64_t key, std::string_view request, bool transient = false);
  // Sample `at` of the group whose request is `key` (in this message or held by the replica).
  // `forced`: tokens to re-prefill (resume from the WAL; empty for fresh work). `stream`: ask
  // for TokenChunks whatever the request says (the WAL logs them). `turn`: a later turn of the
  // tool loop (null: the first).
  void Add(uint64_t key, uint64_t work_id, const SampleAddress& at,
           std::span<const int32_t> forced = {}, bool stream = false,
           const TurnInput* turn = nullptr);
  // The replica may drop its request `key` (applied before this message's requests and items).
  void Forget(uint64_t key) { forget_.push_back(key); }
  // Whether the request `key` is in the message already.
  bool Holds(uint64_t key) const { return index_.count(key) > 0; }
  // Bytes written so far (about the size of the finished message).
  size_t size() const { return fbb_.GetSize() + forget_.size() * 8; }
  bool empty() const { return items_.empty() && forget_.empty(); }
  // The finished ReplicaWork envelope; valid while the builder lives. Call once.
  std::string_view Finish();

 private:
  flatbuffers::FlatBufferBuilder fbb_{4096};
  std::vector<flatbuffers::Offset<wire::WorkItem>> items_;
  std::vector<flatbuffers::Offset<wire::GroupRequest>> requests_;
  std::vector<uint64_t> forget_;
  std::unordered_set<uint64_t> index_;  // keys of the requests in requests_
};

}  // namespace bitroll::rollout
