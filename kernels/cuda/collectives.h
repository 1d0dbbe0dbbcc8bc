// Multi-GPU collectives with a fixed numerical order (NCCL transports bytes; bitroll adds).
//
// deterministic: NCCL's all-reduce picks ring/tree algorithms, protocols and chunkings by
// message size and topology, so its summation order, and its bits, can change with the message
// size. bitroll never lets NCCL add. FixedOrderAllReduceF32 is
//   1. ncclAllGather: every rank receives every rank's buffer, bytes only (no arithmetic);
//   2. FixedOrderSumF32 on every rank: out[i] = ((g[0][i] + g[1][i]) + g[2][i]) + ... in rank
//   order.
// Every rank runs the same additions on the same bits, so every rank ends with identical bits,
// whatever the message size, the NCCL algorithm or the topology. BroadcastWeights moves bytes
// from the trainer's root rank to the replicas (ncclBroadcast; exact).
//
// FixedOrderSumF32 needs only CUDA and is always built; the NCCL functions exist when the build
// found NCCL (BITROLL_HAVE_NCCL, kernels/cuda.cmake).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#if defined(BITROLL_HAVE_NCCL)
#include <nccl.h>
#endif

namespace bitroll::kernels::cuda {

// out[i] = sum over r = 0 .. n_ranks-1 of gathered[r * count + i], added in increasing r
// (device pointers). out may alias gathered's rank-0 slice. cudaErrorInvalidValue for
// n_ranks < 1 or null pointers with count > 0.
cudaError_t FixedOrderSumF32(const float* gathered, int n_ranks, size_t count, float* out,
                             cudaStream_t stream);

// Scratch FixedOrderAllReduceF32 needs: n_ranks * count floats.
size_t FixedOrderAllReduceScratchBytes(int n_ranks, size_t count);

#if defined(BITROLL_HAVE_NCCL)
// In place on each rank's data[count] (device): data = the rank-ordered sum over all ranks.
// scratch: device memory of FixedOrderAllReduceScratchBytes(n_ranks, count) bytes. Call on every
// rank, one thread per rank, NOT inside ncclGroupStart/End (the sum kernel is enqueued at once,
// a grouped all-gather only at ncclGroupEnd). A thread driving several ranks instead groups the
// ncclAllGather calls, then calls FixedOrderSumF32 per rank. Errors: ncclInvalidArgument for bad
// arguments, ncclUnhandledCudaError when the sum kernel fails to launch, else NCCL's.
ncclResult_t FixedOrderAllReduceF32(float* data, size_t count, float* scratch, size_t scratch_bytes,
                                    ncclComm_t comm, cudaStream_t stream);

// Broadcasts `bytes` bytes in place from rank `root` (e.g. new weights from the trainer rank).
ncclResult_t BroadcastWeights(void* data, size_t bytes, int root, ncclComm_t comm,
                              cudaStream_t stream);
#endif

}  // namespace bitroll::kernels::cuda
