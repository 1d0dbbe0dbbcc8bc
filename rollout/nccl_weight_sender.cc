// rollout/nccl_weight_sender.cc: BroadcastWeightsNccl (rollout/nccl_weight_sender.h).
//
// Compiled in every build; the NCCL path exists with BITROLL_HAVE_NCCL (defined by
// kernels/cuda.cmake on bitroll_kernels_cuda, which reaches bitroll_rollout through
// bitroll_engine), otherwise the call returns kUnsupported after checking its arguments.
//
// While it waits (the communicator joining, each broadcast, the teardown), the trainer also polls
// the service's reply with Client::WaitUpdateReply(id, 0): the coordinator answers with the first
// replica error as soon as it arrives, and the trainer then aborts its communicator at once
// instead of waiting for a peer that will never come. A reply "kTimeout" means "no reply yet".
#include "rollout/nccl_weight_sender.h"

#include <string>
#include <string_view>

#if defined(BITROLL_HAVE_NCCL)
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "engine/nccl_util.h"
#endif

namespace bitroll::rollout {
namespace {

Status CheckArguments(std::span<const WeightTensor> tensors, const NcclSendOptions& o) {
  if (tensors.empty()) return Status::InvalidArgument("NCCL weight update: no tensors to send");
  if (o.timeout.count() <= 0) {
    return Status::InvalidArgument("NCCL weight update: timeout " +
                                   std::to_string(o.timeout.count()) + " ms");
  }
  if (o.device < 0) {
    return Status::InvalidArgument("NCCL weight update: device " + std::to_string(o.device));
  }
  for (const WeightTensor& t : tensors) {
    if (Status s = WeightTensorBytes(t).status(); !s.ok()) {
      return s.WithContext("NCCL weight update: " + t.name);
    }
    for (int64_t d : t.shape) {
      if (d <= 0) {
        return Status::InvalidArgument("NCCL weight update: " + t.name + ": dimension " +
                                       std::to_string(d));
      }
    }
    if (t.data == nullptr) {
      return Status::InvalidArgument("NCCL weight update: " + t.name + ": data is null");
    }
  }
  return Status::Ok();
}

#if defined(BITROLL_HAVE_NCCL)

using Clock = std::chrono::steady_clock;
constexpr std::chrono::microseconds kPollInterval = engine::nccl_util::Comm::kPollInterval;
constexpr std::chrono::milliseconds kCloseTimeout{10000};

static_assert(sizeof(ncclUniqueId) == 128, "the wire's unique_id is 128 bytes");

using engine::nccl_util::CudaFailed;
using engine::nccl_util::DeviceGuard;
using engine::nccl_util::DeviceStatus;
using engine::nccl_util::NcclFailed;
using engine::nccl_util::Stream;

// Every tensor's data must be device (or managed) memory of `device`.
Status CheckDevicePointers(std::span<const WeightTensor> tensors, int device) {
  for (const WeightTensor& t : tensors) {
    cudaPointerAttributes a{};
    const cudaError_t e = cudaPointerGetAttributes(&a, t.data);
    if (e != cudaSuccess) return CudaFailed("cudaPointerGetAttributes", e);
    const bool on_device = a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
    if (!on_device || a.device != device) {
      return Status::InvalidArgument("NCCL weight update: " + t.name +
                                     ": data is not memory of CUDA device " +
                                     std::to_string(device));
    }
  }
  return Status::Ok();
}

// Rank 0's non-blocking communicator and the update's reply, polled together. The communicator
// is aborted on scope exit unless it was torn down cleanly.
class Session {
 public:
  Session(Client& client, uint64_t request_id) : client_(client), request_id_(request_id) {}

  ncclComm_t comm() const { return comm_.get(); }

  Status Join(const std::array<uint8_t, 128>& unique_id, int world, Clock::time_point deadline,
              const std::string& on_timeout) {
    return comm_.Join(unique_id, world, /*rank=*/0, deadline, on_timeout, poll_);
  }
  Status WaitComm(const char* call, Clock::time_point deadline, const std::string& on_timeout) {
    return comm_.Wait(call, deadline, on_timeout, poll_);
  }
  Status WaitStream(cudaStream_t stream, Clock::time_point deadline,
                    const std::string& on_timeout) {
    return comm_.WaitStream(stream, deadline, on_timeout, poll_);
  }

  // The service's reply, if one came: an error reply is returned as the error; a version is
  // kept for Finish(). Ok while none has come.
  Status PollReply() {
    if (replied_) return Status::Ok();
    Result<uint64_t> r = client_.WaitUpdateReply(request_id_, 0);
    if (r.ok()) {
      replied_ = true;
      live_version_ = *r;
      return Status::Ok();
    }
    if (r.status().code() == ErrorCode::kTimeout) return Status::Ok();
    return r.status();
  }

  // After the last broadcast: tears the communicator down (ncclCommFinalize, ncclCommDestroy;
  // aborted instead when that takes longer than kCloseTimeout: every byte was sent) while
  // waiting for the reply, which is the result.
  Result<uint64_t> Finish(Clock::time_point deadline, std::chrono::milliseconds timeout) {
    const Clock::time_point close_deadline = std::min(deadline, Clock::now() + kCloseTimeout);
    const ncclResult_t finalized = ncclCommFinalize(comm_.get());
    bool closing = finalized == ncclInProgress;
    if (finalized == ncclSuccess) comm_.Destroy();  // else (an error): the destructor aborts it
    for (;;) {
      if (comm_.get() != nullptr && closing) {
        ncclResult_t state = ncclInProgress;
        if (ncclCommGetAsyncError(comm_.get(), &state) != ncclSuccess || state != ncclInProgress) {
          if (state == ncclSuccess) comm_.Destroy();
          closing = false;  // done, or failed: the destructor aborts it
        } else if (Clock::now() >= close_deadline) {
          closing = false;
        }
      }
      BR_RETURN_IF_ERROR(PollReply());
      if (replied_) return live_version_;
      if (Clock::now() >= deadline) {
        return Status::Timeout(
            "NCCL weight update: every tensor was sent but the service did "
            "not answer within " +
            std::to_string(timeout.count()) + " ms");
      }
      std::this_thread::sleep_for(closing ? kPollInterval : std::chrono::microseconds(2000));
    }
  }

 private:
  Client& client_;
  uint64_t request_id_;
  engine::nccl_util::Comm comm_;  // aborted on scope exit unless torn down cleanly
  const engine::nccl_util::Comm::Poll poll_ = [this] { return PollReply(); };
  bool replied_ = false;
  uint64_t live_version_ = 0;
};

Result<uint64_t> Broadcast(Client& client, std::span<const WeightTensor> tensors, uint64_t version,
                           const NcclSendOptions& o) {
  BR_RETURN_IF_ERROR(DeviceStatus(o.device));
  BR_RETURN_IF_ERROR(CheckDevicePointers(tensors, o.device));
  const int timeout_ms = static_cast<int>(std::min<int64_t>(o.timeout.count(), 1 << 30));
  BR_ASSIGN_OR_RETURN(const StatusInfo status, client.GetStatus(timeout_ms));
  int replicas = 0;
  for (const ReplicaInfo& r : status.replicas) replicas += r.alive ? 1 : 0;
  if (replicas == 0) {
    return Status::FailedPrecondition("NCCL weight update: the service has no live replica");
  }
  DeviceGuard restore_device;
  if (cudaError_t e = cudaSetDevice(o.device); e != cudaSuccess) {
    return CudaFailed("cudaSetDevice", e);
  }
  Stream stream;
  BR_RETURN_IF_ERROR(stream.Create());
  ncclUniqueId id;
  if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
    return NcclFailed("ncclGetUniqueId", r, nullptr);
  }
  std::array<uint8_t, 128> unique_id{};
  std::memcpy(unique_id.data(), &id, sizeof(id));
  const int world = replicas + 1;
  BR_ASSIGN_OR_RETURN(const uint64_t request_id,
                      client.BeginUpdateWeightsNccl(unique_id, world, tensors, version, o.drain));

  Session session(client, request_id);
  const std::string within = " within " + std::to_string(o.timeout.count()) + " ms";
  BR_RETURN_IF_ERROR(session.Join(
      unique_id, world, Clock::now() + o.timeout,
      "the " + std::to_string(replicas) + " replicas did not all join the communicator" + within));
  for (size_t i = 0; i < tensors.size(); ++i) {
    const WeightTensor& t = tensors[i];
    const size_t bytes = *WeightTensorBytes(t);  // checked by CheckArguments
    const Clock::time_point deadline = Clock::now() + o.timeout;
    const std::string what = "tensor " + std::to_string(i) + " (" + t.name + ", " +
                             std::to_string(bytes) + " bytes) was not received" + within;
    // In place at the root: NCCL only reads the trainer's buffer.
    void* data = const_cast<void*>(t.data);
    const ncclResult_t r =
        ncclBroadcast(data, data, bytes, ncclUint8, /*root=*/0, session.comm(), stream.get());
    if (r == ncclInProgress) {
      BR_RETURN_IF_ERROR(session.WaitComm("ncclBroadcast", deadline, what));
    } else if (r != ncclSuccess) {
      return NcclFailed("ncclBroadcast", r, session.comm());
    }
    BR_RETURN_IF_ERROR(session.WaitStream(stream.get(), deadline, what));
  }
  return session.Finish(Clock::now() + o.timeout, o.timeout);
}

#endif  // BITROLL_HAVE_NCCL

}  // namespace

Result<uint64_t> BroadcastWeightsNccl(Client& client, std::span<const WeightTensor> tensors,
                                      uint64_t version, const NcclSendOptions& options) {
  BR_RETURN_IF_ERROR(CheckArguments(tensors, options));
#if defined(BITROLL_HAVE_NCCL)
  return Broadcast(client, tensors, version, options);
#else
  (void)client;
  (void)version;
  return Status::Unsupported(
      "NCCL weight update: this build has no NCCL (configure with CUDA and NCCL present)");
#endif
}

bool NcclSenderBuilt() {
#if defined(BITROLL_HAVE_NCCL)
  return true;
#else
  return false;
#endif
}

}  // namespace bitroll::rollout
