#include "core/store/pinned_pages.h"

#include <utility>

#include "core/store/namespace.h"

namespace kvharbor {

PinnedPages::PinnedPages(PinnedPages&& o) noexcept { *this = std::move(o); }

PinnedPages& PinnedPages::operator=(PinnedPages&& o) noexcept {
  if (this != &o) {
    Reset();
    ns_ = std::move(o.ns_);
    format_ = o.format_;
    slots_ = std::move(o.slots_);
    handles_ = std::move(o.handles_);
    checksums_ = std::move(o.checksums_);
    tiers_ = std::move(o.tiers_);
    positions_ = std::move(o.positions_);
    buffers_ = std::move(o.buffers_);
    codecs_ = std::move(o.codecs_);
    owned_ = std::move(o.owned_);
    raw_ = std::move(o.raw_);
    o.ns_ = nullptr;
  }
  return *this;
}

PinnedPages::~PinnedPages() { Reset(); }

void PinnedPages::Reset() {
  // Without the index lock: a zombie slot freed here is no index page.
  if (ns_ != nullptr) ns_->slots_.Unpin(slots_);
  ns_ = nullptr;
  slots_.clear();
  handles_.clear();
  checksums_.clear();
  tiers_.clear();
  positions_.clear();
  buffers_.clear();
  codecs_.clear();
  owned_.clear();
  raw_.reset();
}

const uint8_t* PinnedPages::data(size_t i) const {
  // Device pools' raw pages and decoded cold pages were copied to raw_ by
  // Materialize.
  if (format_ == FetchFormat::kRaw) {
    if (slots_[i] != SlotTable::kNoSlot &&
        ns_->pool_->kind() == MemoryKind::kHost) {
      return ns_->pool_->Data(slots_[i]);
    }
    return raw_->data() + i * ns_->page_bytes_;
  }
  // A codec buffer: the cold tier's own (shared), or one encoded for this
  // fetch.
  return reinterpret_cast<const uint8_t*>(bytes(i).data());
}

absl::string_view PinnedPages::bytes(size_t i) const {
  if (format_ == FetchFormat::kRaw) {
    return absl::string_view(reinterpret_cast<const char*>(data(i)),
                             ns_->page_bytes_);
  }
  if (buffers_[i] != nullptr) return *buffers_[i];
  return owned_[i];
}

size_t PinnedPages::page_bytes() const {
  return ns_ == nullptr ? 0 : ns_->page_bytes_;
}

void PinnedPages::NoteBytesOut(uint64_t n) const {
  if (ns_ != nullptr) ns_->bytes_out_.fetch_add(n, std::memory_order_relaxed);
}

absl::string_view PinnedPages::codec_name(size_t i) const {
  return codecs_[i] != nullptr ? codecs_[i]->name() : absl::string_view();
}

uint64_t PinnedPages::calibration_fingerprint(size_t i) const {
  return codecs_[i] != nullptr ? codecs_[i]->calibration_fingerprint() : 0;
}

}  // namespace kvharbor
