// rollout/malloc_tuning.h: glibc malloc settings for the long-running service processes.
//
// By default glibc serves blocks above a dynamic threshold (at most 32 MiB) with fresh mmap()s
// and trims freed heap memory above twice that, so every large message buffer (a streamed weight
// part, a ZeroMQ message, a FlatBuffers builder) is new memory that faults in page by page. On
// the VMs this project runs on a page fault costs tens of microseconds: streaming 61 MB of
// weights took 0.36 s with 1 MiB parts (2.3 s with 32 MiB parts) and takes 0.11 s with these
// settings (docs/benchmarks.md). Keeping freed memory in the heap costs resident memory, up to
// the trim threshold, which a rollout server can spare.
#pragma once

#include <malloc.h>

namespace bitroll::rollout {

// Blocks below 64 MiB come from the heap; up to 1 GiB of freed heap memory is kept for reuse.
// Call once at process start, before other threads allocate.
inline void TuneMallocForService() {
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

}  // namespace bitroll::rollout
