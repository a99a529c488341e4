#include "kvharbor/layout_fetch.h"

#include <utility>

#include "absl/strings/str_format.h"
#include "core/memory/paged_kv_copy.h"

namespace kvharbor {
namespace client {

namespace {

absl::Status HostOnly(const PagedKvLayout& l) {
  if (!l.on_device()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "layout.device: %d is GPU memory; this path moves host memory only "
      "(GPU layouts: client/cuda/layout_transfer.h)",
      l.device));
}

std::vector<uint8_t*> PagePointers(std::vector<uint8_t>& buffer, size_t n,
                                   uint64_t page_bytes) {
  std::vector<uint8_t*> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = buffer.data() + i * page_bytes;
  return out;
}

// The result of `n` pages of `page_bytes` moved by this process's CPU.
TransferResult CpuTransfer(const TransferClock& clock, size_t n,
                           uint64_t page_bytes) {
  TransferResult r;
  r.path = "cpu";
  r.pages = static_cast<uint32_t>(n);
  r.bytes_moved = n * page_bytes;
  clock.Finish(&r);
  return r;
}

}  // namespace

void TransferClock::Lap(const std::string& stage) {
  const auto now = std::chrono::steady_clock::now();
  Add(stage, std::chrono::duration<double>(now - last_).count());
  last_ = now;
}

void TransferClock::Add(const std::string& stage, double seconds) {
  for (auto& [name, s] : stages_) {
    if (name == stage) {
      s += seconds;
      return;
    }
  }
  stages_.emplace_back(stage, seconds);
}

double TransferClock::Total() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                       start_)
      .count();
}

void TransferClock::Finish(TransferResult* r) const {
  r->stages = stages_;
  r->seconds = Total();
}

CallOptions WithDeadline(const Client& client, const CallOptions& call) {
  CallOptions both = call;
  if (!both.deadline.has_value()) {
    both.deadline =
        absl::Now() + both.timeout.value_or(client.options().default_timeout);
  }
  return both;
}

absl::StatusOr<uint32_t> PagesOfTokens(Client& client, absl::string_view ns,
                                       absl::Span<const Token> tokens,
                                       const CallOptions& call) {
  absl::StatusOr<NamespaceInfo> info = client.DescribeNamespace(ns, call);
  if (!info.ok()) return info.status();
  const uint32_t page_size = info->spec.geometry.page_size;
  if (tokens.empty() || page_size == 0 || tokens.size() % page_size != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tokens: %u tokens are not a whole, non-zero number of pages of %u",
        tokens.size(), page_size));
  }
  return static_cast<uint32_t>(tokens.size() / page_size);
}

absl::StatusOr<LayoutCall> PrepareLayoutCall(
    Client& client, absl::string_view ns, const PagedKvLayout& layout,
    absl::Span<const int64_t> block_ids, size_t num_pages, bool all_layers,
    const CallOptions& call) {
  absl::StatusOr<NamespaceInfo> info = client.DescribeNamespace(ns, call);
  if (!info.ok()) return info.status();
  LayoutCall out;
  out.geometry = info->spec.geometry.Resolved();
  absl::StatusOr<PagedKvLayout> resolved =
      ResolveLayout(layout, out.geometry, all_layers);
  if (!resolved.ok()) return resolved.status();
  out.layout = *std::move(resolved);
  absl::Status s = CheckBlockIds(out.layout, block_ids, num_pages);
  if (!s.ok()) return s;
  return out;
}

absl::StatusOr<TransferResult> FetchToHostLayout(
    Client& client, absl::string_view ns, uint64_t lease_id,
    const PagedKvLayout& layout, absl::Span<const int64_t> block_ids,
    const LayoutFetchOptions& opts, const CallOptions& given_call) {
  if (lease_id == 0) {
    return absl::InvalidArgumentError(
        "lease_id: 0 is not a lease (Match with lock=true)");
  }
  if (block_ids.empty()) {
    return absl::InvalidArgumentError("block_ids: no page asked for");
  }
  TransferClock clock;
  const CallOptions call = WithDeadline(client, given_call);
  absl::StatusOr<LayoutCall> lc = PrepareLayoutCall(
      client, ns, layout, block_ids, block_ids.size(), false, call);
  if (!lc.ok()) return lc.status();
  if (absl::Status s = HostOnly(lc->layout); !s.ok()) return s;
  clock.Lap("describe");
  // A RAW fetch into a layout of some of the layers asks the daemon for
  // those layers only: each page then is a page of a geometry of that many
  // layers (types/layer_range.h), scattered into the layout from layer 0.
  Geometry g = lc->geometry;
  PagedKvLayout layout_pages = lc->layout;
  const size_t n = block_ids.size();
  FetchSource source = FetchSource::FromLease(lease_id, opts.start_page,
                                              static_cast<uint32_t>(n));
  const uint32_t layers = lc->layout.num_layers();
  if (opts.format != FetchFormat::kCompressed && layers < g.num_layers) {
    source =
        source.Layers(lc->layout.layer_begin, lc->layout.layer_begin + layers);
    g.num_layers = layers;
    layout_pages.layer_begin = 0;
  }
  const uint64_t pb = g.PageBytes();
  std::vector<uint8_t> buffer;
  std::vector<std::vector<uint8_t>> decoded;
  std::vector<const uint8_t*> pages(n);
  if (opts.format == FetchFormat::kCompressed) {
    absl::StatusOr<std::vector<std::vector<uint8_t>>> got =
        client.Fetch(ns, source, FetchFormat::kCompressed, call);
    if (!got.ok()) return got.status();
    decoded = *std::move(got);
    for (size_t i = 0; i < n; ++i) pages[i] = decoded[i].data();
  } else {
    buffer.resize(n * pb);
    absl::StatusOr<FetchResult> got =
        client.FetchInto(ns, source, absl::MakeSpan(buffer), call);
    if (!got.ok()) return got.status();
    for (size_t i = 0; i < n; ++i) pages[i] = buffer.data() + i * pb;
  }
  clock.Lap("fetch");
  absl::Status s = ScatterPagesToLayout(g, layout_pages, pages, block_ids);
  if (!s.ok()) return s;
  clock.Lap("scatter");
  return CpuTransfer(clock, n, pb);
}

absl::StatusOr<std::pair<InsertResult, TransferResult>> InsertFromHostLayout(
    Client& client, absl::string_view ns, absl::Span<const Token> tokens,
    const PagedKvLayout& layout, absl::Span<const int64_t> block_ids,
    const CallOptions& given_call) {
  TransferClock clock;
  const CallOptions call = WithDeadline(client, given_call);
  absl::StatusOr<uint32_t> pages = PagesOfTokens(client, ns, tokens, call);
  if (!pages.ok()) return pages.status();
  const size_t n = *pages;
  absl::StatusOr<LayoutCall> lc =
      PrepareLayoutCall(client, ns, layout, block_ids, n, true, call);
  if (!lc.ok()) return lc.status();
  if (absl::Status s = HostOnly(lc->layout); !s.ok()) return s;
  clock.Lap("describe");
  const uint64_t pb = lc->geometry.PageBytes();
  std::vector<uint8_t> buffer(n * pb);
  absl::Status s = GatherLayoutToPages(lc->geometry, lc->layout, block_ids,
                                       PagePointers(buffer, n, pb));
  if (!s.ok()) return s;
  clock.Lap("gather");
  absl::StatusOr<InsertResult> ins =
      client.Insert(ns, tokens, absl::MakeConstSpan(buffer), pb, call);
  if (!ins.ok()) return ins.status();
  clock.Lap("insert");
  return std::make_pair(*ins, CpuTransfer(clock, n, pb));
}

}  // namespace client
}  // namespace kvharbor
