# engine/loaders/loaders.cmake: GGUF, safetensors and Hugging Face loaders (part of bitroll_model).
# Included by engine/model.cmake after bitroll_model is defined.
find_package(nlohmann_json REQUIRED)

set(_l ${CMAKE_CURRENT_LIST_DIR})
target_sources(bitroll_model PRIVATE
  ${_l}/mapped_file.cc
  ${_l}/gguf.cc
  ${_l}/safetensors.cc
  ${_l}/hf.cc)
target_link_libraries(bitroll_model PRIVATE nlohmann_json::nlohmann_json)

bitroll_add_test(NAME engine_gguf_test SOURCES ${_l}/gguf_test.cc
  LIBS bitroll_model TIMEOUT 120)
bitroll_add_test(NAME engine_safetensors_test SOURCES ${_l}/safetensors_test.cc
  LIBS bitroll_model TIMEOUT 120)
bitroll_add_test(NAME engine_hf_test SOURCES ${_l}/hf_test.cc
  LIBS bitroll_model TIMEOUT 120)

# libFuzzer targets for the header parsers: clang only (-fsanitize=fuzzer). The parser source is
# compiled into the target again so that it carries the fuzzer instrumentation. Run by hand, e.g.
#   ./fuzz_gguf -max_total_time=60 -max_len=65536
if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  foreach(_f gguf safetensors)
    add_executable(fuzz_${_f} ${_l}/fuzz_${_f}.cc ${_l}/${_f}.cc)
    target_include_directories(fuzz_${_f} PRIVATE ${CMAKE_SOURCE_DIR})
    target_link_libraries(fuzz_${_f} PRIVATE bitroll_model nlohmann_json::nlohmann_json)
    target_compile_options(fuzz_${_f} PRIVATE -fsanitize=fuzzer,address,undefined -g)
    target_link_options(fuzz_${_f} PRIVATE -fsanitize=fuzzer,address,undefined)
  endforeach()
endif()
unset(_l)
