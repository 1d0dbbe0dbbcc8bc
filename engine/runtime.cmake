# engine runtime: KV cache, forward pass, scheduler, the CPU Engine.
add_library(bitroll_engine STATIC
  ${CMAKE_CURRENT_LIST_DIR}/kv_cache.cc
  ${CMAKE_CURRENT_LIST_DIR}/kv_disk_tier.cc
  ${CMAKE_CURRENT_LIST_DIR}/prefix_cache.cc
  ${CMAKE_CURRENT_LIST_DIR}/transformer.cc
  ${CMAKE_CURRENT_LIST_DIR}/moe.cc
  ${CMAKE_CURRENT_LIST_DIR}/moe_row.cc
  ${CMAKE_CURRENT_LIST_DIR}/routing.cc
  ${CMAKE_CURRENT_LIST_DIR}/rope_scaling.cc
  ${CMAKE_CURRENT_LIST_DIR}/scheduler.cc
  ${CMAKE_CURRENT_LIST_DIR}/cpu_engine.cc
  ${CMAKE_CURRENT_LIST_DIR}/forward_backend.cc
  ${CMAKE_CURRENT_LIST_DIR}/engine.cc
  ${CMAKE_CURRENT_LIST_DIR}/nccl_weights.cc
  ${CMAKE_CURRENT_LIST_DIR}/invariance_checks.cc
  ${CMAKE_CURRENT_LIST_DIR}/invariance_break.cc
  ${CMAKE_CURRENT_LIST_DIR}/self_test.cc)
target_include_directories(bitroll_engine PUBLIC ${CMAKE_SOURCE_DIR})
target_include_directories(bitroll_engine PRIVATE ${BITROLL_XXHASH_INCLUDE})
target_link_libraries(bitroll_engine PUBLIC bitroll_model bitroll_kernels bitroll_status Threads::Threads
  PRIVATE ${BITROLL_XXHASH_LIB})

# Unit tests of the KV cache, prefix cache and disk tier (scheduler and engine-level suites: tests/).
set(_r ${CMAKE_CURRENT_LIST_DIR})
bitroll_add_test(NAME engine_moe_test SOURCES ${_r}/moe_test.cc LIBS bitroll_engine TIMEOUT 60)
bitroll_add_test(NAME engine_kv_cache_test SOURCES ${_r}/kv_cache_test.cc LIBS bitroll_engine TIMEOUT 60)
bitroll_add_test(NAME engine_prefix_cache_test SOURCES ${_r}/prefix_cache_test.cc
  LIBS bitroll_engine TIMEOUT 60)
bitroll_add_test(NAME engine_kv_disk_tier_test SOURCES ${_r}/kv_disk_tier_test.cc
  LIBS bitroll_engine TIMEOUT 60)
# Device selection (EngineOptions::device): typed errors in every build, no model needed.
bitroll_add_test(NAME engine_device_test SOURCES ${_r}/device_test.cc LIBS bitroll_engine
  TIMEOUT 60)
# NCCL weight broadcasts (engine/nccl_weights.h): the checks before any device call run
# everywhere; the 1- and 2-GPU cases skip loudly without them.
bitroll_add_test(NAME engine_nccl_weights_test SOURCES ${_r}/nccl_weights_test.cc
  LIBS bitroll_engine LABELS "engine;gpu" TIMEOUT 180)
unset(_r)

# The CUDA forward backend (engine/cuda/): built into bitroll_engine when this build has CUDA
# (BITROLL_HAVE_CUDA, top-level CMakeLists.txt); OpenEngine then offers device "cuda".
if(BITROLL_HAVE_CUDA AND TARGET bitroll_kernels_cuda)
  include(${CMAKE_CURRENT_LIST_DIR}/cuda/cuda.cmake)
endif()
