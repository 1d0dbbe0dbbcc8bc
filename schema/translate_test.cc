// Round trips of every translated type (schema/wire_translate.h, schema/wal_translate.h):
// C++ value -> FlatBuffers table (a finished, verified buffer) -> C++ value, compared field by
// field, floats by their bits. The values are chosen so that no field is at its default (a
// dropped field would read back as the default and be missed).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "schema/wal_translate.h"
#include "schema/wire_translate.h"

namespace bitroll {
namespace {

uint32_t Bits(float f) {
  return std::bit_cast<uint32_t>(f);
}
uint64_t Bits(double d) {
  return std::bit_cast<uint64_t>(d);
}
float FloatOf(uint32_t b) {
  return std::bit_cast<float>(b);
}

void ExpectSame(const SamplingParams& a, const SamplingParams& b) {
  EXPECT_EQ(Bits(a.temperature), Bits(b.temperature));
  EXPECT_EQ(a.top_k, b.top_k);
  EXPECT_EQ(Bits(a.top_p), Bits(b.top_p));
  EXPECT_EQ(Bits(a.min_p), Bits(b.min_p));
  EXPECT_EQ(a.seed, b.seed);
}

void ExpectSame(const NumericsFingerprint& a, const NumericsFingerprint& b) {
  EXPECT_EQ(a.weights_hash, b.weights_hash);
  EXPECT_EQ(a.kernel_version, b.kernel_version);
  EXPECT_EQ(a.attention_chunk, b.attention_chunk);
  EXPECT_EQ(a.backend, b.backend);
}

void ExpectSame(const Cost& a, const Cost& b) {
  EXPECT_EQ(a.prefill_computed, b.prefill_computed);
  EXPECT_EQ(a.prefill_cached, b.prefill_cached);
  EXPECT_EQ(a.decode_tokens, b.decode_tokens);
  EXPECT_EQ(Bits(a.engine_seconds), Bits(b.engine_seconds));
  EXPECT_EQ(Bits(a.queue_seconds), Bits(b.queue_seconds));
  EXPECT_EQ(Bits(a.sandbox_seconds), Bits(b.sandbox_seconds));
  EXPECT_EQ(Bits(a.sandbox_cpu_seconds), Bits(b.sandbox_cpu_seconds));
  EXPECT_EQ(a.wal_bytes, b.wal_bytes);
  EXPECT_EQ(Bits(a.price_usd), Bits(b.price_usd));
}

// Finishes `root` in fbb, verifies the buffer as a T and returns its root.
template <typename T>
const T* Reread(flatbuffers::FlatBufferBuilder& fbb, flatbuffers::Offset<T> root) {
  fbb.Finish(root);
  flatbuffers::Verifier v(fbb.GetBufferPointer(), fbb.GetSize());
  EXPECT_TRUE(v.VerifyBuffer<T>(nullptr));
  return flatbuffers::GetRoot<T>(fbb.GetBufferPointer());
}

std::vector<SamplingParams> SamplingCases() {
  SamplingParams odd;
  odd.temperature = FloatOf(0x3F3504F3u);  // an fp32 with every mantissa bit in play
  odd.top_k = std::numeric_limits<int32_t>::max();
  odd.top_p = FloatOf(0x3F7FFFFFu);  // the largest float below 1
  odd.min_p = FloatOf(0x00000001u);  // the smallest denormal
  odd.seed = std::numeric_limits<uint64_t>::max();
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.seed = 1;
  return {odd, greedy, SamplingParams{}};
}

TEST(WireTranslate, SamplingParamsRoundTripThroughSubmitRolloutsAndReplicaWork) {
  for (const SamplingParams& p : SamplingCases()) {
    flatbuffers::FlatBufferBuilder fbb;
    auto sp = SamplingToWire(fbb, p);
    auto sub = wire::CreateSubmitRollouts(fbb, 7, 0, 1, sp, p.seed);
    fbb.Finish(wire::CreateEnvelope(fbb, 1, 0, wire::Message_SubmitRollouts, sub.Union()));
    const auto* m = wire::GetEnvelope(fbb.GetBufferPointer())->msg_as_SubmitRollouts();
    ExpectSame(SamplingFromWire(*m), p);
    // A replica reads them from the same bytes nested in a ReplicaWork (never re-encoded).
    flatbuffers::FlatBufferBuilder outer;
    outer.ForceVectorAlignment(fbb.GetSize(), 1, 8);
    auto bytes = outer.CreateVector(fbb.GetBufferPointer(), fbb.GetSize());
    std::vector<flatbuffers::Offset<wire::GroupRequest>> reqs{
        wire::CreateGroupRequest(outer, bytes)};
    const auto* work = Reread(outer, wire::CreateReplicaWork(outer, 0, outer.CreateVector(reqs)));
    const auto* nested = work->requests()->Get(0)->envelope_nested_root()->msg_as_SubmitRollouts();
    ASSERT_NE(nested, nullptr);
    ExpectSame(SamplingFromWire(*nested), p);
  }
  // No SamplingParams table: the schema's defaults, with the message's seed.
  flatbuffers::FlatBufferBuilder fbb;
  const auto* m = Reread(fbb, wire::CreateSubmitRollouts(fbb, 7, 0, 1, 0, 99));
  SamplingParams want;
  want.seed = 99;
  ExpectSame(SamplingFromWire(*m), want);
}

TEST(WireTranslate, FingerprintRoundTrip) {
  const NumericsFingerprint f{0xFEEDFACECAFEBEEFull, 0xFFFFFFFFu, 64, std::string("cu\0da", 5)};
  flatbuffers::FlatBufferBuilder fbb;
  ExpectSame(FingerprintFromWire(Reread(fbb, FingerprintToWire(fbb, f))), f);
  ExpectSame(FingerprintFromWire(nullptr), NumericsFingerprint{});
}

TEST(WireTranslate, CostRoundTrip) {
  Cost c;
  c.prefill_computed = std::numeric_limits<int64_t>::max();
  c.prefill_cached = -3;
  c.decode_tokens = 12345;
  c.engine_seconds = 0.1;
  c.queue_seconds = std::nextafter(1.0, 2.0);
  c.sandbox_seconds = 5e-324;  // the smallest denormal
  c.sandbox_cpu_seconds = 2.5;
  c.wal_bytes = 1ll << 40;
  c.price_usd = 1.0 / 3.0;
  flatbuffers::FlatBufferBuilder fbb;
  ExpectSame(CostFromWire(Reread(fbb, CostToWire(fbb, c))), c);
  ExpectSame(CostFromWire(nullptr), Cost{});
  // A property of the wire, not of the translator: FlatBuffers leaves out a scalar equal to its
  // default, and -0.0 == 0.0, so a -0.0 cost reads back as +0.0 (costs are never negative).
  Cost neg;
  neg.engine_seconds = -0.0;
  flatbuffers::FlatBufferBuilder fbb2;
  EXPECT_EQ(Bits(CostFromWire(Reread(fbb2, CostToWire(fbb2, neg))).engine_seconds), Bits(0.0));
}

TEST(WireTranslate, EnumsRoundTripEveryValue) {
  for (int i = 0; i <= static_cast<int>(FinishReason::kToolCall); ++i) {
    const auto r = static_cast<FinishReason>(i);
    EXPECT_EQ(static_cast<int>(FinishToWire(r)), i);
    EXPECT_EQ(FinishFromWire(FinishToWire(r)), r);
    // Through a table, as a Trajectory carries it.
    flatbuffers::FlatBufferBuilder fbb;
    wire::TrajectoryBuilder b(fbb);
    b.add_finish(FinishToWire(r));
    const auto* t = Reread(fbb, b.Finish());
    EXPECT_EQ(FinishFromWire(t->finish()), r);
  }
  for (int i = 0; i <= static_cast<int>(ToolTier::kVm); ++i) {
    const auto t = static_cast<ToolTier>(i);
    EXPECT_EQ(static_cast<int>(TierToWire(t)), i);
    EXPECT_EQ(TierFromWire(TierToWire(t)), t);
  }
  for (int i = 0; i <= static_cast<int>(ErrorCode::kProtocol); ++i) {
    const auto c = static_cast<ErrorCode>(i);
    EXPECT_EQ(ErrorCodeFromWire(ErrorCodeToWire(c)), c);
  }
  EXPECT_EQ(ErrorCodeFromWire(static_cast<wire::ErrorCode>(999)), ErrorCode::kInternal);
}

TEST(WireTranslate, StatusRoundTrip) {
  flatbuffers::FlatBufferBuilder fbb;
  const Status s = Status::Timeout("tool ran 10 s");
  const auto* e = Reread(fbb, ErrorToWire(fbb, s, 42));
  EXPECT_EQ(e->group_id(), 42u);
  const Status back = StatusFromWire(e);
  EXPECT_EQ(back.code(), s.code());
  EXPECT_EQ(back.message(), s.message());
  EXPECT_TRUE(StatusFromWire(nullptr).ok());
}

TEST(WalTranslate, SamplingParamsRoundTripThroughHeader) {
  for (const SamplingParams& p : SamplingCases()) {
    flatbuffers::FlatBufferBuilder fbb;
    const wal::fb::SamplingParams sp = SamplingToLog(p);
    wal::fb::HeaderBuilder b(fbb);
    b.add_seed(p.seed);
    b.add_sampling(&sp);
    const auto* h = Reread(fbb, b.Finish());
    ExpectSame(SamplingFromLog(*h), p);
  }
  flatbuffers::FlatBufferBuilder fbb;
  wal::fb::HeaderBuilder b(fbb);
  b.add_seed(5);
  const auto* h = Reread(fbb, b.Finish());
  SamplingParams want;
  want.seed = 5;
  ExpectSame(SamplingFromLog(*h), want);
}

TEST(WalTranslate, FingerprintRoundTrip) {
  const NumericsFingerprint f{1, 2, 3, "cpu-bf16"};
  flatbuffers::FlatBufferBuilder fbb;
  ExpectSame(FingerprintFromLog(Reread(fbb, FingerprintToLog(fbb, f))), f);
  ExpectSame(FingerprintFromLog(nullptr), NumericsFingerprint{});
}

TEST(WalTranslate, EnumsRoundTripEveryValueThroughTheirRecords) {
  for (int i = 0; i <= static_cast<int>(FinishReason::kToolCall); ++i) {
    const auto r = static_cast<FinishReason>(i);
    flatbuffers::FlatBufferBuilder fbb;
    const auto* f = Reread(fbb, wal::fb::CreateFinished(fbb, FinishToLog(r)));
    EXPECT_EQ(f->reason(), i);
    EXPECT_EQ(FinishFromLog(f->reason()), r);
  }
  for (int i = 0; i <= static_cast<int>(ToolTier::kVm); ++i) {
    const auto t = static_cast<ToolTier>(i);
    flatbuffers::FlatBufferBuilder fbb;
    const auto* c = Reread(fbb, wal::fb::CreateToolCall(fbb, 0, 0, 0, TierToLog(t)));
    EXPECT_EQ(c->tier(), i);
    EXPECT_EQ(TierFromLog(c->tier()), t);
  }
}

// A routing record with every weight bit pattern class in play: 3 positions x 2 layers x top-2.
RoutingRecord RoutingCase(int32_t n_experts) {
  RoutingRecord r;
  r.n_layers = 2;
  r.k = 2;
  r.n_experts = n_experts;
  for (int i = 0; i < 12; ++i) {
    r.expert_ids.push_back(static_cast<uint16_t>((i * 37 + 5) % n_experts));
    r.weights.push_back(FloatOf(0x3F3504F3u + uint32_t(i)));
  }
  r.weights[3] = FloatOf(0x00000001u);  // a denormal survives
  return r;
}

void ExpectSame(const RoutingRecord& a, const RoutingRecord& b) {
  EXPECT_EQ(a.n_layers, b.n_layers);
  EXPECT_EQ(a.k, b.k);
  EXPECT_EQ(a.n_experts, b.n_experts);
  EXPECT_EQ(a.expert_ids, b.expert_ids);
  ASSERT_EQ(a.weights.size(), b.weights.size());
  EXPECT_EQ(std::memcmp(a.weights.data(), b.weights.data(), a.weights.size() * 4), 0);
}

// Ids travel in one byte up to 256 experts and in two above; wire and log read back every bit,
// and a record whose lengths or ids are inconsistent is kCorruption, not a silent misread.
TEST(RoutingTranslate, RoundTripsInTheSmallestIdTypeOnWireAndLog) {
  for (int32_t experts : {8, 256, 257, 65535}) {
    const RoutingRecord r = RoutingCase(experts);
    flatbuffers::FlatBufferBuilder fbb;
    const wire::Routing* w = Reread(fbb, RoutingToWire(fbb, r));
    EXPECT_EQ(w->ids_u8() != nullptr, experts <= 256) << experts;
    EXPECT_EQ(w->ids_u16() != nullptr, experts > 256) << experts;
    Result<RoutingRecord> back = RoutingFromWire(w);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    ExpectSame(*back, r);
    EXPECT_EQ(back->positions(), 3);
    flatbuffers::FlatBufferBuilder lb;
    Result<RoutingRecord> logged = RoutingFromLog(Reread(lb, RoutingToLog(lb, r)));
    ASSERT_TRUE(logged.ok()) << logged.status().ToString();
    ExpectSame(*logged, r);
  }
  EXPECT_TRUE(RoutingFromWire(nullptr)->empty());
  // One byte per id up to 256 experts: 12 ids + 48 weight bytes in the vectors.
  EXPECT_EQ(RoutingIdBytes(256), 1);
  EXPECT_EQ(RoutingIdBytes(257), 2);
  // Corrupt records.
  const std::vector<uint8_t> ids = {1, 2, 3, 9};
  const std::vector<float> w4 = {0.5f, 0.5f, 0.5f, 0.5f}, w3 = {0.5f, 0.5f, 0.5f};
  struct Bad {
    const char* what;
    uint16_t layers, k;
    uint32_t experts;
    const std::vector<float>* weights;
  };
  for (const Bad& b : {Bad{"id out of range", 1, 2, 8, &w4}, Bad{"weights short", 1, 2, 16, &w3},
                       Bad{"not a multiple", 1, 3, 16, &w4}}) {
    flatbuffers::FlatBufferBuilder fbb;
    auto bad = wire::CreateRouting(fbb, b.layers, b.k, b.experts, fbb.CreateVector(ids), 0,
                                   fbb.CreateVector(*b.weights));
    Result<RoutingRecord> r = RoutingFromWire(Reread(fbb, bad));
    EXPECT_EQ(r.status().code(), ErrorCode::kCorruption) << b.what;
  }
}

// Measured bytes per position of a routing record on the wire, for Qwen3-30B-A3B's routing (48
// MoE layers, top-8 of 128 experts) and make-model's moe-100m (8 layers, top-2 of 8), against
// vLLM's int16 [tokens, layers, k] id layout (which carries no weights).
TEST(RoutingTranslate, BytesPerPositionOnTheWire) {
  struct Shape {
    const char* name;
    int32_t layers, k, experts;
  };
  for (const Shape& m : {Shape{"qwen3-30b-a3b", 48, 8, 128}, Shape{"moe-100m", 8, 2, 8},
                         Shape{"512-expert", 48, 8, 512}}) {
    RoutingRecord r;
    r.n_layers = m.layers;
    r.k = m.k;
    r.n_experts = m.experts;
    const int64_t positions = 1000, n = positions * m.layers * m.k;
    for (int64_t i = 0; i < n; ++i) {
      r.expert_ids.push_back(static_cast<uint16_t>(i % m.experts));
      r.weights.push_back(0.125f);
    }
    flatbuffers::FlatBufferBuilder fbb;
    fbb.Finish(RoutingToWire(fbb, r));
    const double per = double(fbb.GetSize()) / double(positions);
    const double ids_only = double(m.layers * m.k * RoutingIdBytes(m.experts));
    const double vllm = 2.0 * m.layers * m.k;
    std::printf(
        "routing %s: %.1f B/position on the wire (ids %.0f B + weights %d B); vLLM int16 "
        "ids: %.0f B\n",
        m.name, per, ids_only, m.layers * m.k * 4, vllm);
    EXPECT_LE(per, ids_only + 4.0 * m.layers * m.k + 1.0);  // no per-position overhead
    EXPECT_LE(ids_only, vllm);
  }
}

TEST(Vocab, NamesAndDTypes) {
  EXPECT_STREQ(FinishReasonName(FinishReason::kEos), "eos");
  EXPECT_STREQ(FinishReasonName(FinishReason::kToolCall), "tool_call");
  EXPECT_STREQ(ToolTierName(ToolTier::kContainer), "container");
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16}) {
    auto back = ParseDType(DTypeName(d));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, d);
  }
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(ParseDType("fp8").status().code(), ErrorCode::kInvalidArgument);
  Cost a, b;
  a.decode_tokens = 2;
  b.decode_tokens = 3;
  b.price_usd = 0.5;
  a.Add(b);
  EXPECT_EQ(a.decode_tokens, 5);
  EXPECT_EQ(a.price_usd, 0.5);
}

}  // namespace
}  // namespace bitroll
