#include "core/memory/range_allocator.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/strings/str_format.h"

namespace kvharbor {

RangeAllocator::RangeAllocator(uint64_t bytes, uint64_t align, std::string name)
    : align_(align), name_(std::move(name)) {
  if (bytes > 0) free_.emplace(0, bytes);
}

uint64_t RangeAllocator::free_bytes() const {
  absl::MutexLock l(&mu_);
  uint64_t n = 0;
  for (const auto& [off, size] : free_) n += size;
  return n;
}

absl::StatusOr<uint64_t> RangeAllocator::Take(uint64_t n) {
  n = Round(n);
  absl::MutexLock l(&mu_);
  uint64_t free_total = 0, largest = 0;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    free_total += it->second;
    largest = std::max(largest, it->second);
    if (it->second < n) continue;
    const uint64_t off = it->first, size = it->second;
    free_.erase(it);
    if (size > n) free_.emplace(off + n, size - n);
    return off;
  }
  return absl::ResourceExhaustedError(
      absl::StrFormat("%s has %u bytes free (largest range %u), %u needed",
                      name_, free_total, largest, n));
}

void RangeAllocator::Give(uint64_t offset, uint64_t n) {
  n = Round(n);
  absl::MutexLock l(&mu_);
  auto it = free_.emplace(offset, n).first;
  if (auto next = std::next(it);
      next != free_.end() && it->first + it->second == next->first) {
    it->second += next->second;
    free_.erase(next);
  }
  if (it != free_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == it->first) {
      prev->second += it->second;
      free_.erase(it);
    }
  }
}

}  // namespace kvharbor
