// ReceiveNcclWeights (engine/nccl_weights.h): the replica's side of an NCCL weight broadcast.
//
// Everywhere (no device needed): the typed errors that come before any device call (world_size /
// rank / device / timeout out of range, an unknown name, a wrong shape, a tensor listed twice, an
// empty manifest), the tied classifier's name accepted, the build's answer (kUnsupported without
// NCCL), and a missing device as kUnavailable "no CUDA device: ...".
// With one GPU: a trainer that never joins gives kTimeout after the timeout (ncclCommAbort).
// With two GPUs: a trainer thread (rank 0, GPU 0) broadcasts a model over a replica serving other
// weights (rank 1, GPU 1); the received weights have the source's weights_hash and every tensor
// is memcmp-equal; a perturbed source gives a different hash (negative control).
// Tests that need hardware skip LOUDLY ("[  SKIPPED ] no CUDA device: ..." / "needs 2 GPUs").
#include "engine/nccl_weights.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "engine/make_model.h"
#include "engine/model_loader.h"
#include "engine/weight_update.h"

#if defined(BITROLL_HAVE_NCCL)
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

namespace bitroll::engine {
namespace {

namespace fs = std::filesystem;

// The "tiny" random model (engine/make_model.h) for `seed`, written and loaded once per process.
std::shared_ptr<const ModelWeights> TinyModel(uint64_t seed) {
  static std::map<uint64_t, std::shared_ptr<const ModelWeights>> cache;
  auto it = cache.find(seed);
  if (it != cache.end()) return it->second;
  const fs::path dir =
      fs::temp_directory_path() /
      ("bitroll_nccl_weights_" + std::to_string(::getpid()) + "_" + std::to_string(seed));
  fs::create_directories(dir);
  auto shape = NamedShape("tiny");
  EXPECT_TRUE(shape.ok()) << shape.status().ToString();
  if (!shape.ok()) return nullptr;
  const Status written =
      WriteRandomModel(*shape, seed, (dir / "m.bin").string(), (dir / "t.bin").string());
  EXPECT_TRUE(written.ok()) << written.ToString();
  auto w = LoadModelWeights((dir / "m.bin").string());
  fs::remove_all(dir);  // the weights stay mapped
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  if (!w.ok()) return nullptr;
  auto p = std::make_shared<const ModelWeights>(std::move(*w));
  cache[seed] = p;
  return p;
}

// The manifest of every tensor of `w` as served (what a trainer broadcasts).
std::vector<NcclTensorSpec> ManifestOf(const ModelWeights& w) {
  std::vector<NcclTensorSpec> out;
  for (const NamedTensor& t : TensorManifest(w))
    out.push_back({t.name, t.tensor.dtype, t.tensor.shape});
  return out;
}

// A request that passes every check before the device one; device 1000 exists nowhere, so the
// call stops at the device check (or earlier) whatever the machine.
NcclWeightSource ValidSource(const ModelWeights& w) {
  NcclWeightSource s;
  s.world_size = 2;
  s.rank = 1;
  s.tensors = ManifestOf(w);
  s.device = 1000;
  s.timeout = std::chrono::milliseconds(2000);
  return s;
}

// The answer of a request that passed validation in this build, on device 1000.
void ExpectPassedValidation(const Status& s) {
#if defined(BITROLL_HAVE_NCCL)
  EXPECT_EQ(s.code(), ErrorCode::kUnavailable) << s.ToString();
  EXPECT_EQ(s.message().rfind("no CUDA device: ", 0), 0u) << s.message();
#else
  EXPECT_EQ(s.code(), ErrorCode::kUnsupported) << s.ToString();
#endif
}

Status Call(const NcclWeightSource& s, std::shared_ptr<const ModelWeights> base) {
  return ReceiveNcclWeights(s, std::move(base)).status();
}

TEST(NcclWeightsTest, BuildAnswersNcclWeightsBuilt) {
#if defined(BITROLL_HAVE_NCCL)
  EXPECT_TRUE(NcclWeightsBuilt());
  std::fprintf(stderr, "*** nccl_weights_test: this build has NCCL %d.%d.%d ***\n", NCCL_MAJOR,
               NCCL_MINOR, NCCL_PATCH);
#else
  EXPECT_FALSE(NcclWeightsBuilt());
  auto base = TinyModel(1);
  ASSERT_NE(base, nullptr);
  const Status s = Call(ValidSource(*base), base);
  EXPECT_EQ(s.code(), ErrorCode::kUnsupported) << s.ToString();
  EXPECT_NE(s.message().find("this build has no NCCL"), std::string::npos) << s.message();
  std::fprintf(stderr, "*** nccl_weights_test: build without NCCL: %s ***\n", s.ToString().c_str());
#endif
}

TEST(NcclWeightsTest, RanksDeviceTimeoutAndBaseAreCheckedFirst) {
  auto base = TinyModel(1);
  ASSERT_NE(base, nullptr);
  ExpectPassedValidation(Call(ValidSource(*base), base));
  struct Case {
    const char* what;
    int world, rank, device;
    int64_t timeout_ms;
    const char* needle;
  };
  const Case cases[] = {
      {"world 1", 1, 1, 0, 1000, "world_size 1"},
      {"world 0", 0, 0, 0, 1000, "world_size 0"},
      {"rank 0 is the trainer", 2, 0, 0, 1000, "rank 0 outside 1 .. 1"},
      {"rank == world", 3, 3, 0, 1000, "rank 3 outside 1 .. 2"},
      {"negative rank", 2, -1, 0, 1000, "rank -1"},
      {"negative device", 2, 1, -1, 1000, "device -1"},
      {"zero timeout", 2, 1, 0, 0, "timeout 0 ms"},
  };
  for (const Case& c : cases) {
    NcclWeightSource s = ValidSource(*base);
    s.world_size = c.world;
    s.rank = c.rank;
    s.device = c.device;
    s.timeout = std::chrono::milliseconds(c.timeout_ms);
    const Status st = Call(s, base);
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << c.what << ": " << st.ToString();
    EXPECT_NE(st.message().find(c.needle), std::string::npos) << c.what << ": " << st.message();
  }
  const Status no_base = Call(ValidSource(*base), nullptr);
  EXPECT_EQ(no_base.code(), ErrorCode::kInvalidArgument) << no_base.ToString();
}

TEST(NcclWeightsTest, UnknownNameIsNotFoundWithExampleNames) {
  auto base = TinyModel(1);
  ASSERT_NE(base, nullptr);
  // A typo, and a name of another family (Hugging Face) on a llama2.c model.
  for (const char* bad :
       {"layers.0.attention.wq", "model.embed_tokens.weight", "layers.9.ffn_norm.weight"}) {
    NcclWeightSource s = ValidSource(*base);
    s.tensors[3].name = bad;
    const Status st = Call(s, base);
    EXPECT_EQ(st.code(), ErrorCode::kNotFound) << bad << ": " << st.ToString();
    EXPECT_NE(st.message().find(std::string("'") + bad + "'"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("its names are like tok_embeddings.weight, "), std::string::npos)
        << st.message();
  }
}

TEST(NcclWeightsTest, WrongShapeIsInvalidArgument) {
  auto base = TinyModel(1);
  ASSERT_NE(base, nullptr);
  NcclWeightSource s = ValidSource(*base);
  ASSERT_EQ(s.tensors[3].name, "layers.0.attention.wk.weight");
  ASSERT_EQ(s.tensors[3].shape, (std::vector<int64_t>{16, 32}));  // tiny: kv_dim 16, dim 32
  s.tensors[3].shape = {32, 16};
  Status st = Call(s, base);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << st.ToString();
  EXPECT_EQ(st.message(),
            "weight update: layers.0.attention.wk.weight has shape [32, 16], the model's is "
            "[16, 32]");
  s.tensors[3].shape = {16, 32, 1};
  st = Call(s, base);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << st.ToString();
}

TEST(NcclWeightsTest, DuplicateAndEmptyManifestsAreInvalidArgument) {
  auto base = TinyModel(1);
  ASSERT_NE(base, nullptr);
  NcclWeightSource s = ValidSource(*base);
  s.tensors.push_back(s.tensors[1]);
  Status st = Call(s, base);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("layers.0.attention_norm.weight appears twice"), std::string::npos)
      << st.message();
  s.tensors.clear();
  st = Call(s, base);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("empty"), std::string::npos) << st.message();
}

TEST(NcclWeightsTest, TiedClassifierAndPartialManifestsAreAccepted) {
  auto base = TinyModel(1);
  ASSERT_NE(base, nullptr);
  ASSERT_TRUE(base->config.shared_classifier);
  // A trainer's state_dict() includes the tied classifier: accepted with the embedding's shape.
  NcclWeightSource s = ValidSource(*base);
  s.tensors.push_back({"output.weight", kernels::DType::kBF16, base->token_embedding.shape});
  ExpectPassedValidation(Call(s, base));
  s.tensors.back().shape = {1, 2};
  const Status st = Call(s, base);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << st.ToString();
  // Any subset, in any order, in any of the three dtypes.
  NcclWeightSource part = ValidSource(*base);
  part.tensors = {part.tensors[5], part.tensors[0]};
  part.tensors[0].dtype = kernels::DType::kF16;
  ExpectPassedValidation(Call(part, base));
}

#if defined(BITROLL_HAVE_NCCL)

int CudaDeviceCount(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    *why = std::string("cudaGetDeviceCount -> ") + cudaGetErrorName(e) + " (" +
           cudaGetErrorString(e) + ")";
    return 0;
  }
  if (n == 0) *why = "cudaGetDeviceCount -> 0 devices";
  return n;
}

#define BR_REQUIRE_GPUS(k)                                                       \
  do {                                                                           \
    std::string br_why;                                                          \
    const int br_n = CudaDeviceCount(&br_why);                                   \
    if (br_n == 0) {                                                             \
      std::fprintf(stderr, "[  SKIPPED ] no CUDA device: %s\n", br_why.c_str()); \
      GTEST_SKIP() << "no CUDA device: " << br_why;                              \
    }                                                                            \
    if (br_n < (k)) {                                                            \
      std::fprintf(stderr, "[  SKIPPED ] needs %d GPUs, found %d\n", (k), br_n); \
      GTEST_SKIP() << "needs " << (k) << " GPUs, found " << br_n;                \
    }                                                                            \
  } while (0)

TEST(NcclWeightsTest, MissingDeviceIsUnavailable) {
  auto base = TinyModel(1);
  ASSERT_NE(base, nullptr);
  std::string why;
  const int n = CudaDeviceCount(&why);
  NcclWeightSource s = ValidSource(*base);
  s.device = n == 0 ? 0 : n;  // no device at all, or one past the last
  const Status st = Call(s, base);
  EXPECT_EQ(st.code(), ErrorCode::kUnavailable) << st.ToString();
  EXPECT_EQ(st.message().rfind("no CUDA device: ", 0), 0u) << st.message();
  if (n == 0) {
    std::fprintf(stderr, "*** nccl_weights_test: no CUDA device on this machine: %s ***\n",
                 st.ToString().c_str());
  } else {
    EXPECT_NE(st.message().find("device " + std::to_string(n) + " requested, " + std::to_string(n) +
                                " present"),
              std::string::npos)
        << st.message();
  }
}

TEST(NcclWeightsTest, TrainerThatNeverJoinsIsATimeout) {
  BR_REQUIRE_GPUS(1);
  auto base = TinyModel(1);
  ASSERT_NE(base, nullptr);
  // A real unique id (its bootstrap root listens) whose rank 0 never joins.
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  NcclWeightSource s = ValidSource(*base);
  std::memcpy(s.unique_id.data(), &id, sizeof(id));
  s.device = 0;
  s.timeout = std::chrono::milliseconds(1500);
  const auto t0 = std::chrono::steady_clock::now();
  const Status st = Call(s, base);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(st.code(), ErrorCode::kTimeout) << st.ToString();
  EXPECT_NE(st.message().find("did not all join the communicator within 1500 ms"),
            std::string::npos)
      << st.message();
  EXPECT_GE(seconds, 1.4);
  EXPECT_LT(seconds, 30.0) << "ncclCommAbort of a joining communicator took too long";
  std::fprintf(stderr, "*** nccl_weights_test: timeout after %.2f s: %s ***\n", seconds,
               st.ToString().c_str());
}

// Rank 0 on GPU 0: broadcasts every tensor of `from` in manifest order, as ReceiveNcclWeights
// expects (numel * dtype size bytes, ncclUint8, root 0). `poke`: flip the lowest bit of element
// 7 of tensor 2 first (the negative control). Returns "" or what failed.
std::string TrainerBroadcast(const ncclUniqueId& id, int world, const ModelWeights& from,
                             bool poke) {
  if (cudaSetDevice(0) != cudaSuccess) return "cudaSetDevice(0)";
  ncclComm_t comm = nullptr;
  if (ncclResult_t r = ncclCommInitRank(&comm, world, id, 0); r != ncclSuccess) {
    return std::string("ncclCommInitRank: ") + ncclGetErrorString(r);
  }
  std::string err;
  cudaStream_t stream = nullptr;
  if (cudaStreamCreate(&stream) != cudaSuccess) err = "cudaStreamCreate";
  const std::vector<NamedTensor> tensors = TensorManifest(from);
  for (size_t i = 0; i < tensors.size() && err.empty(); ++i) {
    const Tensor& t = tensors[i].tensor;
    const size_t bytes = static_cast<size_t>(t.size_bytes());
    std::vector<uint8_t> host(static_cast<const uint8_t*>(t.data),
                              static_cast<const uint8_t*>(t.data) + bytes);
    if (poke && i == 2) host[7 * DTypeSize(t.dtype)] ^= 1;
    void* d = nullptr;
    if (cudaMalloc(&d, bytes) != cudaSuccess) {
      err = "cudaMalloc";
      break;
    }
    if (cudaMemcpy(d, host.data(), bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
      err = "cudaMemcpy";
    } else if (ncclResult_t r = ncclBroadcast(d, d, bytes, ncclUint8, 0, comm, stream);
               r != ncclSuccess) {
      err = std::string("ncclBroadcast: ") + ncclGetErrorString(r);
    } else if (cudaStreamSynchronize(stream) != cudaSuccess) {
      err = "cudaStreamSynchronize";
    }
    cudaFree(d);
  }
  if (err.empty()) {
    ncclCommDestroy(comm);
  } else {
    ncclCommAbort(comm);
  }
  if (stream != nullptr) cudaStreamDestroy(stream);
  return err;
}

// Serves `base` on GPU 1 (rank 1) and receives `from` broadcast by a trainer thread on GPU 0.
Result<ModelWeights> BroadcastOver(std::shared_ptr<const ModelWeights> base,
                                   const ModelWeights& from, bool poke, std::string* trainer) {
  ncclUniqueId id;
  if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
    return Status::Internal(std::string("ncclGetUniqueId: ") + ncclGetErrorString(r));
  }
  NcclWeightSource s;
  std::memcpy(s.unique_id.data(), &id, sizeof(id));
  s.world_size = 2;
  s.rank = 1;
  s.device = 1;
  s.tensors = ManifestOf(from);
  s.timeout = std::chrono::milliseconds(60000);
  std::thread t([&] { *trainer = TrainerBroadcast(id, 2, from, poke); });
  Result<ModelWeights> got = ReceiveNcclWeights(s, std::move(base));
  t.join();
  return got;
}

TEST(NcclWeightsTest, TwoRanksReceiveTheSourceBitForBit) {
  BR_REQUIRE_GPUS(2);
  auto served = TinyModel(1);
  auto source = TinyModel(2);
  ASSERT_NE(served, nullptr);
  ASSERT_NE(source, nullptr);
  ASSERT_NE(served->weights_hash, source->weights_hash);
  std::string trainer;
  Result<ModelWeights> got = BroadcastOver(served, *source, /*poke=*/false, &trainer);
  EXPECT_EQ(trainer, "") << "trainer rank 0";
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->weights_hash, source->weights_hash);
  EXPECT_EQ(HashWeights(*got), source->weights_hash);
  const auto a = TensorManifest(*got);
  const auto b = TensorManifest(*source);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].name, b[i].name);
    ASSERT_EQ(a[i].tensor.size_bytes(), b[i].tensor.size_bytes()) << a[i].name;
    EXPECT_EQ(std::memcmp(a[i].tensor.data, b[i].tensor.data, a[i].tensor.size_bytes()), 0)
        << a[i].name;
  }
  // The served weights are untouched (the update is a new ModelWeights).
  EXPECT_EQ(HashWeights(*served), served->weights_hash);
  std::fprintf(stderr, "*** nccl_weights_test: 2 ranks, %zu tensors, hash %016llx ***\n", a.size(),
               static_cast<unsigned long long>(got->weights_hash));
}

TEST(NcclWeightsTest, PerturbedSourceGivesADifferentHash) {
  BR_REQUIRE_GPUS(2);
  auto served = TinyModel(1);
  auto source = TinyModel(2);
  ASSERT_NE(served, nullptr);
  ASSERT_NE(source, nullptr);
  std::string trainer;
  Result<ModelWeights> got = BroadcastOver(served, *source, /*poke=*/true, &trainer);
  EXPECT_EQ(trainer, "") << "trainer rank 0";
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_NE(got->weights_hash, source->weights_hash);
  EXPECT_NE(got->weights_hash, served->weights_hash);
  const auto a = TensorManifest(*got);
  const auto b = TensorManifest(*source);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const bool same =
        std::memcmp(a[i].tensor.data, b[i].tensor.data, a[i].tensor.size_bytes()) == 0;
    EXPECT_EQ(same, i != 2) << a[i].name;
  }
}

#endif  // BITROLL_HAVE_NCCL

}  // namespace
}  // namespace bitroll::engine
