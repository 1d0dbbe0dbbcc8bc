// schema/wire_translate.cc: see wire_translate.h.
#include "schema/wire_translate.h"

#include <string>

#include "schema/translate_common.h"

namespace bitroll {

// Every enumerator of every mirror, checked at compile time: a value added on one side only, or
// renumbered, fails the build here instead of miscasting on the wire.
#define BR_SAME(a, b) static_assert(static_cast<int>(a) == static_cast<int>(b), #a " != " #b)

BR_SAME(FinishReason::kNone, wire::FinishReason_None);
BR_SAME(FinishReason::kLength, wire::FinishReason_Length);
BR_SAME(FinishReason::kStop, wire::FinishReason_Stop);
BR_SAME(FinishReason::kEos, wire::FinishReason_Eos);
BR_SAME(FinishReason::kAborted, wire::FinishReason_Aborted);
BR_SAME(FinishReason::kError, wire::FinishReason_Error);
BR_SAME(FinishReason::kToolCall, wire::FinishReason_ToolCall);
BR_SAME(FinishReason::kToolCall, wire::FinishReason_MAX);

BR_SAME(ToolTier::kFunction, wire::ToolTier_Function);
BR_SAME(ToolTier::kProcess, wire::ToolTier_Process);
BR_SAME(ToolTier::kContainer, wire::ToolTier_Container);
BR_SAME(ToolTier::kVm, wire::ToolTier_Vm);
BR_SAME(ToolTier::kVm, wire::ToolTier_MAX);

BR_SAME(ErrorCode::kOk, wire::ErrorCode_Ok);
BR_SAME(ErrorCode::kInvalidArgument, wire::ErrorCode_InvalidArgument);
BR_SAME(ErrorCode::kNotFound, wire::ErrorCode_NotFound);
BR_SAME(ErrorCode::kCorruption, wire::ErrorCode_Corruption);
BR_SAME(ErrorCode::kIoError, wire::ErrorCode_IoError);
BR_SAME(ErrorCode::kUnsupported, wire::ErrorCode_Unsupported);
BR_SAME(ErrorCode::kOutOfRange, wire::ErrorCode_OutOfRange);
BR_SAME(ErrorCode::kResourceExhausted, wire::ErrorCode_ResourceExhausted);
BR_SAME(ErrorCode::kBusy, wire::ErrorCode_Busy);
BR_SAME(ErrorCode::kTimeout, wire::ErrorCode_Timeout);
BR_SAME(ErrorCode::kAborted, wire::ErrorCode_Aborted);
BR_SAME(ErrorCode::kInternal, wire::ErrorCode_Internal);
BR_SAME(ErrorCode::kUnavailable, wire::ErrorCode_Unavailable);
BR_SAME(ErrorCode::kFailedPrecondition, wire::ErrorCode_FailedPrecondition);
BR_SAME(ErrorCode::kNoSpace, wire::ErrorCode_NoSpace);
BR_SAME(ErrorCode::kProtocol, wire::ErrorCode_Protocol);
BR_SAME(ErrorCode::kProtocol, wire::ErrorCode_MAX);

#undef BR_SAME

flatbuffers::Offset<wire::SamplingParams> SamplingToWire(flatbuffers::FlatBufferBuilder& fbb,
                                                         const SamplingParams& p) {
  return wire::CreateSamplingParams(fbb, p.temperature, p.top_k, p.top_p, p.min_p);
}

flatbuffers::Offset<wire::Fingerprint> FingerprintToWire(flatbuffers::FlatBufferBuilder& fbb,
                                                         const NumericsFingerprint& f) {
  return wire::CreateFingerprint(fbb, f.weights_hash, f.kernel_version, f.attention_chunk,
                                 fbb.CreateString(f.backend));
}

NumericsFingerprint FingerprintFromWire(const wire::Fingerprint* f) {
  return translate_internal::FingerprintFrom(f);
}

flatbuffers::Offset<wire::Cost> CostToWire(flatbuffers::FlatBufferBuilder& fbb, const Cost& c) {
  return wire::CreateCost(fbb, c.prefill_computed, c.prefill_cached, c.decode_tokens,
                          c.engine_seconds, c.queue_seconds, c.sandbox_seconds,
                          c.sandbox_cpu_seconds, c.wal_bytes, c.price_usd);
}

Cost CostFromWire(const wire::Cost* c) {
  Cost r;
  if (c == nullptr) return r;
  r.prefill_computed = c->prefill_computed();
  r.prefill_cached = c->prefill_cached();
  r.decode_tokens = c->decode_tokens();
  r.engine_seconds = c->engine_seconds();
  r.queue_seconds = c->queue_seconds();
  r.sandbox_seconds = c->sandbox_seconds();
  r.sandbox_cpu_seconds = c->sandbox_cpu_seconds();
  r.wal_bytes = c->wal_bytes();
  r.price_usd = c->price_usd();
  return r;
}

flatbuffers::Offset<wire::Routing> RoutingToWire(flatbuffers::FlatBufferBuilder& fbb,
                                                 const RoutingRecord& r) {
  return translate_internal::RoutingTo(fbb, r, wire::CreateRouting);
}

Result<RoutingRecord> RoutingFromWire(const wire::Routing* r) {
  return translate_internal::RoutingFrom(r);
}

wire::FinishReason FinishToWire(FinishReason r) {
  return static_cast<wire::FinishReason>(r);
}

FinishReason FinishFromWire(wire::FinishReason r) {
  return static_cast<FinishReason>(r);
}

wire::ToolTier TierToWire(ToolTier t) {
  return static_cast<wire::ToolTier>(t);
}

ToolTier TierFromWire(wire::ToolTier t) {
  return static_cast<ToolTier>(t);
}

wire::ErrorCode ErrorCodeToWire(ErrorCode code) {
  return static_cast<wire::ErrorCode>(code);
}

ErrorCode ErrorCodeFromWire(wire::ErrorCode code) {
  if (code > wire::ErrorCode_MAX) return ErrorCode::kInternal;
  return static_cast<ErrorCode>(code);
}

Status StatusFromWire(const wire::Error* e) {
  if (e == nullptr || e->code() == wire::ErrorCode_Ok) return Status::Ok();
  return Status(ErrorCodeFromWire(e->code()), e->message() ? e->message()->str() : std::string());
}

flatbuffers::Offset<wire::Error> ErrorToWire(flatbuffers::FlatBufferBuilder& fbb, const Status& s,
                                             uint64_t group_id) {
  return wire::CreateError(fbb, ErrorCodeToWire(s.code()), fbb.CreateString(s.message()), group_id);
}

}  // namespace bitroll
