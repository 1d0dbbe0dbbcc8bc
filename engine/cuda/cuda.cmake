# engine/cuda: the CUDA forward backend, compiled into bitroll_engine (included by
# engine/runtime.cmake only when BITROLL_HAVE_CUDA). Defines BITROLL_HAVE_CUDA for the engine so
# OpenEngine can build the backend for EngineOptions::device == "cuda".
set(_c ${CMAKE_CURRENT_LIST_DIR})
target_sources(bitroll_engine PRIVATE ${_c}/cuda_transformer.cc ${_c}/engine_ops.cu)
# Element-wise kernels: no contraction, as kernels/cuda (-fmad=false, explicit _rn intrinsics).
set_source_files_properties(${_c}/engine_ops.cu PROPERTIES COMPILE_OPTIONS
  "-fmad=false;-Xcompiler=-ffp-contract=off")
set_target_properties(bitroll_engine PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
target_compile_definitions(bitroll_engine PUBLIC BITROLL_HAVE_CUDA=1)
target_link_libraries(bitroll_engine PUBLIC bitroll_kernels_cuda)

# GPU engine suite: one test runs everywhere (the typed errors of OpenEngine), the others skip
# loudly without a device. engine_test_util.cc is compiled in (the tests/ module may be absent,
# e.g. in scripts/device-check.sh's build).
if(BITROLL_BUILD_TESTS)
  bitroll_add_test(NAME cuda_engine_test
    SOURCES ${_c}/cuda_engine_test.cc ${CMAKE_SOURCE_DIR}/tests/engine_test_util.cc
      ${CMAKE_SOURCE_DIR}/tests/invariance_checks.cc
    LIBS bitroll_engine LABELS "cuda;gpu;engine" TIMEOUT 600)
endif()

# Whole-model decode benchmark (run by scripts/device-check.sh, never by ctest).
add_executable(bench_cuda_engine ${CMAKE_SOURCE_DIR}/tests/bench/bench_cuda_engine.cc)
target_link_libraries(bench_cuda_engine PRIVATE bitroll_engine)
unset(_c)
