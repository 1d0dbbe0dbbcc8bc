# engine/model.cmake: model files, tokenizers, the sampler and the random-model writer
# (target bitroll_model). Included by engine/CMakeLists.txt.
find_path(BITROLL_XXHASH_INCLUDE xxhash.h REQUIRED)
find_library(BITROLL_XXHASH_LIB xxhash REQUIRED)

add_library(bitroll_model STATIC
  ${CMAKE_CURRENT_LIST_DIR}/model_weights.cc
  ${CMAKE_CURRENT_LIST_DIR}/weight_update.cc
  ${CMAKE_CURRENT_LIST_DIR}/loaders/llama2c.cc
  ${CMAKE_CURRENT_LIST_DIR}/model_loader.cc
  ${CMAKE_CURRENT_LIST_DIR}/tokenizer.cc
  ${CMAKE_CURRENT_LIST_DIR}/tokenizers/llama2c_tokenizer.cc
  ${CMAKE_CURRENT_LIST_DIR}/sampler.cc
  ${CMAKE_CURRENT_LIST_DIR}/make_model.cc
  ${CMAKE_CURRENT_LIST_DIR}/make_model_hf.cc)
target_include_directories(bitroll_model PUBLIC ${CMAKE_SOURCE_DIR})
target_include_directories(bitroll_model PRIVATE ${BITROLL_XXHASH_INCLUDE})
target_link_libraries(bitroll_model PUBLIC bitroll_status bitroll_kernels PRIVATE ${BITROLL_XXHASH_LIB})
include(${CMAKE_CURRENT_LIST_DIR}/tokenizers/tokenizers.cmake)

include(${CMAKE_CURRENT_LIST_DIR}/loaders/loaders.cmake)

set(_m ${CMAKE_CURRENT_LIST_DIR})
bitroll_add_test(NAME engine_llama2c_test SOURCES ${_m}/loaders/llama2c_test.cc
  LIBS bitroll_model TIMEOUT 60)
bitroll_add_test(NAME engine_tokenizer_test SOURCES ${_m}/tokenizers/llama2c_tokenizer_test.cc
  LIBS bitroll_model TIMEOUT 60)
bitroll_add_test(NAME engine_sampler_test SOURCES ${_m}/sampler_test.cc
  LIBS bitroll_model TIMEOUT 60)
bitroll_add_test(NAME engine_make_model_test SOURCES ${_m}/make_model_test.cc
  LIBS bitroll_model TIMEOUT 60)
unset(_m)
