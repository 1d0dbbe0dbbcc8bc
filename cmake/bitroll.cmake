# Shared CMake helpers for bitroll.

include(GoogleTest OPTIONAL)

# Where the test models live: ../shared/models beside the checkout, unless BITROLL_MODELS_DIR is
# set at configure time. Tests also honour the environment variable of the same name.
set(BITROLL_MODELS_DIR "${CMAKE_SOURCE_DIR}/../shared/models" CACHE PATH "Test model folder")

# bitroll_add_test(NAME name SOURCES a.cc b.cc LIBS lib... [LABELS l...] [TIMEOUT s]
#                  [ENVIRONMENT VAR=value])
# The one helper that registers a GoogleTest suite with CTest (each TEST becomes a CTest case).
function(bitroll_add_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT;ENVIRONMENT" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT BITROLL_BUILD_TESTS)
    return()
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main Threads::Threads)
  target_compile_definitions(${T_NAME} PRIVATE
    BITROLL_MODELS_DIR="${BITROLL_MODELS_DIR}"
    BITROLL_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
    BITROLL_BINARY_DIR="${CMAKE_BINARY_DIR}")
  # gtest_discover_tests (CMake 3.25) flattens a list in PROPERTIES, so several labels become
  # one "a,b" label; `ctest -L b` still selects it (-L is a regular expression).
  string(REPLACE ";" "," _labels "${T_LABELS}")
  set(_env)
  if(T_ENVIRONMENT)
    set(_env ENVIRONMENT "${T_ENVIRONMENT}")
  endif()
  gtest_discover_tests(${T_NAME}
    DISCOVERY_TIMEOUT 120
    PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${_labels}" ${_env})
endfunction()

# bitroll_isa_sources(ISA file...) compiles the files for one SIMD level. ISA is AVX2 or AVX512.
# Only these files may use that ISA's intrinsics; callers reach them through run-time dispatch.
function(bitroll_isa_sources isa)
  if(isa STREQUAL "AVX2")
    set(flags "-mavx2;-mfma;-mf16c")
  elseif(isa STREQUAL "AVX512")
    set(flags "-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx2;-mfma;-mf16c")
  else()
    message(FATAL_ERROR "bitroll_isa_sources: unknown ISA ${isa}")
  endif()
  set_source_files_properties(${ARGN} PROPERTIES COMPILE_OPTIONS "${flags}")
endfunction()
