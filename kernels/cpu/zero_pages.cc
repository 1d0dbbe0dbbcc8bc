#include "kernels/cpu/zero_pages.h"

#include <sys/mman.h>

#include <cstdint>
#include <utility>

namespace bitroll::kernels {

namespace {
constexpr size_t kHugePage = size_t{2} << 20;
}  // namespace

ZeroPages::ZeroPages(ZeroPages&& o) noexcept
    : p_(std::exchange(o.p_, nullptr)),
      n_(std::exchange(o.n_, 0)),
      mapped_(std::exchange(o.mapped_, 0)) {}

ZeroPages& ZeroPages::operator=(ZeroPages&& o) noexcept {
  if (this != &o) {
    Unmap();
    p_ = std::exchange(o.p_, nullptr);
    n_ = std::exchange(o.n_, 0);
    mapped_ = std::exchange(o.mapped_, 0);
  }
  return *this;
}

ZeroPages::~ZeroPages() {
  Unmap();
}

void ZeroPages::Unmap() {
  if (p_ != nullptr) munmap(p_, mapped_);
  p_ = nullptr;
  n_ = mapped_ = 0;
}

bool ZeroPages::Map(size_t bytes, bool huge_pages) {
  Unmap();
  const size_t want = bytes == 0 ? 1 : bytes;
  const bool huge = huge_pages && want >= kHugePage;
  if (huge && want > SIZE_MAX - 2 * kHugePage) return false;
  // Huge pages need 2 MiB-aligned addresses: map one huge page more than asked and trim the
  // unaligned head and the tail.
  const size_t len = huge ? (want + kHugePage - 1) / kHugePage * kHugePage : want;
  const size_t extra = huge ? kHugePage : 0;
  void* raw =
      mmap(nullptr, len + extra, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return false;
  const auto base = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t start = huge ? (base + kHugePage - 1) / kHugePage * kHugePage : base;
  if (start > base) munmap(raw, start - base);
  const uintptr_t end = start + len, raw_end = base + len + extra;
  if (raw_end > end) munmap(reinterpret_cast<void*>(end), raw_end - end);
  // Advice only (a kernel without transparent huge pages keeps 4 KiB pages). Without huge_pages,
  // the "always" policy would use huge pages unasked: keep the choice.
  if (huge) madvise(reinterpret_cast<void*>(start), len, MADV_HUGEPAGE);
  if (!huge_pages) madvise(reinterpret_cast<void*>(start), len, MADV_NOHUGEPAGE);
  p_ = reinterpret_cast<unsigned char*>(start);
  n_ = bytes;
  mapped_ = len;
  return true;
}

}  // namespace bitroll::kernels
