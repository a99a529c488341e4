// BulkSendTicket (server/data/bulk_send_ticket.h).
#include "server/data/bulk_send_ticket.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/base/socket_io.h"

namespace kvharbor {

namespace {

// Bytes and pieces of one sendmsg.
constexpr uint64_t kSendBytes = uint64_t{8} << 20;
constexpr size_t kSendPieces = 64;

// The size every page has on the wire, or 0 when it differs from page to
// page (compressed pages).
uint64_t FixedPageBytes(const PinnedPages& pages, const PageRuns& runs) {
  if (pages.size() == 0 || pages.format() == FetchFormat::kCompressed) {
    return 0;
  }
  return runs.count == 0 ? pages.bytes(0).size() : runs.total();
}

uint64_t TotalBytes(const PinnedPages& pages, const PageRuns& runs) {
  if (runs.count != 0) return pages.size() * runs.total();
  uint64_t total = 0;
  for (size_t i = 0; i < pages.size(); ++i) total += pages.bytes(i).size();
  return total;
}

}  // namespace

BulkSendTicket::BulkSendTicket(PinnedPages pages, const Options& options,
                               PageRuns runs,
                               std::function<void(const absl::Status&)> done)
    : BulkTicket(options, pages.size(), FixedPageBytes(pages, runs),
                 std::move(done)),
      runs_(runs),
      total_bytes_(TotalBytes(pages, runs)),
      pages_(std::move(pages)) {}

uint64_t BulkSendTicket::SentBytes(size_t page) const {
  return runs_.count == 0 ? pages_.bytes(page).size() : runs_.total();
}

uint64_t BulkSendTicket::ConnectionBytes(uint32_t index) const {
  if (page_bytes() != 0) return ConnectionPages(index) * page_bytes();
  uint64_t bytes = 0;
  const uint64_t pages = ConnectionPages(index);
  for (uint64_t q = 0; q < pages; ++q) bytes += SentBytes(StripePage(index, q));
  return bytes;
}

uint64_t BulkSendTicket::AppendStripe(uint32_t index, Cursor* at,
                                      uint64_t max_bytes, size_t max_pieces,
                                      std::vector<iovec>* out) const {
  const uint64_t pages = ConnectionPages(index);
  uint64_t appended = 0;
  size_t pieces = 0;
  while (appended < max_bytes && pieces < max_pieces && at->q < pages) {
    const uint64_t page = StripePage(index, at->q);
    const uint8_t* base = pages_.data(page);
    // The page's pieces: its runs, or all of it.
    const int count = runs_.count == 0 ? 1 : runs_.count;
    uint64_t skip = at->in_page;
    for (int r = 0; r < count && appended < max_bytes && pieces < max_pieces;
         ++r) {
      const uint64_t run_offset = runs_.count == 0 ? 0 : runs_.offset[r];
      const uint64_t run_bytes =
          runs_.count == 0 ? pages_.bytes(page).size() : runs_.bytes[r];
      if (skip >= run_bytes) {
        skip -= run_bytes;
        continue;
      }
      const uint64_t take = std::min(run_bytes - skip, max_bytes - appended);
      out->push_back(iovec{const_cast<uint8_t*>(base + run_offset + skip),
                           static_cast<size_t>(take)});
      ++pieces;
      appended += take;
      at->in_page += take;
      skip = 0;
    }
    if (at->in_page == SentBytes(page)) {
      ++at->q;
      at->in_page = 0;
    }
  }
  return appended;
}

absl::Status BulkSendTicket::Transfer(int fd, uint32_t index,
                                      std::atomic<uint64_t>* moved) {
  const uint64_t total = ConnectionBytes(index);
  uint64_t offset = 0;
  Cursor at;
  std::vector<iovec> pieces;
  while (offset < total) {
    if (ended()) return absl::CancelledError("bulk: the transfer ended");
    pieces.clear();
    if (AppendStripe(index, &at, kSendBytes, kSendPieces, &pieces) == 0) {
      break;
    }
    const int sent = SendPieces(fd, absl::MakeSpan(pieces), [&](uint64_t n) {
      offset += n;
      moved->fetch_add(n);
    });
    if (sent != 0) {
      return absl::UnavailableError(
          absl::StrCat("bulk: connection ", index, " broke after ", offset,
                       " of ", total, " bytes: ",
                       sent == EAGAIN || sent == EWOULDBLOCK
                           ? "the client took no bytes for the idle timeout"
                           : SocketErrorText(sent)));
    }
    NoteProgress();
  }
  if (offset != total) return absl::InternalError("bulk: stripes ended early");
  return absl::OkStatus();
}

void BulkSendTicket::EndedLocked(bool ok) {
  if (ok) pages_.NoteBytesOut(total_bytes_);
  pages_ = PinnedPages();
}

}  // namespace kvharbor
