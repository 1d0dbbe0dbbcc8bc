// rollout/nccl_weight_sender.h: the trainer's side of a weight update broadcast over NCCL.
//
// BroadcastWeightsNccl sends new weights that live in the trainer's GPU memory to every live
// replica of a bitroll service (docs/weights_nccl.md):
//   1. GetStatus: n live replicas; the communicator has world_size = n + 1 ranks;
//   2. ncclGetUniqueId; Client::BeginUpdateWeightsNccl(unique id, n + 1, manifest, version,
//      drain): the coordinator gives the replicas ranks 1 .. n and each replica joins
//      (engine/nccl_weights.h ReceiveNcclWeights);
//   3. the trainer joins as rank 0 (non-blocking communicator), watching for an error reply
//      meanwhile (a replica that refuses the manifest answers at once: the trainer then aborts
//      its communicator and returns that error);
//   4. one ncclBroadcast per tensor, in order, of exactly numel * dtype-size bytes (ncclUint8,
//      root 0), in place from the caller's device memory (never written);
//   5. the service's reply: the live version once every replica installed the weights.
// Every wait is bounded by NcclSendOptions::timeout; on any error the communicator is aborted
// (ncclCommAbort) and nothing is left allocated.
//
// The tensors' names, dtypes and shapes follow docs/weights.md (the served model's own names;
// "f32" | "f16" | "bf16", converted to the served dtype by the replicas).
//
// Thread-safety: uses `client` (not thread-safe) and the calling thread's current CUDA device
// (set to options.device, restored on return); call from the thread that owns the client.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>

#include "rollout/client.h"
#include "schema/status.h"

namespace bitroll::rollout {

struct NcclSendOptions {
  // drain = true: dispatch pauses and in-flight work finishes on the old weights before the swap
  // (UpdateWeights.drain); false: running sequences continue and later tokens record the new
  // version.
  bool drain = false;
  // The CUDA device holding every tensor's data (the trainer's rank-0 GPU).
  int device = 0;
  // Bound of each wait: the status query, joining the communicator, each broadcast, and the
  // service's final reply. Larger models need more per broadcast on slow links.
  std::chrono::milliseconds timeout{60000};
};

// Broadcasts `tensors` (data: device pointers on options.device, numel * dtype-size bytes each,
// read only) to every live replica as weights `version`. Returns the live version once every
// replica installed them.
// Errors: kInvalidArgument (empty list, unknown dtype, non-positive dimension, null data or data
// not in options.device's memory, non-positive timeout), kUnsupported (this build has no NCCL),
// kUnavailable ("no CUDA device: ..."), kFailedPrecondition (no live replica, or the coordinator
// refused the world size), kTimeout (a step did not complete within options.timeout), kInternal
// (an NCCL or CUDA call failed: named with its error string), and any typed error of the
// coordinator or a replica (kNotFound / kInvalidArgument for a manifest the served model
// rejects, ...).
Result<uint64_t> BroadcastWeightsNccl(Client& client, std::span<const WeightTensor> tensors,
                                      uint64_t version, const NcclSendOptions& options);

// True when this build can send NCCL weight broadcasts.
bool NcclSenderBuilt();

}  // namespace bitroll::rollout
