// Client: creation, namespaces, Match and leases, eviction, introspection.
// Insert and Fetch live in client_stream.cc.
#include "kvharbor/client.h"

#include <grpcpp/grpcpp.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <tuple>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client_impl.h"
#include "client/proto_convert.h"

namespace kvharbor {

using client::FromGrpcStatus;
using client::FromProto;
using client::ToProto;

namespace {

// Room for a message's framing (field tags, offsets) next to its data.
constexpr int kFramingBytes = 64 << 10;

absl::Status ValidateOptions(const ClientOptions& o) {
  if (o.address.empty()) {
    return absl::InvalidArgumentError("address: must not be empty");
  }
  if (o.data_plane_connections == 0 || o.data_plane_connections > 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("data_plane_connections: ", o.data_plane_connections,
                     " is not 1 to 16"));
  }
  if (o.max_message_bytes <= kFramingBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_message_bytes: ", o.max_message_bytes,
                     " must exceed ", kFramingBytes));
  }
  const uint64_t room =
      static_cast<uint64_t>(o.max_message_bytes) - kFramingBytes;
  if (o.insert_chunk_bytes == 0 || o.insert_chunk_bytes > room) {
    return absl::InvalidArgumentError(absl::StrCat(
        "insert_chunk_bytes: ", o.insert_chunk_bytes, " is out of range [1, ",
        room, "] (max_message_bytes minus framing)"));
  }
  if (o.fetch_chunk_bytes > room) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fetch_chunk_bytes: ", o.fetch_chunk_bytes, " is out of range [0, ",
        room, "] (max_message_bytes minus framing)"));
  }
  if (o.fetch_pages_per_message > 4096) {  // the daemon's maximum
    return absl::InvalidArgumentError(
        absl::StrCat("fetch_pages_per_message: ", o.fetch_pages_per_message,
                     " is out of range [0, 4096]"));
  }
  if (o.default_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("default_timeout: must be positive");
  }
  for (char c : o.token) {
    // The value must fit an HTTP/2 header; it is not echoed back.
    if (c <= ' ' || c > '~') {
      return absl::InvalidArgumentError(
          "token: holds a character outside visible ASCII (a space, a "
          "newline or a control character?)");
    }
  }
  if (o.tls_cert_file.empty() != o.tls_key_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        o.tls_cert_file.empty() ? "tls_cert_file" : "tls_key_file",
        ": a client certificate needs both tls_cert_file and tls_key_file"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadPemFile(const std::string& path,
                                        absl::string_view field) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": cannot read '", path, "': ", std::strerror(errno)));
  }
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Insecure, or TLS from the options' files.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(
    const ClientOptions& o, grpc::ChannelArguments* args) {
  const bool tls = o.tls || !o.tls_ca_file.empty() ||
                   !o.tls_cert_file.empty() || !o.tls_server_name.empty();
  if (!tls) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  for (auto [path, field, out] :
       {std::tuple<const std::string&, const char*, std::string*>{
            o.tls_ca_file, "tls_ca_file", &ssl.pem_root_certs},
        {o.tls_cert_file, "tls_cert_file", &ssl.pem_cert_chain},
        {o.tls_key_file, "tls_key_file", &ssl.pem_private_key}}) {
    if (path.empty()) continue;
    absl::StatusOr<std::string> pem = ReadPemFile(path, field);
    if (!pem.ok()) return pem.status();
    *out = *std::move(pem);
  }
  if (!o.tls_server_name.empty()) {
    args->SetSslTargetNameOverride(o.tls_server_name);
  }
  return grpc::SslCredentials(ssl);
}

}  // namespace

CallOptions Client::Impl::OneDeadline(const CallOptions& call) const {
  CallOptions one = call;
  if (!one.deadline.has_value()) {
    one.deadline = absl::Now() + one.timeout.value_or(options.default_timeout);
  }
  return one;
}

absl::Status Client::Impl::Prepare(grpc::ClientContext* ctx,
                                   const CallOptions& call) const {
  absl::Time deadline = absl::InfiniteFuture();
  if (call.deadline.has_value()) {
    deadline = *call.deadline;
  } else {
    const absl::Duration t = call.timeout.value_or(options.default_timeout);
    if (t != absl::InfiniteDuration()) deadline = absl::Now() + t;
  }
  if (deadline != absl::InfiniteFuture()) {
    if (deadline <= absl::Now()) {
      return absl::DeadlineExceededError(
          "deadline exceeded before the call started");
    }
    ctx->set_deadline(absl::ToChronoTime(deadline));
  }
  ctx->set_wait_for_ready(options.wait_for_ready);
  // Plain metadata rather than call credentials: gRPC sends call
  // credentials only over secure channels, and a daemon on loopback takes
  // tokens over plaintext too (server/security/security.h).
  if (!options.token.empty()) {
    ctx->AddMetadata("authorization", absl::StrCat("Bearer ", options.token));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Client>> Client::Create(ClientOptions options) {
  absl::Status s = ValidateOptions(options);
  if (!s.ok()) return s;
  auto impl = std::make_unique<Impl>();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  if (options.own_connection)
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  if (options.max_reconnect_backoff > absl::ZeroDuration()) {
    const int ms = static_cast<int>(std::min<int64_t>(
        absl::ToInt64Milliseconds(options.max_reconnect_backoff), 120000));
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, std::max(ms, 1));
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, std::max(ms, 1));
    // GRPC_ARG_MIN_RECONNECT_BACKOFF_MS stays: gRPC also takes it as the
    // connect timeout, and a short one fails handshakes on a busy host.
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
      ChannelCredentials(options, &args);
  if (!creds.ok()) return creds.status();
  impl->channel = grpc::CreateCustomChannel(options.address, *creds, args);
  if (impl->channel == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "address: cannot create a channel to '", options.address, "'"));
  }
  impl->stub = v1::KvHarbor::NewStub(impl->channel);
  impl->fetch_method = std::make_unique<grpc::internal::RpcMethod>(
      "/kvharbor.v1.KvHarbor/Fetch",
      grpc::internal::RpcMethod::SERVER_STREAMING, impl->channel);
  impl->insert_method = std::make_unique<grpc::internal::RpcMethod>(
      "/kvharbor.v1.KvHarbor/Insert",
      grpc::internal::RpcMethod::CLIENT_STREAMING, impl->channel);
  impl->decoder = std::make_unique<client::PageDecoder>();
  impl->host_fetch_allowed = options.host_fetch == HostFetchMode::kOn ||
                             (options.host_fetch == HostFetchMode::kAuto &&
                              IsLocalTarget(options.address));
  const bool tls = options.tls || !options.tls_ca_file.empty() ||
                   !options.tls_cert_file.empty() ||
                   !options.tls_key_file.empty();
  impl->bulk_allowed = !absl::StartsWith(options.address, "unix") &&
                       (options.data_plane == DataPlaneMode::kOn ||
                        (options.data_plane == DataPlaneMode::kAuto && !tls));
  impl->options = std::move(options);
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

const ClientOptions& Client::options() const { return impl_->options; }

absl::Status Client::WaitForConnected(absl::Time deadline) {
  if (impl_->channel->WaitForConnected(absl::ToChronoTime(deadline))) {
    return absl::OkStatus();
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "no connection to ", impl_->options.address, " before the deadline"));
}

// ---- Namespaces ----

absl::StatusOr<client::CreateNamespaceResult> Client::CreateNamespace(
    const client::NamespaceSpec& spec, bool if_not_exists,
    const CallOptions& call) {
  v1::CreateNamespaceRequest req;
  ToProto(spec, req.mutable_spec());
  req.set_if_not_exists(if_not_exists);
  return impl_->Call(&v1::KvHarbor::Stub::CreateNamespace, req, call,
                     [](const v1::CreateNamespaceResponse& resp) {
                       client::CreateNamespaceResult r;
                       r.info = FromProto(resp.info());
                       r.created = resp.created();
                       return r;
                     });
}

absl::StatusOr<client::NamespaceInfo> Client::DescribeNamespace(
    absl::string_view name, const CallOptions& call) {
  v1::DescribeNamespaceRequest req;
  req.set_namespace_(std::string(name));
  return impl_->Call(
      &v1::KvHarbor::Stub::DescribeNamespace, req, call,
      [](const v1::NamespaceInfo& resp) { return FromProto(resp); });
}

absl::StatusOr<std::vector<client::NamespaceInfo>> Client::ListNamespaces(
    const CallOptions& call) {
  v1::ListNamespacesRequest req;
  return impl_->Call(&v1::KvHarbor::Stub::ListNamespaces, req, call,
                     [](const v1::ListNamespacesResponse& resp) {
                       std::vector<client::NamespaceInfo> r;
                       r.reserve(resp.namespaces_size());
                       for (const v1::NamespaceInfo& info : resp.namespaces()) {
                         r.push_back(FromProto(info));
                       }
                       return r;
                     });
}

absl::Status Client::DeleteNamespace(absl::string_view name, bool force,
                                     const CallOptions& call) {
  v1::DeleteNamespaceRequest req;
  req.set_namespace_(std::string(name));
  req.set_force(force);
  v1::DeleteNamespaceResponse resp;
  return impl_->Unary(&v1::KvHarbor::Stub::DeleteNamespace, req, &resp, call);
}

// ---- Match and leases ----

absl::StatusOr<client::Lease> Client::Match(
    absl::string_view ns, absl::Span<const client::Token> tokens, bool lock,
    absl::Duration ttl, const CallOptions& call) {
  return Match(ns, client::Sequence::OfTokens(tokens), lock, ttl, call);
}

absl::StatusOr<client::Lease> Client::Match(absl::string_view ns,
                                            const client::Sequence& sequence,
                                            bool lock, absl::Duration ttl,
                                            const CallOptions& call) {
  if (ttl < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("lease_ttl_ms: must not be negative");
  }
  const int64_t ttl_ms = absl::ToInt64Milliseconds(ttl);
  if (ttl_ms > int64_t{UINT32_MAX}) {
    return absl::InvalidArgumentError(
        absl::StrCat("lease_ttl_ms: ", ttl_ms, " does not fit in 32 bits"));
  }
  v1::MatchRequest req;
  req.set_namespace_(std::string(ns));
  client::SequenceToProto(sequence, req.mutable_token_ids(),
                          req.mutable_page_keys());
  req.set_lock(lock);
  req.set_lease_ttl_ms(static_cast<uint32_t>(ttl_ms));
  v1::MatchResponse resp;
  absl::Status s = impl_->Unary(&v1::KvHarbor::Stub::Match, req, &resp, call);
  if (!s.ok()) return s;
  client::Lease lease;
  lease.id = resp.lease_id();
  if (lease.id != 0) {
    lease.expiry = client::FromUnixMillis(resp.lease_expires_unix_ms());
  }
  lease.pages.assign(resp.page_handles().begin(), resp.page_handles().end());
  for (int t : resp.page_tiers()) {
    lease.page_tiers.push_back(static_cast<client::Tier>(t));
  }
  lease.matched_tokens = resp.matched_tokens();
  lease.page_bytes = resp.page_bytes();
  return lease;
}

absl::Status Client::Release(uint64_t lease_id, const CallOptions& call) {
  v1::ReleaseRequest req;
  req.set_lease_id(lease_id);
  v1::ReleaseResponse resp;
  return impl_->Unary(&v1::KvHarbor::Stub::Release, req, &resp, call);
}

absl::StatusOr<absl::Time> Client::ExtendLease(uint64_t lease_id,
                                               absl::Duration ttl,
                                               const CallOptions& call) {
  const int64_t ttl_ms = absl::ToInt64Milliseconds(ttl);
  if (ttl < absl::ZeroDuration() || ttl_ms > int64_t{UINT32_MAX}) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lease_ttl_ms: ", ttl_ms, " is out of range [0, ", UINT32_MAX, "]"));
  }
  v1::ExtendLeaseRequest req;
  req.set_lease_id(lease_id);
  req.set_lease_ttl_ms(static_cast<uint32_t>(ttl_ms));
  return impl_->Call(
      &v1::KvHarbor::Stub::ExtendLease, req, call,
      [](const v1::ExtendLeaseResponse& resp) {
        return client::FromUnixMillis(resp.lease_expires_unix_ms());
      });
}

// ---- Eviction ----

namespace {

client::EvictResult FromEvict(const v1::EvictResponse& resp) {
  client::EvictResult r;
  r.pages_evicted = resp.pages_evicted();
  r.bytes_freed = resp.bytes_freed();
  return r;
}

// One Evict of `ns`, whose target (pages, bytes or all) `set_target` sets.
template <typename Impl, typename SetTarget>
absl::StatusOr<client::EvictResult> SendEvict(const Impl& impl,
                                              absl::string_view ns,
                                              const CallOptions& call,
                                              SetTarget set_target) {
  v1::EvictRequest req;
  req.set_namespace_(std::string(ns));
  set_target(&req);
  return impl.Call(&v1::KvHarbor::Stub::Evict, req, call, FromEvict);
}

}  // namespace

absl::StatusOr<client::EvictResult> Client::EvictPages(
    absl::string_view ns, absl::Span<const client::PageHandle> pages,
    const CallOptions& call) {
  return SendEvict(*impl_, ns, call, [&](v1::EvictRequest* req) {
    req->mutable_pages()->mutable_page_handles()->Add(pages.begin(),
                                                      pages.end());
  });
}

absl::StatusOr<client::EvictResult> Client::EvictBytes(
    absl::string_view ns, uint64_t bytes, const CallOptions& call) {
  return SendEvict(*impl_, ns, call,
                   [&](v1::EvictRequest* req) { req->set_bytes(bytes); });
}

absl::StatusOr<client::EvictResult> Client::EvictAll(absl::string_view ns,
                                                     const CallOptions& call) {
  return SendEvict(*impl_, ns, call,
                   [](v1::EvictRequest* req) { req->set_all(true); });
}

// ---- Introspection ----

absl::StatusOr<client::Stats> Client::Stats(absl::string_view ns,
                                            const CallOptions& call) {
  v1::StatsRequest req;
  req.set_namespace_(std::string(ns));
  return impl_->Call(&v1::KvHarbor::Stub::Stats, req, call,
                     [](const v1::StatsResponse& resp) {
                       client::Stats r;
                       r.global = FromProto(resp.global());
                       r.namespaces.reserve(resp.namespaces_size());
                       for (const v1::NamespaceStats& n : resp.namespaces()) {
                         r.namespaces.push_back(FromProto(n));
                       }
                       return r;
                     });
}

absl::StatusOr<client::TreeDump> Client::DumpTree(absl::string_view ns,
                                                  uint32_t max_nodes,
                                                  const CallOptions& call) {
  v1::DumpTreeRequest req;
  req.set_namespace_(std::string(ns));
  req.set_max_nodes(max_nodes);
  return impl_->Call(
      &v1::KvHarbor::Stub::DumpTree, req, call,
      [](const v1::DumpTreeResponse& resp) { return client::FromProto(resp); });
}

}  // namespace kvharbor
