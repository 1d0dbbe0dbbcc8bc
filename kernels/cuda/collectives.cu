// Fixed-order sum kernel and the NCCL wrappers (collectives.h).
#include "kernels/cuda/collectives.h"

namespace bitroll::kernels::cuda {

namespace {

__global__ void FixedOrderSumKernel(const float* gathered, int n_ranks, size_t count, float* out) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float s = gathered[i];
    for (int r = 1; r < n_ranks; ++r)
      s = __fadd_rn(s, gathered[static_cast<size_t>(r) * count + i]);
    out[i] = s;
  }
}

}  // namespace

cudaError_t FixedOrderSumF32(const float* gathered, int n_ranks, size_t count, float* out,
                             cudaStream_t stream) {
  if (n_ranks < 1) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  if (gathered == nullptr || out == nullptr) return cudaErrorInvalidValue;
  const int threads = 256;
  const size_t blocks = (count + threads - 1) / threads;
  FixedOrderSumKernel<<<static_cast<unsigned>(blocks < 65536 ? blocks : 65536), threads, 0,
                        stream>>>(gathered, n_ranks, count, out);
  return cudaGetLastError();
}

size_t FixedOrderAllReduceScratchBytes(int n_ranks, size_t count) {
  return n_ranks < 1 ? 0 : static_cast<size_t>(n_ranks) * count * sizeof(float);
}

#if defined(BITROLL_HAVE_NCCL)
ncclResult_t FixedOrderAllReduceF32(float* data, size_t count, float* scratch, size_t scratch_bytes,
                                    ncclComm_t comm, cudaStream_t stream) {
  int n_ranks = 0;
  ncclResult_t r = ncclCommCount(comm, &n_ranks);
  if (r != ncclSuccess) return r;
  if (count == 0) return ncclSuccess;
  if (data == nullptr || scratch == nullptr ||
      scratch_bytes < FixedOrderAllReduceScratchBytes(n_ranks, count)) {
    return ncclInvalidArgument;
  }
  r = ncclAllGather(data, scratch, count, ncclFloat32, comm, stream);
  if (r != ncclSuccess) return r;
  if (FixedOrderSumF32(scratch, n_ranks, count, data, stream) != cudaSuccess) {
    return ncclUnhandledCudaError;
  }
  return ncclSuccess;
}

ncclResult_t BroadcastWeights(void* data, size_t bytes, int root, ncclComm_t comm,
                              cudaStream_t stream) {
  if (bytes == 0) return ncclSuccess;
  if (data == nullptr) return ncclInvalidArgument;
  return ncclBroadcast(data, data, bytes, ncclUint8, root, comm, stream);
}
#endif

}  // namespace bitroll::kernels::cuda
