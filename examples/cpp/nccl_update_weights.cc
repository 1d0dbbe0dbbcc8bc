// examples/cpp/nccl_update_weights.cc: a trainer that broadcasts new weights to a bitroll service
// over NCCL (rollout/nccl_weight_sender.h, docs/weights_nccl.md), then checks that rollouts use
// them.
//
//   nccl_update_weights --connect tcp://HOST:5555 --model FILE --version N
//                       [--perturb-seed S] [--device D] [--drain] [--timeout-ms T]
//
// 1. loads FILE with the engine's loader (any format the service reads; its tensors are named as
//    that format names them) and lists its tensors (engine/weight_update.h TensorManifest);
// 2. with --perturb-seed, multiplies every element by (1 + 1e-3 u), u in [-1, 1) a pure function
//    of (S, tensor, element): new weights a trainer could have produced;
// 3. uploads every tensor to GPU D and calls BroadcastWeightsNccl (every live replica, ranks
//    1..n, receives them on its own GPU);
// 4. runs one small rollout group and prints the weight version and weights_hash its
//    trajectories carry; exit status 0 when they carry version N and the hash of the weights
//    sent, 1 otherwise (or on any error, printed).
// The service must serve FILE's model (same format and shapes) on GPU replicas.
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/model_loader.h"
#include "engine/model_weights.h"
#include "engine/weight_update.h"
#include "kernels/cpu/math.h"
#include "rollout/client.h"
#include "rollout/nccl_weight_sender.h"

#if defined(BITROLL_HAVE_NCCL)
#include <cuda_runtime_api.h>
#endif

namespace {

using bitroll::Status;
using bitroll::engine::ModelWeights;
using bitroll::engine::NamedTensor;
using bitroll::engine::Tensor;
using bitroll::kernels::DType;

struct Args {
  std::string endpoint = "tcp://127.0.0.1:5555";
  std::string model;
  uint64_t version = 0;
  bool has_version = false;
  bool perturb = false;
  uint64_t perturb_seed = 0;
  int device = 0;
  bool drain = false;
  int64_t timeout_ms = 120000;
};

int Usage(const char* why) {
  std::fprintf(stderr,
               "nccl_update_weights: %s\n"
               "usage: nccl_update_weights --connect tcp://HOST:PORT --model FILE --version N\n"
               "                           [--perturb-seed S] [--device D] [--drain]"
               " [--timeout-ms T]\n",
               why);
  return 2;
}

bool ParseArgs(int argc, char** argv, Args* a, std::string* why) {
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&](const char** out) {
      if (i + 1 >= argc) {
        *why = k + " needs a value";
        return false;
      }
      *out = argv[++i];
      return true;
    };
    const char* v = nullptr;
    if (k == "--drain") {
      a->drain = true;
    } else if (k == "--connect" || k == "--model" || k == "--version" || k == "--perturb-seed" ||
               k == "--device" || k == "--timeout-ms") {
      if (!value(&v)) return false;
      char* end = nullptr;
      if (k == "--connect") {
        a->endpoint = v;
      } else if (k == "--model") {
        a->model = v;
      } else if (k == "--device") {
        a->device = static_cast<int>(std::strtol(v, &end, 10));
      } else if (k == "--timeout-ms") {
        a->timeout_ms = std::strtoll(v, &end, 10);
      } else {
        const uint64_t n = std::strtoull(v, &end, 10);
        if (k == "--version") {
          a->version = n;
          a->has_version = true;
        } else {
          a->perturb_seed = n;
          a->perturb = true;
        }
      }
      if (end != nullptr && *end != '\0') {
        *why = k + ": not a number: " + v;
        return false;
      }
    } else {
      *why = "unknown argument " + k;
      return false;
    }
  }
  if (a->model.empty()) *why = "--model is required";
  if (!a->has_version) *why = "--version is required";
  return why->empty();
}

// splitmix64: the perturbation's pure function of (seed, tensor, element).
uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The bytes of `t`, each element times (1 + 1e-3 u) when perturbing.
std::vector<uint8_t> HostCopy(const Tensor& t, size_t index, const Args& a) {
  const auto* p = static_cast<const uint8_t*>(t.data);
  std::vector<uint8_t> out(p, p + t.size_bytes());
  if (!a.perturb) return out;
  for (int64_t i = 0; i < t.numel(); ++i) {
    const uint64_t r = Mix(Mix(a.perturb_seed ^ (index << 40)) ^ static_cast<uint64_t>(i));
    const float u = static_cast<float>(static_cast<double>(r >> 11) * 0x1.0p-52 - 1.0);
    const float scale = 1.0f + 1e-3f * u;
    if (t.dtype == DType::kF32) {
      float f;
      std::memcpy(&f, &out[i * 4], 4);
      f *= scale;
      std::memcpy(&out[i * 4], &f, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, &out[i * 2], 2);
      if (t.dtype == DType::kBF16) {
        h = bitroll::kernels::F32ToBf16(bitroll::kernels::Bf16ToF32(h) * scale);
      } else {
        h = bitroll::kernels::F32ToF16(bitroll::kernels::F16ToF32(h) * scale);
      }
      std::memcpy(&out[i * 2], &h, 2);
    }
  }
  return out;
}

// The tensor fields of `w` in TensorManifest order (present ones; no tied classifier).
std::vector<Tensor*> ManifestFields(ModelWeights& w) {
  std::vector<Tensor*> out;
  auto add = [&](Tensor& t) {
    if (t.data != nullptr) out.push_back(&t);
  };
  add(w.token_embedding);
  for (auto& l : w.layers) {
    for (Tensor* t : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.bq, &l.bk, &l.bv, &l.wo, &l.ffn_norm,
                      &l.w1, &l.w2, &l.w3}) {
      add(*t);
    }
  }
  add(w.final_norm);
  if (!w.config.shared_classifier) add(w.classifier);
  return out;
}

int Fail(const Status& s) {
  std::fprintf(stderr, "nccl_update_weights: %s\n", s.ToString().c_str());
  return 1;
}

#if defined(BITROLL_HAVE_NCCL)
// Device copies of the tensors, freed on scope exit.
class DeviceTensors {
 public:
  ~DeviceTensors() {
    for (void* p : ptrs_) cudaFree(p);
  }
  Status Upload(const std::vector<uint8_t>& host, const void** out) {
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, host.size());
    if (e == cudaSuccess) {
      ptrs_.push_back(p);
      e = cudaMemcpy(p, host.data(), host.size(), cudaMemcpyHostToDevice);
    }
    if (e != cudaSuccess) {
      return Status::Internal(std::string("uploading a tensor: ") + cudaGetErrorString(e));
    }
    *out = p;
    return Status::Ok();
  }

 private:
  std::vector<void*> ptrs_;
};
#endif

}  // namespace

int main(int argc, char** argv) {
  Args a;
  std::string why;
  if (!ParseArgs(argc, argv, &a, &why)) return Usage(why.c_str());
  if (!bitroll::rollout::NcclSenderBuilt()) {
    return Fail(Status::Unsupported("this build has no NCCL: build bitroll with CUDA and NCCL"));
  }
#if defined(BITROLL_HAVE_NCCL)
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess || count <= a.device) {
    return Fail(Status::Unavailable(std::string("no CUDA device: ") +
                                    (e != cudaSuccess
                                         ? cudaGetErrorString(e)
                                         : "device " + std::to_string(a.device) + " requested, " +
                                               std::to_string(count) + " present") +
                                    " (the trainer's tensors must live on a GPU)"));
  }
  if (cudaError_t e = cudaSetDevice(a.device); e != cudaSuccess) {
    return Fail(Status::Unavailable(std::string("no CUDA device: ") + cudaGetErrorString(e)));
  }

  auto loaded = bitroll::engine::LoadModelWeights(a.model);
  if (!loaded.ok()) return Fail(loaded.status());
  ModelWeights sent = *loaded;  // its tensors will point at the (perturbed) host copies
  const std::vector<NamedTensor> manifest = bitroll::engine::TensorManifest(*loaded);
  std::vector<Tensor*> fields = ManifestFields(sent);
  if (fields.size() != manifest.size()) return Fail(Status::Internal("manifest order mismatch"));

  std::vector<std::vector<uint8_t>> host(manifest.size());
  std::vector<bitroll::rollout::WeightTensor> tensors(manifest.size());
  DeviceTensors device;
  uint64_t bytes = 0;
  for (size_t i = 0; i < manifest.size(); ++i) {
    const Tensor& t = manifest[i].tensor;
    host[i] = HostCopy(t, i, a);
    fields[i]->data = host[i].data();
    tensors[i].name = manifest[i].name;
    tensors[i].dtype = std::string(bitroll::DTypeName(t.dtype));
    tensors[i].shape = t.shape;
    if (Status s = device.Upload(host[i], &tensors[i].data); !s.ok()) return Fail(s);
    bytes += host[i].size();
  }
  if (sent.config.shared_classifier) sent.classifier = sent.token_embedding;
  const uint64_t expected_hash = bitroll::engine::HashWeights(sent);
  std::printf(
      "model %s: %zu tensors, %.1f MB, %s; weights_hash to send %016" PRIx64 "\n",
      sent.source.c_str(), manifest.size(), bytes / 1e6,
      a.perturb ? ("perturbed with seed " + std::to_string(a.perturb_seed)).c_str() : "as loaded",
      expected_hash);

  bitroll::rollout::ClientOptions co;
  co.endpoint = a.endpoint;
  auto client = bitroll::rollout::Client::Connect(co);
  if (!client.ok()) return Fail(client.status());
  bitroll::rollout::NcclSendOptions so;
  so.device = a.device;
  so.drain = a.drain;
  so.timeout = std::chrono::milliseconds(a.timeout_ms);
  const auto t0 = std::chrono::steady_clock::now();
  auto live = bitroll::rollout::BroadcastWeightsNccl(**client, tensors, a.version, so);
  if (!live.ok()) return Fail(live.status());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("weights version %" PRIu64 " live after %.3f s (%.1f MB/s to every replica)\n", *live,
              seconds, bytes / 1e6 / seconds);

  // One small group on the new weights.
  bitroll::rollout::SubmitRequest q;
  q.group_id = 1000000 + a.version;
  std::vector<int32_t> prompt = {sent.config.bos_id};
  for (int32_t id = 3; id < 6 && id < sent.config.vocab_size; ++id) prompt.push_back(id);
  q.prompts = {prompt};
  q.n = 2;
  q.seed = 7;
  q.max_tokens = 8;
  auto group = (*client)->Run(q, static_cast<int>(a.timeout_ms));
  if (!group.ok()) return Fail(group.status());
  bool ok = !group->empty();
  for (const auto& t : *group) {
    std::printf("sample %u: %zu tokens, replica %s, weights_hash %016" PRIx64 ", versions:",
                t.sample_index, t.ids.size(), t.replica.c_str(), t.fingerprint.weights_hash);
    for (const auto& [first, v] : t.versions) std::printf(" %" PRIu64 "@%d", v, first);
    std::printf("\n");
    for (const auto& [first, v] : t.versions) ok = ok && v == a.version;
    ok = ok && t.fingerprint.weights_hash == expected_hash;
  }
  std::printf("%s: rollouts %s weight version %" PRIu64 " with weights_hash %016" PRIx64 "\n",
              ok ? "OK" : "MISMATCH", ok ? "carry" : "do not all carry", a.version, expected_hash);
  return ok ? 0 : 1;
#else
  return 1;
#endif
}
