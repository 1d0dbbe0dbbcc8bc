// libFuzzer target for the safetensors header parser (built only with clang; see loaders.cmake).
//   ./fuzz_safetensors -max_total_time=60 -max_len=65536 CORPUS_DIR
#include <cstddef>
#include <cstdint>

#include "engine/loaders/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  bitroll::Result<bitroll::engine::SafetensorsHeader> h =
      bitroll::engine::ParseSafetensors(data, size);
  if (h.ok()) {
    for (const auto& t : h->tensors) {
      if (h->data_offset + t.end > size) __builtin_trap();  // the bounds promise
    }
  }
  return 0;
}
