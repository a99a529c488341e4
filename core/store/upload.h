// Upload: one two-phase Insert into a namespace (Namespace::BeginInsert):
// its pages' slots are reserved, filled here outside the namespace's locks
// (Write, or in place by a same-host client: SlotData / AcceptPlaced),
// checked against their declared checksums, and only then committed to the
// index (Commit). An Upload destroyed before Commit leaves nothing behind.
// InsertSpec says what an Insert stores; InsertOutcome what it did. The
// namespace side (begin, slot reservation, commit, abort) is Uploads'
// (core/store/uploads.h).
//
// Keeps its namespace alive and owns its reservation (slots, the lock on the
// cached prefix) until Commit or destruction. Not thread-safe: one writer
// (the Insert stream) at a time; the reservation makes the filled slots
// this upload's alone, so writes take no namespace lock.
#ifndef KVHARBOR_CORE_STORE_UPLOAD_H_
#define KVHARBOR_CORE_STORE_UPLOAD_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/index/radix_index.h"
#include "core/memory/page_pool.h"

namespace kvharbor {

class Namespace;
class Uploads;

struct InsertOutcome {
  size_t already_present_tokens = 0;
  uint32_t pages_stored = 0;
  uint32_t pages_evicted = 0;
};
class Upload {
 public:
  ~Upload();  // Aborts when not committed: frees slots, drops locks.
  Upload(const Upload&) = delete;
  Upload& operator=(const Upload&) = delete;

  // Pages of the sequence, and those whose bytes the stream carries (the
  // pages after the skipped prefix): total_bytes() = sent_pages() *
  // page bytes.
  uint32_t num_pages() const { return num_pages_; }
  uint32_t sent_pages() const { return num_pages_ - sent_from_; }
  uint64_t total_bytes() const { return total_bytes_; }
  uint64_t bytes_received() const { return received_; }
  // Pages already cached and raw when the upload began: the sent ones
  // among them are accepted and discarded.
  uint32_t skip_pages() const { return skip_pages_; }
  // Whether page `page` gets no slot: it was cached when the upload began
  // (below skip_pages(), or, in a page-hash namespace, anywhere), so its
  // sent bytes are dropped unchecked.
  bool page_cached(uint32_t page) const { return !HasSlot(page); }

  // Appends `data` at `offset`, which must equal bytes_received(): page
  // after page, or with layer_major the layers of all sent pages one
  // after another (InsertSpec), reserving slots for the new pages it
  // reaches (see BeginInsert). InvalidArgument past total_bytes() or out
  // of order; DataLoss when a completed page does not match its declared
  // checksum; ResourceExhausted when no slot can be had. After an error
  // the upload is dead: every later call fails. With `threads` > 1, the
  // whole pages of `data` (page after page, a host pool, starting at a page
  // boundary) are copied and hashed by up to that many threads at once,
  // each its own pages (a same-host client's staged bytes: one call moves
  // hundreds of MiB); the result is the same as with one.
  absl::Status Write(uint64_t offset, absl::string_view data, int threads = 1);
  // Makes the pages visible. FailedPrecondition unless every byte arrived.
  absl::StatusOr<InsertOutcome> Commit();

  // ---- Placed upload (core/store/upload.cc): a same-host
  // client writes the sent pages into the reserved slots itself (CUDA IPC
  // into device slots) instead of sending them through Write.
  // PagePool::Data of the slot reserved for page `page` of the sequence
  // (a device address for device pools); null for a page below
  // skip_pages() or past the end.
  uint8_t* SlotData(uint32_t page) const;
  // Accepts the sent pages [skip_pages(), num_pages()) as written in
  // place: hashes each where it lies (on the GPU for a device pool whose
  // tier can, else read back or in host memory) and compares it with
  // `checksums`, one per sent page in order. DataLoss naming
  // page_checksums[i] (i counted from the first sent page) at the first
  // mismatch, InvalidArgument naming page_checksums for a wrong count,
  // FailedPrecondition once Write took bytes or after a previous accept.
  // After an error the upload is dead: nothing is stored, and destroying
  // it gives the slots back. Then Commit as after Write.
  // `hashes` (empty, or one per written page): the XXH3-64 of each page as
  // it was written, computed by the daemon's own code that wrote it (the
  // bulk data plane's receivers), used instead of reading the slots again.
  // Empty `checksums` with `hashes`: the client declared none (its pages
  // are taken as they came, as a streamed insert without checksums).
  absl::Status AcceptPlaced(absl::Span<const uint64_t> checksums,
                            absl::Span<const uint64_t> hashes = {});
  // Where the reserved slots are: host memory (SlotData is a host address)
  // or a GPU's.
  MemoryKind slot_memory() const;

 private:
  friend class Uploads;
  Upload();
  std::shared_ptr<Namespace> ns_;
  // Where the bytes at stream offset received_ go: (page, offset in it,
  // bytes up to the end of that contiguous run).
  struct Target {
    uint32_t page;
    uint64_t in_page;
    uint64_t run;
  };
  Target Locate(uint64_t offset) const;
  // The pages [0, n) a write up to stream offset `end` reaches at least
  // partly (layer-major: every sent page once past the first layer).
  uint32_t PagesReached(uint64_t end) const;
  // Page `page` is whole with `checksum`: checked against the declared
  // one (DataLoss naming page_checksums[i]) and offered to the sampler.
  absl::Status PageDone(uint32_t page, uint64_t checksum);
  // Layer-major: once every byte arrived, PageDone of each sent page.
  absl::Status FinishPages();
  // Write's parallel part: copies and hashes the whole pages at the front
  // of `data` (received_ on a page boundary, slots reserved) on `threads`
  // threads, then PageDone of each in order; the bytes it took.
  absl::StatusOr<size_t> WriteWholePages(absl::string_view data, int threads);
  // Page `page` has a reserved slot (else it was cached when the upload
  // began and its sent bytes are dropped), which is slots_[SlotIndex(page)]
  // once reserved; SlotsFor(p): the slots pages [0, p) need.
  bool HasSlot(uint32_t page) const {
    return slot_index_.empty() ? page >= skip_pages_
                               : slot_index_[page + 1] != slot_index_[page];
  }
  uint32_t SlotIndex(uint32_t page) const {
    return slot_index_.empty() ? page - skip_pages_ : slot_index_[page];
  }
  uint32_t SlotsFor(uint32_t pages) const {
    if (!slot_index_.empty()) return slot_index_[pages];
    return pages > skip_pages_ ? pages - skip_pages_ : 0;
  }
  std::vector<Token> tokens_;        // the elements of the sequence
  std::vector<uint64_t> checksums_;  // empty, or one per sent page
  // Reserved so far, for pages skip_pages_, skip_pages_ + 1, ... (with
  // slot_index_: for the pages that have a slot, in order).
  std::vector<uint32_t> slots_;
  // Empty, or (a streamed upload into a page-hash namespace) num_pages_ + 1
  // counts: slot_index_[p] = pages before p that were not cached when the
  // upload began. Cached pages anywhere in the list get no slot, so an
  // upload that is mostly present evicts nothing for its bytes.
  std::vector<uint32_t> slot_index_;
  // Pages [skip_pages_, present_pages_) were cached but cold: their bytes
  // are stored raw again at commit (keeps the path invariant).
  uint32_t present_pages_ = 0;
  // Locked while the upload lives: the end of the present prefix's path,
  // or (page-hash namespace) the node of each present leading page.
  std::vector<RadixNode*> locked_;
  // Handles of the cold pages [skip_pages_, sent_from_) RestoreSkipped
  // reads back (in slots_[0..]).
  std::vector<PageHandle> restore_;
  uint32_t num_pages_ = 0;
  uint32_t skip_pages_ = 0;
  // The first page whose bytes the stream carries (InsertSpec's skip);
  // pages [skip_pages_, sent_from_) are cold skipped pages whose slots
  // were filled from their stored copy when the upload began.
  uint32_t sent_from_ = 0;
  uint64_t prefix_lease_id_ = 0;
  bool layer_major_ = false;
  bool placed_ = false;  // every slot reserved at begin (InsertSpec)
  uint32_t evicted_for_room_ = 0;
  uint64_t total_bytes_ = 0;
  uint64_t received_ = 0;
  struct HashState;
  std::unique_ptr<HashState> hash_;
  std::vector<uint64_t> computed_;  // checksum of each completed page
  bool done_ = false;
  absl::Status error_;
};
// What an Insert stores (proto InsertHeader; errors name its fields).
struct InsertSpec {
  // The elements of the whole sequence, skipped pages included: a whole
  // number of pages.
  absl::Span<const Token> elements;
  // Empty, or the XXH3-64 of each sent page (page_checksums[i] is page
  // skip + i).
  absl::Span<const uint64_t> checksums;
  // Append: the first skip_pages pages are not sent. They must be cached
  // (FailedPrecondition naming skip_pages otherwise, nothing stored) and
  // stay locked until the upload ends; cold ones among them are made raw
  // again from their stored copy, as a sent page would be, when that copy
  // is lossless (identity codec; FailedPrecondition naming skip_pages
  // otherwise: the client sends them). In a page-hash namespace each of
  // them must be cached on its own and stays in its tier (no page extends
  // another there).
  uint32_t skip_pages = 0;
  // Append after this lease of the namespace, which must hold a prefix of
  // the sequence (NotFound / FailedPrecondition naming prefix_lease_id):
  // skip exactly its pages (skip_pages, when set, must agree).
  uint64_t prefix_lease_id = 0;
  // Bytes arrive layer by layer: for each layer, for each sent page, K
  // then V of that layer (types/layer_range.h).
  bool layer_major = false;
  // A placed upload (Upload::SlotData / AcceptPlaced): the client writes
  // the slots itself, so every slot is reserved here, not as bytes arrive.
  bool placed = false;
};

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_STORE_UPLOAD_H_
