// libFuzzer target for the GGUF header parser (built only with clang; see loaders.cmake).
//   ./fuzz_gguf -max_total_time=60 -max_len=65536 CORPUS_DIR
#include <cstddef>
#include <cstdint>

#include "engine/loaders/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  bitroll::engine::GgufParseOptions opt;
  opt.check_data_bounds = size % 2 == 0;  // exercise both modes
  bitroll::Result<bitroll::engine::GgufFile> f = bitroll::engine::ParseGguf(data, size, opt);
  if (f.ok()) {
    // Touch what a loader reads: typed getters and tensor ranges.
    (void)f->GetInt("llama.block_count");
    (void)f->GetString("general.architecture");
    for (const auto& t : f->tensors) {
      if (opt.check_data_bounds && f->data_offset + t.offset + t.size_bytes > size)
        __builtin_trap();
    }
  }
  return 0;
}
