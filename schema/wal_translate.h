// schema/wal_translate.h: the one place where the shared values of schema/vocab.h are converted
// to and from the log tables of schema/wal.fbs (wal/record_codec.cc is the only caller). See
// schema/wire_translate.h for why the wire and the log have one translator each.
//
// The log stores FinishReason and ToolTier as plain ubyte fields (not FlatBuffers enums): their
// numbering is the vocabulary's, frozen by the WAL format (docs/wal_format.md) and checked here
// at compile time against the stored values.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

#include "schema/vocab.h"
#include "schema/wal_generated.h"

namespace bitroll {

// In the log the seed is Header.seed, beside the SamplingParams struct: SamplingToLog fills the
// struct and the caller writes params.seed to the header's seed slot.
wal::fb::SamplingParams SamplingToLog(const SamplingParams& p);
// A missing struct gives SamplingParams' defaults.
SamplingParams SamplingFromLog(const wal::fb::SamplingParams* sp, uint64_t seed);
SamplingParams SamplingFromLog(const wal::fb::Header& h);

flatbuffers::Offset<wal::fb::NumericsFingerprint> FingerprintToLog(
    flatbuffers::FlatBufferBuilder& fbb, const NumericsFingerprint& f);
NumericsFingerprint FingerprintFromLog(const wal::fb::NumericsFingerprint* f);  // zeros if null

// RoutingRecord <-> wal::fb::Routing (stored in the Finished record). Errors as
// RoutingFromWire.
flatbuffers::Offset<wal::fb::Routing> RoutingToLog(flatbuffers::FlatBufferBuilder& fbb,
                                                   const RoutingRecord& r);
Result<RoutingRecord> RoutingFromLog(const wal::fb::Routing* r);

uint8_t FinishToLog(FinishReason r);
FinishReason FinishFromLog(uint8_t r);  // any byte passes through (the log is checksummed)
uint8_t TierToLog(ToolTier t);
ToolTier TierFromLog(uint8_t t);

}  // namespace bitroll
