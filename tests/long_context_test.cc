// Long contexts (issue 19): prefill equals decode at 4K tokens, for the fp32 and the bf16 KV cache.
//
// A random-weight stories260K-shape model with a 4,200-token context decodes a trajectory of
// 4,096 positions; re-scoring it with its tokens forced in steps of 1, 7, 16 and 100 tokens and in
// one whole 4,096-token prefill must reproduce every id and logprob bit (memcmp). The attention of
// the last positions walks 256 chunks, so the chunked partials and their left-to-right merge are
// exercised far beyond the 512-token suite. Negative control: the bf16 cache's trajectory differs
// from the fp32 one (rounding K/V changes bits), so the comparisons can tell caches apart.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine/invariance_checks.h"
#include "engine/make_model.h"
#include "engine/model_loader.h"
#include "tests/engine_test_util.h"

namespace bitroll {
namespace {

using engine::SequenceOutput;
using engine::SequenceRequest;
using testing_util::EngineSetup;
using testing_util::MakeEngine;

constexpr int32_t kContext = 4096;

// stories260K's shape with a 4,200-token context, written once per process.
std::shared_ptr<const engine::ModelWeights> LongModel() {
  static std::shared_ptr<const engine::ModelWeights> w = [] {
    std::shared_ptr<const engine::ModelWeights> none;
    auto shape = engine::NamedShape("stories260k");
    if (!shape.ok()) return none;
    shape->max_seq_len = 4200;
    // One directory per process: ctest runs this binary's tests as concurrent processes, and a
    // file rewritten under another process's mapping is a SIGBUS there.
    const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) /
                                      ("bitroll_long_context_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const std::string model = (dir / "model.bin").string();
    if (!engine::WriteRandomModel(*shape, 7, model, (dir / "tokenizer.bin").string()).ok()) {
      return none;
    }
    auto lw = engine::LoadModelWeights(model);
    std::filesystem::remove_all(dir);  // the mapping outlives the name
    if (!lw.ok()) return none;
    return std::make_shared<const engine::ModelWeights>(std::move(lw).value());
  }();
  return w;
}

EngineSetup LongSetup(const std::string& kv_dtype) {
  EngineSetup s;
  s.threads = 2;
  s.max_step_tokens = kContext;
  s.max_prefill_chunk = kContext;  // the 4,096 budget is one whole prefill
  s.kv_dtype = kv_dtype;
  return s;
}

engine::EngineFactory Factory(const EngineSetup& base) {
  return [base](const engine::EngineVariant& v) -> Result<std::unique_ptr<engine::Engine>> {
    EngineSetup s = base;
    if (v.max_step_tokens > 0) s.max_step_tokens = v.max_step_tokens;
    if (v.max_prefill_chunk > 0) s.max_prefill_chunk = v.max_prefill_chunk;
    std::unique_ptr<engine::Engine> e = MakeEngine(s, LongModel());
    if (e == nullptr) return Status::Internal("no engine");
    return e;
  };
}

// 16 prompt tokens, then greedy decoding up to position 4,095.
SequenceRequest LongRequest() {
  SequenceRequest r;
  r.id = 1;
  r.prompt.push_back(1);
  for (int32_t k = 1; k < 16; ++k) r.prompt.push_back(3 + (k * 37) % 500);
  r.sampling = testing_util::Sampled();
  r.sample_index = 2;
  r.stop.max_tokens = kContext - 16;
  r.stop.stop_at_eos = r.stop.stop_at_bos = false;
  return r;
}

SequenceOutput Decode(const EngineSetup& s) {
  auto e = MakeEngine(s, LongModel());
  if (e == nullptr) return {};
  return testing_util::RunAll(*e, {LongRequest()})[1];
}

void ExpectPrefillEqualsDecodeAt4K(const std::string& kv) {
  ASSERT_NE(LongModel(), nullptr);
  const EngineSetup s = LongSetup(kv);
  const SequenceOutput decoded = Decode(s);
  ASSERT_EQ(decoded.tokens.size(), static_cast<size_t>(kContext - 16));
  Result<engine::Mismatches> found = engine::CheckPrefillEqualsDecode(
      Factory(s), LongRequest(), decoded, {1, 7, 16, 100, kContext});
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  for (const auto& m : *found) ADD_FAILURE() << m.ToString();
}

TEST(LongContext, PrefillEqualsDecodeAt4KFp32Kv) {
  ExpectPrefillEqualsDecodeAt4K("f32");
}

TEST(LongContext, PrefillEqualsDecodeAt4KBf16Kv) {
  ExpectPrefillEqualsDecodeAt4K("bf16");
}

TEST(LongContextNegativeControl, Bf16KvChangesTheTrajectory) {
  ASSERT_NE(LongModel(), nullptr);
  EngineSetup f32 = LongSetup("f32"), bf16 = LongSetup("bf16");
  SequenceRequest r = LongRequest();
  r.stop.max_tokens = 600;
  auto a = MakeEngine(f32, LongModel());
  auto b = MakeEngine(bf16, LongModel());
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_NE(a->info().fingerprint.backend, b->info().fingerprint.backend);
  const SequenceOutput oa = testing_util::RunAll(*a, {r})[1];
  const SequenceOutput ob = testing_util::RunAll(*b, {r})[1];
  EXPECT_FALSE(testing_util::SameTrajectory(oa, ob))
      << "a bf16 KV cache gave the fp32 cache's bits: the checks could not tell them apart";
}

}  // namespace
}  // namespace bitroll
