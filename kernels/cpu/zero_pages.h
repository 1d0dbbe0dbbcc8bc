// ZeroPages: one large, zero-filled, anonymous mapping for long-lived arrays that kernels stream
// (packed weights, the KV pool).
//
// With huge_pages, a mapping of at least 2 MiB is 2 MiB-aligned and advised for transparent huge
// pages (MADV_HUGEPAGE); without, it is advised MADV_NOHUGEPAGE, so that a kernel whose policy is
// "always" keeps it on 4 KiB pages too. A stream over huge pages takes one TLB entry per 2 MiB
// instead of one per 4 KiB. Where the kernel refuses huge pages (policy "never", no contiguous
// memory) it falls back to 4 KiB pages; the contents are the same either way, and memory
// placement never changes any arithmetic. The price is at first touch: a huge page is zeroed
// whole, 2 MiB at a time, which in a VM can cost milliseconds; so arrays filled once at load
// (packed weights) take huge pages, and arrays filled while serving (the KV pool) keep 4 KiB
// pages (docs/benchmarks.md, "Issue 19, round 10").
//
// Thread-safety: thread-compatible; the data itself is the caller's to synchronize.
#pragma once

#include <cstddef>

namespace bitroll::kernels {

class ZeroPages {
 public:
  ZeroPages() = default;
  ZeroPages(const ZeroPages&) = delete;
  ZeroPages& operator=(const ZeroPages&) = delete;
  ZeroPages(ZeroPages&& o) noexcept;
  ZeroPages& operator=(ZeroPages&& o) noexcept;
  ~ZeroPages();

  // Maps `bytes` zero bytes (page-aligned; 2 MiB-aligned with huge_pages when bytes >= 2 MiB),
  // replacing any previous mapping. Returns false, mapping nothing, when the system refuses it.
  bool Map(size_t bytes, bool huge_pages);

  unsigned char* data() { return p_; }
  const unsigned char* data() const { return p_; }
  size_t size() const { return n_; }  // bytes, as asked

 private:
  void Unmap();

  unsigned char* p_ = nullptr;
  size_t n_ = 0;
  size_t mapped_ = 0;
};

}  // namespace bitroll::kernels
