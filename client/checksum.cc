#include "kvharbor/checksum.h"

#include <xxh3.h>

#include <algorithm>
#include <thread>

#include "absl/strings/str_format.h"

namespace kvharbor {
namespace client {

uint64_t PageChecksum(absl::Span<const uint8_t> page) {
  return XXH3_64bits(page.data(), page.size());
}

std::vector<uint64_t> PageChecksums(
    absl::Span<const absl::Span<const uint8_t>> pages, int threads) {
  std::vector<uint64_t> out(pages.size());
  // Below a few MiB a thread costs more than it saves.
  uint64_t bytes = 0;
  for (absl::Span<const uint8_t> p : pages) bytes += p.size();
  const size_t n = std::min<size_t>(
      pages.size(),
      static_cast<size_t>(std::max<int>(1, threads)) *
          static_cast<size_t>(bytes >= (uint64_t{8} << 20) ? 1 : 0));
  auto hash = [&](size_t first, size_t step) {
    for (size_t i = first; i < pages.size(); i += step) {
      out[i] = PageChecksum(pages[i]);
    }
  };
  if (n <= 1) {
    hash(0, 1);
    return out;
  }
  std::vector<std::thread> workers;
  for (size_t t = 1; t < n; ++t) workers.emplace_back(hash, t, n);
  hash(0, n);
  for (std::thread& w : workers) w.join();
  return out;
}

absl::Status VerifyPageChecksum(absl::Span<const uint8_t> page,
                                uint64_t expected, uint32_t page_index,
                                uint64_t handle) {
  const uint64_t got = PageChecksum(page);
  if (got == expected) return absl::OkStatus();
  return absl::DataLossError(absl::StrFormat(
      "fetch: page %u (handle %#x, %u bytes): checksum mismatch: bytes hash "
      "to %#016x, daemon sent %#016x",
      page_index, handle, page.size(), got, expected));
}

}  // namespace client
}  // namespace kvharbor
