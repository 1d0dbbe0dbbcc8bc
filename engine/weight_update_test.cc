// WeightStager and Engine::InstallWeights: a model streamed tensor by tensor into an engine serving
// other weights generates exactly (memcmp) what an engine opened on that model generates.
#include "engine/weight_update.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <set>

#include "engine/make_model.h"
#include "engine/model_loader.h"
#include "kernels/cpu/math.h"
#include "tests/engine_test_util.h"

namespace bitroll::engine {
namespace {

namespace fs = std::filesystem;
using testing_util::Greedy;
using testing_util::MakeEngine;
using testing_util::RunAll;
using testing_util::SameTrajectory;
using testing_util::Sampled;

// Random models of stories260K's shape, seeds 1 and 2, written once per process.
std::shared_ptr<const ModelWeights> RandomModel(uint64_t seed) {
  static std::map<uint64_t, std::shared_ptr<const ModelWeights>> cache;
  auto it = cache.find(seed);
  if (it != cache.end()) return it->second;
  const fs::path dir =
      fs::temp_directory_path() /
      ("bitroll_weight_update_" + std::to_string(::getpid()) + "_" + std::to_string(seed));
  fs::create_directories(dir);
  auto shape = NamedShape("stories260k");
  EXPECT_TRUE(shape.ok());
  EXPECT_TRUE(
      WriteRandomModel(*shape, seed, (dir / "m.bin").string(), (dir / "t.bin").string()).ok());
  auto w = LoadModelWeights((dir / "m.bin").string());
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  fs::remove_all(dir);
  auto p = std::make_shared<const ModelWeights>(std::move(*w));
  cache[seed] = p;
  return p;
}

std::span<const uint8_t> Bytes(const Tensor& t) {
  return {static_cast<const uint8_t*>(t.data), static_cast<size_t>(t.size_bytes())};
}

// Stages every tensor of `from` over `base`, in slices of at most `slice` bytes (0: whole).
Result<ModelWeights> StageAll(std::shared_ptr<const ModelWeights> base, const ModelWeights& from,
                              size_t slice, bool full) {
  WeightStager st(std::move(base));
  for (const NamedTensor& t : TensorManifest(from)) {
    const auto all = Bytes(t.tensor);
    const size_t step = slice == 0 ? all.size() : slice;
    for (size_t off = 0; off < all.size(); off += step) {
      TensorSlice s{t.name, t.tensor.dtype, t.tensor.shape, off,
                    all.subspan(off, std::min(step, all.size() - off))};
      BR_RETURN_IF_ERROR(st.Put(s));
    }
  }
  return st.Finish(full);
}

bool SameBytes(const Tensor& a, const Tensor& b) {
  return a.size_bytes() == b.size_bytes() && std::memcmp(a.data, b.data, a.size_bytes()) == 0;
}

TEST(WeightUpdateTest, ManifestNamesFollowTheSourceFormat) {
  auto a = RandomModel(1);
  const auto m = TensorManifest(*a);
  // Embedding, 9 tensors per layer (no biases), final norm; the tied classifier is left out.
  ASSERT_EQ(m.size(), 1u + 9u * a->layers.size() + 1u);
  EXPECT_EQ(m[0].name, "tok_embeddings.weight");
  EXPECT_EQ(m[1].name, "layers.0.attention_norm.weight");
  EXPECT_EQ(m[2].name, "layers.0.attention.wq.weight");
  EXPECT_EQ(m[9].name, "layers.0.feed_forward.w3.weight");
  EXPECT_EQ(m.back().name, "norm.weight");
  EXPECT_EQ(m[2].tensor.shape, (std::vector<int64_t>{64, 64}));
}

TEST(WeightUpdateTest, StreamedModelEqualsTheLoadedOneBitForBit) {
  auto a = RandomModel(1);
  auto b = RandomModel(2);
  ASSERT_NE(a->weights_hash, b->weights_hash);
  for (size_t slice : {size_t{0}, size_t{4}, size_t{1000}, size_t{4096 + 4}}) {
    auto w = StageAll(a, *b, slice, /*full=*/true);
    ASSERT_TRUE(w.ok()) << "slice " << slice << ": " << w.status().ToString();
    EXPECT_EQ(w->weights_hash, b->weights_hash) << "slice " << slice;
    const auto got = TensorManifest(*w);
    const auto want = TensorManifest(*b);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(SameBytes(got[i].tensor, want[i].tensor)) << got[i].name;
    }
    EXPECT_EQ(w->classifier.data, w->token_embedding.data);  // still tied
    EXPECT_EQ(w->source, a->source + "+update");
  }
}

TEST(WeightUpdateTest, PartialUpdateSharesTheRest) {
  auto a = RandomModel(1);
  auto b = RandomModel(2);
  WeightStager st(a);
  const Tensor& wq = b->layers[2].wq;
  ASSERT_TRUE(st.Put({"layers.2.attention.wq.weight", wq.dtype, wq.shape, 0, Bytes(wq)}).ok());
  auto w = st.Finish(false);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_TRUE(SameBytes(w->layers[2].wq, wq));
  EXPECT_EQ(w->layers[1].wq.data, a->layers[1].wq.data);  // shared, not copied
  EXPECT_EQ(w->token_embedding.data, a->token_embedding.data);
  EXPECT_NE(w->weights_hash, a->weights_hash);
  EXPECT_NE(w->weights_hash, b->weights_hash);
  EXPECT_EQ(st.bytes_staged(), static_cast<uint64_t>(wq.size_bytes()));
  // A full update must name every tensor.
  WeightStager full(a);
  ASSERT_TRUE(full.Put({"layers.2.attention.wq.weight", wq.dtype, wq.shape, 0, Bytes(wq)}).ok());
  auto f = full.Finish(true);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(f.status().message().find(
                "full update misses 46 tensors: tok_embeddings.weight, "
                "layers.0.attention_norm.weight, layers.0.attention.wq.weight, ..."),
            std::string::npos)
      << f.status().message();
}

TEST(WeightUpdateTest, NarrowerDtypesWidenExactly) {
  auto a = RandomModel(1);
  auto b = RandomModel(2);
  const Tensor& w1 = b->layers[0].w1;
  const int64_t n = w1.numel();
  const float* src = static_cast<const float*>(w1.data);
  for (kernels::DType d : {kernels::DType::kBF16, kernels::DType::kF16}) {
    std::vector<uint16_t> h(n);
    for (int64_t i = 0; i < n; ++i) {
      h[i] = d == kernels::DType::kBF16 ? kernels::F32ToBf16(src[i]) : kernels::F32ToF16(src[i]);
    }
    WeightStager st(a);
    std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(h.data()), h.size() * 2);
    // Two slices, split at an element boundary.
    ASSERT_TRUE(st.Put({"layers.0.feed_forward.w1.weight", d, w1.shape, 0, bytes.first(202)}).ok());
    ASSERT_TRUE(
        st.Put({"layers.0.feed_forward.w1.weight", d, w1.shape, 202, bytes.subspan(202)}).ok());
    auto w = st.Finish(false);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    ASSERT_EQ(w->layers[0].w1.dtype, kernels::DType::kF32);  // the served dtype is kept
    const float* got = static_cast<const float*>(w->layers[0].w1.data);
    int differs_from_f32 = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float want =
          d == kernels::DType::kBF16 ? kernels::Bf16ToF32(h[i]) : kernels::F16ToF32(h[i]);
      ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want)) << i;
      differs_from_f32 += got[i] != src[i];
    }
    EXPECT_GT(differs_from_f32, n / 2);  // the values really went through 16 bits
  }
}

TEST(WeightUpdateTest, TiedClassifierNameIsAcceptedAndIgnored) {
  auto a = RandomModel(1);
  auto b = RandomModel(2);
  WeightStager st(a);
  const Tensor& e = b->token_embedding;
  ASSERT_TRUE(st.Put({"tok_embeddings.weight", e.dtype, e.shape, 0, Bytes(e)}).ok());
  // A state_dict() also carries the tied output.weight; its data is not used.
  std::vector<float> junk(e.numel(), 0.5f);
  std::span<const uint8_t> jb(reinterpret_cast<const uint8_t*>(junk.data()), junk.size() * 4);
  ASSERT_TRUE(st.Put({"output.weight", kernels::DType::kF32, e.shape, 0, jb}).ok());
  auto w = st.Finish(false);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_TRUE(SameBytes(w->token_embedding, e));
  EXPECT_EQ(w->classifier.data, w->token_embedding.data);
}

// Mixture-of-experts models: QK-norm, router and expert tensors are named as transformers names
// them, a single expert updates by name, and an engine serving the model picks it up.
TEST(WeightUpdateTest, ExpertTensorsUpdateByName) {
  auto a = testing_util::HfShapeModel("qwen3-moe-tiny");
  ASSERT_TRUE(a);
  const auto m = TensorManifest(*a);
  std::set<std::string> names;
  for (const NamedTensor& t : m) names.insert(t.name);
  for (const char* n : {"model.layers.0.self_attn.q_norm.weight", "model.layers.1.mlp.gate.weight",
                        "model.layers.1.mlp.experts.7.down_proj.weight",
                        "model.layers.0.mlp.experts.0.gate_proj.weight"}) {
    EXPECT_EQ(names.count(n), 1u) << n;
  }
  // Embedding; per layer 2 norms, q, k, v, o, q_norm, k_norm, the router and 8 x 3 expert
  // tensors; final norm and head.
  EXPECT_EQ(m.size(), 1u + 2u * (9u + 24u) + 2u);
  const Tensor& down = a->layers[1].experts[7].w2;
  std::vector<float> changed(static_cast<const float*>(down.data),
                             static_cast<const float*>(down.data) + down.numel());
  for (float& v : changed) v = -v;
  const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(changed.data()),
                                       changed.size() * 4);
  WeightStager st(a);
  ASSERT_TRUE(st.Put({"model.layers.1.mlp.experts.7.down_proj.weight", kernels::DType::kF32,
                      down.shape, 0, bytes})
                  .ok());
  auto w = st.Finish(false);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_NE(w->weights_hash, a->weights_hash);
  EXPECT_EQ(std::memcmp(w->layers[1].experts[7].w2.data, changed.data(), changed.size() * 4), 0);
  EXPECT_EQ(w->layers[1].experts[6].w2.data, a->layers[1].experts[6].w2.data);  // shared
  // Served: a sampled trajectory changes once the update is installed.
  auto e = MakeEngine({}, a);
  ASSERT_NE(e, nullptr);
  engine::SequenceRequest r = testing_util::Target(1, Sampled());
  const auto before = RunAll(*e, {r})[1];
  ASSERT_TRUE(e->InstallWeights(std::make_shared<const ModelWeights>(std::move(*w)), 2).ok());
  const auto after = RunAll(*e, {r})[1];
  EXPECT_FALSE(SameTrajectory(before, after));
}

struct BadCase {
  const char* what;
  std::string name;
  std::vector<int64_t> shape;
  uint64_t offset;
  size_t bytes;
  ErrorCode code;
  const char* message;
};

TEST(WeightUpdateTest, BadSlicesGetTypedErrorsAndTheStagerStaysFailed) {
  auto a = RandomModel(1);
  const std::vector<int64_t> sq{64, 64};
  const std::vector<BadCase> cases = {
      {"unknown name", "layers.0.attention.wz.weight", sq, 0, 64 * 64 * 4, ErrorCode::kNotFound,
       "has no tensor 'layers.0.attention.wz.weight'; its names are like tok_embeddings.weight"},
      {"other family", "model.layers.0.self_attn.q_proj.weight", sq, 0, 64 * 64 * 4,
       ErrorCode::kNotFound, "no tensor 'model.layers.0.self_attn.q_proj.weight'"},
      {"layer out of range", "layers.5.attention.wq.weight", sq, 0, 64 * 64 * 4,
       ErrorCode::kNotFound, "layers.5"},
      {"wrong shape",
       "layers.0.attention.wq.weight",
       {64, 32},
       0,
       64 * 32 * 4,
       ErrorCode::kInvalidArgument,
       "has shape [64, 32], the model's is [64, 64]"},
      {"first slice not at 0", "layers.0.attention.wq.weight", sq, 8, 64,
       ErrorCode::kInvalidArgument, "starts at byte 8, not 0"},
      {"past the end", "layers.0.attention.wq.weight", sq, 0, 64 * 64 * 4 + 4,
       ErrorCode::kInvalidArgument, "16384 bytes of f32 elements"},
      {"partial element", "layers.0.attention.wq.weight", sq, 0, 6, ErrorCode::kInvalidArgument,
       "has 6 bytes at byte 0"},
  };
  for (const BadCase& c : cases) {
    WeightStager st(a);
    std::vector<uint8_t> data(c.bytes, 0);
    Status s = st.Put({c.name, kernels::DType::kF32, c.shape, c.offset, data});
    ASSERT_FALSE(s.ok()) << c.what;
    EXPECT_EQ(s.code(), c.code) << c.what << ": " << s.ToString();
    EXPECT_NE(s.message().find(c.message), std::string::npos) << c.what << ": " << s.message();
    // Sticky: a good slice afterwards is refused with the same error, and so is Finish.
    const Tensor& n = a->final_norm;
    EXPECT_EQ(st.Put({"norm.weight", n.dtype, n.shape, 0, Bytes(n)}).message(), s.message());
    EXPECT_EQ(st.Finish(false).status().message(), s.message());
  }
}

TEST(WeightUpdateTest, OrderTwiceDtypeAndNonFiniteErrors) {
  auto a = RandomModel(1);
  const Tensor& t = a->layers[1].wk;  // [32][64] f32
  const auto all = Bytes(t);
  {
    WeightStager st(a);
    ASSERT_TRUE(st.Put({"layers.1.attention.wk.weight", t.dtype, t.shape, 0, all.first(64)}).ok());
    Status s = st.Put({"layers.1.attention.wk.weight", t.dtype, t.shape, 128, all.subspan(128)});
    EXPECT_NE(s.message().find("at byte 128, expected byte 64 (slices go in order)"),
              std::string::npos)
        << s.message();
  }
  {
    WeightStager st(a);
    ASSERT_TRUE(st.Put({"layers.1.attention.wk.weight", t.dtype, t.shape, 0, all}).ok());
    Status s = st.Put({"layers.1.attention.wk.weight", t.dtype, t.shape, 0, all});
    EXPECT_NE(s.message().find("was sent twice"), std::string::npos) << s.message();
  }
  {
    WeightStager st(a);
    ASSERT_TRUE(st.Put({"layers.1.attention.wk.weight", t.dtype, t.shape, 0, all.first(64)}).ok());
    std::vector<uint8_t> h(64, 0);
    Status s = st.Put({"layers.1.attention.wk.weight", kernels::DType::kBF16, t.shape, 64, h});
    EXPECT_NE(s.message().find("change dtype from f32 to bf16"), std::string::npos) << s.message();
  }
  {
    WeightStager st(a);
    ASSERT_TRUE(st.Put({"layers.1.attention.wk.weight", t.dtype, t.shape, 0, all.first(64)}).ok());
    auto w = st.Finish(false);
    ASSERT_FALSE(w.ok());
    EXPECT_NE(w.status().message().find("was only partly sent (64 of 8192 bytes)"),
              std::string::npos)
        << w.status().message();
  }
  for (float bad : {std::nanf(""), INFINITY, -INFINITY}) {
    std::vector<float> v(t.numel(), 0.25f);
    v[777] = bad;
    WeightStager st(a);
    Status s = st.Put({"layers.1.attention.wk.weight",
                       kernels::DType::kF32,
                       t.shape,
                       0,
                       {reinterpret_cast<const uint8_t*>(v.data()), v.size() * 4}});
    EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(s.message().find("layers.1.attention.wk.weight element 777 is not finite"),
              std::string::npos)
        << s.message();
  }
  EXPECT_EQ(ParseDType("fp8").status().code(), ErrorCode::kInvalidArgument);
}

// A Hugging Face qwen2 checkpoint in bf16 (q/k/v biases, untied lm_head): its names, streamed
// bf16 tensors, and f32 tensors narrowed back to the served bf16 (exact here: they were bf16).
TEST(WeightUpdateTest, HuggingFaceNamesBiasesAndBf16) {
  if (std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "SKIPPED LOUDLY: /usr/bin/python3 with numpy writes the checkpoint "
                    "(Debian: python3-numpy)";
  }
  std::shared_ptr<const ModelWeights> w[2];
  for (int i = 0; i < 2; ++i) {
    const fs::path dir = fs::temp_directory_path() /
                         ("bitroll_wu_hf_" + std::to_string(::getpid()) + "_" + std::to_string(i));
    const std::string cmd = std::string("/usr/bin/python3 ") + BITROLL_SOURCE_DIR +
                            "/scripts/make-hf-checkpoint.py --arch qwen2 --dtype bf16 --shards 2 "
                            "--seed " +
                            std::to_string(i + 1) + " --out " + dir.string() + " >/dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    auto m = LoadModelWeights(dir.string());
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    w[i] = std::make_shared<const ModelWeights>(std::move(*m));
    fs::remove_all(dir);
  }
  const auto m = TensorManifest(*w[0]);
  EXPECT_EQ(m.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(m[1].name, "model.layers.0.input_layernorm.weight");
  EXPECT_EQ(m[2].name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(m[5].name, "model.layers.0.self_attn.q_proj.bias");
  EXPECT_EQ(m.back().name, "lm_head.weight");
  EXPECT_EQ(m[2].tensor.dtype, kernels::DType::kBF16);
  auto same = StageAll(w[0], *w[1], 300, /*full=*/true);
  ASSERT_TRUE(same.ok()) << same.status().ToString();
  EXPECT_EQ(same->weights_hash, w[1]->weights_hash);
  // The same values as f32: converted back to bf16 on the replica, bit for bit.
  WeightStager st(w[0]);
  std::vector<std::vector<float>> keep;
  for (const NamedTensor& t : TensorManifest(*w[1])) {
    std::vector<float> f(t.tensor.numel());
    const auto* h = static_cast<const uint16_t*>(t.tensor.data);
    for (size_t i = 0; i < f.size(); ++i) {
      f[i] = t.tensor.dtype == kernels::DType::kBF16  ? kernels::Bf16ToF32(h[i])
             : t.tensor.dtype == kernels::DType::kF16 ? kernels::F16ToF32(h[i])
                                                      : static_cast<const float*>(t.tensor.data)[i];
    }
    keep.push_back(std::move(f));
    ASSERT_TRUE(
        st.Put({t.name,
                kernels::DType::kF32,
                t.tensor.shape,
                0,
                {reinterpret_cast<const uint8_t*>(keep.back().data()), keep.back().size() * 4}})
            .ok())
        << t.name;
  }
  auto widened = st.Finish(true);
  ASSERT_TRUE(widened.ok()) << widened.status().ToString();
  EXPECT_EQ(widened->weights_hash, w[1]->weights_hash);
  // Another family's name is refused.
  WeightStager other(w[0]);
  const Tensor& q = w[1]->layers[0].wq;
  Status s = other.Put({"layers.0.attention.wq.weight", q.dtype, q.shape, 0, Bytes(q)});
  EXPECT_EQ(s.code(), ErrorCode::kNotFound);
  EXPECT_NE(s.message().find("its names are like model.embed_tokens.weight"), std::string::npos)
      << s.message();
}

TEST(WeightUpdateTest, GgufNames) {
  auto g = LoadModelWeights(testing_util::ModelsDir() + "/stories260K.gguf");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  auto base = std::make_shared<const ModelWeights>(std::move(*g));
  const auto m = TensorManifest(*base);
  EXPECT_EQ(m.front().name, "token_embd.weight");
  EXPECT_EQ(m[1].name, "blk.0.attn_norm.weight");
  EXPECT_EQ(m[5].name, "blk.0.attn_output.weight");
  EXPECT_EQ(m[7].name, "blk.0.ffn_gate.weight");
  EXPECT_EQ(m[m.size() - 2].name, "output_norm.weight");
  EXPECT_EQ(m.back().name, "output.weight");  // stored untied in this file
  // The .bin model's tensors under GGUF names (same canonical order) replace every tensor; its
  // tied classifier is the embedding.
  auto bin = testing_util::Stories260K();
  auto src = TensorManifest(*bin);
  src.push_back({"output.weight", bin->token_embedding});
  ASSERT_EQ(src.size(), m.size());
  WeightStager st(base);
  for (size_t i = 0; i < m.size(); ++i) {
    ASSERT_TRUE(
        st.Put({m[i].name, src[i].tensor.dtype, src[i].tensor.shape, 0, Bytes(src[i].tensor)}).ok())
        << m[i].name;
  }
  auto w = st.Finish(true);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const auto got = TensorManifest(*w);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(SameBytes(got[i].tensor, src[i].tensor)) << got[i].name;
  }
}

// The end-to-end property: an engine serving seed-1 weights that installs streamed seed-2 weights
// generates exactly what an engine opened on seed-2 weights generates; before the install it
// does not (negative control).
TEST(WeightUpdateTest, EngineWithStreamedWeightsMatchesEngineOpenedOnThem) {
  auto a = RandomModel(1);
  auto b = RandomModel(2);
  std::vector<SequenceRequest> reqs;
  for (uint64_t i = 0; i < 6; ++i) {
    reqs.push_back(
        testing_util::RandomRequest(i + 1, 100 + i, 512, 40, 24, i % 2 ? Greedy() : Sampled()));
  }
  auto ref = MakeEngine({}, b);
  const auto want = RunAll(*ref, reqs);

  auto e = MakeEngine({}, a);
  const auto before = RunAll(*e, reqs);
  int differ = 0;
  for (const auto& [id, out] : before) differ += !SameTrajectory(out, want.at(id));
  EXPECT_EQ(differ, static_cast<int>(reqs.size())) << "negative control: seed-1 weights";

  auto staged = StageAll(e->weights(), *b, 1000, /*full=*/true);
  ASSERT_TRUE(staged.ok()) << staged.status().ToString();
  ASSERT_TRUE(e->InstallWeights(std::make_shared<const ModelWeights>(std::move(*staged)), 7).ok());
  EXPECT_EQ(e->weights()->weights_hash, b->weights_hash);
  EXPECT_EQ(e->info().fingerprint.weights_hash, b->weights_hash);
  const auto after = RunAll(*e, reqs);
  for (const auto& [id, out] : after) {
    EXPECT_TRUE(SameTrajectory(out, want.at(id))) << "request " << id;
    ASSERT_FALSE(out.versions.empty());
    EXPECT_EQ(out.versions.back().version, 7u);
  }
}

// The real stories260K streamed into an engine serving random weights of its shape gives the
// golden greedy output of the reference implementation.
TEST(WeightUpdateTest, StreamedStories260KGivesTheGoldenGreedyIds) {
  std::vector<int32_t> prompt, golden;
  ASSERT_TRUE(testing_util::ReadGoldenIds(
      testing_util::ModelsDir() + "/golden/once_upon_n256.ids.txt", &prompt, &golden));
  auto real = testing_util::Stories260K();
  auto e = MakeEngine({}, RandomModel(1));
  auto staged = StageAll(e->weights(), *real, 1 << 14, /*full=*/true);
  ASSERT_TRUE(staged.ok()) << staged.status().ToString();
  EXPECT_EQ(staged->weights_hash, real->weights_hash);
  ASSERT_TRUE(e->InstallWeights(std::make_shared<const ModelWeights>(std::move(*staged)), 3).ok());
  const auto out = RunAll(*e, {testing_util::RunCRequest(1, prompt, 256)});
  EXPECT_EQ(testing_util::RunCSequence(prompt, out.at(1).tokens), golden);
}

}  // namespace
}  // namespace bitroll::engine
