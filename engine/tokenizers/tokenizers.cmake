# engine/tokenizers/tokenizers.cmake: the tokenizer.json byte-level BPE tokenizer, part of
# bitroll_model. Included by engine/model.cmake after bitroll_model is defined.
find_package(PkgConfig REQUIRED)
pkg_check_modules(BITROLL_PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
find_package(nlohmann_json 3 REQUIRED)

target_sources(bitroll_model PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/bpe_tokenizer.cc
  ${CMAKE_CURRENT_LIST_DIR}/bpe_tokenizer_load.cc)
target_link_libraries(bitroll_model PRIVATE PkgConfig::BITROLL_PCRE2 nlohmann_json::nlohmann_json)

# Real vocabularies and the reference encoder come from scripts/fetch-test-tokenizers.sh; the test
# looks in BITROLL_TEST_TOKENIZERS_DIR (environment) or, by default, here:
set(BITROLL_TEST_TOKENIZERS_DIR "${CMAKE_BINARY_DIR}/test-tokenizers" CACHE PATH
  "Where scripts/fetch-test-tokenizers.sh installed the npm tokenizer packages")
bitroll_add_test(NAME bpe_tokenizer_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/bpe_tokenizer_test.cc
  LIBS bitroll_model nlohmann_json::nlohmann_json TIMEOUT 120)
if(TARGET bpe_tokenizer_test)
  target_compile_definitions(bpe_tokenizer_test PRIVATE
    BITROLL_TEST_TOKENIZERS_DIR="${BITROLL_TEST_TOKENIZERS_DIR}")
endif()
