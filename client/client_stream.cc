// Client: the streaming calls, Insert and Fetch.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "client/client_impl.h"
#include "client/failed_write.h"
#include "client/fetch_assembler.h"
#include "client/fetch_wire.h"
#include "client/insert_wire.h"
#include "kvharbor/checksum.h"
#include "kvharbor/client.h"

namespace kvharbor {

using client::FetchAssembler;
using client::FromGrpcStatus;

namespace {

absl::Status CheckPages(absl::Span<const absl::Span<const uint8_t>> pages) {
  if (pages.empty()) {
    return absl::InvalidArgumentError("pages: no page given");
  }
  const size_t page_bytes = pages[0].size();
  for (size_t i = 0; i < pages.size(); ++i) {
    if (pages[i].size() != page_bytes || page_bytes == 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "pages[%u]: holds %u bytes; every page must hold the same non-zero "
          "number of bytes as pages[0] (%u)",
          i, pages[i].size(), page_bytes));
    }
    if (pages[i].data() == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrFormat("pages[%u]: null data", i));
    }
  }
  return absl::OkStatus();
}

// Sends the page bytes of an Insert in chunks of `chunk_bytes`, chunks
// crossing page boundaries. False once the stream broke (Finish says why).
bool WriteChunks(grpc::ClientWriter<client::InsertOut>* writer,
                 absl::Span<const absl::Span<const uint8_t>> pages,
                 uint64_t total, uint32_t chunk_bytes) {
  client::InsertOut chunk;
  chunk.pages = pages;
  for (uint64_t offset = 0; offset < total; offset += chunk_bytes) {
    chunk.offset = offset;
    chunk.bytes = std::min<uint64_t>(chunk_bytes, total - offset);
    if (!writer->Write(chunk)) return false;
  }
  return true;
}

// Pages per stripe of an Insert on the bulk data plane.
constexpr uint32_t kBulkInsertStripePages = 16;

// The BulkOffer in an Insert's initial metadata (after its header went
// out), or none: a daemon that does not take the bytes on its plane.
std::optional<v1::BulkOffer> BulkInsertOffer(
    grpc::ClientWriter<client::InsertOut>* writer, grpc::ClientContext* ctx) {
  writer->WaitForInitialMetadata();
  const auto& md = ctx->GetServerInitialMetadata();
  auto it = md.find("kvh-bulk-offer-bin");
  if (it == md.end()) return std::nullopt;
  v1::BulkOffer offer;
  if (!offer.ParseFromArray(it->second.data(),
                            static_cast<int>(it->second.size()))) {
    return std::nullopt;
  }
  return offer;
}

// One Insert stream of `pages`, the pages of `sequence` after the ones
// `skip_pages` / `prefix_lease_id` skip.
absl::StatusOr<client::InsertResult> InsertPages(
    const Client::Impl& impl, absl::string_view ns,
    const client::Sequence& sequence,
    absl::Span<const absl::Span<const uint8_t>> pages, uint32_t skip_pages,
    uint64_t prefix_lease_id, const CallOptions& call) {
  absl::Status s = CheckPages(pages);
  if (!s.ok()) return s;
  // The deadline starts now: hashing the pages is part of the call.
  grpc::ClientContext ctx;
  s = impl.Prepare(&ctx, call);
  if (!s.ok()) return s;
  v1::InsertRequest header_req;
  v1::InsertHeader* header = header_req.mutable_header();
  client::InsertHeaderToProto(ns, sequence, skip_pages, prefix_lease_id,
                              header);
  if (impl.options.send_checksums) {
    // Several threads for a large insert (the hashing is part of the call).
    const int threads = static_cast<int>(
        std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
    const std::vector<uint64_t> sums = client::PageChecksums(pages, threads);
    header->mutable_page_checksums()->Add(sums.begin(), sums.end());
  }
  // Asked every time: the answer comes with the call's own initial
  // metadata, so a daemon without the plane costs nothing.
  const bool bulk = impl.bulk_allowed;
  if (bulk) {
    header->mutable_bulk()->set_connections(
        impl.options.data_plane_connections);
    header->mutable_bulk()->set_stripe_pages(kBulkInsertStripePages);
  }
  v1::InsertResponse resp;
  std::unique_ptr<grpc::ClientWriter<client::InsertOut>> writer(
      grpc::internal::ClientWriterFactory<client::InsertOut>::Create(
          impl.channel.get(), *impl.insert_method, &ctx, &resp));
  client::InsertOut header_msg;
  header_msg.header = &header_req;
  bool sent = writer->Write(header_msg);
  // The daemon's answer to header.bulk: its offer, or none (chunks then).
  std::optional<v1::BulkOffer> offer;
  if (sent && bulk) offer = BulkInsertOffer(writer.get(), &ctx);
  absl::Status plane;
  if (offer.has_value()) {
    plane = impl.SendBulkInsert(
        *offer, pages,
        ctx.deadline() == std::chrono::system_clock::time_point::max()
            ? absl::InfiniteFuture()
            : absl::FromChrono(ctx.deadline()));
    // A broken transfer: nothing is committed (the daemon's status, read
    // below, says why); the stream must not half-close as if complete.
    if (!plane.ok()) ctx.TryCancel();
    sent = plane.ok();
  } else if (sent) {
    sent = WriteChunks(writer.get(), pages, pages.size() * pages[0].size(),
                       impl.options.insert_chunk_bytes);
  }
  if (sent) writer->WritesDone();
  const auto finish = [&] { return writer->Finish(); };
  s = FromGrpcStatus(
      sent ? finish() : client::FinishAfterFailedWrite(&ctx, finish, "Insert"));
  if (!plane.ok()) {
    return s.ok() || s.code() == absl::StatusCode::kCancelled ? plane : s;
  }
  if (!s.ok()) return s;
  client::InsertResult result = client::FromProto(resp);
  result.data_plane = offer.has_value();
  return result;
}

// Whether an error of an append says that its skipped prefix is not cached
// (or its prefix lease is gone): the pages can be sent whole instead.
bool SkippedPrefixGone(const absl::Status& s) {
  return (absl::IsFailedPrecondition(s) || absl::IsNotFound(s)) &&
         (absl::StartsWith(s.message(), "header.skip_pages") ||
          absl::StartsWith(s.message(), "header.prefix_lease_id"));
}

// Whether `pages_given` pages are every page of `sequence` (true) or those
// after the `skip_pages` skipped ones (false).
absl::StatusOr<bool> PagesIncludeSkipped(Client& client, absl::string_view ns,
                                         const client::Sequence& sequence,
                                         size_t pages_given,
                                         uint32_t skip_pages,
                                         const CallOptions& call) {
  if (sequence.page_keys()) return pages_given == sequence.keys().size();
  // Tokens: pages_given * page_size tokens (all pages) or (pages_given +
  // skip_pages) * page_size (the new ones). When only one of the two can
  // divide the tokens the page size is not needed.
  const size_t n = sequence.tokens().size();
  const bool all = pages_given > 0 && n % pages_given == 0;
  const bool new_only = n % (pages_given + skip_pages) == 0;
  if (all != new_only) return all;
  absl::StatusOr<client::NamespaceInfo> info =
      client.DescribeNamespace(ns, call);
  if (!info.ok()) return info.status();
  return uint64_t{pages_given} * info->spec.geometry.page_size == n;
}

// `pages` cut into pages of `page_bytes`.
absl::StatusOr<std::vector<absl::Span<const uint8_t>>> SplitPages(
    absl::Span<const uint8_t> pages, uint64_t page_bytes) {
  if (page_bytes == 0 || pages.empty() || pages.size() % page_bytes != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "pages: %u bytes is not a whole, non-zero number of pages of %u bytes",
        pages.size(), page_bytes));
  }
  std::vector<absl::Span<const uint8_t>> views;
  views.reserve(pages.size() / page_bytes);
  for (size_t off = 0; off < pages.size(); off += page_bytes) {
    views.push_back(pages.subspan(off, page_bytes));
  }
  return views;
}

// The Insert's pages do not cover its tokens: INVALID_ARGUMENT naming
// "pages" with both counts, or OK when they do. The daemon can only say that
// the checksums the SDK computed per given page do not match the token
// pages, which names a field the caller never set.
absl::Status CheckPageCount(const client::NamespaceInfo& info,
                            size_t num_tokens, size_t pages_given) {
  const uint32_t page_size = info.spec.geometry.page_size;
  if (page_size == 0 || num_tokens % page_size != 0) return absl::OkStatus();
  const size_t token_pages = num_tokens / page_size;
  if (token_pages == pages_given) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "pages: %u page(s) given for the %u pages of tokens (%u tokens, "
      "page_size %u); give every page of tokens (the cached prefix too), or "
      "only the new ones with skip_pages",
      pages_given, token_pages, num_tokens, page_size));
}

// `r` as it is, or, when the daemon refused the checksums the SDK computed
// per given page, the page count the caller chose, explained.
absl::StatusOr<client::InsertResult> ExplainPageCount(
    Client& client, absl::string_view ns, size_t num_tokens, size_t pages_given,
    absl::StatusOr<client::InsertResult> r, const CallOptions& call) {
  if (r.ok() || !absl::IsInvalidArgument(r.status()) ||
      !absl::StartsWith(r.status().message(), "header.page_checksums:")) {
    return r;
  }
  absl::StatusOr<client::NamespaceInfo> info =
      client.DescribeNamespace(ns, call);
  if (info.ok()) {
    absl::Status s = CheckPageCount(*info, num_tokens, pages_given);
    if (!s.ok()) return s;
  }
  return r;
}

}  // namespace

absl::StatusOr<client::InsertResult> Client::Insert(
    absl::string_view ns, absl::Span<const client::Token> tokens,
    absl::Span<const absl::Span<const uint8_t>> pages,
    const CallOptions& call) {
  absl::StatusOr<client::InsertResult> r = InsertPages(
      *impl_, ns, client::Sequence::OfTokens(tokens), pages, 0, 0, call);
  return ExplainPageCount(*this, ns, tokens.size(), pages.size(), std::move(r),
                          call);
}

absl::StatusOr<client::InsertResult> Client::Insert(
    absl::string_view ns, const client::Sequence& sequence,
    absl::Span<const absl::Span<const uint8_t>> pages,
    const client::InsertOptions& options, const CallOptions& given_call) {
  const uint32_t skip = options.skip_pages;
  if (skip == 0) {
    // Nothing skipped, or a prefix lease with only the new pages given.
    absl::StatusOr<client::InsertResult> r = InsertPages(
        *impl_, ns, sequence, pages, 0, options.prefix_lease_id, given_call);
    if (sequence.page_keys() || options.prefix_lease_id != 0) return r;
    return ExplainPageCount(*this, ns, sequence.tokens().size(), pages.size(),
                            std::move(r), given_call);
  }
  // One deadline for the lookup, the append and a retry.
  const CallOptions call = impl_->OneDeadline(given_call);
  absl::StatusOr<bool> all =
      PagesIncludeSkipped(*this, ns, sequence, pages.size(), skip, call);
  if (!all.ok()) return all.status();
  if (!*all) {
    return InsertPages(*impl_, ns, sequence, pages, skip,
                       options.prefix_lease_id, call);
  }
  if (pages.size() < skip) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "skip_pages: %u is more than the %u pages given", skip, pages.size()));
  }
  absl::StatusOr<client::InsertResult> r =
      InsertPages(*impl_, ns, sequence, pages.subspan(skip), skip,
                  options.prefix_lease_id, call);
  if (r.ok() || !options.retry_full || !SkippedPrefixGone(r.status())) {
    return r;
  }
  return InsertPages(*impl_, ns, sequence, pages, 0, 0, call);
}

absl::StatusOr<client::InsertResult> Client::Insert(
    absl::string_view ns, const client::Sequence& sequence,
    absl::Span<const uint8_t> pages, uint64_t page_bytes,
    const client::InsertOptions& options, const CallOptions& call) {
  // One deadline for both calls: the lookup is part of this Insert.
  const CallOptions both = impl_->OneDeadline(call);
  if (page_bytes == 0) {
    absl::StatusOr<client::NamespaceInfo> info = DescribeNamespace(ns, both);
    if (!info.ok()) return info.status();
    page_bytes = info->spec.geometry.PageBytes();
  }
  absl::StatusOr<std::vector<absl::Span<const uint8_t>>> views =
      SplitPages(pages, page_bytes);
  if (!views.ok()) return views.status();
  return Insert(ns, sequence, *views, options, both);
}

absl::StatusOr<client::InsertResult> Client::Insert(
    absl::string_view ns, absl::Span<const client::Token> tokens,
    absl::Span<const uint8_t> pages, uint64_t page_bytes,
    const CallOptions& call) {
  if (page_bytes == 0) {
    // One deadline for both calls: the lookup is part of this Insert.
    const CallOptions both = impl_->OneDeadline(call);
    absl::StatusOr<client::NamespaceInfo> info = DescribeNamespace(ns, both);
    if (!info.ok()) return info.status();
    page_bytes = info->stats.page_bytes;
    if (page_bytes == 0) page_bytes = info->spec.geometry.PageBytes();
    if (page_bytes == 0) {
      return absl::InternalError(absl::StrCat(
          "namespace '", ns, "': the daemon reported a page size of 0"));
    }
    if (pages.size() % page_bytes == 0) {
      absl::Status s =
          CheckPageCount(*info, tokens.size(), pages.size() / page_bytes);
      if (!s.ok()) return s;
    }
    return Insert(ns, tokens, pages, page_bytes, both);
  }
  absl::StatusOr<std::vector<absl::Span<const uint8_t>>> views =
      SplitPages(pages, page_bytes);
  if (!views.ok()) return views.status();
  return Insert(ns, tokens, *views, call);
}

// ---- Fetch ----

absl::StatusOr<uint32_t> Client::Impl::BuildFetchRequest(
    absl::string_view ns, const client::FetchSource& source,
    v1::FetchRequest* out) const {
  v1::FetchRequest& req = *out;
  req.set_namespace_(std::string(ns));
  uint32_t expected = 0;
  if (source.by_lease()) {
    if (!source.pages.empty()) {
      return absl::InvalidArgumentError(
          "source: give either lease_id or pages, not both");
    }
    req.set_lease_id(source.lease_id);
    req.set_start_page(source.start_page);
    req.set_page_count(source.page_count);
    req.set_layer_begin(source.layer_begin);
    req.set_layer_end(source.layer_end);
    expected = source.page_count;
  } else {
    if (source.pages.empty()) {
      return absl::InvalidArgumentError(
          "source: neither lease_id nor pages given");
    }
    if (source.pages.size() > UINT32_MAX) {
      return absl::InvalidArgumentError("source.pages: too many handles");
    }
    req.mutable_pages()->mutable_page_handles()->Add(source.pages.begin(),
                                                     source.pages.end());
    req.set_layer_begin(source.layer_begin);
    req.set_layer_end(source.layer_end);
    expected = static_cast<uint32_t>(source.pages.size());
  }
  req.set_max_chunk_bytes(options.fetch_chunk_bytes);
  req.set_max_pages_per_message(options.fetch_pages_per_message);
  return expected;
}

absl::StatusOr<client::FetchResult> Client::Impl::Fetch(
    absl::string_view ns, const client::FetchSource& source,
    FetchAssembler::Destination destination, const CallOptions& given_call,
    const std::function<absl::Status(uint32_t, uint64_t)>& begin) const {
  CallOptions call = given_call;
  // Shared memory serves whole pages only.
  if (host_fetch_allowed && source.by_lease() && !source.layer_range()) {
    // One deadline for the shared-memory try and a streamed fallback.
    call = OneDeadline(call);
    absl::StatusOr<std::optional<client::FetchResult>> shm =
        TryHostFetch(ns, source, destination, call);
    if (!shm.ok()) return shm.status();
    if (shm->has_value()) return **std::move(shm);
  }
  if (bulk_allowed) {
    call = OneDeadline(call);
    client::BulkSink sink;
    sink.begin = begin;
    sink.destination = destination;
    absl::StatusOr<std::optional<client::FetchResult>> bulk =
        TryBulkFetch(ns, source, sink, call);
    if (!bulk.ok()) return bulk.status();
    if (bulk->has_value()) return **std::move(bulk);
  }
  return StreamRaw(ns, source, std::move(destination), nullptr, call);
}

absl::StatusOr<client::FetchResult> Client::Impl::StreamRaw(
    absl::string_view ns, const client::FetchSource& source,
    FetchAssembler::Destination destination, client::PageDone done,
    const CallOptions& call) const {
  v1::FetchRequest req;
  absl::StatusOr<uint32_t> expected_or = BuildFetchRequest(ns, source, &req);
  if (!expected_or.ok()) return expected_or.status();
  const uint32_t expected = *expected_or;

  FetchAssembler assembler(std::move(destination), expected,
                           options.verify_checksums, std::move(done));
  grpc::ClientContext ctx;
  absl::Status prepared = Prepare(&ctx, call);
  if (!prepared.ok()) return prepared;
  client::FetchSink sink;
  sink.assembler = &assembler;
  std::unique_ptr<grpc::ClientReader<client::FetchSink>> reader(
      grpc::internal::ClientReaderFactory<client::FetchSink>::Create(
          channel.get(), *fetch_method, &ctx, req));
  while (reader->Read(&sink)) {
  }
  if (!sink.error.ok()) {
    // The rest of the stream is useless: stop the daemon sending it.
    ctx.TryCancel();
    while (reader->Read(&sink)) {
    }
  }
  absl::Status s = FromGrpcStatus(reader->Finish());
  if (!sink.error.ok()) return sink.error;
  if (!s.ok()) return s;
  return assembler.Finish();
}

absl::StatusOr<client::FetchResult> Client::FetchStreaming(
    absl::string_view ns, const client::FetchSource& source,
    const client::PageDestination& destination, const client::PageDone& done,
    const CallOptions& call) {
  return impl_->StreamRaw(ns, source, destination, done, call);
}

bool Client::host_fetch_allowed() const { return impl_->host_fetch_allowed; }

bool Client::device_ipc_allowed() const {
  return impl_->options.device_ipc == DeviceIpcMode::kOn ||
         (impl_->options.device_ipc == DeviceIpcMode::kAuto &&
          IsLocalTarget(impl_->options.address));
}

absl::StatusOr<client::FetchResult> Client::FetchInto(
    absl::string_view ns, const client::FetchSource& source,
    absl::Span<uint8_t> dst, const CallOptions& call) {
  auto destination = [dst](uint32_t index,
                           uint64_t page_bytes) -> absl::StatusOr<uint8_t*> {
    // index * page_bytes + page_bytes <= dst.size(), without overflow.
    if (page_bytes > dst.size() ||
        index > (dst.size() - page_bytes) / page_bytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "dst: holds %u bytes; page %u of %u bytes does not fit", dst.size(),
          index, page_bytes));
    }
    return dst.data() + uint64_t{index} * page_bytes;
  };
  return impl_->Fetch(ns, source, destination, call);
}

absl::StatusOr<client::FetchResult> Client::FetchInto(
    absl::string_view ns, const client::FetchSource& source,
    absl::Span<uint8_t* const> page_dsts, uint64_t page_capacity,
    const CallOptions& call) {
  auto destination = [page_dsts, page_capacity](
                         uint32_t index,
                         uint64_t page_bytes) -> absl::StatusOr<uint8_t*> {
    if (index >= page_dsts.size()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("page_dsts: holds %u pointers; page %u does not fit",
                          page_dsts.size(), index));
    }
    if (page_bytes > page_capacity) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "page_capacity: %u bytes is less than a page (%u bytes)",
          page_capacity, page_bytes));
    }
    if (page_dsts[index] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrFormat("page_dsts[%u]: null", index));
    }
    return page_dsts[index];
  };
  return impl_->Fetch(ns, source, destination, call);
}

absl::StatusOr<std::vector<std::vector<uint8_t>>> Client::Fetch(
    absl::string_view ns, const client::FetchSource& source,
    const CallOptions& call) {
  std::vector<std::vector<uint8_t>> pages;
  auto destination = [&pages](uint32_t index,
                              uint64_t page_bytes) -> absl::StatusOr<uint8_t*> {
    // The assembler has checked the index against the request (or that
    // pages of an open-ended lease arrive in order), so this stays bounded.
    // On the bulk plane `begin` sized the list first: threads receiving
    // different pages then only touch their own page here.
    if (index >= pages.size()) pages.resize(size_t{index} + 1);
    pages[index].resize(page_bytes);
    return pages[index].data();
  };
  auto begin = [&pages](uint32_t num_pages, uint64_t) {
    pages.resize(num_pages);
    return absl::OkStatus();
  };
  absl::StatusOr<client::FetchResult> r =
      impl_->Fetch(ns, source, destination, call, begin);
  if (!r.ok()) return r.status();
  pages.resize(r->num_pages);
  return pages;
}

}  // namespace kvharbor
