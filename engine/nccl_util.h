// engine/nccl_util.h: CUDA / NCCL helpers shared by the two sides of an NCCL weight update
// (engine/nccl_weights.cc, the replica; rollout/nccl_weight_sender.cc, the trainer): typed errors
// from CUDA and NCCL results, the device check, RAII for the current device and a stream, and a
// non-blocking communicator with deadline-bounded waits.
// Header-only; include only where BITROLL_HAVE_NCCL is defined.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <array>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <utility>

#include "schema/status.h"

namespace bitroll::engine::nccl_util {

inline Status CudaFailed(const char* call, cudaError_t e) {
  cudaGetLastError();  // clear this thread's error state
  return Status::Internal(std::string("NCCL weight update: ") + call + " -> " +
                          cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

inline Status NcclFailed(const char* call, ncclResult_t r, ncclComm_t comm) {
  std::string m = std::string("NCCL weight update: ") + call + " -> " + ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0') m += std::string(" (") + last + ")";
  return Status::Internal(std::move(m));
}

// Ok when `device` exists, else kUnavailable "no CUDA device: ...".
inline Status DeviceStatus(int device) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return Status::Unavailable(std::string("no CUDA device: cudaGetDeviceCount -> ") +
                               cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
  }
  if (count == 0) return Status::Unavailable("no CUDA device: cudaGetDeviceCount found none");
  if (device >= count) {
    return Status::Unavailable("no CUDA device: device " + std::to_string(device) + " requested, " +
                               std::to_string(count) + " present");
  }
  return Status::Ok();
}

// Restores the calling thread's current device on scope exit.
class DeviceGuard {
 public:
  DeviceGuard() { had_ = cudaGetDevice(&previous_) == cudaSuccess; }
  ~DeviceGuard() {
    if (had_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool had_ = false;
};

class Stream {
 public:
  Stream() = default;
  ~Stream() {
    if (s_ != nullptr) cudaStreamDestroy(s_);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  Status Create() {
    const cudaError_t e = cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
      s_ = nullptr;
      return CudaFailed("cudaStreamCreateWithFlags", e);
    }
    return Status::Ok();
  }
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

// A non-blocking NCCL communicator (config.blocking = 0), aborted on scope exit unless
// Destroy()ed. The waits poll ncclCommGetAsyncError every kPollInterval; `poll`, when given, is
// called on every round too (the trainer polls the service's reply) and ends the wait with its
// error.
class Comm {
 public:
  using Clock = std::chrono::steady_clock;
  using Poll = std::function<Status()>;
  static constexpr std::chrono::microseconds kPollInterval{100};

  Comm() = default;
  ~Comm() {
    if (comm_ != nullptr) ncclCommAbort(comm_);
  }
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  ncclComm_t get() const { return comm_; }

  // Joins as `rank` of `world`; kTimeout (with `on_timeout`) when not every rank joined by
  // `deadline`.
  Status Join(const std::array<uint8_t, 128>& unique_id, int world, int rank,
              Clock::time_point deadline, const std::string& on_timeout, const Poll& poll = {}) {
    static_assert(sizeof(ncclUniqueId) == 128, "the wire's unique_id is 128 bytes");
    ncclUniqueId id;
    std::memcpy(&id, unique_id.data(), sizeof(id));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t r = ncclCommInitRankConfig(&comm_, world, id, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      return NcclFailed("ncclCommInitRankConfig", r, comm_);
    }
    return Wait("ncclCommInitRankConfig", deadline, on_timeout, poll);
  }

  // Waits until the communicator's last call leaves ncclInProgress.
  Status Wait(const char* call, Clock::time_point deadline, const std::string& on_timeout,
              const Poll& poll = {}) {
    for (;;) {
      ncclResult_t state = ncclInProgress;
      const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
      if (r != ncclSuccess) return NcclFailed("ncclCommGetAsyncError", r, comm_);
      if (state == ncclSuccess) return Status::Ok();
      if (state != ncclInProgress) return NcclFailed(call, state, comm_);
      if (poll) BR_RETURN_IF_ERROR(poll());
      if (Clock::now() >= deadline) return Status::Timeout("NCCL weight update: " + on_timeout);
      std::this_thread::sleep_for(kPollInterval);
    }
  }

  // Waits until `stream` is idle, failing early on an asynchronous NCCL error.
  Status WaitStream(cudaStream_t stream, Clock::time_point deadline, const std::string& on_timeout,
                    const Poll& poll = {}) {
    for (;;) {
      const cudaError_t e = cudaStreamQuery(stream);
      if (e == cudaSuccess) return Status::Ok();
      if (e != cudaErrorNotReady) return CudaFailed("cudaStreamQuery", e);
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
      if (r != ncclSuccess) return NcclFailed("ncclCommGetAsyncError", r, comm_);
      if (state != ncclSuccess && state != ncclInProgress) {
        return NcclFailed("ncclBroadcast", state, comm_);
      }
      if (poll) BR_RETURN_IF_ERROR(poll());
      if (Clock::now() >= deadline) return Status::Timeout("NCCL weight update: " + on_timeout);
      std::this_thread::sleep_for(kPollInterval);
    }
  }

  // After a clean exchange (ncclCommFinalize done): frees the communicator without an abort.
  void Destroy() {
    if (comm_ != nullptr) ncclCommDestroy(comm_);
    comm_ = nullptr;
  }

 private:
  ncclComm_t comm_ = nullptr;
};

}  // namespace bitroll::engine::nccl_util
