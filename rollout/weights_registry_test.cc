// The weights registry and the audit's resolution of versions to files
// (rollout/weights_registry.h, rollout/audit_weights.h, rollout/client_audit_record.h): entries
// round-trip, a torn last line is skipped and a bad middle line refused, a version resolves to
// its file only while the file hashes as registered, multi-version records are refused naming
// every file, and a client trajectory becomes a record that parses back.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "rollout/audit_weights.h"
#include "rollout/client_audit_record.h"
#include "rollout/weights_registry.h"

namespace bitroll::rollout {
namespace {

std::string TempDir(const char* name) {
  const auto d = std::filesystem::temp_directory_path() /
                 (std::string("bitroll_") + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d.string();
}

TEST(WeightsRegistry, AppendsReadsAndFinds) {
  const std::string dir = TempDir("registry");
  ASSERT_TRUE(RecordInitialWeights(dir, "a.bin", 0xaa).ok());
  ASSERT_TRUE(RecordInitialWeights(dir, "a.bin", 0xaa).ok());  // the same: not appended again
  ASSERT_TRUE(RecordWeightsVersion(dir, 1, "path", "/m/b.bin", 0xbb).ok());
  ASSERT_TRUE(RecordWeightsVersion(dir, 2, "tensors", "", 0xcc).ok());
  ASSERT_TRUE(RecordInitialWeights(dir, "other.bin", 0xdd).ok());  // a restart, another model
  Result<std::vector<WeightsEntry>> r = ReadWeightsRegistry(WeightsRegistryPath(dir));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 4u);
  EXPECT_EQ((*r)[1].path, "/m/b.bin");
  EXPECT_TRUE(std::filesystem::path((*r)[0].path).is_absolute());
  EXPECT_EQ(FindWeightsVersion(*r, 0)->weights_hash, 0xddu);        // the last
  EXPECT_EQ(FindWeightsVersion(*r, 0, 0xaa)->weights_hash, 0xaau);  // the one asked for
  EXPECT_EQ(FindWeightsVersion(*r, 2)->source, "tensors");
  EXPECT_FALSE(FindWeightsVersion(*r, 3).has_value());
  EXPECT_EQ(RegisteredWeightsHash(dir, 1), 0xbbu);
  EXPECT_EQ(RegisteredWeightsHash(dir, 7), 0u);
  {  // a torn last line (a crash mid-append): skipped
    std::ofstream f(WeightsRegistryPath(dir), std::ios::app);
    f << "{\"version\": 3, \"weights_ha";
  }
  r = ReadWeightsRegistry(WeightsRegistryPath(dir));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->size(), 4u);
  {  // ... but not in the middle
    std::ofstream f(WeightsRegistryPath(dir), std::ios::app);
    f << "\n{\"version\": 4, \"weights_hash\": \"00000000000000ee\"}\n";
  }
  r = ReadWeightsRegistry(WeightsRegistryPath(dir));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kCorruption);
  EXPECT_NE(r.status().message().find("line 5"), std::string::npos) << r.status().message();
  EXPECT_EQ(ReadWeightsRegistry(dir + "/none.jsonl").status().code(), ErrorCode::kNotFound);
  std::filesystem::remove_all(dir);
}

AuditItem Item(std::vector<RecordVersionSpan> spans, uint64_t hash) {
  AuditItem it;
  it.record.weight_versions = std::move(spans);
  it.record.fingerprint.weights_hash = hash;
  return it;
}

TEST(AuditWeights, ResolvesVersionsToFilesThatStillHashAsRegistered) {
  std::vector<WeightsEntry> reg = {{0, "initial", "/m/a.bin", 0xaa, 0},
                                   {1, "path", "/m/b.bin", 0xbb, 0},
                                   {2, "tensors", "", 0xcc, 0}};
  std::map<std::string, uint64_t> files = {
      {"/m/a.bin", 0xaa}, {"/m/b.bin", 0xbb}, {"/m/c.bin", 0xcc}};
  int calls = 0;
  WeightsHasher hasher = [&](const std::string& p) -> Result<uint64_t> {
    ++calls;
    auto it = files.find(p);
    if (it == files.end()) return Status::NotFound(p + " does not exist");
    return it->second;
  };
  std::vector<AuditItem> items = {Item({{0, 0}}, 0xaa), Item({{0, 1}}, 0xbb),
                                  Item({{0, 0}, {5, 1}}, 0xaa), Item({{0, 2}}, 0xcc),
                                  Item({{0, 9}}, 0x99)};
  WeightsPlan p = PlanAuditWeights(items, &reg, "", hasher);
  ASSERT_EQ(p.files.size(), 2u);
  EXPECT_EQ(p.files[p.file_of_item[0]], "/m/a.bin");
  EXPECT_EQ(p.files[p.file_of_item[1]], "/m/b.bin");
  ASSERT_TRUE(p.verdicts[2].has_value());
  EXPECT_EQ(p.verdicts[2]->kind, VerdictKind::kWeightsUnavailable);
  EXPECT_NE(p.verdicts[2]->detail.find("multi-version record needs from token 0 version 0 = "
                                       "/m/a.bin (available); from token 5 version 1 = /m/b.bin"),
            std::string::npos)
      << p.verdicts[2]->detail;
  EXPECT_NE(p.verdicts[3]->detail.find("version 2 came as tensors (hash 00000000000000cc): no "
                                       "file holds it"),
            std::string::npos)
      << p.verdicts[3]->detail;
  EXPECT_NE(p.verdicts[4]->detail.find("version 9 is not in the weights registry"),
            std::string::npos);
  EXPECT_EQ(calls, 2);  // once per file
  // --model holding the streamed version's weights audits it.
  p = PlanAuditWeights(items, &reg, "/m/c.bin", hasher);
  EXPECT_EQ(p.files[p.file_of_item[3]], "/m/c.bin");
  // A file replaced or removed: refused, naming the version, the file and both hashes.
  files["/m/b.bin"] = 0xb0;
  files.erase("/m/a.bin");
  p = PlanAuditWeights(items, &reg, "", hasher);
  ASSERT_TRUE(p.verdicts[1].has_value());
  EXPECT_EQ(p.verdicts[1]->detail,
            "weights unavailable: version 1 was /m/b.bin (hash 00000000000000bb), file now "
            "hashes 00000000000000b0");
  ASSERT_TRUE(p.verdicts[0].has_value());
  EXPECT_NE(p.verdicts[0]->detail.find("version 0 was /m/a.bin (hash 00000000000000aa), file "
                                       "now cannot be read"),
            std::string::npos)
      << p.verdicts[0]->detail;
  // Without a registry every record goes to --model (AuditRecords checks its hash).
  p = PlanAuditWeights(items, nullptr, "/m/x.bin", hasher);
  for (int f : p.file_of_item) EXPECT_EQ(f, 0);
}

TEST(ClientAuditRecord, AReceivedTrajectoryParsesBack) {
  SubmitRequest q;
  q.prompts = {{1, 2, 3}, {1, 4}};
  q.temperature = 0.7f;
  q.top_p = 0.9f;
  q.seed = 0xffffffffffffff01ull;
  q.max_tokens = 9;
  q.tools.push_back({});
  TrajectoryResult t;
  t.group_id = 3;
  t.prompt_index = 1;
  t.sample_index = 2;
  t.ids = {5, 6, 7, 8};
  t.logprobs = {-0.5f, 0.0f, 0.0f, -1.25f};
  t.mask = {1, 0, 0, 1};
  t.versions = {{0, 4}};
  t.fingerprint = {0xabc, 3, 64, "cpu"};
  t.finish = FinishReason::kLength;
  ToolCallResult c;
  c.name = "echo";
  c.exit_status = 0;
  c.output = "x";
  c.token_index = 1;
  t.tool_calls.push_back(c);
  const TrajectoryRecord r = ClientAuditRecord(t, q);
  EXPECT_EQ(r.prompt_ids, (std::vector<int32_t>{1, 4}));
  EXPECT_EQ(r.turn_begins, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(r.tool_result_template, "\n<result>{output}</result>\n");
  Result<TrajectoryRecord> back = RecordFromJson(RecordToJson(r));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->sampling.seed, q.seed);
  EXPECT_EQ(back->logprob_bits, (std::vector<uint32_t>{FloatBits(-0.5f), 0, 0, FloatBits(-1.25f)}));
  EXPECT_EQ(back->weight_versions[0].version, 4u);
  EXPECT_EQ(back->fingerprint.kernel_version, 3u);
  EXPECT_EQ(back->fingerprint.attention_chunk, 64u);
  EXPECT_EQ(back->finish, "length");
  // A call that exited non-zero quotes stderr, which the wire does not carry: no template.
  t.tool_calls[0].exit_status = 1;
  EXPECT_TRUE(ClientAuditRecord(t, q).tool_result_template.empty());
}

}  // namespace
}  // namespace bitroll::rollout
