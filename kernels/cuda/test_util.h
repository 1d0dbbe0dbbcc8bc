// Helpers for the CUDA test suites (host C++): the loud skip without a device, error checks, and
// an owning device buffer. Test-only.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

namespace bitroll::kernels::cuda::testing {

// "" when a CUDA device is usable, else why not (the cudaGetDeviceCount result).
inline std::string CudaDeviceUnavailableReason() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return std::string("cudaGetDeviceCount -> ") + cudaGetErrorName(err) + " (" +
           cudaGetErrorString(err) + ")";
  }
  if (n < 1) return "cudaGetDeviceCount -> 0 devices";
  return "";
}

// Device buffer of T, freed on scope exit. Size 0 holds nullptr.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n = 0) : n_(n) {
    if (n > 0 && cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)) != cudaSuccess) {
      p_ = nullptr;
    }
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { Upload(host); }
  ~DeviceBuffer() {
    if (p_ != nullptr) cudaFree(p_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return p_; }
  size_t size() const { return n_; }
  bool ok() const { return n_ == 0 || p_ != nullptr; }
  cudaError_t Upload(const std::vector<T>& host) {
    return cudaMemcpy(p_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  std::vector<T> Download() const {
    std::vector<T> host(n_);
    if (n_ > 0) cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return host;
  }
  // Fills with a byte pattern (tests poison outputs to catch unwritten elements).
  cudaError_t Fill(int byte) { return cudaMemset(p_, byte, n_ * sizeof(T)); }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace bitroll::kernels::cuda::testing

// Skips the current test, loudly, when no CUDA device is usable.
#define BR_REQUIRE_CUDA_DEVICE()                                                                 \
  do {                                                                                           \
    const std::string br_why = ::bitroll::kernels::cuda::testing::CudaDeviceUnavailableReason(); \
    if (!br_why.empty()) {                                                                       \
      std::fprintf(stderr, "[  SKIPPED ] no CUDA device: %s\n", br_why.c_str());                 \
      GTEST_SKIP() << "no CUDA device: " << br_why;                                              \
    }                                                                                            \
  } while (0)

// Asserts a CUDA call succeeded, naming the error.
#define BR_CUDA_OK(expr)                                                           \
  do {                                                                             \
    const cudaError_t br_err = (expr);                                             \
    ASSERT_EQ(br_err, cudaSuccess) << #expr << " -> " << cudaGetErrorName(br_err); \
  } while (0)
