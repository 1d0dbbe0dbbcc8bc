// engine/nccl_weights.cc: ReceiveNcclWeights (engine/nccl_weights.h), a replica's side of an NCCL
// weight broadcast.
//
// Compiled in every build. The checks of the request (ranks, manifest against the served model)
// need no device and run first everywhere; the NCCL path exists only with BITROLL_HAVE_NCCL
// (kernels/cuda.cmake), otherwise the call ends there with kUnsupported.
//
// Sequence (replica rank r of world_size, on `device`):
//   1. validate world_size / rank / timeout and every manifest entry against TensorManifest(base)
//      (same names and shape rules as the WeightStager; the tied classifier's name is accepted);
//   2. cudaSetDevice, one stream, one device buffer of the largest tensor (as broadcast), one
//      pinned host staging buffer of at most kStagingBytes;
//   3. ncclCommInitRankConfig(blocking = 0), polling ncclCommGetAsyncError until it leaves
//      ncclInProgress or `timeout` passes (then ncclCommAbort, kTimeout);
//   4. per tensor, in manifest order: ncclBroadcast(buf, buf, numel * dtype size, ncclUint8,
//      root 0) and poll the stream (and the communicator's async error) until done or `timeout`;
//      copy it to the host in staging-sized pieces, each WeightStager::Put as one slice (which
//      converts to the served dtype and refuses non-finite values);
//   5. ncclCommFinalize + ncclCommDestroy (ncclCommAbort when that does not complete within
//      kCloseTimeout: the bytes are all there), WeightStager::Finish(false).
// On every error path the communicator is aborted (ncclCommAbort) before the buffers and the
// stream are freed (RAII, in reverse order of creation), and the caller's current device is
// restored.
#include "engine/nccl_weights.h"

#include <algorithm>
#include <cstring>
#include <unordered_set>
#include <utility>

#include "engine/weight_update.h"

#if defined(BITROLL_HAVE_NCCL)
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "engine/nccl_util.h"

#include <thread>
#endif

namespace bitroll::engine {
namespace {

Status CheckRequest(const NcclWeightSource& source, const ModelWeights* base) {
  if (base == nullptr) {
    return Status::InvalidArgument("NCCL weight update: no served weights to update");
  }
  if (source.world_size < 2) {
    return Status::InvalidArgument("NCCL weight update: world_size " +
                                   std::to_string(source.world_size) +
                                   " (needs >= 2: the trainer, rank 0, and a replica)");
  }
  if (source.rank < 1 || source.rank >= source.world_size) {
    return Status::InvalidArgument("NCCL weight update: rank " + std::to_string(source.rank) +
                                   " outside 1 .. " + std::to_string(source.world_size - 1) +
                                   " (rank 0 is the trainer)");
  }
  if (source.device < 0) {
    return Status::InvalidArgument("NCCL weight update: device " + std::to_string(source.device));
  }
  if (source.timeout.count() <= 0) {
    return Status::InvalidArgument("NCCL weight update: timeout " +
                                   std::to_string(source.timeout.count()) + " ms");
  }
  return Status::Ok();
}

// Checks every manifest entry against the served model before any device call, with the
// WeightStager's own name and shape rules (a tied classifier's name included), each tensor once.
// Sets *max_bytes to the largest tensor as broadcast.
Status CheckManifest(const std::vector<NcclTensorSpec>& specs,
                     std::shared_ptr<const ModelWeights> base, uint64_t* max_bytes) {
  if (specs.empty()) return Status::InvalidArgument("NCCL weight update: the manifest is empty");
  const WeightStager rules(std::move(base));
  std::unordered_set<std::string> seen;
  *max_bytes = 0;
  for (const NcclTensorSpec& spec : specs) {
    BR_RETURN_IF_ERROR(rules.Check(spec.name, spec.shape));
    if (!seen.insert(spec.name).second) {
      return Status::InvalidArgument("weight update: " + spec.name +
                                     " appears twice in the NCCL manifest");
    }
    uint64_t numel = 1;
    for (int64_t d : spec.shape) numel *= static_cast<uint64_t>(d);
    *max_bytes = std::max(*max_bytes, numel * DTypeSize(spec.dtype));
  }
  return Status::Ok();
}

#if defined(BITROLL_HAVE_NCCL)

static_assert(sizeof(ncclUniqueId) == sizeof(NcclWeightSource::unique_id),
              "NcclWeightSource::unique_id holds an ncclUniqueId");

using Clock = std::chrono::steady_clock;

// Host staging: device -> pinned host copies and WeightStager::Put in pieces of at most this
// many bytes (a multiple of every element size), so a large tensor needs no large pinned buffer.
constexpr uint64_t kStagingBytes = uint64_t{64} << 20;
// The longest the communicator's teardown may take after the last tensor arrived.
constexpr std::chrono::milliseconds kCloseTimeout{10000};

using nccl_util::CudaFailed;
using nccl_util::DeviceGuard;
using nccl_util::DeviceStatus;
using nccl_util::NcclFailed;
using nccl_util::Stream;

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() {
    if (p_ != nullptr) cudaFree(p_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  Status Allocate(uint64_t bytes) {
    const cudaError_t e = cudaMalloc(&p_, bytes);
    if (e != cudaSuccess) {
      p_ = nullptr;
      return CudaFailed("cudaMalloc", e);
    }
    return Status::Ok();
  }
  uint8_t* get() const { return static_cast<uint8_t*>(p_); }

 private:
  void* p_ = nullptr;
};

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() {
    if (p_ != nullptr) cudaFreeHost(p_);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  Status Allocate(uint64_t bytes) {
    const cudaError_t e = cudaMallocHost(&p_, bytes);
    if (e != cudaSuccess) {
      p_ = nullptr;
      return CudaFailed("cudaMallocHost", e);
    }
    return Status::Ok();
  }
  uint8_t* get() const { return static_cast<uint8_t*>(p_); }

 private:
  void* p_ = nullptr;
};

// Tears the communicator down after a complete exchange: ncclCommFinalize (every rank does; it
// completes once all are quiescent), then ncclCommDestroy. When that does not happen by
// `deadline`, the Comm's destructor aborts it instead.
void Close(nccl_util::Comm& comm, Clock::time_point deadline) {
  const ncclResult_t r = ncclCommFinalize(comm.get());
  if (r != ncclSuccess && r != ncclInProgress) return;
  if (!comm.Wait("ncclCommFinalize", deadline, "").ok()) return;
  comm.Destroy();
}

Result<ModelWeights> Receive(const NcclWeightSource& source,
                             std::shared_ptr<const ModelWeights> base, uint64_t max_bytes) {
  BR_RETURN_IF_ERROR(DeviceStatus(source.device));
  DeviceGuard restore_device;
  if (cudaError_t e = cudaSetDevice(source.device); e != cudaSuccess) {
    return CudaFailed("cudaSetDevice", e);
  }
  // Declared in this order so that the communicator is aborted (or already destroyed) before
  // the buffers its operations use are freed.
  Stream stream;
  BR_RETURN_IF_ERROR(stream.Create());
  DeviceBuffer buffer;  // one tensor as broadcast
  BR_RETURN_IF_ERROR(buffer.Allocate(max_bytes));
  const uint64_t staging_bytes = std::min(max_bytes, kStagingBytes);
  PinnedBuffer staging;
  BR_RETURN_IF_ERROR(staging.Allocate(staging_bytes));
  nccl_util::Comm comm;
  BR_RETURN_IF_ERROR(
      comm.Join(source.unique_id, source.world_size, source.rank, Clock::now() + source.timeout,
                "the trainer and the other replicas did not all join the communicator within " +
                    std::to_string(source.timeout.count()) + " ms"));

  WeightStager stager(base);
  const std::string within = " within " + std::to_string(source.timeout.count()) + " ms";
  for (size_t i = 0; i < source.tensors.size(); ++i) {
    const NcclTensorSpec& spec = source.tensors[i];
    int64_t numel = 1;
    for (int64_t d : spec.shape) numel *= d;
    const uint64_t bytes = static_cast<uint64_t>(numel) * DTypeSize(spec.dtype);
    const Clock::time_point deadline = Clock::now() + source.timeout;
    const std::string what = "tensor " + std::to_string(i) + " (" + spec.name + ", " +
                             std::to_string(bytes) + " bytes) was not broadcast" + within;
    const ncclResult_t r = ncclBroadcast(buffer.get(), buffer.get(), bytes, ncclUint8,
                                         /*root=*/0, comm.get(), stream.get());
    if (r == ncclInProgress) {
      BR_RETURN_IF_ERROR(comm.Wait("ncclBroadcast", deadline, what));
    } else if (r != ncclSuccess) {
      return NcclFailed("ncclBroadcast", r, comm.get());
    }
    BR_RETURN_IF_ERROR(comm.WaitStream(stream.get(), deadline, what));
    for (uint64_t off = 0; off < bytes; off += staging_bytes) {
      const uint64_t n = std::min(staging_bytes, bytes - off);
      if (cudaError_t e = cudaMemcpyAsync(staging.get(), buffer.get() + off, n,
                                          cudaMemcpyDeviceToHost, stream.get());
          e != cudaSuccess) {
        return CudaFailed("cudaMemcpyAsync", e);
      }
      if (cudaError_t e = cudaStreamSynchronize(stream.get()); e != cudaSuccess) {
        return CudaFailed("cudaStreamSynchronize", e);
      }
      TensorSlice slice;
      slice.name = spec.name;
      slice.dtype = spec.dtype;
      slice.shape = spec.shape;
      slice.offset = off;
      slice.data = std::span<const uint8_t>(staging.get(), n);
      BR_RETURN_IF_ERROR(stager.Put(slice));
    }
  }
  // Every byte has arrived: a teardown that does not complete in time (a peer gone after the
  // last broadcast) costs an ncclCommAbort, not the update.
  Close(comm, Clock::now() + std::min<std::chrono::milliseconds>(source.timeout, kCloseTimeout));
  return stager.Finish(/*full=*/false);
}

#endif  // BITROLL_HAVE_NCCL

}  // namespace

Result<ModelWeights> ReceiveNcclWeights(const NcclWeightSource& source,
                                        std::shared_ptr<const ModelWeights> base) {
  BR_RETURN_IF_ERROR(CheckRequest(source, base.get()));
  uint64_t max_bytes = 0;
  BR_RETURN_IF_ERROR(CheckManifest(source.tensors, base, &max_bytes));
#if defined(BITROLL_HAVE_NCCL)
  return Receive(source, std::move(base), max_bytes);
#else
  return Status::Unsupported(
      "NCCL weight update: this build has no NCCL (configure with CUDA and NCCL present)");
#endif
}

bool NcclWeightsBuilt() {
#if defined(BITROLL_HAVE_NCCL)
  return true;
#else
  return false;
#endif
}

}  // namespace bitroll::engine
