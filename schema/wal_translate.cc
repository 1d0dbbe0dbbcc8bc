// schema/wal_translate.cc: see wal_translate.h.
#include "schema/wal_translate.h"

#include <string>

#include "schema/translate_common.h"
#include "schema/wire_translate.h"  // translate_internal::SamplingFrom

namespace bitroll {

namespace fb = wal::fb;

// The numbering stored in every WAL written so far (docs/wal_format.md): never renumber.
static_assert(static_cast<uint8_t>(FinishReason::kNone) == 0);
static_assert(static_cast<uint8_t>(FinishReason::kLength) == 1);
static_assert(static_cast<uint8_t>(FinishReason::kStop) == 2);
static_assert(static_cast<uint8_t>(FinishReason::kEos) == 3);
static_assert(static_cast<uint8_t>(FinishReason::kAborted) == 4);
static_assert(static_cast<uint8_t>(FinishReason::kError) == 5);
static_assert(static_cast<uint8_t>(FinishReason::kToolCall) == 6);
static_assert(static_cast<uint8_t>(ToolTier::kFunction) == 0);
static_assert(static_cast<uint8_t>(ToolTier::kProcess) == 1);
static_assert(static_cast<uint8_t>(ToolTier::kContainer) == 2);
static_assert(static_cast<uint8_t>(ToolTier::kVm) == 3);
static_assert(sizeof(fb::SamplingParams) == 16, "the log's SamplingParams struct is 4 x 4 bytes");

fb::SamplingParams SamplingToLog(const SamplingParams& p) {
  return fb::SamplingParams(p.temperature, p.top_k, p.top_p, p.min_p);
}

SamplingParams SamplingFromLog(const fb::SamplingParams* sp, uint64_t seed) {
  return translate_internal::SamplingFrom(sp, seed);
}

SamplingParams SamplingFromLog(const fb::Header& h) {
  return SamplingFromLog(h.sampling(), h.seed());
}

flatbuffers::Offset<fb::NumericsFingerprint> FingerprintToLog(flatbuffers::FlatBufferBuilder& fbb,
                                                              const NumericsFingerprint& f) {
  auto backend = fbb.CreateString(f.backend);
  return fb::CreateNumericsFingerprint(fbb, f.weights_hash, f.kernel_version, f.attention_chunk,
                                       backend);
}

NumericsFingerprint FingerprintFromLog(const fb::NumericsFingerprint* f) {
  return translate_internal::FingerprintFrom(f);
}

flatbuffers::Offset<fb::Routing> RoutingToLog(flatbuffers::FlatBufferBuilder& fbb,
                                              const RoutingRecord& r) {
  return translate_internal::RoutingTo(fbb, r, fb::CreateRouting);
}

Result<RoutingRecord> RoutingFromLog(const fb::Routing* r) {
  return translate_internal::RoutingFrom(r);
}

uint8_t FinishToLog(FinishReason r) {
  return static_cast<uint8_t>(r);
}

FinishReason FinishFromLog(uint8_t r) {
  return static_cast<FinishReason>(r);
}

uint8_t TierToLog(ToolTier t) {
  return static_cast<uint8_t>(t);
}

ToolTier TierFromLog(uint8_t t) {
  return static_cast<ToolTier>(t);
}

}  // namespace bitroll
