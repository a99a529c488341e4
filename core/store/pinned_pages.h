// PinnedPages: the pages of one Fetch (Namespace::PinLease / PinPages), held
// for reading in the format asked for. Raw pages in the pool are pinned (their
// slots are not reused until this object goes); cold pages are read, checked
// and decoded (or raw pages encoded) into buffers this object owns or shares
// with the cold-page table (core/store/cold_pages.h).
//
// Keeps its namespace (and so its pool) alive; movable, not copyable.
// Not thread-safe: one reader at a time; pinning and unpinning take the
// slot table's own lock.
#ifndef KVHARBOR_CORE_STORE_PINNED_PAGES_H_
#define KVHARBOR_CORE_STORE_PINNED_PAGES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/codec/codec.h"
#include "core/index/radix_index.h"
#include "core/memory/host_block.h"
#include "core/store/namespace_config.h"
#include "types/tier.h"

namespace kvharbor {

class Namespace;
class ColdPages;

class PinnedPages {
 public:
  PinnedPages() = default;
  PinnedPages(PinnedPages&&) noexcept;
  PinnedPages& operator=(PinnedPages&&) noexcept;
  ~PinnedPages();
  size_t size() const { return handles_.size(); }
  FetchFormat format() const { return format_; }
  // Tier the page was in when pinned.
  Tier tier(size_t i) const { return tiers_[i]; }
  // The page in the pinned format: page_bytes() raw bytes, or its codec
  // buffer. checksum(i) is the XXH3-64 of exactly these bytes.
  absl::string_view bytes(size_t i) const;
  // The first byte of bytes(i) (a raw page, or a codec buffer).
  const uint8_t* data(size_t i) const;
  PageHandle handle(size_t i) const { return handles_[i]; }
  uint64_t checksum(size_t i) const { return checksums_[i]; }
  // Compressed format: the codec bytes(i) is in and its calibration's
  // fingerprint (pages of one fetch may differ after a codec switch).
  absl::string_view codec_name(size_t i) const;
  uint64_t calibration_fingerprint(size_t i) const;
  size_t page_bytes() const;
  // Counts bytes sent to a client in the namespace's bytes_out.
  void NoteBytesOut(uint64_t n) const;

 private:
  friend class Namespace;
  friend class ColdPages;  // loads, decodes and encodes the pages
  friend class Uploads;    // reads back an append's cold skipped pages
  void Reset();
  std::shared_ptr<Namespace> ns_;
  FetchFormat format_ = FetchFormat::kRaw;
  std::vector<uint32_t> slots_;  // SlotTable::kNoSlot for cold pages
  std::vector<Tier> tiers_;
  std::vector<uint64_t> positions_;
  // Cold pages' buffers (shared with the tier) and bytes made for this
  // read (decoded or encoded), by page; empty where unused.
  std::vector<std::shared_ptr<const std::string>> buffers_;
  // The codec of each cold page's buffer; for raw pages the encoder.
  std::vector<std::shared_ptr<const Codec>> codecs_;
  std::vector<std::string> owned_;  // COMPRESSED format
  // RAW format: page i's bytes at raw_ + i * page_bytes when it is not
  // read in place from a host pool (one allocation for the whole read).
  std::unique_ptr<HostBlock> raw_;
  std::vector<PageHandle> handles_;
  std::vector<uint64_t> checksums_;
};

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_STORE_PINNED_PAGES_H_
