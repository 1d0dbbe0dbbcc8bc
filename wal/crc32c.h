// CRC32C (Castagnoli, polynomial 0x82F63B78 reflected), the checksum of every WAL record.
//
// Two implementations give identical results: a portable slice-by-8 table walk, and the SSE4.2
// `crc32` instruction (crc32c_sse42.cc, the only file compiled with -msse4.2). Value()/Extend()
// pick the hardware path at run time when CPUID reports SSE4.2.
//
// Check value: Value("123456789", 9) == 0xE3069283.
// Thread-safety: all functions are pure and thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

namespace bitroll::wal::crc32c {

// Returns the CRC32C of data[0, n) continued from `crc`, the CRC32C of some preceding bytes
// (0 for none): Extend(Value(a), b) == Value(a ++ b).
uint32_t Extend(uint32_t crc, const void* data, size_t n);

inline uint32_t Value(const void* data, size_t n) {
  return Extend(0, data, n);
}

// The portable slice-by-8 path; always available.
uint32_t ExtendPortable(uint32_t crc, const void* data, size_t n);

// True when this CPU has SSE4.2 and the hardware path was compiled in.
bool HasHardware();

// The SSE4.2 path. REQUIRES: HasHardware().
uint32_t ExtendHardware(uint32_t crc, const void* data, size_t n);

}  // namespace bitroll::wal::crc32c
