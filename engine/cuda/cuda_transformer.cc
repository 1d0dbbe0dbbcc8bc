// engine/cuda/cuda_transformer.cc: see cuda_transformer.h.
#include "engine/cuda/cuda_transformer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "engine/cuda/engine_ops.h"
#include "engine/transformer.h"  // TensorRowToF32
#include "kernels/cpu/math.h"    // F32ToBf16
#include "kernels/cpu/ops.h"     // RopeTable
#include "kernels/cuda/attention.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/ops.h"

namespace bitroll::engine::cuda {

namespace kc = kernels::cuda;

namespace {

Status CudaError(cudaError_t err, const std::string& what) {
  const std::string msg =
      "cuda: " + what + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
  if (err == cudaErrorMemoryAllocation) return Status::ResourceExhausted(msg);
  return Status::Internal(msg);
}

#define BR_CUDA_CALL(expr, what)             \
  do {                                       \
    const cudaError_t br_cuda_err_ = (expr); \
    if (br_cuda_err_ != cudaSuccess) {       \
      return CudaError(br_cuda_err_, what);  \
    }                                        \
  } while (0)

int64_t Pad8(int64_t k) {
  return (k + 7) / 8 * 8;
}

Status CheckTensor(const Tensor& t, int64_t rows, int64_t cols, const char* what) {
  if (t.data == nullptr)
    return Status::InvalidArgument(std::string("cuda: missing weight ") + what);
  if (t.numel() != rows * cols) {
    return Status::InvalidArgument(std::string("cuda: weight ") + what + " has " +
                                   std::to_string(t.numel()) + " elements, expected " +
                                   std::to_string(rows) + " x " + std::to_string(cols));
  }
  return Status::Ok();
}

kc::CudaAttentionKernel ToCuda(kernels::AttentionKernel k) {
  switch (k) {
    case kernels::AttentionKernel::kSingle:
      return kc::CudaAttentionKernel::kSingle;
    case kernels::AttentionKernel::kSplit:
      return kc::CudaAttentionKernel::kSplit;
    default:
      return kc::CudaAttentionKernel::kAuto;
  }
}

struct Part {
  const Tensor* t;
  int64_t rows;
  const char* what;
};

// Stacks the parts along N, rounds to bf16 (nearest even) with K padded to a multiple of 8 by
// zero columns, and uploads. With `split`, the rounding residue w - bf16(w) (exact in fp32) is
// rounded to bf16 too and uploaded to `lo` when any element of it is non-zero (fp32 / f16
// sources); bf16 sources have none.
Status UploadMatrix(std::initializer_list<Part> parts, int64_t k, bool split, DeviceBuffer* data,
                    DeviceBuffer* lo, int64_t* n_out, int64_t* k_out) {
  int64_t n = 0;
  for (const Part& p : parts) {
    BR_RETURN_IF_ERROR(CheckTensor(*p.t, p.rows, k, p.what));
    n += p.rows;
  }
  const int64_t kp = Pad8(k);
  bool all_bf16 = true;  // bf16 sources round-trip exactly: no low half to look for
  for (const Part& p : parts) all_bf16 = all_bf16 && p.t->dtype == kernels::DType::kBF16;
  split = split && !all_bf16;
  std::vector<uint16_t> host(static_cast<size_t>(n * kp), 0);
  std::vector<uint16_t> host_lo(split ? static_cast<size_t>(n * kp) : 0, 0);
  bool any_lo = false;
  std::vector<float> row(static_cast<size_t>(k));
  int64_t at = 0;
  for (const Part& p : parts) {
    for (int64_t r = 0; r < p.rows; ++r, ++at) {
      TensorRowToF32(*p.t, r, k, row.data());
      uint16_t* dst = host.data() + at * kp;
      for (int64_t i = 0; i < k; ++i) {
        const float v = row[static_cast<size_t>(i)];
        dst[i] = kernels::F32ToBf16(v);
        if (split) {
          const uint16_t l = kernels::F32ToBf16(v - kernels::Bf16ToF32(dst[i]));
          host_lo[static_cast<size_t>(at * kp + i)] = l;
          any_lo = any_lo || (l & 0x7FFFu) != 0;
        }
      }
    }
  }
  BR_RETURN_IF_ERROR(data->Allocate(host.size() * sizeof(uint16_t), parts.begin()->what));
  BR_CUDA_CALL(cudaMemcpy(data->as<void>(), host.data(), host.size() * sizeof(uint16_t),
                          cudaMemcpyHostToDevice),
               "uploading a weight matrix");
  BR_RETURN_IF_ERROR(lo->Allocate(0, parts.begin()->what));
  if (any_lo) {
    BR_RETURN_IF_ERROR(lo->Allocate(host_lo.size() * sizeof(uint16_t), parts.begin()->what));
    BR_CUDA_CALL(cudaMemcpy(lo->as<void>(), host_lo.data(), host_lo.size() * sizeof(uint16_t),
                            cudaMemcpyHostToDevice),
                 "uploading a weight matrix (low half)");
  }
  *n_out = n;
  *k_out = kp;
  return Status::Ok();
}

Status UploadF32(const float* src, int64_t n, DeviceBuffer* dst, const char* what) {
  BR_RETURN_IF_ERROR(dst->Allocate(static_cast<size_t>(n) * sizeof(float), what));
  BR_CUDA_CALL(cudaMemcpy(dst->as<void>(), src, static_cast<size_t>(n) * sizeof(float),
                          cudaMemcpyHostToDevice),
               std::string("uploading ") + what);
  return Status::Ok();
}

Status UploadVector(const Tensor& t, int64_t n, DeviceBuffer* dst, const char* what) {
  BR_RETURN_IF_ERROR(CheckTensor(t, 1, n, what));
  std::vector<float> host(static_cast<size_t>(n));
  TensorRowToF32(t, 0, n, host.data());
  return UploadF32(host.data(), n, dst, what);
}

}  // namespace

Status CudaDeviceStatus(int device) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the error state of this thread
    return Status::Unavailable(std::string("no CUDA device: ") + cudaGetErrorString(err));
  }
  if (count == 0) return Status::Unavailable("no CUDA device: cudaGetDeviceCount found none");
  if (device < 0 || device >= count) {
    return Status::Unavailable("no CUDA device: device " + std::to_string(device) + " requested, " +
                               std::to_string(count) + " present");
  }
  int major = 0, minor = 0;
  err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  }
  if (err != cudaSuccess) {
    cudaGetLastError();
    return Status::Unavailable(std::string("no CUDA device: ") + cudaGetErrorString(err));
  }
  if (major < 9) {
    return Status::Unavailable("CUDA device " + std::to_string(device) + " is sm_" +
                               std::to_string(major) + std::to_string(minor) +
                               "; this build has code for sm_90 and newer only");
  }
  return Status::Ok();
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (p_ != nullptr) cudaFree(p_);
    p_ = o.p_;
    bytes_ = o.bytes_;
    o.p_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (p_ != nullptr) cudaFree(p_);
}

Status DeviceBuffer::Allocate(size_t bytes, const char* what) {
  if (p_ != nullptr) {
    // Work still queued may use the old buffer: wait for it before freeing.
    cudaDeviceSynchronize();
    cudaFree(p_);
    p_ = nullptr;
    bytes_ = 0;
  }
  if (bytes == 0) return Status::Ok();
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return CudaError(err, "allocating " + std::to_string(bytes) + " bytes for " + what);
  }
  p_ = p;
  bytes_ = bytes;
  return Status::Ok();
}

Status DeviceBuffer::Reserve(size_t bytes, const char* what) {
  if (bytes <= bytes_) return Status::Ok();
  return Allocate(bytes, what);
}

Result<std::unique_ptr<CudaTransformer>> CudaTransformer::Create(
    std::shared_ptr<const ModelWeights> weights, const CudaTransformerOptions& options) {
  if (weights == nullptr) return Status::InvalidArgument("cuda transformer: no weights");
  const ModelConfig& c = weights->config;
  BR_RETURN_IF_ERROR(c.Validate());
  BR_RETURN_IF_ERROR(CudaDeviceStatus(options.device));
  if (c.is_moe() || c.qk_norm || c.head_size != 0 || c.rope_factor != 0.0f) {
    return Status::Unsupported(
        "cuda transformer: mixture of experts, QK-norm, an explicit head_dim and rope scaling "
        "run on the cpu device only");
  }
  if (c.dim % 8 != 0) {
    return Status::Unsupported("cuda transformer: dim " + std::to_string(c.dim) +
                               " is not a multiple of 8");
  }
  if (c.n_heads / c.n_kv_heads > kc::kCudaAttentionMaxGroup ||
      c.head_dim() > kc::kCudaAttentionMaxHeadDim) {
    return Status::Unsupported("cuda transformer: attention supports n_heads / n_kv_heads <= " +
                               std::to_string(kc::kCudaAttentionMaxGroup) +
                               " and head_dim <= " + std::to_string(kc::kCudaAttentionMaxHeadDim));
  }
  std::unique_ptr<CudaTransformer> t(new CudaTransformer());
  t->weights_ = std::move(weights);
  t->config_ = c;
  t->opt_ = options;
  BR_CUDA_CALL(cudaSetDevice(options.device), "cudaSetDevice");
  BR_CUDA_CALL(cudaStreamCreateWithFlags(&t->stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  BR_CUDA_CALL(cudaDeviceGetAttribute(&t->num_sms_, cudaDevAttrMultiProcessorCount, options.device),
               "cudaDeviceGetAttribute(multiProcessorCount)");
  BR_RETURN_IF_ERROR(t->Upload());
  // cudaMemcpy from pageable memory may return before its DMA lands, and stream_ does not wait
  // for the legacy default stream: finish the uploads before any kernel can read them.
  BR_CUDA_CALL(cudaDeviceSynchronize(), "uploading the weights");
  t->weights_.reset();  // everything the forward pass needs is on the device now
  return t;
}

CudaTransformer::~CudaTransformer() {
  cudaSetDevice(opt_.device);
  if (stream_ != nullptr) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  if (host_meta_ != nullptr) cudaFreeHost(host_meta_);
  cudaGetLastError();
}

Result<std::unique_ptr<ForwardBackend>> CudaTransformer::WithWeights(
    std::shared_ptr<const ModelWeights> weights) const {
  BR_ASSIGN_OR_RETURN(std::unique_ptr<CudaTransformer> t, Create(std::move(weights), opt_));
  return std::unique_ptr<ForwardBackend>(std::move(t));
}

Status CudaTransformer::Upload() {
  const ModelWeights& w = *weights_;
  const ModelConfig& c = config_;
  const int64_t dim = c.dim, kv = c.kv_dim(), hidden = c.hidden_dim, hd = c.head_dim();
  hidden_pad_ = Pad8(hidden);
  const bool split = opt_.split_weights;
  if (static_cast<int64_t>(w.layers.size()) != c.n_layers) {
    return Status::InvalidArgument("cuda transformer: " + std::to_string(w.layers.size()) +
                                   " layers, config says " + std::to_string(c.n_layers));
  }
  layers_.resize(w.layers.size());
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const LayerWeights& lw = w.layers[l];
    Layer& L = layers_[l];
    BR_RETURN_IF_ERROR(UploadMatrix({{&lw.wq, dim, "wq"}, {&lw.wk, kv, "wk"}, {&lw.wv, kv, "wv"}},
                                    dim, split, &L.wqkv.data, &L.wqkv.lo, &L.wqkv.n, &L.wqkv.k));
    BR_RETURN_IF_ERROR(
        UploadMatrix({{&lw.wo, dim, "wo"}}, dim, split, &L.wo.data, &L.wo.lo, &L.wo.n, &L.wo.k));
    BR_RETURN_IF_ERROR(UploadMatrix({{&lw.w1, hidden, "w1"}, {&lw.w3, hidden, "w3"}}, dim, split,
                                    &L.w13.data, &L.w13.lo, &L.w13.n, &L.w13.k));
    BR_RETURN_IF_ERROR(
        UploadMatrix({{&lw.w2, dim, "w2"}}, hidden, split, &L.w2.data, &L.w2.lo, &L.w2.n, &L.w2.k));
    if (lw.bq.data != nullptr) {
      BR_RETURN_IF_ERROR(CheckTensor(lw.bq, 1, dim, "bq"));
      BR_RETURN_IF_ERROR(CheckTensor(lw.bk, 1, kv, "bk"));
      BR_RETURN_IF_ERROR(CheckTensor(lw.bv, 1, kv, "bv"));
      std::vector<float> b(static_cast<size_t>(dim + 2 * kv));
      TensorRowToF32(lw.bq, 0, dim, b.data());
      TensorRowToF32(lw.bk, 0, kv, b.data() + dim);
      TensorRowToF32(lw.bv, 0, kv, b.data() + dim + kv);
      BR_RETURN_IF_ERROR(UploadF32(b.data(), dim + 2 * kv, &L.bqkv, "qkv bias"));
    }
    BR_RETURN_IF_ERROR(UploadVector(lw.attn_norm, dim, &L.attn_norm, "attn_norm"));
    BR_RETURN_IF_ERROR(UploadVector(lw.ffn_norm, dim, &L.ffn_norm, "ffn_norm"));
  }
  BR_RETURN_IF_ERROR(UploadMatrix({{&w.classifier, c.vocab_size, "classifier"}}, dim, split,
                                  &classifier_.data, &classifier_.lo, &classifier_.n,
                                  &classifier_.k));
  BR_RETURN_IF_ERROR(CheckTensor(w.token_embedding, c.vocab_size, dim, "token_embedding"));
  {
    std::vector<float> e(static_cast<size_t>(int64_t{c.vocab_size} * dim));
    TensorRowToF32(w.token_embedding, 0, int64_t{c.vocab_size} * dim, e.data());
    BR_RETURN_IF_ERROR(UploadF32(e.data(), int64_t{c.vocab_size} * dim, &embedding_, "embedding"));
  }
  BR_RETURN_IF_ERROR(UploadVector(w.final_norm, dim, &final_norm_, "final_norm"));
  const int64_t half = hd / 2;
  std::vector<float> cs(static_cast<size_t>(c.max_seq_len * half));
  std::vector<float> sn(static_cast<size_t>(c.max_seq_len * half));
  kernels::RopeTable(c.rope_theta, hd, c.max_seq_len, cs.data(), sn.data());
  BR_RETURN_IF_ERROR(UploadF32(cs.data(), c.max_seq_len * half, &rope_cos_, "rope cos"));
  BR_RETURN_IF_ERROR(UploadF32(sn.data(), c.max_seq_len * half, &rope_sin_, "rope sin"));
  return Status::Ok();
}

Status CudaTransformer::AttachKvCache(const KvCache& cache) {
  const KvCacheOptions& o = cache.options();
  const ModelConfig& c = config_;
  if (o.n_layers != c.n_layers || o.n_kv_heads != c.n_kv_heads || o.head_dim != c.head_dim() ||
      o.block_size % kc::kCudaAttentionChunk != 0 || o.num_blocks < 1) {
    return Status::InvalidArgument("cuda transformer: the KV cache's shape does not fit the model");
  }
  kv_ = o;
  layer_floats_ = o.num_blocks * o.n_kv_heads * o.head_dim * o.block_size;
  const size_t bytes = static_cast<size_t>(layer_floats_) * o.n_layers * sizeof(float);
  BR_CUDA_CALL(cudaSetDevice(opt_.device), "cudaSetDevice");
  BR_RETURN_IF_ERROR(k_pool_.Allocate(bytes, "the K pool"));
  BR_RETURN_IF_ERROR(v_pool_.Allocate(bytes, "the V pool"));
  // Zeros: the attention kernels never read a slot past a sequence's position as a value, but
  // the pool holds finite numbers everywhere, as the host pages do.
  BR_CUDA_CALL(cudaMemsetAsync(k_pool_.as<void>(), 0, bytes, stream_), "cudaMemset K pool");
  BR_CUDA_CALL(cudaMemsetAsync(v_pool_.as<void>(), 0, bytes, stream_), "cudaMemset V pool");
  BR_CUDA_CALL(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  return Status::Ok();
}

void CudaTransformer::Keep(cudaError_t err, const char* what) const {
  if (err == cudaSuccess) return;
  cudaGetLastError();
  if (error_.ok()) error_ = CudaError(err, what);
}

void CudaTransformer::CopyBlock(int32_t src, int32_t dst) {
  const int64_t per = int64_t{kv_.n_kv_heads} * kv_.head_dim * kv_.block_size;
  Keep(cudaSetDevice(opt_.device), "cudaSetDevice");
  for (int32_t l = 0; l < kv_.n_layers; ++l) {
    const int64_t base = l * layer_floats_;
    Keep(cudaMemcpyAsync(k_pool_.as<float>() + base + dst * per,
                         k_pool_.as<float>() + base + src * per, per * sizeof(float),
                         cudaMemcpyDeviceToDevice, stream_),
         "CopyBlock (K)");
    Keep(cudaMemcpyAsync(v_pool_.as<float>() + base + dst * per,
                         v_pool_.as<float>() + base + src * per, per * sizeof(float),
                         cudaMemcpyDeviceToDevice, stream_),
         "CopyBlock (V)");
  }
}

void CudaTransformer::ExportBlock(int32_t block, float* out) const {
  const int64_t per = int64_t{kv_.n_kv_heads} * kv_.head_dim * kv_.block_size;
  Keep(cudaSetDevice(opt_.device), "cudaSetDevice");
  for (int32_t l = 0; l < kv_.n_layers; ++l) {
    const int64_t base = l * layer_floats_ + block * per;
    Keep(cudaMemcpyAsync(out + (2 * l) * per, k_pool_.as<float>() + base, per * sizeof(float),
                         cudaMemcpyDeviceToHost, stream_),
         "ExportBlock (K)");
    Keep(cudaMemcpyAsync(out + (2 * l + 1) * per, v_pool_.as<float>() + base, per * sizeof(float),
                         cudaMemcpyDeviceToHost, stream_),
         "ExportBlock (V)");
  }
  Keep(cudaStreamSynchronize(stream_), "ExportBlock (synchronize)");
}

void CudaTransformer::ImportBlock(int32_t block, const float* in) {
  const int64_t per = int64_t{kv_.n_kv_heads} * kv_.head_dim * kv_.block_size;
  Keep(cudaSetDevice(opt_.device), "cudaSetDevice");
  for (int32_t l = 0; l < kv_.n_layers; ++l) {
    const int64_t base = l * layer_floats_ + block * per;
    Keep(cudaMemcpyAsync(k_pool_.as<float>() + base, in + (2 * l) * per, per * sizeof(float),
                         cudaMemcpyHostToDevice, stream_),
         "ImportBlock (K)");
    Keep(cudaMemcpyAsync(v_pool_.as<float>() + base, in + (2 * l + 1) * per, per * sizeof(float),
                         cudaMemcpyHostToDevice, stream_),
         "ImportBlock (V)");
  }
  Keep(cudaStreamSynchronize(stream_), "ImportBlock (synchronize)");
}

int64_t CudaTransformer::device_bytes() const {
  int64_t b = 0;
  for (const Layer& L : layers_) {
    for (const Matrix* m : {&L.wqkv, &L.wo, &L.w13, &L.w2}) b += m->data.bytes() + m->lo.bytes();
    b += L.bqkv.bytes() + L.attn_norm.bytes() + L.ffn_norm.bytes();
  }
  for (const DeviceBuffer* d : {&classifier_.data,
                                &classifier_.lo,
                                &embedding_,
                                &final_norm_,
                                &rope_cos_,
                                &rope_sin_,
                                &k_pool_,
                                &v_pool_,
                                &x_,
                                &xg_,
                                &qkv_,
                                &q_,
                                &k_,
                                &v_,
                                &att_,
                                &tmp_,
                                &h13_,
                                &logits_,
                                &xb16_,
                                &hb16_,
                                &meta_,
                                &attn_ws_,
                                &gemm_ws_,
                                &lo_out_}) {
    b += static_cast<int64_t>(d->bytes());
  }
  return b;
}

Status CudaTransformer::EnsureScratch(int64_t rows, int64_t logit_rows, int64_t table_stride) {
  const ModelConfig& c = config_;
  const int64_t dim = c.dim, kv = c.kv_dim(), hidden = c.hidden_dim;
  if (rows > cap_rows_) {
    const int64_t r = (rows + 15) / 16 * 16;
    const size_t f = sizeof(float);
    BR_RETURN_IF_ERROR(x_.Allocate(r * dim * f, "x"));
    BR_RETURN_IF_ERROR(xg_.Allocate(r * dim * f, "x (logit rows)"));
    BR_RETURN_IF_ERROR(qkv_.Allocate(r * (dim + 2 * kv) * f, "qkv"));
    BR_RETURN_IF_ERROR(q_.Allocate(r * dim * f, "q"));
    BR_RETURN_IF_ERROR(k_.Allocate(r * kv * f, "k"));
    BR_RETURN_IF_ERROR(v_.Allocate(r * kv * f, "v"));
    BR_RETURN_IF_ERROR(att_.Allocate(r * dim * f, "attention out"));
    BR_RETURN_IF_ERROR(tmp_.Allocate(r * dim * f, "tmp"));
    BR_RETURN_IF_ERROR(h13_.Allocate(r * 2 * hidden * f, "h13"));
    BR_RETURN_IF_ERROR(xb16_.Allocate(r * dim * 2, "x (bf16)"));
    BR_RETURN_IF_ERROR(hb16_.Allocate(r * hidden_pad_ * 2, "hb (bf16)"));
    // The K padding columns of hb16 must stay zero (the down projection's K is hidden_pad_).
    // On stream_ (a non-blocking stream does not wait for the legacy default stream).
    BR_CUDA_CALL(cudaMemsetAsync(hb16_.as<void>(), 0, hb16_.bytes(), stream_), "cudaMemset hb16");
    cap_rows_ = r;
  }
  if (logit_rows > cap_logit_rows_) {
    const int64_t r = (logit_rows + 15) / 16 * 16;
    BR_RETURN_IF_ERROR(logits_.Allocate(r * c.vocab_size * sizeof(float), "logits"));
    cap_logit_rows_ = r;
  }
  const size_t meta = static_cast<size_t>(3 * rows + rows * table_stride) * sizeof(int32_t);
  BR_RETURN_IF_ERROR(meta_.Reserve(meta, "step metadata"));
  if (host_meta_bytes_ < meta) {
    const size_t want = std::max(meta, 2 * host_meta_bytes_);
    if (host_meta_ != nullptr) cudaFreeHost(host_meta_);
    host_meta_ = nullptr;
    host_meta_bytes_ = 0;
    void* p = nullptr;
    BR_CUDA_CALL(cudaMallocHost(&p, want), "cudaMallocHost (step metadata)");
    host_meta_ = static_cast<int32_t*>(p);
    host_meta_bytes_ = want;
  }
  return Status::Ok();
}

Status CudaTransformer::Gemm(const uint16_t* x, int64_t m, int64_t ldx, const Matrix& w, float* y,
                             int64_t ldy) {
  kc::CudaGemmParams p;
  p.x = x;
  p.m = m;
  p.ldx = ldx;
  p.w = w.data.as<uint16_t>();
  p.n = w.n;
  p.k = w.k;
  p.y = y;
  p.ldy = ldy;
  p.out = kc::GemmOut::kF32;
  BR_RETURN_IF_ERROR(GemmOne(p));
  if (w.lo.bytes() == 0) return Status::Ok();
  // Split weights: y = x w_hi^T, then y += x w_lo^T (a second GEMM into scratch, one fp32 add
  // per element). REQUIRES ldy == n (every GEMM of the forward pass writes dense rows).
  if (ldy != w.n) return Status::Internal("cuda transformer: split GEMM needs dense output rows");
  BR_RETURN_IF_ERROR(lo_out_.Reserve(static_cast<size_t>(m * w.n) * sizeof(float), "split GEMM"));
  p.w = w.lo.as<uint16_t>();
  p.y = lo_out_.as<float>();
  BR_RETURN_IF_ERROR(GemmOne(p));
  BR_CUDA_CALL(LaunchAddInPlace(y, lo_out_.as<float>(), m * w.n, stream_), "split GEMM add");
  return Status::Ok();
}

Status CudaTransformer::GemmOne(const kernels::cuda::CudaGemmParams& p) {
  if (opt_.split_k_gemm) {
    BR_RETURN_IF_ERROR(gemm_ws_.Reserve(kc::CudaGemmSplitKWorkspaceBytes(p.m, p.n), "split-K"));
    BR_CUDA_CALL(kc::CudaGemmSplitKByM(p, gemm_ws_.as<float>(), gemm_ws_.bytes(), stream_),
                 "split-K GEMM (negative control)");
    return Status::Ok();
  }
  BR_CUDA_CALL(kc::CudaGemm(p, stream_), "GEMM");
  return Status::Ok();
}

Status CudaTransformer::Forward(std::span<const ForwardRow> rows, KvCache* cache, float* logits) {
  if (!error_.ok()) return error_;
  const ModelConfig& c = config_;
  const int64_t n = static_cast<int64_t>(rows.size());
  if (n == 0) return Status::Ok();
  int32_t max_pos = 0;
  int64_t m = 0;
  for (const ForwardRow& r : rows) {
    BR_RETURN_IF_ERROR(CheckForwardRow(r, c));
    max_pos = std::max(max_pos, r.position);
    m += r.want_logits ? 1 : 0;
  }
  if (k_pool_.bytes() == 0 || cache == nullptr || cache->block_size() != kv_.block_size ||
      cache->num_blocks() != kv_.num_blocks) {
    return Status::Internal("cuda transformer: Forward without its KV cache (AttachKvCache)");
  }
  if (n > 65535) {  // CudaRope's grid.y
    return Status::InvalidArgument("cuda transformer: more than 65535 rows in one forward pass");
  }
  const Status s = ForwardImpl(rows, max_pos, m, logits);
  if (!s.ok()) error_ = s;  // the device state is unknown now: the backend stays failed
  return s;
}

Status CudaTransformer::ForwardImpl(std::span<const ForwardRow> rows, int32_t max_pos, int64_t m,
                                    float* logits) {
  const ModelConfig& c = config_;
  const int64_t n = static_cast<int64_t>(rows.size());
  const int64_t dim = c.dim, kv = c.kv_dim(), hidden = c.hidden_dim, hd = c.head_dim();
  const int64_t qkv_dim = dim + 2 * kv;
  const int32_t bs = kv_.block_size;
  const int64_t stride = max_pos / bs + 1;
  BR_CUDA_CALL(cudaSetDevice(opt_.device), "cudaSetDevice");
  BR_RETURN_IF_ERROR(EnsureScratch(n, m, stride));

  // Step metadata, one upload: tokens | positions | logit rows | block tables [n][stride].
  int32_t* h_tokens = host_meta_;
  int32_t* h_pos = h_tokens + n;
  int32_t* h_idx = h_pos + n;
  int32_t* h_tables = h_idx + n;
  int64_t j = 0;
  for (int64_t r = 0; r < n; ++r) {
    const ForwardRow& row = rows[r];
    h_tokens[r] = row.token;
    h_pos[r] = row.position;
    if (row.want_logits) h_idx[j++] = static_cast<int32_t>(r);
    const int64_t nb = row.position / bs + 1;
    int32_t* t = h_tables + r * stride;
    for (int64_t b = 0; b < nb; ++b) {
      const int32_t id = row.block_table[b];
      if (id < 0 || id >= kv_.num_blocks) {
        return Status::Internal("cuda transformer: block id " + std::to_string(id) +
                                " outside the pool");
      }
      t[b] = id;
    }
    for (int64_t b = nb; b < stride; ++b) t[b] = 0;
  }
  for (; j < n; ++j) h_idx[j] = 0;
  const size_t meta_bytes = static_cast<size_t>(3 * n + n * stride) * sizeof(int32_t);
  BR_CUDA_CALL(
      cudaMemcpyAsync(meta_.as<void>(), host_meta_, meta_bytes, cudaMemcpyHostToDevice, stream_),
      "uploading the step metadata");
  const int32_t* d_tokens = meta_.as<int32_t>();
  const int32_t* d_pos = d_tokens + n;
  const int32_t* d_idx = d_pos + n;
  const int32_t* d_tables = d_idx + n;

  float* x = x_.as<float>();
  uint16_t* xb16 = xb16_.as<uint16_t>();
  BR_CUDA_CALL(LaunchEmbedRows(d_tokens, embedding_.as<float>(), n, dim, x, stream_), "embedding");

  kc::CudaAttentionParams ap;
  ap.n_tokens = static_cast<int32_t>(n);
  ap.n_heads = c.n_heads;
  ap.n_kv_heads = c.n_kv_heads;
  ap.head_dim = static_cast<int32_t>(hd);
  ap.block_size = bs;
  ap.q = q_.as<float>();
  ap.out = att_.as<float>();
  ap.k_cache = k_pool_.as<float>();
  ap.v_cache = v_pool_.as<float>();
  ap.positions = d_pos;
  ap.block_tables = d_tables;
  ap.block_table_stride = static_cast<int32_t>(stride);
  ap.max_context = max_pos + 1;
  ap.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const kc::CudaAttentionKernel kernel = ToCuda(opt_.attention);
  BR_CUDA_CALL(kc::CheckCudaAttentionParams(ap), "attention parameters");
  const size_t ws = opt_.flash_attention ? kc::CudaFlashDecodeWorkspaceBytes(ap, num_sms_)
                                         : kc::CudaAttentionWorkspaceBytes(ap, kernel);
  BR_RETURN_IF_ERROR(attn_ws_.Reserve(ws, "attention workspace"));
  const bool half_split = c.rope_layout == kernels::RopeLayout::kHalfSplit;

  for (int32_t l = 0; l < c.n_layers; ++l) {
    const Layer& L = layers_[l];
    // attention block
    BR_CUDA_CALL(
        kc::CudaRmsNorm(x, L.attn_norm.as<float>(), n, dim, c.norm_eps, nullptr, xb16, stream_),
        "attention RMSNorm");
    BR_RETURN_IF_ERROR(Gemm(xb16, n, dim, L.wqkv, qkv_.as<float>(), qkv_dim));
    BR_CUDA_CALL(
        LaunchSplitQkv(qkv_.as<float>(), qkv_dim, L.bqkv.bytes() > 0 ? L.bqkv.as<float>() : nullptr,
                       n, dim, kv, q_.as<float>(), k_.as<float>(), v_.as<float>(), stream_),
        "qkv split");
    BR_CUDA_CALL(kc::CudaRope(q_.as<float>(), n, c.n_heads, hd, d_pos, rope_cos_.as<float>(),
                              rope_sin_.as<float>(), c.max_seq_len, half_split, stream_),
                 "RoPE (q)");
    BR_CUDA_CALL(kc::CudaRope(k_.as<float>(), n, c.n_kv_heads, hd, d_pos, rope_cos_.as<float>(),
                              rope_sin_.as<float>(), c.max_seq_len, half_split, stream_),
                 "RoPE (k)");
    float* k_layer = k_pool_.as<float>() + l * layer_floats_;
    float* v_layer = v_pool_.as<float>() + l * layer_floats_;
    BR_CUDA_CALL(LaunchWriteKv(k_.as<float>(), v_.as<float>(), d_pos, d_tables, stride, n,
                               c.n_kv_heads, hd, bs, k_layer, v_layer, stream_),
                 "KV write");
    ap.k_cache = k_layer;
    ap.v_cache = v_layer;
    if (opt_.flash_attention) {
      BR_CUDA_CALL(kc::CudaFlashDecodeAttention(ap, num_sms_, attn_ws_.as<void>(), attn_ws_.bytes(),
                                                stream_),
                   "flash-decoding attention (negative control)");
    } else {
      BR_CUDA_CALL(kc::CudaAttention(ap, kernel, attn_ws_.as<void>(), attn_ws_.bytes(), stream_),
                   "attention");
    }
    BR_CUDA_CALL(LaunchF32ToBf16Rows(att_.as<float>(), n, dim, dim, xb16, dim, stream_),
                 "attention out to bf16");
    BR_RETURN_IF_ERROR(Gemm(xb16, n, dim, L.wo, tmp_.as<float>(), dim));
    BR_CUDA_CALL(LaunchAddInPlace(x, tmp_.as<float>(), n * dim, stream_), "residual add");
    // feed-forward block
    BR_CUDA_CALL(
        kc::CudaRmsNorm(x, L.ffn_norm.as<float>(), n, dim, c.norm_eps, nullptr, xb16, stream_),
        "FFN RMSNorm");
    BR_RETURN_IF_ERROR(Gemm(xb16, n, dim, L.w13, h13_.as<float>(), 2 * hidden));
    BR_CUDA_CALL(LaunchSwiGluRowsBf16(h13_.as<float>(), n, hidden, hb16_.as<uint16_t>(),
                                      hidden_pad_, stream_),
                 "SwiGLU");
    BR_RETURN_IF_ERROR(Gemm(hb16_.as<uint16_t>(), n, hidden_pad_, L.w2, tmp_.as<float>(), dim));
    BR_CUDA_CALL(LaunchAddInPlace(x, tmp_.as<float>(), n * dim, stream_), "residual add");
  }

  if (m > 0) {
    BR_CUDA_CALL(LaunchGatherRows(x, d_idx, m, dim, xg_.as<float>(), stream_), "logit rows");
    BR_CUDA_CALL(kc::CudaRmsNorm(xg_.as<float>(), final_norm_.as<float>(), m, dim, c.norm_eps,
                                 nullptr, xb16, stream_),
                 "final RMSNorm");
    BR_RETURN_IF_ERROR(Gemm(xb16, m, dim, classifier_, logits_.as<float>(), c.vocab_size));
    BR_CUDA_CALL(cudaMemcpyAsync(logits, logits_.as<void>(),
                                 static_cast<size_t>(m * c.vocab_size) * sizeof(float),
                                 cudaMemcpyDeviceToHost, stream_),
                 "downloading the logits");
  }
  BR_CUDA_CALL(cudaStreamSynchronize(stream_), "forward pass");
  return Status::Ok();
}

}  // namespace bitroll::engine::cuda
