// Tests for engine/loaders/gguf: the parser on real and hand-built files, the Llama mapping
// against the llama2.c loader (same model, two formats), the embedded tokenizer, bad input, and a
// bounded mutation smoke test of the header parser.
#include "engine/loaders/gguf.h"

#include <gtest/gtest.h>

#include <unistd.h>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "engine/loaders/llama2c.h"
#include "engine/loaders/mapped_file.h"
#include "engine/tokenizers/llama2c_tokenizer.h"

namespace bitroll::engine {
namespace {

std::string ModelsDir() {
  const char* env = std::getenv("BITROLL_MODELS_DIR");
  return env != nullptr && *env != '\0' ? env : BITROLL_MODELS_DIR;
}

std::string TempPath(const std::string& name) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return (std::filesystem::temp_directory_path() /
          ("bitroll_gguf_" + std::to_string(::getpid()) + "_" + info->name() + "_" + name))
      .string();
}

// Builds GGUF files by hand (little-endian, as the spec describes), independently of the parser.
class GgufBuilder {
 public:
  explicit GgufBuilder(uint32_t version = 3) : version_(version) {}

  void Str(std::string* o, const std::string& s) {
    Pod(o, uint64_t(s.size()));
    o->append(s);
  }
  template <typename T>
  static void Pod(std::string* o, T v) {
    o->append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  // Raw key/value: `value` is the encoded value for `type`.
  void Kv(const std::string& key, GgufType type, const std::string& value) {
    Str(&kv_, key);
    Pod(&kv_, uint32_t(type));
    kv_ += value;
    ++n_kv_;
  }
  void U32(const std::string& key, uint32_t v) {
    std::string s;
    Pod(&s, v);
    Kv(key, GgufType::kUint32, s);
  }
  void F32(const std::string& key, float v) {
    std::string s;
    Pod(&s, v);
    Kv(key, GgufType::kFloat32, s);
  }
  void String(const std::string& key, const std::string& v) {
    std::string s;
    Str(&s, v);
    Kv(key, GgufType::kString, s);
  }
  // A tensor with given ggml dims (fastest first) and type; `bytes` of data (zero-filled when
  // shorter than `size`). Offsets are assigned in order, aligned to 32.
  void Tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type, size_t size,
              const void* bytes = nullptr) {
    Str(&ti_, name);
    Pod(&ti_, uint32_t(ne.size()));
    for (uint64_t d : ne) Pod(&ti_, d);
    Pod(&ti_, type);
    while (data_.size() % align_ != 0) data_.push_back('\0');
    Pod(&ti_, uint64_t(data_.size()));
    const size_t at = data_.size();
    data_.resize(at + size, '\0');
    if (bytes != nullptr) std::memcpy(&data_[at], bytes, size);
    ++n_tensors_;
  }
  // F32 tensor of `numel` small values.
  void F32Tensor(const std::string& name, std::vector<uint64_t> ne) {
    size_t n = 1;
    for (uint64_t d : ne) n *= d;
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = float((i * 7 + name.size()) % 13) / 13.0f - 0.5f;
    Tensor(name, ne, 0, n * 4, v.data());
  }
  // Declares general.alignment and pads to it.
  void Align(uint32_t a) {
    U32("general.alignment", a);
    align_ = a;
  }
  std::string Build() const {
    std::string o;
    Pod(&o, uint32_t(0x46554747));
    Pod(&o, version_);
    Pod(&o, n_tensors_);
    Pod(&o, n_kv_);
    o += kv_;
    o += ti_;
    while (o.size() % align_ != 0) o.push_back('\0');
    return o + data_;
  }

 private:
  uint32_t version_;
  uint32_t align_ = 32;
  uint64_t n_kv_ = 0, n_tensors_ = 0;
  std::string kv_, ti_, data_;
};

// A complete tiny llama GGUF: dim 32, 2 heads, 1 kv head (kv_dim 16), hidden 64, 2 layers,
// vocab 16. `skip` names a tensor to leave out; `q_type` is the ggml type of blk.0.attn_q.weight.
GgufBuilder TinyLlama(const std::string& skip = "", uint32_t q_type = 0,
                      const std::string& arch = "llama") {
  GgufBuilder b;
  b.String("general.architecture", arch);
  const std::string p = arch + ".";
  b.U32(p + "embedding_length", 32);
  b.U32(p + "feed_forward_length", 64);
  b.U32(p + "block_count", 2);
  b.U32(p + "attention.head_count", 2);
  b.U32(p + "attention.head_count_kv", 1);
  b.U32(p + "context_length", 64);
  b.F32(p + "attention.layer_norm_rms_epsilon", 1e-5f);
  b.F32(p + "rope.freq_base", 500000.0f);
  auto add = [&](const std::string& n, std::vector<uint64_t> ne) {
    if (n == skip) return;
    if (n == "blk.0.attn_q.weight" && q_type != 0) {
      b.Tensor(n, ne, q_type, 32 * 32 / 32 * 18);  // Q4_0: 18 bytes per 32 elements
      return;
    }
    b.F32Tensor(n, ne);
  };
  add("token_embd.weight", {32, 16});
  for (int l = 0; l < 2; ++l) {
    const std::string k = "blk." + std::to_string(l) + ".";
    add(k + "attn_norm.weight", {32});
    add(k + "attn_q.weight", {32, 32});
    add(k + "attn_k.weight", {32, 16});
    add(k + "attn_v.weight", {32, 16});
    add(k + "attn_output.weight", {32, 32});
    add(k + "ffn_norm.weight", {32});
    add(k + "ffn_gate.weight", {32, 64});
    add(k + "ffn_up.weight", {32, 64});
    add(k + "ffn_down.weight", {64, 32});
  }
  add("output_norm.weight", {32});
  return b;
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
}

Result<GgufFile> Parse(const std::string& bytes) {
  return ParseGguf(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

// ---- the real files ----------------------------------------------------------------------------

TEST(Gguf, ParsesStories260KHeader) {
  auto map = MapFile(ModelsDir() + "/stories260K.gguf");
  ASSERT_TRUE(map.ok()) << map.status().ToString();
  Result<GgufFile> f = ParseGguf((*map)->data, (*map)->size);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->version, 3u);
  EXPECT_EQ(f->tensors.size(), 3u + 5u * 9u);  // embd, output_norm, output + 9 per layer
  EXPECT_EQ(*f->GetString("general.architecture"), "llama");
  EXPECT_EQ(*f->GetInt("llama.embedding_length"), 64);  // stories260K: dim 64 (README)
  EXPECT_EQ(*f->GetInt("llama.block_count"), 5);
  EXPECT_EQ(*f->GetInt("llama.attention.head_count_kv"), 4);
  const GgufTensorInfo* emb = f->FindTensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->ne, (std::vector<uint64_t>{64, 512}));  // ggml order: fastest first
  EXPECT_EQ(f->data_offset % 32, 0u);
  const GgufValue* toks = f->Find("tokenizer.ggml.tokens");
  ASSERT_NE(toks, nullptr);
  EXPECT_EQ(toks->array.size(), 512u);
  EXPECT_EQ(toks->array[1].str, "<s>");
  EXPECT_EQ(f->GetInt("no.such.key").status().code(), ErrorCode::kNotFound);
  EXPECT_EQ(f->GetInt("general.architecture").status().code(), ErrorCode::kCorruption);
}

// The GGUF conversion of stories260K carries llama2.c's weights unchanged: every tensor's bytes
// equal the .bin's (memcmp), under the same config.
TEST(Gguf, Stories260KTensorsEqualTheLlama2cFile) {
  Result<ModelWeights> g = LoadGguf(ModelsDir() + "/stories260K.gguf");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  Result<ModelWeights> b = LoadLlama2c(ModelsDir() + "/stories260K.bin");
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  const ModelConfig &gc = g->config, &bc = b->config;
  EXPECT_EQ(gc.dim, bc.dim);
  EXPECT_EQ(gc.hidden_dim, bc.hidden_dim);
  EXPECT_EQ(gc.n_layers, bc.n_layers);
  EXPECT_EQ(gc.n_heads, bc.n_heads);
  EXPECT_EQ(gc.n_kv_heads, bc.n_kv_heads);
  EXPECT_EQ(gc.vocab_size, bc.vocab_size);
  EXPECT_EQ(gc.max_seq_len, 128);  // the converter wrote context_length 128
  EXPECT_EQ(gc.rope_layout, kernels::RopeLayout::kInterleaved);
  EXPECT_EQ(gc.rope_theta, 10000.0f);
  EXPECT_EQ(gc.norm_eps, 1e-5f);
  EXPECT_EQ(gc.bos_id, 1);
  EXPECT_EQ(gc.eos_id, 2);
  auto same = [](const Tensor& x, const Tensor& y, const std::string& what) {
    ASSERT_EQ(x.shape, y.shape) << what;
    ASSERT_EQ(x.dtype, y.dtype) << what;
    EXPECT_EQ(std::memcmp(x.data, y.data, size_t(x.size_bytes())), 0) << what;
  };
  same(g->token_embedding, b->token_embedding, "token_embedding");
  same(g->final_norm, b->final_norm, "final_norm");
  same(g->classifier, b->classifier, "classifier");  // output.weight = copy of the embedding
  for (size_t l = 0; l < b->layers.size(); ++l) {
    const LayerWeights &x = g->layers[l], &y = b->layers[l];
    const std::string L = "layer " + std::to_string(l) + " ";
    same(x.attn_norm, y.attn_norm, L + "attn_norm");
    same(x.wq, y.wq, L + "wq");
    same(x.wk, y.wk, L + "wk");
    same(x.wv, y.wv, L + "wv");
    same(x.wo, y.wo, L + "wo");
    same(x.ffn_norm, y.ffn_norm, L + "ffn_norm");
    same(x.w1, y.w1, L + "w1");
    same(x.w2, y.w2, L + "w2");
    same(x.w3, y.w3, L + "w3");
  }
  // Negative control: the comparison sees a difference between two different tensors.
  EXPECT_NE(
      std::memcmp(g->layers[0].wq.data, b->layers[1].wq.data, size_t(g->layers[0].wq.size_bytes())),
      0);
}

TEST(Gguf, EmbeddedVocabularyEncodesLikeTok512) {
  Result<std::unique_ptr<Tokenizer>> g = LoadGgufTokenizer(ModelsDir() + "/stories260K.gguf", 512);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  Result<std::unique_ptr<Tokenizer>> b = LoadLlama2cTokenizer(ModelsDir() + "/tok512.bin", 512);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  // run.c's reference tokens for this prompt (models/README.txt): 1 403 407 261 378.
  Result<std::vector<int32_t>> once = (*g)->Encode("Once upon a time", true);
  ASSERT_TRUE(once.ok());
  EXPECT_EQ(*once, (std::vector<int32_t>{1, 403, 407, 261, 378}));
  for (const char* text : {"Once upon a time", "Lily and Tom went to the park.\nThe sun was hot!",
                           "caf\xC3\xA9 \xE2\x82\xAC 42", "", "  two  spaces"}) {
    Result<std::vector<int32_t>> x = (*g)->Encode(text, true);
    Result<std::vector<int32_t>> y = (*b)->Encode(text, true);
    ASSERT_TRUE(x.ok() && y.ok()) << text;
    EXPECT_EQ(*x, *y) << text;
    // Decoded after BOS (tok512.bin spells BOS "\n<s>\n", the GGUF "<s>").
    const std::span<const int32_t> xs(*x), ys(*y);
    Result<std::string> dx = (*g)->Decode(xs.subspan(1), 1);
    Result<std::string> dy = (*b)->Decode(ys.subspan(1), 1);
    ASSERT_TRUE(dx.ok() && dy.ok());
    EXPECT_EQ(*dx, *dy) << text;
  }
  EXPECT_EQ(LoadGgufTokenizer(ModelsDir() + "/stories260K.gguf", 32000).status().code(),
            ErrorCode::kInvalidArgument);
}

TEST(Gguf, LoadsLlama2TinyRandomF16) {
  const std::string path = ModelsDir() + "/llama-2-tiny-random.gguf";
  Result<ModelWeights> w = LoadGguf(path, GgufLoadOptions{.max_seq_len = 256});
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->config.dim, 8);
  EXPECT_EQ(w->config.head_dim(), 4);
  EXPECT_EQ(w->config.vocab_size, 32000);
  EXPECT_EQ(w->config.max_seq_len, 256);  // capped from 4096
  EXPECT_FALSE(w->config.shared_classifier);
  EXPECT_EQ(w->token_embedding.dtype, kernels::DType::kF16);
  EXPECT_EQ(w->layers[0].attn_norm.dtype, kernels::DType::kF32);
  Result<std::unique_ptr<Tokenizer>> t = LoadGgufTokenizer(path, 32000);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  // Llama-2's SentencePiece ids: "▁Hello" = 15043, "▁world" = 3186.
  Result<std::vector<int32_t>> ids = (*t)->Encode("Hello world", true);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int32_t>{1, 15043, 3186}));
  const std::string text = "The quick brown fox, \xE2\x9C\x93 done.\n";
  Result<std::vector<int32_t>> enc = (*t)->Encode(text, true);
  ASSERT_TRUE(enc.ok());
  Result<std::string> dec = (*t)->Decode(std::span<const int32_t>(*enc).subspan(1), (*enc)[0]);
  ASSERT_TRUE(dec.ok());
  EXPECT_EQ(*dec, text);
}

// ---- hand-built files --------------------------------------------------------------------------

TEST(Gguf, ParsesEveryValueTypeAndNestedArrays) {
  GgufBuilder b(2);
  std::string v;
  GgufBuilder::Pod(&v, uint8_t(200));
  b.Kv("u8", GgufType::kUint8, v);
  v.clear();
  GgufBuilder::Pod(&v, int8_t(-5));
  b.Kv("i8", GgufType::kInt8, v);
  v.clear();
  GgufBuilder::Pod(&v, uint16_t(60000));
  b.Kv("u16", GgufType::kUint16, v);
  v.clear();
  GgufBuilder::Pod(&v, int16_t(-30000));
  b.Kv("i16", GgufType::kInt16, v);
  v.clear();
  GgufBuilder::Pod(&v, int32_t(-7));
  b.Kv("i32", GgufType::kInt32, v);
  v.clear();
  GgufBuilder::Pod(&v, uint64_t(1) << 40);
  b.Kv("u64", GgufType::kUint64, v);
  v.clear();
  GgufBuilder::Pod(&v, int64_t(-(int64_t(1) << 40)));
  b.Kv("i64", GgufType::kInt64, v);
  v.clear();
  GgufBuilder::Pod(&v, 2.5);
  b.Kv("f64", GgufType::kFloat64, v);
  v.clear();
  GgufBuilder::Pod(&v, uint8_t(1));
  b.Kv("bool", GgufType::kBool, v);
  // [[ "a", "bc" ], []] : array of arrays of strings
  v.clear();
  GgufBuilder::Pod(&v, uint32_t(GgufType::kArray));
  GgufBuilder::Pod(&v, uint64_t(2));
  GgufBuilder::Pod(&v, uint32_t(GgufType::kString));
  GgufBuilder::Pod(&v, uint64_t(2));
  b.Str(&v, "a");
  b.Str(&v, "bc");
  GgufBuilder::Pod(&v, uint32_t(GgufType::kString));
  GgufBuilder::Pod(&v, uint64_t(0));
  b.Kv("nested", GgufType::kArray, v);
  b.Align(64);
  b.F32Tensor("t", {3});
  Result<GgufFile> f = Parse(b.Build());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->version, 2u);
  EXPECT_EQ(*f->GetInt("u8"), 200);
  EXPECT_EQ(*f->GetInt("i8"), -5);
  EXPECT_EQ(*f->GetInt("u16"), 60000);
  EXPECT_EQ(*f->GetInt("i16"), -30000);
  EXPECT_EQ(*f->GetInt("i32"), -7);
  EXPECT_EQ(*f->GetInt("u64"), int64_t(1) << 40);
  EXPECT_EQ(*f->GetInt("i64"), -(int64_t(1) << 40));
  EXPECT_EQ(*f->GetFloat("f64"), 2.5);
  EXPECT_EQ(f->Find("bool")->u64, 1u);
  const GgufValue* n = f->Find("nested");
  ASSERT_NE(n, nullptr);
  ASSERT_EQ(n->array.size(), 2u);
  EXPECT_EQ(n->array[0].array[1].str, "bc");
  EXPECT_TRUE(n->array[1].array.empty());
  EXPECT_EQ(f->alignment, 64u);
  EXPECT_EQ(f->data_offset % 64, 0u);
}

TEST(Gguf, LoadsAHandBuiltLlama) {
  const std::string path = TempPath("tiny.gguf");
  WriteFile(path, TinyLlama().Build());
  Result<ModelWeights> w = LoadGguf(path);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->config.n_kv_heads, 1);
  EXPECT_EQ(w->config.kv_dim(), 16);
  EXPECT_EQ(w->config.rope_theta, 500000.0f);
  EXPECT_TRUE(w->config.shared_classifier);  // no output.weight: tied
  EXPECT_EQ(w->classifier.data, w->token_embedding.data);
  EXPECT_EQ(w->layers[1].wk.shape, (std::vector<int64_t>{16, 32}));
  std::remove(path.c_str());
}

struct BadCase {
  const char* name;
  std::string bytes;
  ErrorCode code;
  const char* message_part;
};

TEST(Gguf, BadHeadersGiveTypedErrors) {
  const std::string good = TinyLlama().Build();
  auto patch = [&](size_t at, const void* p, size_t n) {
    std::string s = good;
    std::memcpy(&s[at], p, n);
    return s;
  };
  const uint32_t v1 = 1, v9 = 9, be = 0x03000000;
  const uint64_t huge = uint64_t(1) << 62;
  std::vector<BadCase> cases = {
      {"bad magic", "GGUX" + good.substr(4), ErrorCode::kCorruption, "bad magic"},
      {"version 1", patch(4, &v1, 4), ErrorCode::kUnsupported, "version 1"},
      {"version 9", patch(4, &v9, 4), ErrorCode::kUnsupported, "version 9"},
      {"big endian", patch(4, &be, 4), ErrorCode::kUnsupported, "big-endian"},
      {"absurd tensor count", patch(8, &huge, 8), ErrorCode::kCorruption, "tensor count"},
      {"absurd kv count", patch(16, &huge, 8), ErrorCode::kCorruption, "metadata count"},
      {"key length past end", patch(24, &huge, 8), ErrorCode::kCorruption, "metadata key"},
      {"empty", "", ErrorCode::kCorruption, "truncated"},
  };
  // Hand-built single-purpose files.
  {
    GgufBuilder b;
    std::string v;
    GgufBuilder::Pod(&v, uint32_t(GgufType::kUint8));
    GgufBuilder::Pod(&v, huge);
    b.Kv("arr", GgufType::kArray, v);
    cases.push_back({"absurd array length", b.Build(), ErrorCode::kCorruption, "array of"});
  }
  {
    GgufBuilder b;
    std::string v;
    GgufBuilder::Pod(&v, uint32_t(99));
    b.Kv("x", GgufType(99), v);
    cases.push_back(
        {"unknown value type", b.Build(), ErrorCode::kCorruption, "unknown value type"});
  }
  {
    GgufBuilder b;
    std::string v;
    for (int d = 0; d < 20; ++d) {
      GgufBuilder::Pod(&v, uint32_t(GgufType::kArray));
      GgufBuilder::Pod(&v, uint64_t(1));
    }
    GgufBuilder::Pod(&v, uint32_t(GgufType::kUint8));
    GgufBuilder::Pod(&v, uint64_t(0));
    b.Kv("deep", GgufType::kArray, v);
    cases.push_back({"deep nesting", b.Build(), ErrorCode::kCorruption, "nested deeper"});
  }
  {
    GgufBuilder b;
    b.U32("general.alignment", 24);
    cases.push_back({"bad alignment", b.Build(), ErrorCode::kCorruption, "power of two"});
  }
  {
    GgufBuilder b;
    b.U32("k", 1);
    b.U32("k", 2);
    cases.push_back({"duplicate key", b.Build(), ErrorCode::kCorruption, "duplicate metadata"});
  }
  {
    GgufBuilder b;
    b.F32Tensor("a", {4});
    b.F32Tensor("a", {4});
    cases.push_back({"duplicate tensor", b.Build(), ErrorCode::kCorruption, "duplicate tensor"});
  }
  {
    GgufBuilder b;
    b.Tensor("q", {31}, 2, 18);  // Q4_0 row of 31: not a block multiple
    cases.push_back({"partial block", b.Build(), ErrorCode::kCorruption, "multiple of its block"});
  }
  {
    GgufBuilder b;
    b.Tensor("x", {4}, 77, 16);
    cases.push_back({"unknown ggml type", b.Build(), ErrorCode::kCorruption, "unknown ggml type"});
  }
  {
    GgufBuilder b;
    b.Tensor("x", {4, 0}, 0, 0);
    cases.push_back({"zero dim", b.Build(), ErrorCode::kCorruption, "zero or too large"});
  }
  {
    GgufBuilder b;
    b.F32Tensor("big", {1024});
    std::string s = b.Build();
    s.resize(s.size() - 100);  // data section shorter than the tensor
    cases.push_back({"tensor past end", s, ErrorCode::kCorruption, "past the end"});
  }
  {
    // Two tensors, the second's offset rewritten to overlap the first.
    GgufBuilder b;
    b.F32Tensor("first", {16});
    b.F32Tensor("second", {16});
    std::string s = b.Build();
    const std::string name = "second";
    const size_t at = s.find(name) + name.size() + 4 + 8 + 4;  // n_dims, ne[0], type
    const uint64_t off = 32;
    std::memcpy(&s[at], &off, 8);
    cases.push_back({"overlapping tensors", s, ErrorCode::kCorruption, "overlap"});
    const uint64_t odd = 36;
    std::memcpy(&s[at], &odd, 8);
    cases.push_back({"misaligned tensor", s, ErrorCode::kCorruption, "not a multiple"});
  }
  for (const BadCase& c : cases) {
    Result<GgufFile> f = Parse(c.bytes);
    ASSERT_FALSE(f.ok()) << c.name;
    EXPECT_EQ(f.status().code(), c.code) << c.name << ": " << f.status().ToString();
    EXPECT_NE(f.status().message().find(c.message_part), std::string::npos)
        << c.name << ": " << f.status().ToString();
  }
  // Every strict prefix of a valid file is rejected (the data section is part of the check).
  for (size_t n = 0; n < good.size(); n += (n < 600 ? 1 : 97)) {
    EXPECT_FALSE(Parse(good.substr(0, n)).ok()) << "prefix of " << n << " bytes";
  }
  EXPECT_TRUE(Parse(good).ok());
}

TEST(Gguf, LoaderErrorsNameWhatIsWrong) {
  struct Case {
    const char* name;
    GgufBuilder b;
    ErrorCode code;
    const char* part;
  };
  std::vector<Case> cases = {
      {"quantized", TinyLlama("", 2), ErrorCode::kUnsupported, "blk.0.attn_q.weight has type Q4_0"},
      {"missing tensor", TinyLlama("blk.1.ffn_up.weight"), ErrorCode::kNotFound,
       "missing tensor blk.1.ffn_up.weight"},
      {"architecture", TinyLlama("", 0, "mamba"), ErrorCode::kUnsupported, "\"mamba\""},
      {"qwen2 without biases", TinyLlama("", 0, "qwen2"), ErrorCode::kNotFound,
       "missing tensor blk.0.attn_q.bias"},
  };
  {
    GgufBuilder b = TinyLlama();
    b.F32Tensor("output.weight", {32, 15});  // vocab 15 != 16
    cases.push_back({"wrong shape", b, ErrorCode::kInvalidArgument, "output.weight has shape"});
  }
  {
    GgufBuilder b = TinyLlama();
    b.U32("llama.rope.dimension_count", 2);
    cases.push_back({"partial rope", b, ErrorCode::kUnsupported, "partial RoPE"});
  }
  for (Case& c : cases) {
    const std::string path = TempPath("bad.gguf");
    WriteFile(path, c.b.Build());
    Result<ModelWeights> w = LoadGguf(path);
    ASSERT_FALSE(w.ok()) << c.name;
    EXPECT_EQ(w.status().code(), c.code) << c.name << ": " << w.status().ToString();
    EXPECT_NE(w.status().message().find(c.part), std::string::npos)
        << c.name << ": " << w.status().ToString();
    std::remove(path.c_str());
  }
  EXPECT_EQ(LoadGguf(TempPath("absent.gguf")).status().code(), ErrorCode::kNotFound);
}

// Bounded mutation smoke test: thousands of mutated copies of real headers go through the same
// parse function the libFuzzer target drives. Passing means no crash, hang or sanitizer report,
// and every rejection is a typed header error.
TEST(Gguf, MutatedHeadersNeverCrash) {
  std::vector<std::string> seeds = {TinyLlama().Build()};
  {
    std::ifstream in(ModelsDir() + "/stories260K.gguf", std::ios::binary);
    std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!s.empty()) seeds.push_back(s.substr(0, 14200));  // the header (ends at 14152)
  }
  std::mt19937_64 rng(1234);
  int ok = 0, rejected = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    std::string s = seeds[iter % seeds.size()];
    const int edits = 1 + int(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % s.size();
      switch (rng() % 4) {
        case 0:
          s[at] = char(rng());
          break;   // random byte
        case 1: {  // an interesting 8-byte value
          const uint64_t vals[] = {0, 1, 0xFFFFFFFFull, ~0ull, 1ull << 62, 32, 8};
          const uint64_t v = vals[rng() % 7];
          std::memcpy(&s[at], &v, std::min<size_t>(8, s.size() - at));
          break;
        }
        case 2:
          s.resize(at);
          break;  // truncate
        default:
          s.insert(at, 1 + rng() % 8, char(rng()));
          break;
      }
      if (s.empty()) break;
    }
    GgufParseOptions opt;
    opt.check_data_bounds = iter % 2 == 0;
    Result<GgufFile> f = ParseGguf(reinterpret_cast<const uint8_t*>(s.data()), s.size(), opt);
    if (f.ok()) {
      ++ok;
    } else {
      ++rejected;
      ASSERT_TRUE(f.status().code() == ErrorCode::kCorruption ||
                  f.status().code() == ErrorCode::kUnsupported)
          << f.status().ToString();
      ASSERT_FALSE(f.status().message().empty());
    }
  }
  EXPECT_GT(rejected, 1000);  // the mutations do reach the checks
  std::printf("gguf mutation smoke: %d accepted, %d rejected\n", ok, rejected);
}

}  // namespace
}  // namespace bitroll::engine
