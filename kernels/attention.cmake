# Attention (dual kernel) sources of bitroll_kernels, and its tests.
bitroll_isa_sources(AVX2 ${CMAKE_CURRENT_LIST_DIR}/cpu/attention_avx2.cc)
bitroll_isa_sources(AVX512 ${CMAKE_CURRENT_LIST_DIR}/cpu/attention_avx512.cc
  ${CMAKE_CURRENT_LIST_DIR}/cpu/attention_tile_avx512.cc)
target_sources(bitroll_kernels PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/cpu/attention.cc
  ${CMAKE_CURRENT_LIST_DIR}/cpu/attention_siblings.cc
  ${CMAKE_CURRENT_LIST_DIR}/cpu/attention_avx2.cc
  ${CMAKE_CURRENT_LIST_DIR}/cpu/attention_avx512.cc
  ${CMAKE_CURRENT_LIST_DIR}/cpu/attention_tile_avx512.cc)
if(EXISTS ${CMAKE_CURRENT_LIST_DIR}/cpu/attention_test.cc)
  bitroll_add_test(NAME kernels_attention_test SOURCES cpu/attention_test.cc LIBS bitroll_kernels
    TIMEOUT 120)
endif()
if(EXISTS ${CMAKE_CURRENT_LIST_DIR}/cpu/attention_siblings_test.cc)
  bitroll_add_test(NAME kernels_attention_siblings_test SOURCES cpu/attention_siblings_test.cc
    LIBS bitroll_kernels TIMEOUT 120)
endif()
if(EXISTS ${CMAKE_CURRENT_LIST_DIR}/cpu/attention_gqa_test.cc)
  bitroll_add_test(NAME kernels_attention_gqa_test SOURCES cpu/attention_gqa_test.cc
    LIBS bitroll_kernels TIMEOUT 120)
endif()
