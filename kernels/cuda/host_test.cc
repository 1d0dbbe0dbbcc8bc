// Host-only checks of the CUDA launchers: parameter validation and the scheduling choices that
// must never depend on the batch. Needs no GPU: always runs in CI.
#include <gtest/gtest.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/collectives.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/sampling.h"

namespace bitroll::kernels::cuda {
namespace {

alignas(16) uint16_t g_bf16[64];
alignas(16) float g_f32[64];

CudaGemmParams GoodGemm() {
  CudaGemmParams p;
  p.x = g_bf16;
  p.m = 3;
  p.ldx = 16;
  p.w = g_bf16;
  p.n = 5;
  p.k = 16;
  p.y = g_f32;
  p.ldy = 5;
  return p;
}

TEST(CudaHostTest, GemmParamValidation) {
  EXPECT_EQ(CheckCudaGemmParams(GoodGemm()), cudaSuccess);
  auto bad = [](auto mutate) {
    CudaGemmParams p = GoodGemm();
    mutate(p);
    return CheckCudaGemmParams(p);
  };
  EXPECT_EQ(bad([](CudaGemmParams& p) { p.k = 12; }), cudaErrorInvalidValue);  // k % 8
  EXPECT_EQ(bad([](CudaGemmParams& p) { p.k = 0; }), cudaErrorInvalidValue);
  EXPECT_EQ(bad([](CudaGemmParams& p) { p.n = 0; }), cudaErrorInvalidValue);
  EXPECT_EQ(bad([](CudaGemmParams& p) { p.m = -1; }), cudaErrorInvalidValue);
  EXPECT_EQ(bad([](CudaGemmParams& p) { p.m = int64_t{1} << 21; }), cudaErrorInvalidValue);
  EXPECT_EQ(bad([](CudaGemmParams& p) { p.x = nullptr; }), cudaErrorInvalidValue);
  EXPECT_EQ(bad([](CudaGemmParams& p) { p.y = nullptr; }), cudaErrorInvalidValue);
  EXPECT_EQ(bad([](CudaGemmParams& p) { p.w = nullptr; }), cudaErrorInvalidValue);
  EXPECT_EQ(bad([](CudaGemmParams& p) { p.x = g_bf16 + 1; }), cudaErrorInvalidValue);  // align
  EXPECT_EQ(bad([](CudaGemmParams& p) { p.w = g_bf16 + 4; }), cudaErrorInvalidValue);
  EXPECT_EQ(bad([](CudaGemmParams& p) { p.ldx = 8; }), cudaErrorInvalidValue);   // < k
  EXPECT_EQ(bad([](CudaGemmParams& p) { p.ldx = 20; }), cudaErrorInvalidValue);  // % 8
  EXPECT_EQ(bad([](CudaGemmParams& p) { p.ldy = 4; }), cudaErrorInvalidValue);
  EXPECT_EQ(bad([](CudaGemmParams& p) { p.y = reinterpret_cast<char*>(g_f32) + 2; }),
            cudaErrorInvalidValue);  // fp32 output needs 4-byte alignment
  EXPECT_EQ(bad([](CudaGemmParams& p) { p.out = static_cast<GemmOut>(7); }), cudaErrorInvalidValue);
  // m == 0 needs no x / y and launches nothing.
  EXPECT_EQ(bad([](CudaGemmParams& p) {
              p.m = 0;
              p.x = nullptr;
              p.y = nullptr;
            }),
            cudaSuccess);
  // The launchers validate before touching the device, so they answer without one.
  CudaGemmParams p = GoodGemm();
  p.k = 12;
  EXPECT_EQ(CudaGemm(p, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(CudaGemmWithConfig(GoodGemm(), kGemmNumConfigs, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(CudaGemmSplitKByM(GoodGemm(), nullptr, 0, nullptr), cudaErrorInvalidValue);
}

TEST(CudaHostTest, GemmTileConfigIsAFunctionOfNAndKOnly) {
  // The signature takes no M: the configuration cannot depend on the batch.
  static_assert(
      std::is_same_v<decltype(&CudaGemmTileConfigFor), GemmTileConfig (*)(int64_t, int64_t)>);
  const int64_t shapes[][2] = {{896, 896},    {4864, 896},   {896, 4864},    {4096, 4096},
                               {14336, 4096}, {4096, 14336}, {128256, 4096}, {1152, 896}};
  for (const auto& s : shapes) {
    const GemmTileConfig a = CudaGemmTileConfigFor(s[0], s[1]);
    const GemmTileConfig b = CudaGemmTileConfigFor(s[0], s[1]);
    EXPECT_EQ(a.id, b.id);
    ASSERT_GE(a.id, 0);
    ASSERT_LT(a.id, kGemmNumConfigs);
    const GemmTileConfig c = CudaGemmConfig(a.id);
    EXPECT_EQ(c.bm, a.bm);
    EXPECT_EQ(c.bn, a.bn);
    EXPECT_EQ(a.bk, 32);
    EXPECT_EQ(a.bm % (16 * a.warps_m), 0);
    EXPECT_EQ(a.bn % (16 * a.warps_n), 0);
    EXPECT_LE(a.smem_bytes, size_t{227} * 1024);
  }
  EXPECT_EQ(CudaGemmTileConfigFor(128256, 4096).bm, 128);
  EXPECT_EQ(CudaGemmTileConfigFor(896, 896).bm, 64);
}

TEST(CudaHostTest, SplitKNegativeControlDependsOnM) {
  // Documented: the negative control's split count changes with the batch size.
  EXPECT_EQ(CudaGemmSplitKCount(1), 4);
  EXPECT_EQ(CudaGemmSplitKCount(64), 2);
  EXPECT_EQ(CudaGemmSplitKCount(256), 1);
  EXPECT_EQ(CudaGemmSplitKWorkspaceBytes(1, 10), 4 * 10 * sizeof(float));
}

CudaAttentionParams GoodAttention() {
  CudaAttentionParams p;
  p.n_tokens = 2;
  p.n_heads = 8;
  p.n_kv_heads = 2;
  p.head_dim = 64;
  p.block_size = 32;
  p.q = g_f32;
  p.out = g_f32;
  p.k_cache = g_f32;
  p.v_cache = g_f32;
  static int32_t ints[8] = {};
  p.positions = ints;
  p.block_tables = ints;
  p.max_context = 100;
  p.block_table_stride = 4;
  p.scale = 0.125f;
  return p;
}

TEST(CudaHostTest, AttentionParamValidation) {
  EXPECT_EQ(CheckCudaAttentionParams(GoodAttention()), cudaSuccess);
  auto bad = [](auto mutate) {
    CudaAttentionParams p = GoodAttention();
    mutate(p);
    return CheckCudaAttentionParams(p);
  };
  EXPECT_EQ(bad([](CudaAttentionParams& p) { p.n_heads = 7; }), cudaErrorInvalidValue);
  EXPECT_EQ(bad([](CudaAttentionParams& p) { p.n_heads = 32; }), cudaErrorInvalidValue);  // G 16
  EXPECT_EQ(bad([](CudaAttentionParams& p) { p.head_dim = 0; }), cudaErrorInvalidValue);
  EXPECT_EQ(bad([](CudaAttentionParams& p) { p.head_dim = 257; }), cudaErrorInvalidValue);
  EXPECT_EQ(bad([](CudaAttentionParams& p) { p.block_size = 24; }), cudaErrorInvalidValue);
  EXPECT_EQ(bad([](CudaAttentionParams& p) { p.max_context = 0; }), cudaErrorInvalidValue);
  EXPECT_EQ(bad([](CudaAttentionParams& p) { p.block_table_stride = 3; }), cudaErrorInvalidValue);
  EXPECT_EQ(bad([](CudaAttentionParams& p) { p.q = nullptr; }), cudaErrorInvalidValue);
  EXPECT_EQ(bad([](CudaAttentionParams& p) { p.n_tokens = -1; }), cudaErrorInvalidValue);
  EXPECT_EQ(bad([](CudaAttentionParams& p) {
              p.n_tokens = 0;
              p.q = nullptr;
            }),
            cudaSuccess);
  CudaAttentionParams p = GoodAttention();
  p.block_size = 24;
  EXPECT_EQ(CudaAttention(p, CudaAttentionKernel::kAuto, nullptr, 0, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(CudaFlashDecodeAttention(p, 132, nullptr, 0, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(CudaAttentionWorkspaceBytes(GoodAttention(), CudaAttentionKernel::kSingle), 0u);
  // kSplit: every item keeps a partial per chunk: items * chunks * G * (head_dim + 2) floats.
  EXPECT_EQ(CudaAttentionWorkspaceBytes(GoodAttention(), CudaAttentionKernel::kSplit),
            size_t{4} * 7 * 4 * 66 * sizeof(float));
}

TEST(CudaHostTest, AttentionPlanOnlySchedules) {
  // kSingle / kSplit are forced; kAuto runs whole waves single and the tail split.
  EXPECT_EQ(PlanCudaAttention(100, 528, 10, CudaAttentionKernel::kSingle).first_split, 100);
  EXPECT_EQ(PlanCudaAttention(100, 528, 10, CudaAttentionKernel::kSplit).first_split, 0);
  EXPECT_EQ(PlanCudaAttention(100, 528, 10, CudaAttentionKernel::kAuto).first_split, 0);
  EXPECT_EQ(PlanCudaAttention(1056, 528, 10, CudaAttentionKernel::kAuto).first_split, 1056);
  EXPECT_EQ(PlanCudaAttention(1100, 528, 10, CudaAttentionKernel::kAuto).first_split, 1056);
  // No device (slots 0): kAuto degrades to single.
  EXPECT_EQ(PlanCudaAttention(7, 0, 10, CudaAttentionKernel::kAuto).first_split, 7);
  for (int64_t n : {1, 3, 44, 527, 1100}) {
    const CudaAttentionPlan plan = PlanCudaAttention(n, 528, 125, CudaAttentionKernel::kAuto);
    EXPECT_GE(plan.split_ctas, 1);
    EXPECT_LE(plan.split_ctas, 125);
  }
}

TEST(CudaHostTest, FlashDecodeSplitsDependOnTheBatch) {
  // The baseline is non-invariant on purpose: its split count follows the batch size.
  EXPECT_GT(CudaFlashDecodeSplits(8, 132, 125), 1);
  EXPECT_EQ(CudaFlashDecodeSplits(1024, 132, 125), 1);
  EXPECT_LE(CudaFlashDecodeSplits(1, 132, 3), 3);
  EXPECT_EQ(CudaFlashDecodeSplits(1, 132, 1), 1);
}

TEST(CudaHostTest, OpsAndSamplingValidation) {
  EXPECT_EQ(CudaRmsNorm(g_f32, g_f32, -1, 8, 1e-5f, g_f32, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(CudaRmsNorm(g_f32, g_f32, 1, 0, 1e-5f, g_f32, nullptr, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(CudaRmsNorm(g_f32, g_f32, 1, 8, 1e-5f, nullptr, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(CudaRmsNorm(nullptr, nullptr, 0, 8, 1e-5f, nullptr, nullptr, nullptr), cudaSuccess);
  static int32_t pos[1] = {0};
  EXPECT_EQ(CudaRope(g_f32, 1, 2, 7, pos, g_f32, g_f32, 4, false, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(CudaSwiGlu(g_f32, nullptr, 4, g_f32, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(CudaLogSoftmax(g_f32, 1, 0, g_f32, nullptr), cudaErrorInvalidValue);
  static int32_t tok[1];
  static CudaSampleRow row[1];
  EXPECT_EQ(CudaSample(g_f32, 1, 0, row, tok, g_f32, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(CudaSample(g_f32, -1, 8, row, tok, g_f32, nullptr), cudaErrorInvalidValue);
  EXPECT_TRUE(CudaSamplingSupported(0, 1.0f, 0.0f));
  EXPECT_FALSE(CudaSamplingSupported(40, 1.0f, 0.0f));
  EXPECT_FALSE(CudaSamplingSupported(0, 0.9f, 0.0f));
  EXPECT_FALSE(CudaSamplingSupported(0, 1.0f, 0.05f));
  EXPECT_EQ(FixedOrderSumF32(g_f32, 0, 4, g_f32, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(FixedOrderSumF32(nullptr, 2, 4, g_f32, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(FixedOrderSumF32(nullptr, 2, 0, nullptr, nullptr), cudaSuccess);
  EXPECT_EQ(FixedOrderAllReduceScratchBytes(4, 10), 4 * 10 * sizeof(float));
}

}  // namespace
}  // namespace bitroll::kernels::cuda
