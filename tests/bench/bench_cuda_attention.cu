// Benchmark: the dual-kernel decode attention (kernels/cuda/attention.h, kAuto: whole waves in
// kernel 1, the tail in kernel 2) against the non-invariant flash-decoding baseline, at batch
// 1..128 x context 1k..32k, Llama-3-8B heads (32 q / 8 kv, head_dim 128, fp32 KV, block 32).
// Also times kernel 1 and kernel 2 forced, and measures HBM bandwidth with a device-to-device
// copy kernel in the same run. GB/s counts the KV bytes each call must read (K and V of every
// key of every sequence once). Median of event-timed repetitions after warm-up.
//   bench_cuda_attention [--quick] [--reps=N] [--csv=PATH]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda/attention.h"
#include "tests/bench/bench_cuda_common.h"

namespace {

using bitroll::bench::Median;

using bitroll::kernels::cuda::CudaAttention;
using bitroll::kernels::cuda::CudaAttentionKernel;
using bitroll::kernels::cuda::CudaAttentionParams;
using bitroll::kernels::cuda::CudaAttentionSlots;
using bitroll::kernels::cuda::CudaAttentionWorkspaceBytes;
using bitroll::kernels::cuda::CudaFlashDecodeAttention;
using bitroll::kernels::cuda::CudaFlashDecodeSplits;
using bitroll::kernels::cuda::CudaFlashDecodeWorkspaceBytes;

__global__ void FillF32(float* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 0x9E3779B9u ^ seed;
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    h *= 0xC2B2AE35u;
    h ^= h >> 16;
    p[i] = (static_cast<float>(h >> 8) * (1.0f / 16777216.0f)) * 2.0f - 1.0f;
  }
}

__global__ void CopyKernel(const float4* __restrict__ src, float4* __restrict__ dst, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    dst[i] = src[i];
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bitroll::bench::CudaBenchArgs args = bitroll::bench::ParseCudaBenchArgs(argc, argv, 10);
  const bool quick = args.quick;
  const int reps = args.reps;
  const std::string csv_path = args.csv_path;
  if (!bitroll::bench::HaveCudaDevice("bench_cuda_attention")) return 0;
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  std::printf("device: %s, %d SMs; attention resident slots (kernel 1): %lld\n", prop.name, sms,
              static_cast<long long>(CudaAttentionSlots()));
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  auto time_it = [&](auto&& fn, int n_reps) {
    fn();
    fn();
    CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<float> t;
    for (int r = 0; r < n_reps; ++r) {
      CHECK_CUDA(cudaEventRecord(e0));
      fn();
      CHECK_CUDA(cudaEventRecord(e1));
      CHECK_CUDA(cudaEventSynchronize(e1));
      float ms = 0;
      CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
      t.push_back(ms * 1000.0f);
    }
    return Median(t);
  };

  // HBM bandwidth: a 2 GiB device-to-device copy, counting bytes read + written.
  double hbm_gbs = 0;
  {
    const size_t bytes = size_t{2} << 30;
    float *a = nullptr, *b = nullptr;
    CHECK_CUDA(cudaMalloc(&a, bytes));
    CHECK_CUDA(cudaMalloc(&b, bytes));
    FillF32<<<4096, 256>>>(a, bytes / 4, 7);
    const size_t n4 = bytes / 16;
    const double us = time_it(
        [&] {
          CopyKernel<<<sms * 8, 512>>>(reinterpret_cast<const float4*>(a),
                                       reinterpret_cast<float4*>(b), n4);
        },
        reps);
    CHECK_CUDA(cudaGetLastError());
    hbm_gbs = 2.0 * bytes / (us * 1e-6) / 1e9;
    std::printf("HBM copy kernel: %.0f GB/s (read + write of 2 GiB, %.0f us)\n", hbm_gbs, us);
    cudaFree(a);
    cudaFree(b);
  }

  const int32_t n_heads = 32, n_kv = 8, hd = 128, bs = 32;
  const std::vector<int32_t> batches =
      quick ? std::vector<int32_t>{1, 16, 128} : std::vector<int32_t>{1, 4, 16, 32, 64, 128};
  const std::vector<int32_t> contexts =
      quick ? std::vector<int32_t>{1024, 32768} : std::vector<int32_t>{1024, 4096, 16384, 32768};
  const int32_t max_ctx = *std::max_element(contexts.begin(), contexts.end());
  const int32_t max_batch = *std::max_element(batches.begin(), batches.end());
  const int64_t blocks_per_seq = max_ctx / bs;
  const int64_t num_blocks = blocks_per_seq * max_batch;
  const size_t pool = static_cast<size_t>(num_blocks) * n_kv * hd * bs;  // floats per K or V
  float *k = nullptr, *v = nullptr, *q = nullptr, *out = nullptr;
  CHECK_CUDA(cudaMalloc(&k, pool * 4));
  CHECK_CUDA(cudaMalloc(&v, pool * 4));
  CHECK_CUDA(cudaMalloc(&q, static_cast<size_t>(max_batch) * n_heads * hd * 4));
  CHECK_CUDA(cudaMalloc(&out, static_cast<size_t>(max_batch) * n_heads * hd * 4));
  FillF32<<<8192, 256>>>(k, pool, 1);
  FillF32<<<8192, 256>>>(v, pool, 2);
  FillF32<<<256, 256>>>(q, static_cast<size_t>(max_batch) * n_heads * hd, 3);
  std::vector<int32_t> tables(static_cast<size_t>(max_batch * blocks_per_seq));
  for (size_t i = 0; i < tables.size(); ++i) tables[i] = static_cast<int32_t>(i);
  int32_t *tables_d = nullptr, *pos_d = nullptr;
  CHECK_CUDA(cudaMalloc(&tables_d, tables.size() * 4));
  CHECK_CUDA(cudaMalloc(&pos_d, max_batch * 4));
  CHECK_CUDA(cudaMemcpy(tables_d, tables.data(), tables.size() * 4, cudaMemcpyHostToDevice));
  // The largest workspace any case needs (kernel 2 forced at the largest shape).
  CudaAttentionParams big;
  big.n_tokens = max_batch;
  big.n_heads = n_heads;
  big.n_kv_heads = n_kv;
  big.head_dim = hd;
  big.block_size = bs;
  big.q = q;
  big.out = out;
  big.k_cache = k;
  big.v_cache = v;
  big.positions = pos_d;
  big.block_tables = tables_d;
  big.block_table_stride = static_cast<int32_t>(blocks_per_seq);
  big.max_context = max_ctx;
  big.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const size_t ws_bytes = std::max(CudaAttentionWorkspaceBytes(big, CudaAttentionKernel::kSplit),
                                   CudaFlashDecodeWorkspaceBytes(big, sms));
  void* ws = nullptr;
  CHECK_CUDA(cudaMalloc(&ws, ws_bytes));
  CHECK_CUDA(cudaDeviceSynchronize());

  FILE* csv = csv_path.empty() ? nullptr : std::fopen(csv_path.c_str(), "w");
  if (csv != nullptr) {
    std::fprintf(csv,
                 "batch,context,kv_mb,dual_us,flash_us,single_us,split_us,flash_splits,"
                 "dual_gbs,flash_gbs,ratio,dual_hbm_frac,k1_eq_k2,max_diff_flash\n");
  }
  std::printf("%5s %7s %8s %9s %9s %9s %9s %6s %8s %8s %6s %6s %6s %s\n", "batch", "context",
              "KV_MB", "dual_us", "flash_us", "k1_us", "k2_us", "splits", "dual_GBs", "flash_GBs",
              "ratio", "%HBM", "k1==k2", "|k1-flash|");
  double worst_ratio = 1e9, best_frac = 0, worst_frac_big = 1e9;
  bool all_bitwise = true;
  double worst_flash_diff = 0;
  for (int32_t batch : batches) {
    for (int32_t ctx : contexts) {
      std::vector<int32_t> pos(static_cast<size_t>(batch), ctx - 1);
      CHECK_CUDA(cudaMemcpy(pos_d, pos.data(), pos.size() * 4, cudaMemcpyHostToDevice));
      CudaAttentionParams p = big;
      p.n_tokens = batch;
      p.max_context = ctx;
      const double kv_bytes = 2.0 * batch * static_cast<double>(ctx) * n_kv * hd * 4;
      const int r = kv_bytes > 4e9 ? std::max(3, reps / 2) : reps;
      auto dual = [&] {
        CHECK_CUDA(CudaAttention(p, CudaAttentionKernel::kAuto, ws, ws_bytes, nullptr));
      };
      auto k1 = [&] {
        CHECK_CUDA(CudaAttention(p, CudaAttentionKernel::kSingle, ws, ws_bytes, nullptr));
      };
      auto k2 = [&] {
        CHECK_CUDA(CudaAttention(p, CudaAttentionKernel::kSplit, ws, ws_bytes, nullptr));
      };
      auto flash = [&] { CHECK_CUDA(CudaFlashDecodeAttention(p, sms, ws, ws_bytes, nullptr)); };
      const double t_dual = time_it(dual, r);
      const double t_flash = time_it(flash, r);
      const double t_k1 = time_it(k1, r);
      const double t_k2 = time_it(k2, r);
      // Large-scale checks for free: kernel 1 and kernel 2 bitwise equal, flash close to them.
      const size_t n_out = static_cast<size_t>(batch) * n_heads * hd;
      std::vector<float> o1(n_out), o2(n_out), of(n_out);
      k1();
      CHECK_CUDA(cudaMemcpy(o1.data(), out, n_out * 4, cudaMemcpyDeviceToHost));
      k2();
      CHECK_CUDA(cudaMemcpy(o2.data(), out, n_out * 4, cudaMemcpyDeviceToHost));
      flash();
      CHECK_CUDA(cudaMemcpy(of.data(), out, n_out * 4, cudaMemcpyDeviceToHost));
      const bool same = std::memcmp(o1.data(), o2.data(), n_out * 4) == 0;
      double max_diff = 0;
      for (size_t i = 0; i < n_out; ++i) {
        max_diff = std::max(max_diff, std::fabs(double(o1[i]) - of[i]));
      }
      all_bitwise = all_bitwise && same;
      worst_flash_diff = std::max(worst_flash_diff, max_diff);
      const double gbs_dual = kv_bytes / (t_dual * 1e-6) / 1e9;
      const double gbs_flash = kv_bytes / (t_flash * 1e-6) / 1e9;
      const double ratio = t_flash / t_dual;  // dual's throughput as a fraction of flash's
      const double frac = gbs_dual / hbm_gbs;
      const int splits =
          CudaFlashDecodeSplits(static_cast<int64_t>(batch) * n_kv, sms, (ctx + 15) / 16);
      std::printf("%5d %7d %8.0f %9.1f %9.1f %9.1f %9.1f %6d %8.0f %8.0f %6.2f %6.2f %6s %.1e\n",
                  batch, ctx, kv_bytes / 1e6, t_dual, t_flash, t_k1, t_k2, splits, gbs_dual,
                  gbs_flash, ratio, frac, same ? "yes" : "NO", max_diff);
      if (csv != nullptr) {
        std::fprintf(csv, "%d,%d,%.1f,%.2f,%.2f,%.2f,%.2f,%d,%.1f,%.1f,%.3f,%.3f,%d,%.3e\n", batch,
                     ctx, kv_bytes / 1e6, t_dual, t_flash, t_k1, t_k2, splits, gbs_dual, gbs_flash,
                     ratio, frac, same ? 1 : 0, max_diff);
      }
      worst_ratio = std::min(worst_ratio, ratio);
      best_frac = std::max(best_frac, frac);
      if (kv_bytes >= 1e9) worst_frac_big = std::min(worst_frac_big, frac);
    }
  }
  if (csv != nullptr) std::fclose(csv);
  std::printf(
      "SUMMARY attention: HBM %.0f GB/s; dual/flash throughput worst %.2f (target >= "
      "0.95); dual best %.2f of HBM, worst %.2f on >= 1 GB of KV (target >= 0.70)\n",
      hbm_gbs, worst_ratio, best_frac, worst_frac_big > 1e8 ? 0.0 : worst_frac_big);
  std::printf(
      "SUMMARY attention checks: kernel 1 == kernel 2 bitwise in every case: %s; max "
      "|kernel 1 - flash| %.2e\n",
      all_bitwise ? "yes" : "NO", worst_flash_diff);
  cudaFree(ws);
  cudaFree(k);
  cudaFree(v);
  cudaFree(q);
  cudaFree(out);
  cudaFree(tables_d);
  cudaFree(pos_d);
  return all_bitwise ? 0 : 1;  // a kernel 1 / kernel 2 mismatch fails the run
}
