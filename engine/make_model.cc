// engine/make_model.cc: reproducible random llama2.c models (see the header).
#include "engine/make_model.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "engine/model_weights.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/philox.h"

namespace bitroll::engine {
namespace {

const ModelShape kShapes[] = {
    {"stories110m", 768, 2048, 12, 12, 12, 32000, 1024},
    {"stories110m-gqa", 768, 2048, 12, 12, 4, 32000, 1024},
    {"stories15m", 288, 768, 6, 6, 6, 32000, 256},
    {"stories260k", 64, 172, 5, 8, 4, 512, 512},
    {"tiny", 32, 64, 2, 4, 2, 300, 128},
    {"qwen0.5b-like", 896, 4864, 24, 14, 2, 151936, 4096},
};

constexpr uint32_t kWeightStream = 0x6D6F646C;  // "mold"

// Buffered writer that remembers the first error.
class Writer {
 public:
  explicit Writer(const std::string& path) : path_(path), f_(std::fopen(path.c_str(), "wb")) {
    if (f_ == nullptr)
      status_ = Status::IoError("cannot create " + path + ": " + std::strerror(errno));
  }
  ~Writer() {
    if (f_ != nullptr) std::fclose(f_);
  }
  void Bytes(const void* data, size_t n) {
    if (!status_.ok() || n == 0) return;
    if (std::fwrite(data, 1, n, f_) != n) status_ = Status::IoError("write failed on " + path_);
  }
  void I32(int32_t v) { Bytes(&v, 4); }
  void F32(float v) { Bytes(&v, 4); }
  void F32s(const std::vector<float>& v) { Bytes(v.data(), v.size() * 4); }
  Status Close() {
    if (f_ != nullptr) {
      if (std::fclose(f_) != 0 && status_.ok())
        status_ = Status::IoError("close failed on " + path_);
      f_ = nullptr;
    }
    return status_;
  }

 private:
  std::string path_;
  FILE* f_;
  Status status_;
};

// Streams `count` weights starting at stream index `*next`.
void WriteWeights(Writer* w, uint64_t seed, int64_t count, uint64_t* next) {
  std::vector<float> buf;
  buf.reserve(1 << 16);
  const kernels::PhiloxKey key = {uint32_t(seed), uint32_t(seed >> 32)};
  constexpr double kScale = 0.02 * 1.7320508075688772;  // 0.02 * sqrt(3)
  for (int64_t i = 0; i < count; ++i) {
    const uint64_t idx = (*next)++;
    const kernels::PhiloxCounter x =
        kernels::Philox4x32_10({uint32_t(idx), uint32_t(idx >> 32), kWeightStream, 0}, key);
    const double sum = (double(x[0]) + double(x[1]) + double(x[2]) + double(x[3])) * 0x1p-32;
    buf.push_back(float(kScale * (sum - 2.0)));
    if (buf.size() == buf.capacity()) {
      w->F32s(buf);
      buf.clear();
    }
  }
  w->F32s(buf);
}

void WriteOnes(Writer* w, int64_t count) {
  w->F32s(std::vector<float>(size_t(count), 1.0f));
}

std::vector<std::string> TokenizerPieces(int32_t vocab) {
  std::vector<std::string> pieces = {"<unk>", "\n<s>\n", "\n</s>\n"};
  char hex[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(hex, sizeof(hex), "<0x%02X>", b);
    pieces.push_back(hex);
  }
  std::string singles = " ";
  for (char c = 'a'; c <= 'z'; ++c) singles += c;
  for (char c = 'A'; c <= 'Z'; ++c) singles += c;
  for (char c = '0'; c <= '9'; ++c) singles += c;
  for (int c = 0x21; c <= 0x7e; ++c) {
    if (!std::isalnum(c)) singles += char(c);
  }
  for (char c : singles) {
    if (int32_t(pieces.size()) >= vocab) return pieces;
    pieces.push_back(std::string(1, c));
  }
  const std::string alphabet = " abcdefghijklmnopqrstuvwxyz";
  const int a = int(alphabet.size());
  for (int len = 2; len <= 4; ++len) {
    int total = 1;
    for (int k = 0; k < len; ++k) total *= a;
    for (int code = 0; code < total; ++code) {
      if (int32_t(pieces.size()) >= vocab) return pieces;
      std::string s(size_t(len), ' ');
      for (int k = len - 1, c = code; k >= 0; --k, c /= a) s[size_t(k)] = alphabet[size_t(c % a)];
      pieces.push_back(s);
    }
  }
  // Beyond 3 + 256 + 95 + 27^2 + 27^3 + 27^4 pieces: numbered fillers.
  for (int32_t k = 0; int32_t(pieces.size()) < vocab; ++k)
    pieces.push_back("tok" + std::to_string(k));
  return pieces;
}

}  // namespace

Result<ModelShape> NamedShape(std::string_view name) {
  return FindShape(kShapes, name);
}

Status WriteRandomModel(const ModelShape& shape, uint64_t seed, const std::string& model_path,
                        const std::string& tokenizer_path) {
  ModelConfig c;
  c.dim = shape.dim;
  c.hidden_dim = shape.hidden_dim;
  c.n_layers = shape.n_layers;
  c.n_heads = shape.n_heads;
  c.n_kv_heads = shape.n_kv_heads;
  c.vocab_size = shape.vocab_size;
  c.max_seq_len = shape.max_seq_len;
  BR_RETURN_IF_ERROR(c.Validate());
  if (c.vocab_size < 259) {
    return Status::InvalidArgument("vocab_size " + std::to_string(c.vocab_size) +
                                   " < 259: the tokenizer needs <unk>, BOS, EOS and 256 bytes");
  }

  {
    Writer w(model_path);
    for (int32_t v :
         {c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size, c.max_seq_len}) {
      w.I32(v);
    }
    const int64_t dim = c.dim, hidden = c.hidden_dim, layers = c.n_layers, kv = c.kv_dim();
    uint64_t next = 0;
    WriteWeights(&w, seed, int64_t(c.vocab_size) * dim, &next);  // token embedding
    WriteOnes(&w, layers * dim);                                 // rms_att
    WriteWeights(&w, seed, layers * dim * dim, &next);           // wq
    WriteWeights(&w, seed, layers * kv * dim, &next);            // wk
    WriteWeights(&w, seed, layers * kv * dim, &next);            // wv
    WriteWeights(&w, seed, layers * dim * dim, &next);           // wo
    WriteOnes(&w, layers * dim);                                 // rms_ffn
    WriteWeights(&w, seed, layers * hidden * dim * 3, &next);    // w1, w2, w3
    WriteOnes(&w, dim);                                          // rms_final
    const int64_t half = c.head_dim() / 2, seq = c.max_seq_len;
    std::vector<float> cos(size_t(seq * half)), sin(size_t(seq * half));
    kernels::RopeTable(10000.0f, c.head_dim(), seq, cos.data(), sin.data());
    w.F32s(cos);  // freq_cis_real
    w.F32s(sin);  // freq_cis_imag
    BR_RETURN_IF_ERROR(w.Close());
  }

  Writer t(tokenizer_path);
  const std::vector<std::string> pieces = TokenizerPieces(c.vocab_size);
  int32_t max_len = 0;
  for (const std::string& p : pieces) max_len = std::max(max_len, int32_t(p.size()));
  t.I32(max_len);
  float next_score = -1.0f;
  for (const std::string& p : pieces) {
    const bool merged = p.size() >= 2 && p[0] != '<' && p[0] != '\n';
    t.F32(merged ? next_score : 0.0f);
    if (merged) next_score -= 1.0f;
    t.I32(int32_t(p.size()));
    t.Bytes(p.data(), p.size());
  }
  return t.Close();
}

}  // namespace bitroll::engine
