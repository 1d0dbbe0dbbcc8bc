// schema/wire_translate.h: the one place where the shared values of schema/vocab.h (and the
// ErrorCode/Status of schema/status.h) are converted to and from the wire tables of
// schema/rollout.fbs. Every module that reads or writes these tables calls these functions; none
// copies their fields itself.
//
// Why two translators (this one and schema/wal_translate.h) and not one: the WAL must never see
// the wire schema (wal/ stores the wire request as opaque bytes and is built and tested without
// it), and the wire side has no business with the log's tables. One header per schema keeps each
// include graph honest; both live in the bitroll_schema library, next to the schemas and the
// vocabulary, and each has its round-trip test in schema/translate_test.cc. The one exception:
// the sampling parameters' field reads, a template below, are shared with the log's translator
// (wal_translate.cc includes this header; wal_translate.h and wal/ do not).
//
// Enum mirrors are checked at compile time, enumerator by enumerator (wire_translate.cc).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

#include "schema/rollout_generated.h"
#include "schema/status.h"
#include "schema/vocab.h"

namespace bitroll {

namespace translate_internal {

// The per-field reads of the sampling parameters, the one copy of them. `sp` is a
// wire::SamplingParams table or a wal::fb::SamplingParams struct (schema/wal_translate.cc reads the
// log with it: both generated types have the same accessors); null: the defaults. This template
// needs no generated code of its own, so including this header adds no log symbols to a binary.
template <typename Table>
SamplingParams SamplingFrom(const Table* sp, uint64_t seed) {
  SamplingParams p;
  if (sp != nullptr) {
    p.temperature = sp->temperature();
    p.top_k = sp->top_k();
    p.top_p = sp->top_p();
    p.min_p = sp->min_p();
  }
  p.seed = seed;
  return p;
}

}  // namespace translate_internal

// SamplingParams. On the wire `seed` is a field of the message that holds the SamplingParams
// table (SubmitRollouts.seed), so SamplingToWire writes the four table fields and the caller
// passes params.seed to the message's seed slot; the reader takes the whole message. Replicas
// read them from the request itself (ReplicaWork.requests): nothing re-encodes them.
flatbuffers::Offset<wire::SamplingParams> SamplingToWire(flatbuffers::FlatBufferBuilder& fbb,
                                                         const SamplingParams& p);
// A missing table gives the schema's defaults (temperature 1, filters off).
inline SamplingParams SamplingFromWire(const wire::SamplingParams* sp, uint64_t seed) {
  return translate_internal::SamplingFrom(sp, seed);
}
inline SamplingParams SamplingFromWire(const wire::SubmitRollouts& m) {
  return SamplingFromWire(m.sampling(), m.seed());
}

flatbuffers::Offset<wire::Fingerprint> FingerprintToWire(flatbuffers::FlatBufferBuilder& fbb,
                                                         const NumericsFingerprint& f);
NumericsFingerprint FingerprintFromWire(const wire::Fingerprint* f);  // zeros when null

flatbuffers::Offset<wire::Cost> CostToWire(flatbuffers::FlatBufferBuilder& fbb, const Cost& c);
Cost CostFromWire(const wire::Cost* c);  // zeros when null

// RoutingRecord <-> wire::Routing (ids in the smallest type that fits, schema/vocab.h).
flatbuffers::Offset<wire::Routing> RoutingToWire(flatbuffers::FlatBufferBuilder& fbb,
                                                 const RoutingRecord& r);
// An empty record when null. Errors: kCorruption for inconsistent lengths or an id out of range.
Result<RoutingRecord> RoutingFromWire(const wire::Routing* r);

wire::FinishReason FinishToWire(FinishReason r);
// Values outside the mirror pass through unchanged (a newer peer's reason; never produced here).
FinishReason FinishFromWire(wire::FinishReason r);

wire::ToolTier TierToWire(ToolTier t);
// Values outside the mirror pass through unchanged (ValidateTools refuses them).
ToolTier TierFromWire(wire::ToolTier t);

wire::ErrorCode ErrorCodeToWire(ErrorCode code);
// Unknown wire codes map to kInternal.
ErrorCode ErrorCodeFromWire(wire::ErrorCode code);
// OK when `e` is null.
Status StatusFromWire(const wire::Error* e);
// An Error table of `s` (code and message) about group `group_id` (0: none).
flatbuffers::Offset<wire::Error> ErrorToWire(flatbuffers::FlatBufferBuilder& fbb, const Status& s,
                                             uint64_t group_id = 0);

}  // namespace bitroll
