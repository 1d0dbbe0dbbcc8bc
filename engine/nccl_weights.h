// engine/nccl_weights.h: a replica's side of a weight update broadcast over NCCL.
//
// The trainer (rank 0 of a communicator it created with ncclGetUniqueId) broadcasts every tensor
// of a manifest, in manifest order, one ncclBroadcast per tensor of exactly
// numel * dtype-size bytes. Each replica (ranks 1 .. world_size-1, on its own GPU) joins the
// communicator, receives the tensors into device memory and stages them over the weights it
// serves (engine/weight_update.h: names, dtypes and validation are the same as for a streamed
// update), so the engine can InstallWeights() the result.
//
// The manifest is validated against the served model BEFORE joining the communicator, so a bad
// manifest gives a prompt error on every replica (the trainer then aborts its communicator).
//
// Always declared; the implementation needs a build with CUDA and NCCL (BITROLL_HAVE_NCCL),
// otherwise ReceiveNcclWeights returns kUnsupported.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/model_weights.h"
#include "schema/status.h"

namespace bitroll::engine {

struct NcclTensorSpec {
  std::string name;
  kernels::DType dtype = kernels::DType::kF32;  // as broadcast (converted to the served dtype)
  std::vector<int64_t> shape;
};

struct NcclWeightSource {
  std::array<uint8_t, 128> unique_id{};  // ncclUniqueId bytes
  int world_size = 0;                    // >= 2
  int rank = 0;                          // 1 .. world_size - 1
  std::vector<NcclTensorSpec> tensors;   // broadcast in this order
  int device = 0;                        // CUDA device of this replica
  // How long joining the communicator and each broadcast may take before the replica gives up
  // (ncclCommAbort) with kTimeout.
  std::chrono::milliseconds timeout{60000};
};

// Errors: kUnsupported (no CUDA or NCCL in this build), kUnavailable (no usable GPU),
// kInvalidArgument (world_size / rank out of range, and the WeightStager's errors for the
// manifest, reported before joining), kNotFound (a name the model lacks), kTimeout (the
// trainer did not join or send in time), kInternal (an NCCL or CUDA error, named).
Result<ModelWeights> ReceiveNcclWeights(const NcclWeightSource& source,
                                        std::shared_ptr<const ModelWeights> base);

// True when this build can receive NCCL weight broadcasts.
bool NcclWeightsBuilt();

}  // namespace bitroll::engine
