// Page checksums of the kvharbor SDK: XXH3-64 of a page's bytes, the same
// function the daemon computes when a page is stored and sends with the first
// chunk of every fetched page.
//
// Stateless free functions over caller-owned memory; thread-safe.
#ifndef KVHARBOR_CLIENT_CHECKSUM_H_
#define KVHARBOR_CLIENT_CHECKSUM_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace kvharbor {
namespace client {

// XXH3-64 (seed 0) of `page`.
uint64_t PageChecksum(absl::Span<const uint8_t> page);

// PageChecksum of every page, hashed by up to `threads` threads at once
// (each its own pages): an insert of gigabytes hashes at memory speed.
std::vector<uint64_t> PageChecksums(
    absl::Span<const absl::Span<const uint8_t>> pages, int threads);

// OK when PageChecksum(page) == expected; otherwise DATA_LOSS naming the page
// index, its handle and both checksums.
absl::Status VerifyPageChecksum(absl::Span<const uint8_t> page,
                                uint64_t expected, uint32_t page_index,
                                uint64_t handle);

}  // namespace client
}  // namespace kvharbor

#endif  // KVHARBOR_CLIENT_CHECKSUM_H_
