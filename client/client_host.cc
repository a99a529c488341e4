// Client: same-host Fetch through shared memory (docs/operations.md
// "Same-host Fetch"). GetHostHandles is the raw RPC; TryHostFetch is what
// FetchInto/Fetch of a lease run first: ask the daemon where the lease's
// pages lie in its shared host arena, map the arena once per process
// (include/kvharbor/host_ipc.h), copy each page into the caller's destination
// and verify it. Whenever that cannot serve the call the Fetch streams over
// gRPC instead, so the caller sees the same pages either way.
#include <grpcpp/grpcpp.h>

#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "client/client_impl.h"
#include "client/proto_convert.h"
#include "kvharbor/client.h"
#include "kvharbor/host_ipc.h"

namespace kvharbor {

namespace {

client::HostHandles FromProto(const v1::GetHostHandlesResponse& resp) {
  client::HostHandles out;
  out.socket_path = resp.socket_path();
  out.daemon_id = resp.daemon_id();
  out.arena_bytes = resp.arena_bytes();
  out.pages.reserve(resp.pages_size());
  for (const v1::HostPage& p : resp.pages()) {
    out.pages.push_back({p.page_handle(), p.offset(), p.bytes(), p.checksum()});
  }
  out.lease_expiry = client::FromUnixMillis(resp.lease_expires_unix_ms());
  out.arena_generation = resp.arena_generation();
  return out;
}

}  // namespace

// The host of a gRPC target ("dns:///h:p", "ipv4:h:p", "h:p", "[::1]:p").
absl::string_view TargetHost(absl::string_view target) {
  for (absl::string_view scheme : {"dns:///", "dns:", "ipv4:", "ipv6:"}) {
    if (absl::ConsumePrefix(&target, scheme)) break;
  }
  if (absl::StartsWith(target, "[")) {
    const size_t close = target.find(']');
    return close == absl::string_view::npos ? target
                                            : target.substr(1, close - 1);
  }
  const size_t colon = target.rfind(':');
  return colon == absl::string_view::npos ? target : target.substr(0, colon);
}

bool IsLocalTarget(absl::string_view target) {
  if (absl::StartsWith(target, "unix:") ||
      absl::StartsWith(target, "unix-abstract:")) {
    return true;
  }
  const absl::string_view host = TargetHost(target);
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

absl::StatusOr<client::HostHandles> Client::Impl::GetHostHandles(
    absl::string_view ns, uint64_t lease_id, const CallOptions& call) const {
  v1::GetHostHandlesRequest req;
  req.set_namespace_(std::string(ns));
  req.set_lease_id(lease_id);
  return Call(
      &v1::KvHarbor::Stub::GetHostHandles, req, call,
      [](const v1::GetHostHandlesResponse& resp) { return FromProto(resp); });
}

absl::StatusOr<client::HostHandles> Client::GetHostHandles(
    absl::string_view ns, uint64_t lease_id, const CallOptions& call) {
  return impl_->GetHostHandles(ns, lease_id, call);
}

client::HostFetchStats Client::host_fetch_stats() const {
  const Impl::HostFetchCounters& c = impl_->host_fetch;
  client::HostFetchStats out;
  out.shm_fetches = c.shm_fetches.load();
  out.shm_pages = c.shm_pages.load();
  out.fallbacks = c.fallbacks.load();
  out.checksum_mismatches = c.checksum_mismatches.load();
  out.connects = c.connects.load();
  return out;
}

absl::StatusOr<std::optional<client::FetchResult>> Client::Impl::TryHostFetch(
    absl::string_view ns, const client::FetchSource& source,
    const client::FetchAssembler::Destination& destination,
    const CallOptions& call) const {
  if (!host_fetch_allowed || !source.by_lease() || !source.pages.empty() ||
      absl::ToUnixNanos(absl::Now()) < host_fetch.retry_after_ns.load()) {
    return std::nullopt;
  }
  const auto fall_back = [this](bool pause) {
    ++host_fetch.fallbacks;
    if (pause) {
      host_fetch.retry_after_ns.store(
          absl::ToUnixNanos(absl::Now() + kHostFetchRetry));
    }
    return std::optional<client::FetchResult>();
  };
  absl::StatusOr<client::HostHandles> handles =
      GetHostHandles(ns, source.lease_id, call);
  absl::Status s = handles.status();
  if (s.code() == absl::StatusCode::kUnimplemented ||
      (s.code() == absl::StatusCode::kFailedPrecondition &&
       absl::StartsWith(s.message(), "store.host_ipc_socket"))) {
    return fall_back(/*pause=*/true);  // not offered (or an older daemon)
  }
  // A page outside the arena (a cold tier): this lease streams.
  if (s.code() == absl::StatusCode::kFailedPrecondition) {
    return fall_back(false);
  }
  if (!s.ok()) return s;  // unknown lease etc.: Fetch would say the same
  const client::HostHandles& h = *handles;
  // The requested range; anything odd streams so the error is Fetch's own.
  const size_t n = h.pages.size();
  const size_t first = source.start_page;
  if (first >= n || source.page_count > n - first) return fall_back(false);
  const size_t count = source.page_count == 0 ? n - first : source.page_count;
  bool connected = false;
  absl::StatusOr<std::shared_ptr<const client::HostArenaMapping>> map =
      client::HostIpc::Default().Get(h, &connected);
  if (!map.ok()) return fall_back(/*pause=*/true);  // unreachable or foreign
  if (connected) ++host_fetch.connects;
  s = client::CopyHostPages(**map, h, first, count, destination);
  if (s.code() == absl::StatusCode::kDataLoss) {
    // The lease ran out and its slots were reused: never hand these bytes
    // out; the stream says what the daemon has now.
    ++host_fetch.checksum_mismatches;
    return fall_back(false);
  }
  if (s.code() == absl::StatusCode::kFailedPrecondition) {
    return fall_back(false);
  }
  if (!s.ok()) return s;  // the destination's error
  client::FetchResult r;
  r.num_pages = static_cast<uint32_t>(count);
  r.page_bytes = h.pages[first].bytes;
  r.handles.reserve(count);
  for (size_t i = first; i < first + count; ++i) {
    r.handles.push_back(h.pages[i].handle);
  }
  r.path = client::FetchPath::kSharedMemory;
  ++host_fetch.shm_fetches;
  host_fetch.shm_pages += count;
  return std::optional<client::FetchResult>(std::move(r));
}

}  // namespace kvharbor
