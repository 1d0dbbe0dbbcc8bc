// schema/translate_common.h: internal to schema/wire_translate.cc and schema/wal_translate.cc.
// The wire's and the log's SamplingParams and fingerprint are different generated types (a table
// and a struct; two FlatBuffers namespaces) with the same accessors; each value is read from
// them by one template here.
#pragma once

#include <cstdint>
#include <string>

#include "schema/vocab.h"

namespace bitroll::translate_internal {

// `sp` is a wire::SamplingParams table or a wal::fb::SamplingParams struct; null: the defaults.
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

// `f` is a wire::Fingerprint or a wal::fb::NumericsFingerprint table; null: zeros.
template <typename Table>
NumericsFingerprint FingerprintFrom(const Table* f) {
  NumericsFingerprint r;
  if (f == nullptr) return r;
  r.weights_hash = f->weights_hash();
  r.kernel_version = f->kernel_version();
  r.attention_chunk = f->attention_chunk();
  r.backend = f->backend() ? f->backend()->str() : std::string();
  return r;
}

}  // namespace bitroll::translate_internal
