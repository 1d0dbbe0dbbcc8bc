// engine/loaders/llama2c.cc: llama2.c checkpoint loader (see the header for the format).
#include "engine/loaders/llama2c.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace bitroll::engine {
namespace {

constexpr int64_t kHeaderBytes = 7 * 4;
constexpr uint32_t kMagicAk42 = 0x616b3432;  // llama2.c export.py version >= 1 ("ak42")
constexpr uint32_t kMagicGguf = 0x46554747;  // "GGUF"

// a * b, or false on overflow / negative operands.
bool MulOk(int64_t a, int64_t b, int64_t* out) {
  if (a < 0 || b < 0) return false;
  return !__builtin_mul_overflow(a, b, out);
}

// Closes the fd on scope exit.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

std::string BaseName(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

Result<ModelWeights> LoadLlama2c(const std::string& path) {
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) {
    const int err = errno;
    if (err == ENOENT) return Status::NotFound("no model file " + path);
    return Status::IoError("cannot open " + path + ": " + std::strerror(err));
  }
  struct stat st;
  if (::fstat(f.fd, &st) != 0)
    return Status::IoError("cannot stat " + path + ": " + std::strerror(errno));
  if (S_ISDIR(st.st_mode))
    return Status::InvalidArgument(path + " is a directory, not a llama2.c file");
  const int64_t file_size = st.st_size;
  if (file_size < kHeaderBytes) {
    return Status::Corruption(path + ": expected at least " + std::to_string(kHeaderBytes) +
                              " bytes (header), file has " + std::to_string(file_size));
  }
  int32_t h[7];
  if (::pread(f.fd, h, sizeof(h), 0) != ssize_t(sizeof(h))) {
    return Status::IoError("cannot read the header of " + path);
  }
  uint32_t magic;
  std::memcpy(&magic, h, 4);
  if (magic == kMagicAk42) {
    return Status::Unsupported(path + ": llama2.c export version " + std::to_string(h[1]) +
                               " (magic \"ak42\"); only the legacy version-0 format is supported");
  }
  if (magic == kMagicGguf)
    return Status::Unsupported(path + ": a GGUF file, not a llama2.c checkpoint");

  ModelConfig c;
  c.arch = "llama";
  c.dim = h[0];
  c.hidden_dim = h[1];
  c.n_layers = h[2];
  c.n_heads = h[3];
  c.n_kv_heads = h[4];
  c.shared_classifier = h[5] > 0;
  c.vocab_size = h[5] == INT32_MIN ? 0 : (h[5] < 0 ? -h[5] : h[5]);
  c.max_seq_len = h[6];
  c.norm_eps = 1e-5f;
  c.rope_theta = 10000.0f;
  c.rope_layout = kernels::RopeLayout::kInterleaved;
  c.qkv_bias = false;
  c.bos_id = 1;
  c.eos_id = 2;
  {
    Status s = c.Validate();
    if (!s.ok()) return s.WithContext(path + " (llama2.c header)");
  }

  // Element counts, in file order, with overflow checks.
  const int64_t dim = c.dim, hidden = c.hidden_dim, layers = c.n_layers, vocab = c.vocab_size;
  const int64_t kv_dim = c.kv_dim(), seq = c.max_seq_len, half_head = c.head_dim() / 2;
  int64_t n_emb = 0, n_dd = 0, n_kd = 0, n_hd = 0, n_ld = 0, n_freq = 0, t = 0;
  bool ok = MulOk(vocab, dim, &n_emb) && MulOk(dim, dim, &n_dd) && MulOk(kv_dim, dim, &n_kd) &&
            MulOk(hidden, dim, &n_hd) && MulOk(layers, dim, &n_ld) &&
            MulOk(seq, half_head, &n_freq);
  int64_t total = 0;
  auto add = [&](int64_t count, int64_t times) {
    ok = ok && MulOk(count, times, &t) && !__builtin_add_overflow(total, t, &total);
  };
  add(n_emb, 1);          // token embedding
  add(n_ld, 1);           // rms_att
  add(n_dd, layers);      // wq
  add(n_kd, layers);      // wk
  add(n_kd, layers);      // wv
  add(n_dd, layers);      // wo
  add(n_ld, 1);           // rms_ffn
  add(n_hd, layers * 3);  // w1, w2, w3
  add(dim, 1);            // rms_final
  add(n_freq, 2);         // freq_cis_real, freq_cis_imag
  if (!c.shared_classifier) add(n_emb, 1);
  int64_t expected = 0;
  ok = ok && MulOk(total, 4, &expected) &&
       !__builtin_add_overflow(expected, kHeaderBytes, &expected);
  if (!ok) return Status::InvalidArgument(path + ": header sizes overflow 64-bit byte counts");
  if (file_size != expected) {
    return Status::Corruption(path + ": expected " + std::to_string(expected) +
                              " bytes for this header, file has " + std::to_string(file_size) +
                              (file_size < expected ? " (truncated)" : " (trailing bytes)"));
  }

  void* map = ::mmap(nullptr, size_t(file_size), PROT_READ, MAP_PRIVATE, f.fd, 0);
  if (map == MAP_FAILED)
    return Status::IoError("cannot mmap " + path + ": " + std::strerror(errno));
  const size_t map_size = size_t(file_size);
  std::shared_ptr<const void> storage(
      map, [map_size](const void* p) { ::munmap(const_cast<void*>(p), map_size); });

  ModelWeights w;
  w.config = c;
  w.storage = storage;
  w.source = "llama2c:" + BaseName(path);
  const float* ptr = reinterpret_cast<const float*>(static_cast<const char*>(map) + kHeaderBytes);
  auto take = [&](std::vector<int64_t> shape) {
    Tensor tensor;
    tensor.data = ptr;
    tensor.dtype = kernels::DType::kF32;
    tensor.shape = std::move(shape);
    ptr += tensor.numel();
    return tensor;
  };
  w.token_embedding = take({vocab, dim});
  w.layers.resize(size_t(layers));
  for (auto& l : w.layers) l.attn_norm = take({dim});
  for (auto& l : w.layers) l.wq = take({dim, dim});
  for (auto& l : w.layers) l.wk = take({kv_dim, dim});
  for (auto& l : w.layers) l.wv = take({kv_dim, dim});
  for (auto& l : w.layers) l.wo = take({dim, dim});
  for (auto& l : w.layers) l.ffn_norm = take({dim});
  for (auto& l : w.layers) l.w1 = take({hidden, dim});
  for (auto& l : w.layers) l.w2 = take({dim, hidden});
  for (auto& l : w.layers) l.w3 = take({hidden, dim});
  w.final_norm = take({dim});
  ptr += 2 * n_freq;  // freq_cis_real, freq_cis_imag: recomputed by the forward pass
  w.classifier = c.shared_classifier ? w.token_embedding : take({vocab, dim});
  w.weights_hash = HashWeights(w);
  return w;
}

}  // namespace bitroll::engine
