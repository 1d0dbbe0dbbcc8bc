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

// The tool loop's earlier turns of a trajectory, put before the last turn's tokens.
struct TurnPrefix {
  std::span<const int32_t> ids;                 // sampled and injected tokens of the earlier turns
  std::span<const float> lps;                   // 0.0 for injected tokens
  std::span<const uint8_t> mask;                // 1 sampled, 0 injected
  std::span<const wire::VersionSpan> versions;  // begin = trajectory index
  int32_t turns = 1;
  std::span<const ToolOutcome> calls;
};

// A Trajectory envelope for the client: the replica's ids, logprobs (bit-exact copies), finish,
// turns, versions, fingerprint and error, with the client's address, `cost` (queue time and price
// filled in by the coordinator), the replica's name and the client tag (may be null). `prefix`
// (tool loop): the earlier turns go first, and turns / tool_calls come from it; without one,
// t's mask and tool_calls are copied (a mask of ones when t has none). `wal_bytes_slot`: the Cost
// table stores every field, zeros included, so that SetTrajectoryWalBytes can fill in wal_bytes
// later without encoding the trajectory again (the WAL counts a record's bytes at commit).
void BuildClientTrajectory(flatbuffers::FlatBufferBuilder& fbb, const wire::Trajectory& t,
                           const SampleAddress& at, const Cost& cost, std::string_view replica,
                           const flatbuffers::String* client_tag,
                           const TurnPrefix* prefix = nullptr, bool wal_bytes_slot = false);

// Sets cost.wal_bytes of a Trajectory envelope built with wal_bytes_slot, in place. False (and
// nothing changed) when `envelope` is no Trajectory or its Cost has no wal_bytes slot.
bool SetTrajectoryWalBytes(std::string& envelope, int64_t wal_bytes);

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
};

// One ReplicaWork message on its way to a replica (replica protocol 3). A group's request goes
// in, when the replica does not hold it, as the bytes of its SubmitRollouts envelope that the
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
