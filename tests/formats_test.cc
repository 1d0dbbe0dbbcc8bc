// Cross-format, end-to-end through the engine:
//  * stories260K.gguf and stories260K.bin give the same greedy ids and logprob bits (memcmp);
//  * llama-2-tiny-random.gguf (F16, 32000-token SentencePiece vocabulary) generates through
//    OpenEngine with its embedded tokenizer;
//  * random Hugging Face checkpoints (Llama / Llama 3 rope scaling / Qwen2 / Qwen3 QK-norm /
//    Qwen3-MoE / Qwen2-MoE with a shared expert, GQA, f32 / bf16, tied / untied, 1-3 shards) give
//    the logprobs of an independent numpy forward pass (tests/hf_reference.py) within a stated
//    tolerance — a cross-implementation check, so a tolerance is right here — and disagree with a
//    reference that leaves the feature out (--break);
//  * format detection and tokenizer lookup for every format.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/loaders/gguf.h"
#include "engine/loaders/hf.h"
#include "engine/loaders/llama2c.h"
#include "engine/model_loader.h"
#include "tests/engine_test_util.h"

namespace bitroll {
namespace {

namespace fs = std::filesystem;
using testing_util::ModelsDir;

std::shared_ptr<const engine::ModelWeights> Load(const std::string& path, int32_t max_seq = 0) {
  engine::ModelLoadOptions o;
  o.max_seq_len = max_seq;
  Result<engine::ModelWeights> w = engine::LoadModelWeights(path, o);
  if (!w.ok()) {
    ADD_FAILURE() << path << ": " << w.status().ToString();
    return nullptr;
  }
  return std::make_shared<const engine::ModelWeights>(std::move(w).value());
}

engine::SequenceRequest Greedy(uint64_t id, std::vector<int32_t> prompt, int32_t max_tokens) {
  engine::SequenceRequest r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.stop.max_tokens = max_tokens;
  r.stop.stop_at_eos = false;
  r.stop.stop_at_bos = false;
  return r;
}

TEST(Formats, Stories260KGgufEqualsLlama2cBitwise) {
  auto bin = Load(ModelsDir() + "/stories260K.bin");
  auto gguf = Load(ModelsDir() + "/stories260K.gguf");
  ASSERT_TRUE(bin && gguf);
  auto tok = engine::LoadTokenizerFor(ModelsDir() + "/stories260K.gguf", "", 512);
  ASSERT_TRUE(tok.ok() && *tok != nullptr);
  std::vector<engine::SequenceRequest> reqs;
  uint64_t id = 1;
  for (const char* text : {"Once upon a time", "Lily wanted a red ball", "The dog"}) {
    Result<std::vector<int32_t>> ids = (*tok)->Encode(text, true);
    ASSERT_TRUE(ids.ok());
    reqs.push_back(Greedy(id++, *ids, 100));  // prompt + 100 < 128 (the GGUF's context)
  }
  engine::SequenceRequest sampled = Greedy(id++, reqs[0].prompt, 100);
  sampled.sampling.temperature = 0.8f;
  sampled.sampling.seed = 7;
  reqs.push_back(sampled);
  auto e_bin = testing_util::MakeEngine({}, bin);
  auto e_gguf = testing_util::MakeEngine({}, gguf);
  ASSERT_TRUE(e_bin && e_gguf);
  auto out_bin = testing_util::RunAll(*e_bin, reqs);
  auto out_gguf = testing_util::RunAll(*e_gguf, reqs);
  for (const auto& r : reqs) {
    const auto& a = out_bin[r.id];
    const auto& b = out_gguf[r.id];
    ASSERT_EQ(a.tokens.size(), 100u);
    EXPECT_TRUE(testing_util::SameTrajectory(a, b)) << "request " << r.id;
    ASSERT_EQ(a.logprobs.size(), b.logprobs.size());
    EXPECT_EQ(std::memcmp(a.logprobs.data(), b.logprobs.data(), a.logprobs.size() * 4), 0);
  }
  // run.c's reference continuation of "Once upon a time" starts 432 383 286 261 376 (README).
  EXPECT_EQ(std::vector<int32_t>(out_gguf[1].tokens.begin(), out_gguf[1].tokens.begin() + 5),
            (std::vector<int32_t>{432, 383, 286, 261, 376}));

  // Negative control: the same bytes under the other RoPE layout give different bits, so the
  // comparison above can fail.
  auto flipped = std::make_shared<engine::ModelWeights>(*gguf);
  flipped->config.rope_layout = kernels::RopeLayout::kHalfSplit;
  auto e_flip = testing_util::MakeEngine({}, flipped);
  ASSERT_TRUE(e_flip);
  auto out_flip = testing_util::RunAll(*e_flip, {reqs[0]});
  EXPECT_FALSE(testing_util::SameTrajectory(out_bin[1], out_flip[1]));
}

TEST(Formats, Llama2TinyRandomGgufGeneratesThroughOpenEngine) {
  engine::EngineOptions o;
  o.model_path = ModelsDir() + "/llama-2-tiny-random.gguf";
  o.kv_cache_bytes = 16 << 20;
  Result<std::unique_ptr<engine::Engine>> e = engine::OpenEngine(o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const engine::Tokenizer* tok = (*e)->tokenizer();
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->vocab_size(), 32000);
  EXPECT_EQ((*e)->info().vocab_size, 32000);
  Result<std::vector<int32_t>> prompt = tok->Encode("Hello world, this is a test.", true);
  ASSERT_TRUE(prompt.ok());
  EXPECT_EQ((*prompt)[0], 1);
  auto out = testing_util::RunAll(**e, {Greedy(1, *prompt, 24)});
  ASSERT_EQ(out[1].tokens.size(), 24u);
  for (float lp : out[1].logprobs) EXPECT_TRUE(std::isfinite(lp) && lp <= 0.0f);
  Result<std::string> text = tok->Decode(out[1].tokens, prompt->back());
  EXPECT_TRUE(text.ok()) << text.status().ToString();
  // Determinism across engines: a second engine gives the same bits.
  Result<std::unique_ptr<engine::Engine>> e2 = engine::OpenEngine(o);
  ASSERT_TRUE(e2.ok());
  auto out2 = testing_util::RunAll(**e2, {Greedy(1, *prompt, 24)});
  EXPECT_TRUE(testing_util::SameTrajectory(out[1], out2[1]));
}

// ---- Hugging Face against the numpy reference --------------------------------------------------

bool HavePythonNumpy() {
  static const bool ok = std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") == 0;
  return ok;
}

struct HfCase {
  const char* name;
  const char* args;
  // A deliberately wrong reference (tests/hf_reference.py --break) the engine must disagree with:
  // it shows the case exercises that feature. nullptr = none.
  const char* broken = nullptr;
};

void PrintTo(const HfCase& c, std::ostream* os) {
  *os << c.name;
}

class HfReference : public ::testing::TestWithParam<HfCase> {};

// Teacher-forces a random token sequence through the engine and compares every logprob with the
// float64 reference. Tolerance: 2e-4 absolute on logprobs (fp32 engine vs float64 reference on a
// 2-layer model with O(1) activations; the measured gap is ~1e-5). A wrong RoPE layout, a missing
// bias, GQA mapped wrongly or an untied head read as tied moves logprobs by > 1e-2.
TEST_P(HfReference, LogprobsMatchNumpyForward) {
  if (!HavePythonNumpy()) {
    GTEST_SKIP() << "/usr/bin/python3 with numpy is needed (Debian: python3-numpy)";
  }
  const HfCase& c = GetParam();
  const fs::path dir =
      fs::temp_directory_path() / ("bitroll_fmt_" + std::to_string(::getpid()) + "_" + c.name);
  fs::remove_all(dir);
  const std::string src = BITROLL_SOURCE_DIR;
  ASSERT_EQ(std::system(("/usr/bin/python3 " + src + "/scripts/make-hf-checkpoint.py --out " +
                         dir.string() + " " + c.args)
                            .c_str()),
            0);
  ASSERT_EQ(engine::DetectModelFormat(dir.string()).value(), engine::ModelFormat::kHuggingFace);
  auto w = Load(dir.string(), 256);
  ASSERT_TRUE(w);
  std::mt19937 rng(42);
  std::vector<int32_t> tokens(40);
  for (int32_t& t : tokens) t = int32_t(rng() % uint32_t(w->config.vocab_size));
  auto reference = [&](const std::string& extra) {
    return testing_util::HfReferenceLogprobs(dir.string(), tokens, extra);
  };
  const std::vector<double> ref = reference("");
  ASSERT_EQ(ref.size(), tokens.size() - 1);

  auto run = [&](std::shared_ptr<const engine::ModelWeights> weights) {
    engine::SequenceRequest r = Greedy(1, {tokens[0]}, int32_t(tokens.size() - 1));
    r.forced.assign(tokens.begin() + 1, tokens.end());
    auto e = testing_util::MakeEngine({}, weights);
    if (!e) return std::vector<float>();
    auto out = testing_util::RunAll(*e, {r});
    return out[1].logprobs;
  };
  const std::vector<float> got = run(w);
  ASSERT_EQ(got.size(), ref.size());
  double max_err = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) max_err = std::max(max_err, std::fabs(got[i] - ref[i]));
  EXPECT_LT(max_err, 2e-4) << c.name;
  std::printf("%s: max |logprob - reference| = %.3g over %zu tokens\n", c.name, max_err,
              ref.size());

  // Negative control: the interleaved layout (wrong for HF) is caught by the same tolerance.
  auto wrong = std::make_shared<engine::ModelWeights>(*w);
  wrong->config.rope_layout = kernels::RopeLayout::kInterleaved;
  const std::vector<float> bad = run(wrong);
  ASSERT_EQ(bad.size(), ref.size());
  double bad_err = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) bad_err = std::max(bad_err, std::fabs(bad[i] - ref[i]));
  EXPECT_GT(bad_err, 1e-2) << c.name << ": the wrong RoPE layout went unnoticed";

  // Negative control of the feature under test: the engine disagrees with a reference that
  // skips it (QK-norm, rope scaling) or routes to one expert too many.
  if (c.broken != nullptr) {
    const std::vector<double> wrong_ref = reference(std::string(" --break ") + c.broken);
    ASSERT_EQ(wrong_ref.size(), ref.size());
    double err = 0.0;
    for (size_t i = 0; i < ref.size(); ++i) err = std::max(err, std::fabs(got[i] - wrong_ref[i]));
    EXPECT_GT(err, 1e-2) << c.name << ": a reference with --break " << c.broken
                         << " agreed with the engine";
    std::printf("%s: max |logprob - reference --break %s| = %.3g\n", c.name, c.broken, err);
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Checkpoints, HfReference,
    ::testing::Values(
        HfCase{"llama_f32_untied", "--arch llama --dtype f32 --seed 11"},
        HfCase{"llama_bf16_tied_2shards", "--arch llama --dtype bf16 --tied --shards 2 --seed 12"},
        HfCase{"qwen2_bf16_gqa_3shards",
               "--arch qwen2 --dtype bf16 --shards 3 --kv-heads 1 --seed 13"},
        HfCase{"qwen2_f32_tied",
               "--arch qwen2 --dtype f32 --tied --theta 1000000 "
               "--seed 14"},
        HfCase{"qwen3_bf16_headdim32", "--arch qwen3 --dtype bf16 --head-dim 32 --seed 15",
               "no_qk_norm"},
        HfCase{"qwen3_f32_tied", "--arch qwen3 --dtype f32 --tied --seed 16", "no_qk_norm"},
        HfCase{"llama3_rope_scaling", "--arch llama --llama3-scaling --theta 500000 --seed 17",
               "no_rope_scaling"},
        HfCase{"qwen3_moe_8x_top2", "--arch qwen3_moe --head-dim 32 --seed 18", "topk_plus_one"},
        HfCase{"qwen3_moe_unnormalised_bf16",
               "--arch qwen3_moe --dtype bf16 --norm-topk false --experts 6 --top-k 3 "
               "--seed 19",
               "topk_plus_one"},
        HfCase{"qwen2_moe_shared_expert", "--arch qwen2_moe --seed 20", "topk_plus_one"}),
    [](const ::testing::TestParamInfo<HfCase>& i) { return std::string(i.param.name); });

// ---- Qwen3-MoE from GGUF ------------------------------------------------------------------------

// A GGUF v3 file of F32 tensors with string / uint32 / float32 metadata (the spec's layout),
// written here independently of the parser.
class GgufWriter {
 public:
  void Str(const std::string& key, const std::string& v) {
    Key(key, 8);
    Text(&kv_, v);
  }
  void U32(const std::string& key, uint32_t v) {
    Key(key, 4);
    Pod(&kv_, v);
  }
  void F32(const std::string& key, float v) {
    Key(key, 6);
    Pod(&kv_, v);
  }
  // `shape` outermost first (ggml's ne is its reverse).
  void Tensor(const std::string& name, std::vector<int64_t> shape, const float* data) {
    Text(&ti_, name);
    Pod(&ti_, uint32_t(shape.size()));
    size_t n = 1;
    for (auto it = shape.rbegin(); it != shape.rend(); ++it) {
      Pod(&ti_, uint64_t(*it));
      n *= size_t(*it);
    }
    Pod(&ti_, uint32_t(0));  // GGML_TYPE_F32
    while (data_.size() % 32 != 0) data_.push_back('\0');
    Pod(&ti_, uint64_t(data_.size()));
    data_.append(reinterpret_cast<const char*>(data), n * 4);
    ++tensors_;
  }
  std::string Build() const {
    std::string o;
    Pod(&o, uint32_t(0x46554747));
    Pod(&o, uint32_t(3));
    Pod(&o, tensors_);
    Pod(&o, keys_);
    o += kv_ + ti_;
    while (o.size() % 32 != 0) o.push_back('\0');
    return o + data_;
  }

 private:
  template <typename T>
  static void Pod(std::string* o, T v) {
    o->append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  static void Text(std::string* o, const std::string& s) {
    Pod(o, uint64_t(s.size()));
    *o += s;
  }
  void Key(const std::string& key, uint32_t type) {
    Text(&kv_, key);
    Pod(&kv_, type);
    ++keys_;
  }
  uint64_t tensors_ = 0, keys_ = 0;
  std::string kv_, ti_, data_;
};

// make-model's qwen3-moe-tiny written as a llama.cpp-style qwen3moe GGUF (experts stacked; Qwen's
// q/k rows as they are: half-split RoPE) gives the Hugging Face folder's weights hash and the same
// trajectories bit for bit; swapping two experts in the GGUF is noticed (negative control).
TEST(Formats, Qwen3MoeGgufEqualsHuggingFaceBitwise) {
  auto hf = testing_util::HfShapeModel("qwen3-moe-tiny");
  ASSERT_TRUE(hf);
  const engine::ModelConfig& c = hf->config;
  auto f32 = [](const engine::Tensor& t) { return static_cast<const float*>(t.data); };
  auto write = [&](const std::string& path, bool swap_experts) {
    GgufWriter g;
    g.Str("general.architecture", "qwen3moe");
    g.U32("qwen3moe.embedding_length", uint32_t(c.dim));
    g.U32("qwen3moe.feed_forward_length", uint32_t(c.hidden_dim));
    g.U32("qwen3moe.block_count", uint32_t(c.n_layers));
    g.U32("qwen3moe.attention.head_count", uint32_t(c.n_heads));
    g.U32("qwen3moe.attention.head_count_kv", uint32_t(c.n_kv_heads));
    g.U32("qwen3moe.attention.key_length", uint32_t(c.head_dim()));
    g.U32("qwen3moe.context_length", uint32_t(c.max_seq_len));
    g.U32("qwen3moe.expert_count", uint32_t(c.n_experts));
    g.U32("qwen3moe.expert_used_count", uint32_t(c.n_experts_per_tok));
    g.U32("qwen3moe.expert_feed_forward_length", uint32_t(c.moe_hidden_dim));
    g.F32("qwen3moe.attention.layer_norm_rms_epsilon", c.norm_eps);
    g.F32("qwen3moe.rope.freq_base", c.rope_theta);
    g.Tensor("token_embd.weight", hf->token_embedding.shape, f32(hf->token_embedding));
    for (int32_t l = 0; l < c.n_layers; ++l) {
      const engine::LayerWeights& L = hf->layers[size_t(l)];
      const std::string b = "blk." + std::to_string(l) + ".";
      for (auto [name, t] :
           {std::pair{"attn_norm", &L.attn_norm}, std::pair{"attn_q", &L.wq},
            std::pair{"attn_k", &L.wk}, std::pair{"attn_v", &L.wv}, std::pair{"attn_output", &L.wo},
            std::pair{"attn_q_norm", &L.q_norm}, std::pair{"attn_k_norm", &L.k_norm},
            std::pair{"ffn_norm", &L.ffn_norm}, std::pair{"ffn_gate_inp", &L.router}}) {
        g.Tensor(b + name + ".weight", t->shape, f32(*t));
      }
      for (int which = 0; which < 3; ++which) {
        std::vector<float> stacked;
        std::vector<int64_t> shape;
        for (int32_t e = 0; e < c.n_experts; ++e) {
          const int32_t src = swap_experts && l == 1 && e < 2 ? 1 - e : e;
          const engine::FfnWeights& x = L.experts[size_t(src)];
          const engine::Tensor& t = which == 0 ? x.w1 : which == 1 ? x.w3 : x.w2;
          stacked.insert(stacked.end(), f32(t), f32(t) + t.numel());
          shape = t.shape;
        }
        shape.insert(shape.begin(), c.n_experts);
        const char* name = which == 0   ? "ffn_gate_exps"
                           : which == 1 ? "ffn_up_exps"
                                        : "ffn_down_exps";
        g.Tensor(b + name + ".weight", shape, stacked.data());
      }
    }
    g.Tensor("output_norm.weight", hf->final_norm.shape, f32(hf->final_norm));
    g.Tensor("output.weight", hf->classifier.shape, f32(hf->classifier));
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    const std::string bytes = g.Build();
    out.write(bytes.data(), std::streamsize(bytes.size()));
  };
  const fs::path dir =
      fs::temp_directory_path() / ("bitroll_fmt_q3moe_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string good = (dir / "m.gguf").string(), bad = (dir / "swapped.gguf").string();
  write(good, false);
  write(bad, true);
  auto gg = Load(good);
  ASSERT_TRUE(gg);
  EXPECT_EQ(engine::DetectModelFormat(good).value(), engine::ModelFormat::kGguf);
  EXPECT_EQ(gg->config.arch, "qwen3_moe");
  EXPECT_TRUE(gg->config.qk_norm && gg->config.norm_topk_prob);
  EXPECT_EQ(gg->config.n_experts, c.n_experts);
  EXPECT_EQ(gg->config.head_dim(), c.head_dim());
  EXPECT_EQ(gg->weights_hash, hf->weights_hash);
  std::vector<engine::SequenceRequest> reqs;
  for (uint64_t id = 1; id <= 4; ++id) {
    engine::SequenceRequest r = Greedy(id, {1, int32_t(10 * id), int32_t(20 + id), 30}, 40);
    if (id % 2 == 0) {
      r.sampling.temperature = 1.0f;
      r.sampling.seed = id;
    }
    r.return_routing = true;
    reqs.push_back(r);
  }
  auto e_hf = testing_util::MakeEngine({}, hf);
  auto e_gg = testing_util::MakeEngine({}, gg);
  ASSERT_TRUE(e_hf && e_gg);
  auto a = testing_util::RunAll(*e_hf, reqs);
  auto b = testing_util::RunAll(*e_gg, reqs);
  for (const auto& r : reqs) {
    EXPECT_TRUE(testing_util::SameTrajectory(a[r.id], b[r.id])) << r.id;
    EXPECT_EQ(a[r.id].routing.expert_ids, b[r.id].routing.expert_ids) << r.id;
  }
  auto sw = Load(bad);
  ASSERT_TRUE(sw);
  EXPECT_NE(sw->weights_hash, hf->weights_hash);
  auto e_sw = testing_util::MakeEngine({}, sw);
  ASSERT_TRUE(e_sw);
  auto s = testing_util::RunAll(*e_sw, reqs);
  int differ = 0;
  for (const auto& r : reqs) differ += testing_util::SameTrajectory(a[r.id], s[r.id]) ? 0 : 1;
  EXPECT_GT(differ, 0) << "two swapped experts went unnoticed";
  fs::remove_all(dir);
}

// ---- detection and tokenizers ------------------------------------------------------------------

TEST(Formats, DetectionAndTokenizerLookup) {
  using engine::ModelFormat;
  EXPECT_EQ(engine::DetectModelFormat(ModelsDir() + "/stories260K.bin").value(),
            ModelFormat::kLlama2c);
  EXPECT_EQ(engine::DetectModelFormat(ModelsDir() + "/stories260K.gguf").value(),
            ModelFormat::kGguf);
  EXPECT_EQ(engine::DetectModelFormat(ModelsDir() + "/nope").status().code(), ErrorCode::kNotFound);
  EXPECT_EQ(engine::DetectModelFormat(ModelsDir()).status().code(), ErrorCode::kUnsupported);
  // GGUF: the embedded vocabulary; an explicit GGUF tokenizer path works too.
  auto t = engine::LoadTokenizerFor(ModelsDir() + "/llama-2-tiny-random.gguf", "", 32000);
  ASSERT_TRUE(t.ok() && *t != nullptr) << t.status().ToString();
  EXPECT_EQ((*t)->vocab_size(), 32000);
  auto t2 = engine::LoadTokenizerFor(ModelsDir() + "/stories260K.bin",
                                     ModelsDir() + "/stories260K.gguf", 512);
  ASSERT_TRUE(t2.ok() && *t2 != nullptr) << t2.status().ToString();
  // A tokenizer that does not match the model is a typed error, whichever format it comes in.
  auto bad = engine::LoadTokenizerFor(ModelsDir() + "/stories260K.gguf",
                                      ModelsDir() + "/llama-2-tiny-random.gguf", 512);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("tokenizer has 32000 tokens, model expects 512"),
            std::string::npos)
      << bad.status().ToString();
  auto bad2 = engine::LoadTokenizerFor(ModelsDir() + "/llama-2-tiny-random.gguf", "", 512);
  EXPECT_EQ(bad2.status().code(), ErrorCode::kInvalidArgument);
  // A Hugging Face directory: its tokenizer.json, through OpenEngine (engine/tokenizers/bpe).
  if (HavePythonNumpy()) {
    const fs::path hf =
        fs::temp_directory_path() / ("bitroll_fmt_bpe_" + std::to_string(::getpid()));
    fs::remove_all(hf);
    ASSERT_EQ(std::system(("/usr/bin/python3 " + std::string(BITROLL_SOURCE_DIR) +
                           "/scripts/make-hf-checkpoint.py --tokenizer --out " + hf.string())
                              .c_str()),
              0);
    engine::EngineOptions o;
    o.model_path = hf.string();
    o.kv_cache_bytes = 16 << 20;
    Result<std::unique_ptr<engine::Engine>> e = engine::OpenEngine(o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    ASSERT_NE((*e)->tokenizer(), nullptr);
    Result<std::vector<int32_t>> ids = (*e)->tokenizer()->Encode("hi!", false);
    ASSERT_TRUE(ids.ok()) << ids.status().ToString();
    EXPECT_EQ(*ids, (std::vector<int32_t>{'h', 'i', '!'}));  // byte tokens: id = byte value
    auto out = testing_util::RunAll(**e, {Greedy(1, *ids, 8)});
    EXPECT_EQ(out[1].tokens.size(), 8u);
    // A tokenizer.json that does not parse is a typed error, not a silent fallback.
    std::FILE* f = std::fopen((hf / "tokenizer.json").c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("{broken", f);
    std::fclose(f);
    auto broken = engine::LoadTokenizerFor(hf.string(), "", 256);
    EXPECT_FALSE(broken.ok());
    fs::remove_all(hf);
  }
  // A Hugging Face directory without a tokenizer file has none (nullptr, not an error).
  const fs::path dir =
      fs::temp_directory_path() / ("bitroll_fmt_tok_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto none = engine::LoadTokenizerFor(dir.string(), "", 256);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace bitroll
