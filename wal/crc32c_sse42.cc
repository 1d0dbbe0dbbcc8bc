// The SSE4.2 CRC32C path. This is the only file compiled with -msse4.2 (wal/CMakeLists.txt); it is
// reached only through crc32c::Extend()'s run-time CPUID check.
#include <nmmintrin.h>

#include <cstring>

#include "wal/crc32c.h"

namespace bitroll::wal::crc32c {

uint32_t ExtendHardware(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t c = ~crc;
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
    --n;
  }
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    c = _mm_crc32_u64(c, w);
    p += 8;
    n -= 8;
  }
  while (n-- > 0) c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
  return ~static_cast<uint32_t>(c);
}

}  // namespace bitroll::wal::crc32c
