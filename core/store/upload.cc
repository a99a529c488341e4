#include "core/store/upload.h"

#include <xxh3.h>

#include <algorithm>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/store/namespace.h"
#include "core/store/uploads.h"
#include "types/layer_range.h"

namespace kvharbor {

struct Upload::HashState {
  HashState() : state(XXH3_createState()) {}
  ~HashState() { XXH3_freeState(state); }
  XXH3_state_t* state;
};

Upload::Target Upload::Locate(uint64_t offset) const {
  const uint64_t pb = ns_->page_bytes_;
  if (!layer_major_) {
    return Target{sent_from_ + static_cast<uint32_t>(offset / pb), offset % pb,
                  pb - offset % pb};
  }
  // For each layer, for each sent page: K then V of the layer.
  const Geometry& g = ns_->config_.geometry;
  const uint64_t kvb = KvLayerBytes(g);
  const uint64_t layer_bytes = uint64_t{num_pages_ - sent_from_} * 2 * kvb;
  const uint32_t layer = static_cast<uint32_t>(offset / layer_bytes);
  const uint64_t in_layer = offset % layer_bytes;
  const uint32_t page = static_cast<uint32_t>(in_layer / (2 * kvb));
  const int kv = static_cast<int>(in_layer / kvb % 2);
  const uint64_t in = in_layer % kvb;
  return Target{sent_from_ + page, KvLayerOffset(g, layer, kv) + in, kvb - in};
}

uint32_t Upload::PagesReached(uint64_t end) const {
  if (end == 0) return 0;
  if (layer_major_) {
    const uint64_t layer_bytes = uint64_t{num_pages_ - sent_from_} * 2 *
                                 KvLayerBytes(ns_->config_.geometry);
    if (end > layer_bytes) return num_pages_;
  }
  return Locate(end - 1).page + 1;
}

absl::Status Upload::Write(uint64_t offset, absl::string_view data,
                           int threads) {
  if (!error_.ok()) return error_;
  if (done_) return absl::FailedPreconditionError("upload: already committed");
  if (offset != received_) {
    return error_ = absl::InvalidArgumentError(absl::StrFormat(
               "chunk.offset: %u, expected %u (chunks must arrive in order)",
               offset, received_));
  }
  if (data.size() > total_bytes_ - received_) {
    return error_ = absl::InvalidArgumentError(absl::StrFormat(
               "chunk: %u bytes at offset %u run past the declared size of "
               "%u bytes (%u sent pages)",
               data.size(), offset, total_bytes_, num_pages_ - sent_from_));
  }
  const size_t pb = ns_->page_bytes_;
  // Slots for the new pages this chunk reaches, and no more: an upload never
  // evicts for pages it has not started to fill.
  if (!data.empty()) {
    const uint32_t reached = PagesReached(received_ + data.size());
    const uint32_t need = SlotsFor(reached);
    if (need > slots_.size()) {
      absl::Status s = ns_->uploads_->Reserve(
          this, need - static_cast<uint32_t>(slots_.size()));
      if (!s.ok()) return error_ = s;
    }
  }
  if (threads > 1 && !layer_major_ && ns_->pool_->kind() == MemoryKind::kHost &&
      received_ % pb == 0 && data.size() >= 2 * pb) {
    absl::StatusOr<size_t> took = WriteWholePages(data, threads);
    if (!took.ok()) return error_ = took.status();
    data.remove_prefix(*took);
  }
  while (!data.empty()) {
    const Target t = Locate(received_);
    const size_t n =
        static_cast<size_t>(std::min<uint64_t>(t.run, data.size()));
    // Pages without a slot are cached: their bytes are dropped.
    if (HasSlot(t.page)) {
      // The slot is reserved for this upload alone: no lock needed to fill.
      const uint32_t slot = slots_[SlotIndex(t.page)];
      absl::Status copied = ns_->pool_->Write(
          slot, t.in_page, reinterpret_cast<const uint8_t*>(data.data()), n);
      if (!copied.ok()) return error_ = copied;
      // Page after page, the checksum streams along; layer by layer it is
      // taken once the page is whole (FinishPages).
      if (!layer_major_) {
        if (t.in_page == 0) XXH3_64bits_reset(hash_->state);
        XXH3_64bits_update(hash_->state, data.data(), n);
        if (t.in_page + n == pb) {
          absl::Status s = PageDone(t.page, XXH3_64bits_digest(hash_->state));
          if (!s.ok()) return error_ = s;
        }
      }
    }
    received_ += n;
    data.remove_prefix(n);
  }
  if (layer_major_ && received_ == total_bytes_) {
    if (absl::Status s = FinishPages(); !s.ok()) return error_ = s;
  }
  return absl::OkStatus();
}

namespace {
// WriteWholePages' piece: copied, then hashed from cache.
constexpr size_t kCopyPieceBytes = size_t{64} << 10;
}  // namespace

absl::StatusOr<size_t> Upload::WriteWholePages(absl::string_view data,
                                               int threads) {
  const size_t pb = ns_->page_bytes_;
  const uint32_t first = Locate(received_).page;
  const uint32_t count = static_cast<uint32_t>(data.size() / pb);
  std::vector<uint64_t> sums(count);
  PagePool& pool = *ns_->pool_;
  // Reserved slots belong to this upload alone, and a host pool's Write is
  // a memcpy into its own slot: the workers share nothing but `sums`, each
  // its own entries.
  // Each page is copied and hashed a piece at a time, the hash reading the
  // piece just written while it is in cache: the bytes cross memory twice
  // (read, write), not three times.
  const auto work = [&](uint32_t begin, uint32_t end) {
    XXH3_state_t* state = XXH3_createState();
    for (uint32_t i = begin; i < end; ++i) {
      const uint32_t page = first + i;
      if (!HasSlot(page)) continue;  // cached: the bytes are dropped
      const uint8_t* src =
          reinterpret_cast<const uint8_t*>(data.data()) + uint64_t{i} * pb;
      const uint32_t slot = slots_[SlotIndex(page)];
      XXH3_64bits_reset(state);
      for (size_t at = 0; at < pb; at += kCopyPieceBytes) {
        const size_t n = std::min(kCopyPieceBytes, pb - at);
        pool.Write(slot, at, src + at, n).IgnoreError();  // a host memcpy
        XXH3_64bits_update(state, pool.Data(slot) + at, n);
      }
      sums[i] = XXH3_64bits_digest(state);
    }
    XXH3_freeState(state);
  };
  const uint32_t n = std::min<uint32_t>(static_cast<uint32_t>(threads), count);
  std::vector<std::thread> workers;
  for (uint32_t w = 1; w < n; ++w) {
    workers.emplace_back(work, count * w / n, count * (w + 1) / n);
  }
  work(0, count / n);
  for (std::thread& t : workers) t.join();
  for (uint32_t i = 0; i < count; ++i) {
    if (!HasSlot(first + i)) continue;
    KVH_RETURN_IF_ERROR(PageDone(first + i, sums[i]));
  }
  received_ += uint64_t{count} * pb;
  return size_t{count} * pb;
}

absl::Status Upload::PageDone(uint32_t page, uint64_t checksum) {
  computed_[page] = checksum;
  const uint32_t i = page - sent_from_;
  if (!checksums_.empty() && checksums_[i] != checksum) {
    return absl::DataLossError(absl::StrFormat(
        "page_checksums[%u]: the bytes of page %u hash to %#x, not the "
        "declared %#x",
        i, page, checksum, checksums_[i]));
  }
  if (ns_->calibrations_.has_sampler()) {
    ns_->uploads_->SampleSlot(slots_[SlotIndex(page)],
                              uint64_t{page} * ns_->config_.geometry.page_size);
  }
  return absl::OkStatus();
}

absl::Status Upload::FinishPages() {
  const size_t pb = ns_->page_bytes_;
  PagePool& pool = *ns_->pool_;
  std::string host;  // a device page's copy
  for (uint32_t page = std::max(skip_pages_, sent_from_); page < num_pages_;
       ++page) {
    if (!HasSlot(page)) continue;
    const uint32_t slot = slots_[SlotIndex(page)];
    const uint8_t* bytes = pool.Data(slot);
    if (pool.kind() != MemoryKind::kHost) {
      host.resize(pb);
      KVH_RETURN_IF_ERROR(
          pool.Read(slot, reinterpret_cast<uint8_t*>(host.data())));
      bytes = reinterpret_cast<const uint8_t*>(host.data());
    }
    KVH_RETURN_IF_ERROR(PageDone(page, XXH3_64bits(bytes, pb)));
  }
  return absl::OkStatus();
}

absl::StatusOr<InsertOutcome> Upload::Commit() {
  if (!error_.ok()) return error_;
  if (done_) return absl::FailedPreconditionError("upload: already committed");
  if (received_ != total_bytes_) {
    return error_ = absl::InvalidArgumentError(absl::StrFormat(
               "chunk: the stream ended after %u of %u bytes (%u sent pages "
               "of %u bytes)",
               received_, total_bytes_, num_pages_ - sent_from_,
               ns_->page_bytes_));
  }
  return ns_->uploads_->Commit(this);
}

Upload::Upload() : hash_(std::make_unique<HashState>()) {}

Upload::~Upload() {
  if (ns_ != nullptr && !done_) ns_->uploads_->Abort(this);
}

uint8_t* Upload::SlotData(uint32_t page) const {
  // Only pages the client sends: the cold skipped pages of an append
  // [skip_pages_, sent_from_) are restored by the daemon. (A placed upload
  // has a slot for every page from skip_pages_ on: no slot_index_.)
  if (ns_ == nullptr || done_ || !placed_ ||
      page < std::max(skip_pages_, sent_from_) || page >= num_pages_) {
    return nullptr;
  }
  return ns_->pool_->Data(slots_[page - skip_pages_]);
}

MemoryKind Upload::slot_memory() const { return ns_->pool_->kind(); }

absl::Status Upload::AcceptPlaced(absl::Span<const uint64_t> checksums,
                                  absl::Span<const uint64_t> hashes) {
  if (!error_.ok()) return error_;
  if (done_) return absl::FailedPreconditionError("upload: already committed");
  if (!placed_) {
    return absl::FailedPreconditionError(
        "upload: not begun as a placed upload (InsertSpec.placed), so its "
        "slots are reserved as bytes arrive through Write");
  }
  if (received_ != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "upload: %u bytes already arrived through Write (or the pages were "
        "accepted before); a placed upload takes its pages in place, once",
        received_));
  }
  // The client wrote pages [first, num_pages_): those with a slot that it
  // sends (the cold skipped pages of an append are the daemon's to restore).
  const uint32_t first = std::max(skip_pages_, sent_from_);
  const uint32_t sent = num_pages_ - first;
  if (!hashes.empty() && hashes.size() != sent) {
    return error_ = absl::InternalError(absl::StrFormat(
               "upload: %u hashes for %u written pages", hashes.size(), sent));
  }
  if (hashes.empty() ? checksums.size() != sent
                     : !checksums.empty() && checksums.size() != sent) {
    return error_ = absl::InvalidArgumentError(absl::StrFormat(
               "page_checksums: %u given for %u written pages (one per page "
               "from page %u of the sequence on)",
               checksums.size(), sent, first));
  }
  const absl::Span<const uint32_t> written =
      absl::MakeConstSpan(slots_).subspan(first - skip_pages_);
  absl::StatusOr<std::vector<uint64_t>> got =
      hashes.empty() ? ns_->slots_.Checksum(written)
                     : std::vector<uint64_t>(hashes.begin(), hashes.end());
  if (!got.ok()) return error_ = got.status();
  if (checksums.empty()) checksums = *got;
  for (uint32_t i = 0; i < sent; ++i) {
    if ((*got)[i] != checksums[i]) {
      return error_ = absl::DataLossError(absl::StrFormat(
                 "page_checksums[%u]: page %u of the sequence hashes to %#x "
                 "in its slot, not the declared %#x; nothing is stored",
                 i, first + i, (*got)[i], checksums[i]));
    }
    computed_[first + i] = (*got)[i];
  }
  if (ns_->calibrations_.has_sampler()) {
    for (uint32_t i = 0; i < sent; ++i) {
      ns_->uploads_->SampleSlot(
          written[i], uint64_t{first + i} * ns_->config_.geometry.page_size);
    }
  }
  received_ = total_bytes_;
  return absl::OkStatus();
}

}  // namespace kvharbor
