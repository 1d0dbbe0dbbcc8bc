// rollout/protocol.h: decoding, validation and encoding of bitroll wire messages
// (schema/rollout.fbs; docs/protocol.md).
//
// Every byte string that arrives on a socket goes through DecodeEnvelope() before anything reads
// it: the FlatBuffers verifier, the file identifier, the protocol version and the message type are
// all checked there, so code past it may trust the buffer's structure. ValidateSubmit() then checks
// a SubmitRollouts' values (n, max_tokens, token ids, ...).
//
// Thread-safety: every function here is a pure function of its arguments; call from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "schema/rollout_generated.h"
#include "schema/status.h"
#include "schema/vocab.h"
#include "schema/wire_translate.h"

namespace bitroll::rollout {

// Version carried in every Envelope. Bump on an incompatible change to schema/rollout.fbs.
inline constexpr uint32_t kProtocolVersion = 1;

// Version of the replica protocol (coordinator <-> replicas), carried in ReplicaHello. A
// coordinator admits only replicas of its own version (others get Error{code: Protocol}); clients
// never see it.
//   1 (field absent): WorkItems carried copies of the request's prompt, sampling and stops;
//     TokenChunk.position_begin and Trajectory.versions counted the tokens of the current turn.
//   2: a ReplicaWork carries each group's request once, verbatim (ReplicaWork.requests), and its
//     WorkItems name it; position_begin and versions are trajectory indexes, counting every token
//     after the prompt, earlier turns and injected ids included (docs/design.md "Token indexes").
//   3: a replica keeps each request it is sent for the life of its connection; items name it by
//     key (WorkItem.request_key), the coordinator sends it once per replica and says when to drop
//     it (ReplicaWork.forget); an item naming an unknown key is sent back (ReplicaRefused).
//   4: the replica encodes the client's Trajectory envelope of every trajectory that ends with a
//     turn (ReplicaResults.finished, nested bytes, a slot for every Cost field); the coordinator
//     forwards those bytes, setting only the Cost fields in place. A later turn's WorkItem carries
//     the earlier turns' logprobs, mask, version spans, tool calls and the turn number for it.
inline constexpr uint32_t kReplicaProtocolVersion = 4;

// What a coordinator may make one replica keep (replica protocol 3): at most this many requests
// of at most this many bytes in all. The replica keeps no more (rollout/request_store.h); the
// coordinator forgets idle ones to make room, and sends one that still does not fit as
// GroupRequest.transient (used by the items of its message only).
inline constexpr size_t kMaxHeldRequests = 1024;
inline constexpr size_t kMaxHeldRequestBytes = size_t{256} << 20;

struct DecodeLimits {
  // Larger messages are refused with kResourceExhausted before the verifier runs.
  size_t max_message_bytes = size_t{64} << 20;
  // Verifier limits: nesting depth and number of tables (guards against pathological buffers).
  uint32_t max_depth = 64;
  uint32_t max_tables = 4'000'000;
};

// Verifies `data[0, size)` as an Envelope and returns a pointer into `data` (not owned; valid while
// `data` is). Errors: kResourceExhausted (size > max_message_bytes), kProtocol (too short, wrong
// file identifier, verifier failure, wrong protocol_version, empty or unknown message type).
Result<const wire::Envelope*> DecodeEnvelope(const void* data, size_t size,
                                             const DecodeLimits& limits);

// ZeroMQ hands out message data at any address (right after its 2- or 9-byte frame header), but
// FlatBuffers reads assume natural alignment. Returns `data` when it is 8-byte aligned, else a
// copy of it in *storage (which must outlive the use of the result).
const void* AlignForRead(const void* data, size_t size, std::vector<uint64_t>* storage);

struct SubmitLimits {
  uint32_t max_prompts = 4096;  // prompts per group
  uint32_t max_n = 4096;        // samples per prompt
  // prompts x n per group; a quarter of CoordinatorOptions::max_queued, so that one group at the
  // limit cannot fill the queue and refuse everyone else.
  uint64_t max_samples = 1 << 18;
  int32_t max_tokens = 1 << 20;  // per trajectory
  int32_t max_turns = 64;
  size_t max_prompt_tokens = 1 << 20;  // ids or text bytes per prompt
  int32_t vocab_size = 0;              // token ids must be < vocab_size; 0 = not yet known
  // A prompt of ids must leave room for one generated token: shorter than the model's context
  // (the smallest of the replicas'). 0 = not yet known.
  int32_t max_seq_len = 0;
};

// Checks a verified SubmitRollouts. Errors: kInvalidArgument (no prompts, n == 0 or too large,
// max_tokens < 1 or too large, bad sampling params, a prompt with neither or both of ids/text,
// an empty prompt), kOutOfRange (a token id < 0 or >= vocab_size, in a prompt or in stop_ids;
// a prompt of ids that does not fit the model's context, max_seq_len).
Status ValidateSubmit(const wire::SubmitRollouts& m, const SubmitLimits& limits);

// The tool loop's part of ValidateSubmit (docs/protocol.md "Tools"). kInvalidArgument: a
// delimiter pair half set, strings and ids both set, tools without delimiters or delimiters
// without tools, a tool name that is not one word or is given twice, an unknown tier, a function
// tool naming no built-in function (rollout/tool_functions.h: echo, calc, append), a command
// tool whose template lacks "{input}", limits out of range, a result template without
// "{output}", an empty stop string.
Status ValidateTools(const wire::SubmitRollouts& m);

// The request of `work` whose key is `key`; null when the message does not carry it.
const wire::GroupRequest* FindRequest(const wire::ReplicaWork& work, uint64_t key);

// The SubmitRollouts in `request` (a verified envelope: DecodeEnvelope verifies a GroupRequest's
// nested one too; null: none) that `item` runs. Errors: kProtocol (no envelope, one that holds no
// SubmitRollouts, a prompt_index outside its prompts).
Result<const wire::SubmitRollouts*> SubmitOf(const wire::Envelope* request,
                                             const wire::WorkItem& item);

// The request a WorkItem of `work` runs when the message itself carries it (FindRequest by
// item.request_key, then SubmitOf). kProtocol when the message does not carry it; a replica
// also looks among the requests it holds (rollout/request_store.h).
Result<const wire::SubmitRollouts*> RequestOf(const wire::ReplicaWork& work,
                                              const wire::WorkItem& item);

// Refuses a ReplicaHello of another replica protocol (kProtocol; an absent field is version 1).
Status CheckReplicaHello(const wire::ReplicaHello& hello);

// DecodeEnvelope(), then the per-type checks a receiver applies (ValidateSubmit for
// SubmitRollouts). The one entry point of the fuzz target (rollout/fuzz_decode.cc).
Status CheckMessage(const void* data, size_t size, const DecodeLimits& decode,
                    const SubmitLimits& submit);

// The conversions of ErrorCode, Status, Cost, SamplingParams, fingerprints, finish reasons and
// tool tiers to and from the wire: schema/wire_translate.h.

// Finishes `fbb` as an Envelope holding `msg` of `type` with the current protocol version.
// client_id: the owner of the groups the message names (clients only; docs/protocol.md "Owners").
void FinishEnvelope(flatbuffers::FlatBufferBuilder& fbb, uint64_t request_id, wire::Message type,
                    flatbuffers::Offset<void> msg, std::string_view client_id = {});

// A complete encoded Error envelope.
std::string EncodeError(uint64_t request_id, const Status& status, uint64_t group_id = 0);

inline std::string_view BufferView(const flatbuffers::FlatBufferBuilder& fbb) {
  return {reinterpret_cast<const char*>(fbb.GetBufferPointer()), fbb.GetSize()};
}

}  // namespace bitroll::rollout
