// engine/forward_backend.cc: device selection (CheckDevice, MakeDeviceBackend). The only engine
// file besides engine/cuda/ that knows whether this build has CUDA (BITROLL_HAVE_CUDA).
#include "engine/forward_backend.h"

#include <utility>

#ifdef BITROLL_HAVE_CUDA
#include "engine/cuda/cuda_transformer.h"
#endif

namespace bitroll::engine {

Status CheckDevice(const std::string& device) {
  if (device == "cpu") return Status::Ok();
  if (device != "cuda") {
    return Status::InvalidArgument("device '" + device + "': expected cpu or cuda");
  }
#ifdef BITROLL_HAVE_CUDA
  return cuda::CudaDeviceStatus(0);
#else
  return Status::Unsupported(
      "device cuda: this build has no CUDA (configure with nvcc present, -DBITROLL_CUDA=ON)");
#endif
}

Result<std::unique_ptr<ForwardBackend>> MakeDeviceBackend(
    const EngineOptions& options, std::shared_ptr<const ModelWeights> weights) {
  BR_RETURN_IF_ERROR(CheckDevice(options.device));
  if (options.device == "cpu") return std::unique_ptr<ForwardBackend>();
#ifdef BITROLL_HAVE_CUDA
  cuda::CudaTransformerOptions co;
  if (options.attention == "single") co.attention = kernels::AttentionKernel::kSingle;
  if (options.attention == "split") co.attention = kernels::AttentionKernel::kSplit;
  BR_ASSIGN_OR_RETURN(std::unique_ptr<cuda::CudaTransformer> t,
                      cuda::CudaTransformer::Create(std::move(weights), co));
  return std::unique_ptr<ForwardBackend>(std::move(t));
#else
  (void)weights;
  return Status::Internal("unreachable: CheckDevice accepted cuda without CUDA");
#endif
}

}  // namespace bitroll::engine
