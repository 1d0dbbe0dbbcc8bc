// rollout/messages.h: builders of the envelopes the coordinator relays (replica -> client) and
// dispatches (coordinator -> replica). Kept apart from coordinator.cc's state machine.
//
// Thread-safety: pure functions of their arguments.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "rollout/protocol.h"

namespace bitroll::rollout {

// Where a relayed message belongs on the client side.
struct SampleAddress {
  uint64_t group_id = 0;
  uint32_t prompt_index = 0;
  uint32_t sample_index = 0;
};

// A Trajectory envelope for the client: the replica's ids, logprobs (bit-exact copies), finish,
// turns, versions, fingerprint and error, with the client's address, `cost` (queue time and price
// filled in by the coordinator), the replica's name and the client tag (may be null).
void BuildClientTrajectory(flatbuffers::FlatBufferBuilder& fbb, const wire::Trajectory& t,
                           const SampleAddress& at, const CostInfo& cost, std::string_view replica,
                           const flatbuffers::String* client_tag);

// A TokenChunk envelope for the client.
void BuildClientTokenChunk(flatbuffers::FlatBufferBuilder& fbb, const wire::TokenChunk& c,
                           const SampleAddress& at);

// One WorkItem of sample (prompt_index, sample_index) of `m`, for a ReplicaWork batch. `forced`:
// tokens to re-prefill (resume from the WAL; empty for fresh work). `stream`: ask the replica
// for TokenChunks (the client asked for them, or the WAL logs them).
flatbuffers::Offset<wire::WorkItem> BuildWorkItem(flatbuffers::FlatBufferBuilder& fbb,
                                                  const wire::SubmitRollouts& m, uint64_t work_id,
                                                  const SampleAddress& at,
                                                  std::span<const int32_t> forced = {},
                                                  bool stream = false);

}  // namespace bitroll::rollout
