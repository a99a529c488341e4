#include "kvharbor/checksum.h"

#include <xxh3.h>

#include "absl/strings/str_format.h"

namespace kvharbor {
namespace client {

uint64_t PageChecksum(absl::Span<const uint8_t> page) {
  return XXH3_64bits(page.data(), page.size());
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
