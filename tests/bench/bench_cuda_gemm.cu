// Benchmark: the batch-invariant bf16 GEMM (kernels/cuda/gemm.h) against cuBLAS bf16
// (cublasGemmEx, fp32 compute, bf16 output) on the weight shapes of 0.5B-8B models at
// M = 1 .. 4096. Median of event-timed repetitions after warm-up; weights rotate over enough
// copies that every repetition reads them from HBM, not L2. Prints one line per case and a
// summary; --csv=PATH writes every number. Run by scripts/device-check.sh (never by ctest).
//   bench_cuda_gemm [--quick] [--reps=N] [--csv=PATH]
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda/gemm.h"
#include "tests/bench/bench_cuda_common.h"

namespace {

using bitroll::bench::Median;

using bitroll::kernels::cuda::CudaGemm;
using bitroll::kernels::cuda::CudaGemmParams;
using bitroll::kernels::cuda::CudaGemmTileConfigFor;
using bitroll::kernels::cuda::GemmOut;

#define CHECK_CUBLAS(expr)                                                               \
  do {                                                                                   \
    cublasStatus_t s_ = (expr);                                                          \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                   \
      std::fprintf(stderr, "%s:%d: %s -> cublas status %d\n", __FILE__, __LINE__, #expr, \
                   static_cast<int>(s_));                                                \
      std::exit(2);                                                                      \
    }                                                                                    \
  } while (0)

// Random bf16 in [-1, 1) from a counter hash (no zeros: METHOD.md).
__global__ void FillBf16(uint16_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 0x9E3779B9u ^ seed;
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    h *= 0xC2B2AE35u;
    h ^= h >> 16;
    const float f = (static_cast<float>(h >> 8) * (1.0f / 16777216.0f)) * 2.0f - 1.0f;
    p[i] = static_cast<uint16_t>(__float_as_uint(f) >> 16);
  }
}

struct Shape {
  const char* model;
  const char* name;
  int64_t n, k;
};

const Shape kShapes[] = {
    {"qwen2.5-0.5b", "qkvo 896x896", 896, 896},
    {"qwen2.5-0.5b", "up 4864x896", 4864, 896},
    {"qwen2.5-0.5b", "down 896x4864", 896, 4864},
    {"llama3-8b", "qo 4096x4096", 4096, 4096},
    {"llama3-8b", "up 14336x4096", 14336, 4096},
    {"llama3-8b", "down 4096x14336", 4096, 14336},
    {"llama3-8b", "lm_head 128256x4096", 128256, 4096},
};

float BfToF(uint16_t h) {
  uint32_t b = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  const bitroll::bench::CudaBenchArgs args = bitroll::bench::ParseCudaBenchArgs(argc, argv, 20);
  const bool quick = args.quick;
  const int reps = args.reps;
  const std::string csv_path = args.csv_path;
  if (!bitroll::bench::HaveCudaDevice("bench_cuda_gemm")) return 0;
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20);
  cublasHandle_t handle;
  CHECK_CUBLAS(cublasCreate(&handle));
  FILE* csv = csv_path.empty() ? nullptr : std::fopen(csv_path.c_str(), "w");
  if (csv != nullptr) {
    std::fprintf(csv,
                 "model,shape,M,N,K,tile,ours_us,cublas_us,ours_tflops,cublas_tflops,"
                 "ratio,max_rel_diff\n");
  }
  const std::vector<int64_t> ms =
      quick ? std::vector<int64_t>{1, 256, 4096} : std::vector<int64_t>{1, 16, 64, 256, 1024, 4096};
  std::printf("%-13s %-20s %5s %6s %9s %9s %7s %7s %6s %9s\n", "model", "shape", "M", "tile",
              "ours_us", "cublas_us", "ours_TF", "cubl_TF", "ratio", "rel_diff");
  double worst_ratio_256 = 1e9;
  int bad_cases = 0;
  double sum_ratio_256 = 0;
  int n_ratio_256 = 0;
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  for (const Shape& s : kShapes) {
    const size_t w_elems = static_cast<size_t>(s.n * s.k);
    // Enough weight copies that the rotation exceeds 2x L2.
    const size_t w_bytes = w_elems * 2;
    const int copies = static_cast<int>(std::min<size_t>(
        128, std::max<size_t>(1, (2 * static_cast<size_t>(prop.l2CacheSize)) / w_bytes + 1)));
    uint16_t* w = nullptr;
    CHECK_CUDA(cudaMalloc(&w, w_bytes * copies));
    FillBf16<<<1024, 256>>>(w, w_elems * copies, 1234);
    for (int64_t m : ms) {
      uint16_t *x = nullptr, *y_ours = nullptr, *y_ref = nullptr;
      CHECK_CUDA(cudaMalloc(&x, static_cast<size_t>(m * s.k) * 2));
      CHECK_CUDA(cudaMalloc(&y_ours, static_cast<size_t>(m * s.n) * 2));
      CHECK_CUDA(cudaMalloc(&y_ref, static_cast<size_t>(m * s.n) * 2));
      FillBf16<<<1024, 256>>>(x, static_cast<size_t>(m * s.k), 99);
      CHECK_CUDA(cudaGetLastError());
      auto ours = [&](int copy) {
        CudaGemmParams p;
        p.x = x;
        p.m = m;
        p.ldx = s.k;
        p.w = w + static_cast<size_t>(copy) * w_elems;
        p.n = s.n;
        p.k = s.k;
        p.y = y_ours;
        p.ldy = s.n;
        p.out = GemmOut::kBF16;
        CHECK_CUDA(CudaGemm(p, nullptr));
      };
      auto cublas = [&](int copy) {
        const float alpha = 1.0f, beta = 0.0f;
        // Column-major view: Y^T [N x M] = W [N x K] (W^T stored, op T) * X^T [K x M].
        CHECK_CUBLAS(cublasGemmEx(
            handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(s.n), static_cast<int>(m),
            static_cast<int>(s.k), &alpha, w + static_cast<size_t>(copy) * w_elems, CUDA_R_16BF,
            static_cast<int>(s.k), x, CUDA_R_16BF, static_cast<int>(s.k), &beta, y_ref, CUDA_R_16BF,
            static_cast<int>(s.n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      };
      auto time_it = [&](auto&& fn) {
        for (int i = 0; i < 3; ++i) fn(i % copies);
        CHECK_CUDA(cudaDeviceSynchronize());
        std::vector<float> t;
        for (int r = 0; r < reps; ++r) {
          CHECK_CUDA(cudaEventRecord(e0));
          fn(r % copies);
          CHECK_CUDA(cudaEventRecord(e1));
          CHECK_CUDA(cudaEventSynchronize(e1));
          float ms_ = 0;
          CHECK_CUDA(cudaEventElapsedTime(&ms_, e0, e1));
          t.push_back(ms_ * 1000.0f);
        }
        return Median(t);
      };
      const double t_ours = time_it(ours);
      const double t_ref = time_it(cublas);
      // Same inputs (copy 0) for the correctness check.
      ours(0);
      cublas(0);
      CHECK_CUDA(cudaDeviceSynchronize());
      std::vector<uint16_t> a(static_cast<size_t>(m * s.n)), b(a.size());
      CHECK_CUDA(cudaMemcpy(a.data(), y_ours, a.size() * 2, cudaMemcpyDeviceToHost));
      CHECK_CUDA(cudaMemcpy(b.data(), y_ref, b.size() * 2, cudaMemcpyDeviceToHost));
      double num = 0, den = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        const double d = double(BfToF(a[i])) - BfToF(b[i]);
        num += d * d;
        den += double(BfToF(b[i])) * BfToF(b[i]);
      }
      const double rel = den > 0 ? std::sqrt(num / den) : 0.0;
      if (!(rel < 2e-2)) ++bad_cases;  // bf16 rounding of both outputs is ~4e-3
      const double flops = 2.0 * m * s.n * s.k;
      const double tf_ours = flops / (t_ours * 1e-6) / 1e12;
      const double tf_ref = flops / (t_ref * 1e-6) / 1e12;
      const double ratio = t_ref / t_ours;  // ours' throughput as a fraction of cuBLAS'
      const auto tile = CudaGemmTileConfigFor(s.n, s.k);
      char tile_s[16];
      std::snprintf(tile_s, sizeof(tile_s), "%dx%d", tile.bm, tile.bn);
      std::printf("%-13s %-20s %5lld %6s %9.1f %9.1f %7.1f %7.1f %6.2f %9.2e\n", s.model, s.name,
                  static_cast<long long>(m), tile_s, t_ours, t_ref, tf_ours, tf_ref, ratio, rel);
      if (csv != nullptr) {
        std::fprintf(csv, "%s,%s,%lld,%lld,%lld,%s,%.2f,%.2f,%.2f,%.2f,%.3f,%.3e\n", s.model,
                     s.name, static_cast<long long>(m), static_cast<long long>(s.n),
                     static_cast<long long>(s.k), tile_s, t_ours, t_ref, tf_ours, tf_ref, ratio,
                     rel);
      }
      if (m >= 256) {
        worst_ratio_256 = std::min(worst_ratio_256, ratio);
        sum_ratio_256 += ratio;
        ++n_ratio_256;
      }
      cudaFree(x);
      cudaFree(y_ours);
      cudaFree(y_ref);
    }
    cudaFree(w);
  }
  if (csv != nullptr) std::fclose(csv);
  std::printf(
      "SUMMARY gemm: M>=256 ours/cuBLAS throughput mean %.2f, worst %.2f (target >= 0.85)\n",
      n_ratio_256 > 0 ? sum_ratio_256 / n_ratio_256 : 0.0, worst_ratio_256);
  std::printf("SUMMARY gemm checks: %d case(s) with ||ours - cuBLAS|| / ||cuBLAS|| >= 2e-2\n",
              bad_cases);
  cublasDestroy(handle);
  return bad_cases == 0 ? 0 : 1;
}
