// schema/translate_common.h: internal to schema/wire_translate.cc and schema/wal_translate.cc.
// The wire's and the log's fingerprint and routing record are different generated types (two
// FlatBuffers namespaces) with the same accessors; each value is read from them by one template
// here. The sampling parameters' template is translate_internal::SamplingFrom in
// schema/wire_translate.h, beside the wire's reader that uses it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flatbuffers/flatbuffers.h"

#include "schema/vocab.h"

namespace bitroll::translate_internal {

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

// `r` is a wire::Routing or a wal::fb::Routing table; null: an empty record. Errors
// (kCorruption): ids in both or neither width for a non-empty record, lengths that disagree
// (ids, weights, a multiple of n_layers * k), an id >= n_experts.
template <typename Table>
Result<RoutingRecord> RoutingFrom(const Table* r) {
  RoutingRecord out;
  if (r == nullptr) return out;
  out.n_layers = r->n_layers();
  out.k = r->k();
  out.n_experts = static_cast<int32_t>(r->n_experts());
  const auto* u8 = r->ids_u8();
  const auto* u16 = r->ids_u16();
  const size_t n8 = u8 ? u8->size() : 0, n16 = u16 ? u16->size() : 0;
  const size_t nw = r->weights() ? r->weights()->size() : 0;
  const size_t per = static_cast<size_t>(out.n_layers) * static_cast<size_t>(out.k);
  const size_t n = n8 + n16;
  if ((n8 > 0 && n16 > 0) || n != nw || (n > 0 && (per == 0 || n % per != 0)) ||
      out.n_experts > 65535) {
    return Status::Corruption("routing record: " + std::to_string(n8) + " + " +
                              std::to_string(n16) + " ids, " + std::to_string(nw) +
                              " weights for " + std::to_string(out.n_layers) + " layers x top-" +
                              std::to_string(out.k));
  }
  out.expert_ids.resize(n);
  out.weights.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const uint16_t id =
        n8 > 0 ? u8->Get(static_cast<uint32_t>(i)) : u16->Get(static_cast<uint32_t>(i));
    if (id >= out.n_experts) {
      return Status::Corruption("routing record: expert id " + std::to_string(id) +
                                " >= " + std::to_string(out.n_experts) + " experts");
    }
    out.expert_ids[i] = id;
    out.weights[i] = r->weights()->Get(static_cast<uint32_t>(i));
  }
  return out;
}

// Builds a wire::Routing or wal::fb::Routing with `create` (wire::CreateRouting or
// wal::fb::CreateRouting): ids in one byte when n_experts <= 256, else two.
template <typename Create>
auto RoutingTo(flatbuffers::FlatBufferBuilder& fbb, const RoutingRecord& r, Create create) {
  flatbuffers::Offset<flatbuffers::Vector<uint8_t>> u8;
  flatbuffers::Offset<flatbuffers::Vector<uint16_t>> u16;
  if (RoutingIdBytes(r.n_experts) == 1) {
    std::vector<uint8_t> ids(r.expert_ids.begin(), r.expert_ids.end());
    u8 = fbb.CreateVector(ids);
  } else {
    u16 = fbb.CreateVector(r.expert_ids);
  }
  auto w = fbb.CreateVector(r.weights);
  return create(fbb, static_cast<uint16_t>(r.n_layers), static_cast<uint16_t>(r.k),
                static_cast<uint32_t>(r.n_experts), u8, u16, w);
}

}  // namespace bitroll::translate_internal
