# kernels/cuda: the CUDA kernels, their tests and benchmarks. Built only when the top-level
# CMakeLists.txt found CUDA (BITROLL_HAVE_CUDA); the CPU build is unchanged otherwise.
if(NOT BITROLL_HAVE_CUDA)
  return()
endif()

# -fmad=false: nvcc never contracts a * b + c into an FMA (the -ffp-contract=off of the CPU code);
# the kernels also spell every operation as an explicit _rn intrinsic (kernels/cuda/common.cuh).
add_library(bitroll_kernels_cuda STATIC
  cuda/gemm.cu
  cuda/ops.cu
  cuda/attention.cu
  cuda/sampling.cu)
target_include_directories(bitroll_kernels_cuda PUBLIC ${CMAKE_SOURCE_DIR})
target_link_libraries(bitroll_kernels_cuda PUBLIC CUDA::cudart)
target_compile_options(bitroll_kernels_cuda PRIVATE
  "$<$<COMPILE_LANGUAGE:CUDA>:-fmad=false;-Xcompiler=-ffp-contract=off>")
set_target_properties(bitroll_kernels_cuda PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)

# NCCL (collectives.h): linked only when found, beside the toolkit or on the default paths.
find_path(BITROLL_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
find_library(BITROLL_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
target_sources(bitroll_kernels_cuda PRIVATE cuda/collectives.cu)
if(BITROLL_NCCL_INCLUDE_DIR AND BITROLL_NCCL_LIBRARY)
  message(STATUS "bitroll: NCCL found (${BITROLL_NCCL_LIBRARY}): building the collectives")
  target_include_directories(bitroll_kernels_cuda PUBLIC ${BITROLL_NCCL_INCLUDE_DIR})
  target_link_libraries(bitroll_kernels_cuda PUBLIC ${BITROLL_NCCL_LIBRARY})
  target_compile_definitions(bitroll_kernels_cuda PUBLIC BITROLL_HAVE_NCCL=1)
else()
  message(STATUS "bitroll: NCCL not found: collectives.h without the NCCL functions")
endif()

# Host-only checks: always run (no device needed).
bitroll_add_test(NAME kernels_cuda_host_test SOURCES cuda/host_test.cc
  LIBS bitroll_kernels_cuda LABELS cuda TIMEOUT 60)
# GPU suites: each test skips loudly ("[  SKIPPED ] no CUDA device: ...") without a device.
bitroll_add_test(NAME kernels_cuda_gemm_test SOURCES cuda/gemm_test.cc
  LIBS bitroll_kernels_cuda bitroll_kernels LABELS "cuda;gpu" TIMEOUT 300)
bitroll_add_test(NAME kernels_cuda_ops_test SOURCES cuda/ops_test.cc
  LIBS bitroll_kernels_cuda bitroll_kernels LABELS "cuda;gpu" TIMEOUT 120)
bitroll_add_test(NAME kernels_cuda_attention_test SOURCES cuda/attention_test.cc
  LIBS bitroll_kernels_cuda bitroll_kernels LABELS "cuda;gpu" TIMEOUT 300)
bitroll_add_test(NAME kernels_cuda_sampling_test SOURCES cuda/sampling_test.cc
  LIBS bitroll_kernels_cuda bitroll_kernels LABELS "cuda;gpu" TIMEOUT 120)
bitroll_add_test(NAME kernels_cuda_collectives_test SOURCES cuda/collectives_test.cc
  LIBS bitroll_kernels_cuda LABELS "cuda;gpu" TIMEOUT 120)

# Benchmarks: run by scripts/device-check.sh on a GPU machine (never by ctest).
add_executable(bench_cuda_attention ${CMAKE_SOURCE_DIR}/tests/bench/bench_cuda_attention.cu)
target_link_libraries(bench_cuda_attention PRIVATE bitroll_kernels_cuda)
set_target_properties(bench_cuda_attention PROPERTIES CUDA_STANDARD 17)
if(TARGET CUDA::cublas)
  add_executable(bench_cuda_gemm ${CMAKE_SOURCE_DIR}/tests/bench/bench_cuda_gemm.cu)
  target_link_libraries(bench_cuda_gemm PRIVATE bitroll_kernels_cuda CUDA::cublas)
  set_target_properties(bench_cuda_gemm PROPERTIES CUDA_STANDARD 17)
endif()
