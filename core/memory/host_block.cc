#include "core/memory/host_block.h"

#include <sys/mman.h>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace kvharbor {
namespace {

#ifndef MADV_POPULATE_WRITE
constexpr int MADV_POPULATE_WRITE = 23;  // Linux 5.14; older headers lack it
#endif
constexpr size_t kHugePage = size_t{2} << 20;

}  // namespace

absl::StatusOr<std::unique_ptr<HostBlock>> HostBlock::Create(size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("bytes: must be positive");
  // Whole huge pages, so the tail can be a huge page too.
  const size_t mapped = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("cannot map %u bytes of host memory", mapped));
  }
  // Advice only: refused where THP is off or the kernel is older.
  (void)madvise(p, mapped, MADV_HUGEPAGE);
  (void)madvise(p, mapped, MADV_POPULATE_WRITE);
  return std::unique_ptr<HostBlock>(
      new HostBlock(static_cast<uint8_t*>(p), mapped, bytes));
}

HostBlock::~HostBlock() { munmap(data_, mapped_); }

}  // namespace kvharbor
