// The audit record and the audit's pure helpers (rollout/trajectory_record.h, rollout/audit.h):
// JSON round trip keeps every bit (NaN payloads and -0 included), a record lacking any required
// field is refused with "missing FIELD" and never throws, ULP distances, the exit status rule.
#include <gtest/gtest.h>

#include <bit>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "engine/make_model_hf.h"
#include "rollout/audit.h"
#include "rollout/trajectory_record.h"

namespace bitroll::rollout {
namespace {

TrajectoryRecord Sample() {
  TrajectoryRecord r;
  r.bitroll_version = BitrollVersion();
  r.source = "generate";
  r.group_id = 0xfedcba9876543210ull;
  r.prompt_index = 2;
  r.sample_index = 5;
  r.prompt_ids = {1, 403, 407};
  r.ids = {10, 11, 12, 13, 14};
  r.mask = {1, 1, 0, 0, 1};
  r.logprob_bits = {0xbf800000u, 0x80000000u, 0, 0, 0x7fc00001u};  // -1, -0, NaN with payload
  r.turn_begins = {0, 2};
  RecordToolCall c;
  c.token_index = 2;
  c.name = "echo";
  c.input = "hi";
  c.has_result = true;
  c.stdout_data = "hi\n";
  r.tool_calls.push_back(c);
  r.sampling.temperature = 0.7f;
  r.sampling.top_k = 40;
  r.sampling.top_p = 0.95f;
  r.sampling.min_p = 0.05f;
  r.sampling.seed = std::numeric_limits<uint64_t>::max();
  r.max_tokens = 64;
  r.stop_ids = {7};
  r.weight_versions = {{0, 3}};
  r.fingerprint.weights_hash = 0xc2378c25745e78b5ull;
  r.fingerprint.kernel_version = 1;
  r.fingerprint.attention_chunk = 16;
  r.fingerprint.backend = "cpu";
  r.finish = "length";
  return r;
}

TEST(AuditRecordTest, JsonRoundTripKeepsEveryBit) {
  const TrajectoryRecord a = Sample();
  const std::string text = RecordToJson(a).dump();
  Result<TrajectoryRecord> b = RecordFromJson(nlohmann::json::parse(text));
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_EQ(b->logprob_bits.size(), a.logprob_bits.size());
  EXPECT_EQ(0, std::memcmp(b->logprob_bits.data(), a.logprob_bits.data(),
                           a.logprob_bits.size() * sizeof(uint32_t)));
  EXPECT_EQ(b->ids, a.ids);
  EXPECT_EQ(b->mask, a.mask);
  EXPECT_EQ(b->sampling.seed, a.sampling.seed);
  EXPECT_EQ(b->group_id, a.group_id);
  EXPECT_EQ(b->fingerprint.weights_hash, a.fingerprint.weights_hash);
  EXPECT_EQ(FloatBits(b->sampling.temperature), FloatBits(a.sampling.temperature));
  EXPECT_EQ(FloatBits(b->sampling.top_p), FloatBits(a.sampling.top_p));
  EXPECT_EQ(FloatBits(b->sampling.min_p), FloatBits(a.sampling.min_p));
  EXPECT_EQ(b->turn_begins, a.turn_begins);
  ASSERT_EQ(b->tool_calls.size(), 1u);
  EXPECT_EQ(b->tool_calls[0].stdout_data, "hi\n");
  // Negative control: one flipped bit in the text is one flipped bit in the record.
  nlohmann::json j = RecordToJson(a);
  j["logprob_bits"][0] = "bf800001";
  Result<TrajectoryRecord> c = RecordFromJson(j);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(0, std::memcmp(c->logprob_bits.data(), a.logprob_bits.data(),
                           a.logprob_bits.size() * sizeof(uint32_t)));
}

// The routing record of a MoE trajectory travels in the audit record bit for bit; a malformed one
// is a typed error; a record without one reads back without one.
TEST(AuditRecordTest, RoutingRecordRoundTripsAndIsChecked) {
  TrajectoryRecord a = Sample();
  EXPECT_FALSE(RecordToJson(a).contains("routing"));
  a.routing.n_layers = 2;
  a.routing.k = 2;
  a.routing.n_experts = 300;
  for (int i = 0; i < 8; ++i) {
    a.routing.expert_ids.push_back(static_cast<uint16_t>(i * 37 % 300));
    a.routing.weights.push_back(std::bit_cast<float>(0x3F3504F3u + uint32_t(i)));
  }
  const nlohmann::json j = RecordToJson(a);
  EXPECT_EQ(j["routing"]["shape"], nlohmann::json::array({2, 2, 2}));
  Result<TrajectoryRecord> b = RecordFromJson(nlohmann::json::parse(j.dump()));
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->routing.expert_ids, a.routing.expert_ids);
  EXPECT_EQ(0, std::memcmp(b->routing.weights.data(), a.routing.weights.data(), 8 * 4));
  EXPECT_EQ(b->routing.n_experts, 300);
  for (const char* bad : {"id", "short", "shape"}) {
    nlohmann::json k = j;
    if (std::string(bad) == "id") k["routing"]["expert_ids"][0] = 300;
    if (std::string(bad) == "short") k["routing"]["weight_bits"].erase(0);
    if (std::string(bad) == "shape") k["routing"]["shape"] = {3, 2, 2};
    Result<TrajectoryRecord> r = RecordFromJson(k);
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument) << bad;
  }
}

// Re-scoring a MoE trajectory re-derives its routing record: an untouched record is identical,
// one flipped weight bit or one changed expert id is a divergence naming the position.
TEST(AuditRecordTest, RescoringChecksTheRoutingRecord) {
  const std::string dir = ::testing::TempDir() + "/audit_moe_" + std::to_string(::getpid());
  auto shape = engine::NamedHfShape("qwen3-moe-tiny");
  ASSERT_TRUE(shape.ok());
  ASSERT_TRUE(engine::WriteRandomHfModel(*shape, 7, dir).ok());
  engine::EngineOptions eo;
  eo.model_path = dir;
  eo.kv_cache_bytes = 16 << 20;
  auto e = engine::OpenEngine(eo);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  engine::SequenceRequest q;
  q.id = 1;
  q.prompt = {1, 40, 41, 42, 43};
  q.sample_index = 3;
  q.sampling.temperature = 1.0f;
  q.sampling.seed = 99;
  q.stop.max_tokens = 24;
  q.stop.stop_at_eos = false;
  q.return_routing = true;
  ASSERT_TRUE((*e)->Add(q).ok());
  engine::SequenceOutput out;
  while ((*e)->HasWork()) {
    auto st = (*e)->Step();
    ASSERT_TRUE(st.ok());
    for (auto& f : st->finished) out = f;
  }
  ASSERT_EQ(out.tokens.size(), 24u);
  ASSERT_FALSE(out.routing.empty());
  TrajectoryRecord r = Sample();
  r.prompt_ids = q.prompt;
  r.ids = out.tokens;
  r.mask.assign(r.ids.size(), 1);
  r.logprob_bits.clear();
  for (float lp : out.logprobs) r.logprob_bits.push_back(std::bit_cast<uint32_t>(lp));
  r.turn_begins = {0};
  r.tool_calls.clear();
  r.sampling = q.sampling;
  r.sample_index = q.sample_index;
  r.max_tokens = 24;
  r.stop_ids.clear();
  r.weight_versions = {{0, 0}};
  r.fingerprint = (*e)->info().fingerprint;
  r.routing = out.routing;
  auto audit = [&](const TrajectoryRecord& rec) {
    Result<std::vector<AuditVerdict>> v =
        AuditRecords(**e, {AuditItem{rec, Status::Ok()}}, {}, nullptr);
    EXPECT_TRUE(v.ok()) << v.status().ToString();
    return v.ok() ? (*v)[0] : AuditVerdict{};
  };
  const AuditVerdict ok = audit(r);
  EXPECT_EQ(ok.kind, VerdictKind::kIdentical) << ok.detail;
  TrajectoryRecord bad = r;
  const size_t at = bad.routing.weights.size() - 3;  // a generated position, the last layer
  bad.routing.weights[at] =
      std::bit_cast<float>(std::bit_cast<uint32_t>(bad.routing.weights[at]) ^ 1u);
  const AuditVerdict flipped = audit(bad);
  EXPECT_EQ(flipped.kind, VerdictKind::kDiverged);
  EXPECT_NE(flipped.detail.find("routing differs at position"), std::string::npos)
      << flipped.detail;
  TrajectoryRecord other = r;
  other.routing.expert_ids[0] = static_cast<uint16_t>((other.routing.expert_ids[0] + 1) % 8);
  EXPECT_EQ(audit(other).kind, VerdictKind::kDiverged);
  std::filesystem::remove_all(dir);
}

TEST(AuditRecordTest, MissingFieldsAreNamedNeverThrown) {
  for (const char* field : {"record_version", "sample_index", "prompt_ids", "ids", "mask",
                            "logprob_bits", "sampling", "seed", "weight_versions", "fingerprint"}) {
    nlohmann::json j = RecordToJson(Sample());
    j.erase(field);
    Result<TrajectoryRecord> r = RecordFromJson(j);
    ASSERT_FALSE(r.ok()) << field;
    EXPECT_EQ(r.status().message(), std::string("missing ") + field);
  }
  nlohmann::json j = RecordToJson(Sample());
  j["sampling"].erase("top_p");
  EXPECT_EQ(RecordFromJson(j).status().message(), "missing sampling.top_p");
  j = RecordToJson(Sample());
  j["mask"].push_back(1);
  EXPECT_FALSE(RecordFromJson(j).ok());  // lengths differ
  j = RecordToJson(Sample());
  j["logprob_bits"][1] = -3;
  EXPECT_FALSE(RecordFromJson(j).ok());
  j = RecordToJson(Sample());
  j["seed"] = "-1";
  EXPECT_FALSE(RecordFromJson(j).ok());
  j = RecordToJson(Sample());
  j["record_version"] = 2;
  EXPECT_EQ(RecordFromJson(j).status().code(), ErrorCode::kUnsupported);
  EXPECT_FALSE(RecordFromJson(nlohmann::json::array()).ok());
}

// Every field (and every field of the nested objects) replaced by a value of every other type:
// an error or a record, never an exception.
TEST(AuditRecordTest, WrongTypesNeverThrow) {
  const nlohmann::json base = RecordToJson(Sample());
  const std::vector<nlohmann::json> values = {nullptr,
                                              true,
                                              -1,
                                              4294967296ll,
                                              18446744073709551615ull,
                                              1.5,
                                              "x",
                                              "zz",
                                              nlohmann::json::array(),
                                              nlohmann::json::array({1, "a", nullptr}),
                                              nlohmann::json::object(),
                                              nlohmann::json::object({{"a", 1}})};
  int refused = 0, cases = 0;
  auto try_one = [&](const nlohmann::json& j) {
    ++cases;
    EXPECT_NO_THROW({
      Result<TrajectoryRecord> r = RecordFromJson(j);
      refused += r.ok() ? 0 : 1;
    }) << j.dump();
  };
  for (const auto& [key, _] : base.items()) {
    for (const nlohmann::json& v : values) {
      nlohmann::json j = base;
      j[key] = v;
      try_one(j);
      if (base[key].is_object()) {
        for (const auto& [sub, __] : base[key].items()) {
          nlohmann::json k = base;
          k[key][sub] = v;
          try_one(k);
        }
      }
      if (base[key].is_array() && !base[key].empty()) {
        nlohmann::json k = base;
        k[key][0] = v;
        try_one(k);
      }
    }
  }
  EXPECT_GT(refused, cases / 3);  // most replacements are refused (the test can fail)
}

TEST(AuditRecordTest, UlpDistance) {
  EXPECT_EQ(UlpDistance(0x3f800000u, 0x3f800000u), 0u);
  EXPECT_EQ(UlpDistance(0x3f800000u, 0x3f800001u), 1u);
  EXPECT_EQ(UlpDistance(0xbf800000u, 0xbf800001u), 1u);
  EXPECT_EQ(UlpDistance(0x00000000u, 0x80000000u), 0u);  // +0 and -0
  EXPECT_EQ(UlpDistance(0x00000001u, 0x80000001u), 2u);  // across zero
}

TEST(AuditRecordTest, ExitStatus) {
  std::vector<AuditVerdict> v(3);
  EXPECT_EQ(AuditExitStatus(v), 0);
  v[1].kind = VerdictKind::kIncomplete;
  EXPECT_EQ(AuditExitStatus(v), 2);
  v[2].kind = VerdictKind::kDiverged;
  EXPECT_EQ(AuditExitStatus(v), 1);
}

}  // namespace
}  // namespace bitroll::rollout
