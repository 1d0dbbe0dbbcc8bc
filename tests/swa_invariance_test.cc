// The invariance suite (docs/design.md "Promises") on hybrid sliding-window models: make-model's
// swa-tiny (GPT-OSS style: sliding W=8 / full layers alternating, with attention sinks) and
// swa-5to1-tiny (Gemma 3 style: five sliding W=8 layers per full one). The window (8) is not a
// multiple of the attention chunk (16) and the contexts are many windows long, so windows start
// inside chunks and cross chunk and prefill-chunk boundaries. Every comparison is memcmp. The
// negative control anchors the window at the prefill chunk's start
// (BITROLL_TEST_BREAK_INVARIANCE=window_chunk) and shows the same checks fail.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/invariance_break.h"
#include "engine/invariance_checks.h"
#include "engine/loaders/hf.h"
#include "engine/make_model_hf.h"
#include "engine/transformer.h"
#include "kernels/cpu/isa.h"
#include "tests/engine_test_util.h"
#include "tests/invariance_checks.h"

namespace bitroll {
namespace {

namespace fs = std::filesystem;
using engine::SequenceOutput;
using engine::SequenceRequest;
using testing_util::EngineSetup;
using testing_util::Greedy;
using testing_util::MakeEngine;
using testing_util::RandomRequest;
using testing_util::RunAll;
using testing_util::SameTrajectory;
using testing_util::Sampled;
using testing_util::ScopedBreak;

const char* const kSwa = "swa-tiny";
const char* const kSwa5 = "swa-5to1-tiny";

std::shared_ptr<const engine::ModelWeights> Model(const std::string& name) {
  return testing_util::HfShapeModel(name);
}

testing_util::EngineFactory Cpu(const std::string& model, const EngineSetup& base) {
  return testing_util::HfShapeEngines(model, base);
}

engine::EngineFactory CpuVariants(const std::string& model, const EngineSetup& base) {
  return testing_util::HfShapeVariants(model, base);
}

const std::vector<int> kBatchSizes = {2, 3, 8, 17};

// Guards: the models are hybrid, with the declared windows and sinks.
TEST(SwaInvariance, TheModelsAreHybrid) {
  auto w = Model(kSwa);
  ASSERT_TRUE(w);
  EXPECT_EQ(w->config.layer_window, (std::vector<int32_t>{8, 0, 8, 0}));
  EXPECT_TRUE(w->config.attn_sinks);
  ASSERT_NE(w->layers[0].sinks.data, nullptr);
  auto w5 = Model(kSwa5);
  ASSERT_TRUE(w5);
  EXPECT_EQ(w5->config.layer_window, (std::vector<int32_t>{8, 8, 8, 8, 8, 0}));
  EXPECT_FALSE(w5->config.attn_sinks);
}

TEST(SwaInvariance, BatchComposition) {
  EngineSetup s;
  s.threads = 2;
  EXPECT_EQ(0, testing_util::BatchCompositionMismatches(Cpu(kSwa, s), Sampled(), kBatchSizes));
  EXPECT_EQ(0, testing_util::BatchCompositionMismatches(Cpu(kSwa5, {}), Greedy(), {3, 17}));
}

TEST(SwaInvariance, EveryRequestOfABatchEqualsItsSoloRun) {
  testing_util::CheckEveryRequestOfABatchEqualsItsSoloRun(Cpu(kSwa, {}));
}

TEST(SwaInvariance, PrefillChunking) {
  testing_util::CheckPrefillChunking(Cpu(kSwa, {}));
  testing_util::CheckPrefillChunking(Cpu(kSwa5, {}));
}

TEST(SwaInvariance, PrefillEqualsDecode) {
  testing_util::CheckPrefillEqualsDecode(Cpu(kSwa, {}));
}

TEST(SwaInvariance, ThreadsAttentionKernelsAndIsas) {
  testing_util::CheckThreadsAttentionKernelsAndIsas(kSwa);
}

// Prefix-cache hits, preemption and the disk tier give the bits of a fresh engine's run.
TEST(SwaInvariance, PrefixHitsPreemptionAndDiskTier) {
  testing_util::CheckPrefixHitsPreemptionAndDiskTier(kSwa);
}

// Stats: bytes per token and live bytes per layer kind; the window figure is what the sliding
// layers of the running sequences need, less than what they hold once contexts outgrow W.
TEST(SwaInvariance, KvMemoryPerLayerKind) {
  auto e = MakeEngine(EngineSetup{}, Model(kSwa));
  ASSERT_NE(e, nullptr);
  std::mt19937 rng(4);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(e->Add(RandomRequest(i, rng(), 512, 100, 30, Greedy())).ok());
  }
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(e->Step().ok());
  const engine::EngineStats s = e->stats();
  // swa-tiny: 2 full + 2 sliding layers, 2 kv heads x 16 dims, K and V, fp32.
  EXPECT_EQ(s.kv_bytes_per_token_full, 2 * 2 * 16 * 2 * 4);
  EXPECT_EQ(s.kv_bytes_per_token_sliding, 2 * 2 * 16 * 2 * 4);
  EXPECT_GT(s.kv_live_bytes_full, 0);
  EXPECT_EQ(s.kv_live_bytes_sliding, s.kv_live_bytes_full);
  EXPECT_GT(s.kv_window_bytes_sliding, 0);
  EXPECT_LT(s.kv_window_bytes_sliding, s.kv_live_bytes_sliding);
  // A full-attention model has no sliding layers.
  auto d = MakeEngine(EngineSetup{}, Model("qwen3-tiny"));
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->stats().kv_bytes_per_token_sliding, 0);
  EXPECT_GT(d->stats().kv_bytes_per_token_full, 0);
}

// ---- the independent numpy forward (tests/hf_reference.py) ----

double MaxErr(const std::vector<float>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// Teacher-forces 64 random tokens (8 windows) through the engine and compares every logprob with
// the float64 reference. Tolerance 2e-4 absolute on logprobs (as formats_test). Controls: the
// reference with the window one key too wide, or without the sinks, must disagree by > 1e-3.
TEST(SwaReference, LogprobsMatchNumpyForwardAndBrokenReferencesDisagree) {
  if (std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "/usr/bin/python3 with numpy is needed (Debian: python3-numpy)";
  }
  for (const char* m : {kSwa, kSwa5}) {
    const fs::path dir =
        fs::temp_directory_path() / ("bitroll_swa_ref_" + std::to_string(::getpid()) + "_" + m);
    Result<engine::HfModelShape> shape = engine::NamedHfShape(m);
    ASSERT_TRUE(shape.ok());
    ASSERT_TRUE(engine::WriteRandomHfModel(*shape, 11, dir.string()).ok());
    Result<engine::ModelWeights> w = engine::LoadHuggingFace(dir.string());
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    auto weights = std::make_shared<const engine::ModelWeights>(std::move(w).value());
    std::mt19937 rng(42);
    std::vector<int32_t> tokens(64);
    for (int32_t& t : tokens) t = int32_t(3 + rng() % 500);
    auto reference = [&](const std::string& extra) {
      return testing_util::HfReferenceLogprobs(dir.string(), tokens, extra);
    };
    SequenceRequest r;
    r.id = 1;
    r.prompt = {tokens[0]};
    r.sampling = Greedy();
    r.stop.max_tokens = int32_t(tokens.size() - 1);
    r.stop.stop_at_eos = false;
    r.stop.stop_at_bos = false;
    r.forced.assign(tokens.begin() + 1, tokens.end());
    auto e = MakeEngine({}, weights);
    ASSERT_NE(e, nullptr);
    const std::vector<float> got = RunAll(*e, {r})[1].logprobs;
    const std::vector<double> ref = reference("");
    ASSERT_EQ(ref.size(), tokens.size() - 1) << m;
    ASSERT_EQ(got.size(), ref.size()) << m;
    const double err = MaxErr(got, ref);
    EXPECT_LT(err, 2e-4) << m;
    std::printf("%s: max |logprob - reference| = %.3g over %zu tokens\n", m, err, ref.size());
    const double wrong_window = MaxErr(got, reference(" --break wrong_window"));
    EXPECT_GT(wrong_window, 1e-3) << m << ": a window one key wider went unnoticed";
    std::printf("%s: vs --break wrong_window: %.3g\n", m, wrong_window);
    if (weights->config.attn_sinks) {
      const double no_sinks = MaxErr(got, reference(" --break no_sinks"));
      EXPECT_GT(no_sinks, 1e-3) << m << ": dropping the sinks went unnoticed";
      std::printf("%s: vs --break no_sinks: %.3g\n", m, no_sinks);
    }
    fs::remove_all(dir);
  }
}

// Typed errors for bad configs: window <= 0, unknown layer type, sinks of the wrong shape.
TEST(SwaReference, BadSlidingWindowConfigsAreTypedErrors) {
  const fs::path dir =
      fs::temp_directory_path() / ("bitroll_swa_bad_" + std::to_string(::getpid()));
  Result<engine::HfModelShape> shape = engine::NamedHfShape(kSwa);
  ASSERT_TRUE(shape.ok());
  ASSERT_TRUE(engine::WriteRandomHfModel(*shape, 11, dir.string()).ok());
  const std::string cfg_path = (dir / "config.json").string();
  std::string cfg;
  {
    FILE* f = std::fopen(cfg_path.c_str(), "rb");
    ASSERT_NE(f, nullptr);
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) cfg.append(buf, n);
    std::fclose(f);
  }
  auto with = [&](const std::string& from, const std::string& to) {
    std::string c = cfg;
    const size_t at = c.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) c.replace(at, from.size(), to);
    FILE* f = std::fopen(cfg_path.c_str(), "wb");
    std::fwrite(c.data(), 1, c.size(), f);
    std::fclose(f);
    return engine::LoadHuggingFace(dir.string()).status();
  };
  EXPECT_EQ(with("\"sliding_window\": 8", "\"sliding_window\": 0").code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(with("\"sliding_window\": 8", "\"sliding_window\": -3").code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(with("\"full_attention\"", "\"chunked_attention\"").code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(with("\"num_attention_heads\": 4", "\"num_attention_heads\": 2").code(),
            ErrorCode::kInvalidArgument);  // sinks (and q_proj) no longer [n_heads]
  EXPECT_TRUE(with("\"sliding_window\": 8", "\"sliding_window\": 8").ok());
  // Qwen configs carry an unused window: use_sliding_window false means every layer is full.
  {
    ASSERT_TRUE(
        with("\"sliding_window\": 8", "\"use_sliding_window\": false, \"sliding_window\": 8").ok());
    Result<engine::ModelWeights> q = engine::LoadHuggingFace(dir.string());
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    EXPECT_FALSE(q->config.has_sliding());
  }
  EXPECT_EQ(with("\"layer_types\"", "\"max_window_layers\": 2, \"ignored_types\"").code(),
            ErrorCode::kUnsupported);
  ASSERT_TRUE(with("\"sliding_window\": 8", "\"sliding_window\": 8").ok());  // restore
  // Engine-level: a sink tensor of the wrong length is rejected when the engine is built.
  Result<engine::ModelWeights> w = engine::LoadHuggingFace(dir.string());
  ASSERT_TRUE(w.ok());
  w->layers[1].sinks.shape = {3};
  auto built = engine::Transformer::Create(std::make_shared<const engine::ModelWeights>(*w), {});
  EXPECT_EQ(built.status().code(), ErrorCode::kInvalidArgument);
  fs::remove_all(dir);
}

// ---- negative control ----

SequenceRequest LongPrompt() {
  SequenceRequest r = testing_util::Target(1, Sampled());
  std::mt19937 rng(3);
  for (int i = 0; i < 150; ++i) {
    r.prompt.push_back(std::uniform_int_distribution<int32_t>(3, 511)(rng));
  }
  return r;
}

TEST(SwaInvarianceNegativeControl, WindowAnchoredAtTheChunkStartIsCaught) {
  ScopedBreak broken("window_chunk");
  const SequenceRequest r = LongPrompt();
  for (const char* m : {kSwa, kSwa5}) {
    Result<engine::Mismatches> found =
        engine::CheckPrefillChunking(CpuVariants(m, {}), r, {1, 7, 16, 48, 100});
    ASSERT_TRUE(found.ok()) << found.status().ToString();
    EXPECT_FALSE(found->empty()) << m << ": a window mask anchored at the prefill chunk's start "
                                 << "gave the same bits in every chunking";
  }
  // Full-attention models have no window: the same switch leaves them invariant, so the failure
  // above comes from the window mask.
  Result<engine::Mismatches> dense =
      engine::CheckPrefillChunking(CpuVariants("qwen3-tiny", {}), r, {1, 7, 16, 48, 100});
  ASSERT_TRUE(dense.ok());
  EXPECT_TRUE(dense->empty());
}

TEST(SwaInvarianceNegativeControl, PrefillEqualsDecodeCatchesTheBrokenWindowToo) {
  ScopedBreak broken("window_chunk");
  SequenceRequest r = testing_util::Target(1, Sampled());
  const SequenceOutput decoded = testing_util::RunAloneOn(Cpu(kSwa, {}), 0, r);
  Result<engine::Mismatches> found =
      engine::CheckPrefillEqualsDecode(CpuVariants(kSwa, {}), r, decoded, {4096});
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_FALSE(found->empty()) << "re-scoring with a chunk-anchored window gave the decoded bits";
}

}  // namespace
}  // namespace bitroll
