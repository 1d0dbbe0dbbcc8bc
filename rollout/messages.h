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
  std::span<const wire::VersionSpan> versions;  // begin indexes into ids
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

// A TokenChunk envelope for the client; position_begin is moved by `offset` (the tokens of the
// earlier turns) and injected_ids are copied.
void BuildClientTokenChunk(flatbuffers::FlatBufferBuilder& fbb, const wire::TokenChunk& c,
                           const SampleAddress& at, int32_t offset = 0);

// Deep copy of a ToolCallInfo into another builder.
flatbuffers::Offset<wire::ToolCallInfo> CopyToolCallInfo(flatbuffers::FlatBufferBuilder& fbb,
                                                         const wire::ToolCallInfo& c);

// The tool loop's part of a WorkItem: a later turn (docs/protocol.md "Tools").
struct TurnInput {
  std::span<const int32_t> context;  // every token of the earlier turns
  std::string_view inject;           // formatted tool result to encode and append
  int32_t max_tokens = 0;            // budget left for this turn
};

// What the WorkItems of one group in one builder share: the request's parts (prompt, sampling,
// stop ids and strings, tool delimiters) are encoded once per message and group, and every item
// points at them (a FlatBuffers table may be referenced from several places; readers see the
// same values). Valid for one builder and one SubmitRollouts only.
struct WorkItemShared {
  const wire::SubmitRollouts* request = nullptr;
  bool built = false;
  flatbuffers::Offset<wire::SamplingParams> sampling;
  flatbuffers::Offset<flatbuffers::Vector<int32_t>> stop;
  flatbuffers::Offset<flatbuffers::String> open, close;
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>> stops;
  std::unordered_map<uint32_t, flatbuffers::Offset<wire::Prompt>> prompts;  // by prompt index
};

// One WorkItem of sample (prompt_index, sample_index) of `m`, for a ReplicaWork batch. `forced`:
// tokens to re-prefill (resume from the WAL; empty for fresh work). `stream`: ask the replica
// for TokenChunks (the client asked for them, or the WAL logs them). `turn`: a later turn of
// the tool loop (null: the first). The request's tool delimiters and stop strings are copied.
flatbuffers::Offset<wire::WorkItem> BuildWorkItem(
    flatbuffers::FlatBufferBuilder& fbb, const wire::SubmitRollouts& m, uint64_t work_id,
    const SampleAddress& at, std::span<const int32_t> forced = {}, bool stream = false,
    const TurnInput* turn = nullptr, WorkItemShared* shared = nullptr);

}  // namespace bitroll::rollout
