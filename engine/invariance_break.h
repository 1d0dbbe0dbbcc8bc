// engine/invariance_break.h: a deliberately broken kernel, for tests only.
//
// The invariance checks (engine/invariance_checks.h) and the start-up self-test
// (engine/self_test.h) must be able to fail. Their negative controls plug BatchVariantMatmul in
// place of kernels::Matmul: with more than one row in the batch it splits K in two halves and
// adds the halves, so a sequence's bits depend on what shares its batch, exactly the kind of
// kernel the contract forbids.
//
// TEST ONLY: the environment variable BITROLL_TEST_BREAK_INVARIANCE=matmul makes every CPU
// engine created afterwards in the process use BatchVariantMatmul (CpuEngine::Create reads it once;
// unset or empty, nothing changes and the hot path pays nothing). It exists so that the tests can
// show, through the real `bitroll` command line, that a broken kernel is caught at start-up.
// BITROLL_TEST_BREAK_INVARIANCE=expert_matmul plugs it into the routed experts of
// mixture-of-experts models only (engine/moe.h), where `m` is the number of tokens routed to the
// expert: the expert matmul's reduction then depends on its token count.
// BITROLL_TEST_BREAK_INVARIANCE=window_chunk anchors the sliding window's lower edge at the start
// of each sequence's rows in the forward call (TransformerOptions::test_break_window_chunk): a
// window mask that depends on the prefill chunk, on sliding-window models.
// BITROLL_TEST_BREAK_INVARIANCE=late_rebuild makes a sliding-state rebuild after a prefix hit
// start one token after its exact bound (SchedulerOptions::test_late_rebuild).
// BITROLL_TEST_BREAK_INVARIANCE=sibling_tile fuses the o update of the AVX-512 tile that walks the
// shared chunks of GRPO siblings (AttentionParams::test_fused_sibling_tile): a sample's bits then
// depend on whether its siblings decode in the same step. Never set it in production. Engines on
// another device backend ignore it.
//
// Thread-safety: BatchVariantMatmul is as thread-safe as kernels::Matmul; TestBreakMatmulFromEnv
// reads the environment (call it while no thread changes the environment).
#pragma once

#include "kernels/cpu/isa.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"
#include "schema/status.h"

namespace bitroll::engine {

using MatmulFn = void (*)(kernels::Isa, const kernels::MatmulParams&, kernels::ThreadPool*);

// The environment variable's name.
inline constexpr const char* kTestBreakInvarianceEnv = "BITROLL_TEST_BREAK_INVARIANCE";

// kernels::Matmul for p.m == 1; a split-K sum (the two halves added) for p.m > 1.
void BatchVariantMatmul(kernels::Isa isa, const kernels::MatmulParams& p,
                        kernels::ThreadPool* pool);

// The matmul BITROLL_TEST_BREAK_INVARIANCE asks for: nullptr when unset or empty,
// &BatchVariantMatmul for "matmul". Errors: kInvalidArgument for any other value (a typo must not
// pass for a healthy engine, nor a healthy one for a broken one).
// "expert_matmul" is accepted here (and gives nullptr): see TestBreakExpertMatmulFromEnv.
Result<MatmulFn> TestBreakMatmulFromEnv();

// &BatchVariantMatmul when BITROLL_TEST_BREAK_INVARIANCE is "expert_matmul", else nullptr.
MatmulFn TestBreakExpertMatmulFromEnv();

// True when BITROLL_TEST_BREAK_INVARIANCE is "window_chunk".
bool TestBreakWindowChunkFromEnv();

// True when BITROLL_TEST_BREAK_INVARIANCE is "sibling_tile".
bool TestBreakSiblingTileFromEnv();

// True when BITROLL_TEST_BREAK_INVARIANCE is "late_rebuild".
bool TestBreakLateRebuildFromEnv();

}  // namespace bitroll::engine
