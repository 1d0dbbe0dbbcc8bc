// Portable slice-by-8 CRC32C and the run-time dispatch to the SSE4.2 path.
#include "wal/crc32c.h"

#include <array>
#include <cstring>

namespace bitroll::wal::crc32c {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // Castagnoli, reflected

struct Tables {
  // t[k][b]: CRC of byte b followed by k zero bytes.
  std::array<std::array<uint32_t, 256>, 8> t;
};

constexpr Tables MakeTables() {
  Tables tb{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int i = 0; i < 8; ++i) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    tb.t[0][b] = c;
  }
  for (int k = 1; k < 8; ++k) {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t c = tb.t[k - 1][b];
      tb.t[k][b] = (c >> 8) ^ tb.t[0][c & 0xFF];
    }
  }
  return tb;
}

constexpr Tables kTables = MakeTables();

bool DetectSse42() {
#if defined(__x86_64__) || defined(__i386__)
  return __builtin_cpu_supports("sse4.2");
#else
  return false;
#endif
}

}  // namespace

#if !(defined(__x86_64__) || defined(__i386__))
uint32_t ExtendHardware(uint32_t crc, const void* data, size_t n) {
  return ExtendPortable(crc, data, n);
}
#endif

uint32_t ExtendPortable(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  const auto& t = kTables.t;
  uint32_t c = ~crc;
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    c = (c >> 8) ^ t[0][(c ^ *p++) & 0xFF];
    --n;
  }
  while (n >= 8) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);  // little-endian host assumed (x86-64 / aarch64)
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;
    c = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^
        t[3][hi & 0xFF] ^ t[2][(hi >> 8) & 0xFF] ^ t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xFF];
  return ~c;
}

bool HasHardware() {
  static const bool has = DetectSse42();
  return has;
}

uint32_t Extend(uint32_t crc, const void* data, size_t n) {
  return HasHardware() ? ExtendHardware(crc, data, n) : ExtendPortable(crc, data, n);
}

}  // namespace bitroll::wal::crc32c
