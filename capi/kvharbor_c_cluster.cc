// The C ABI of capi/kvharbor_c.h for the cluster client (ABI 4):
// kvharbor::ClusterClient (include/kvharbor/cluster_client.h) over a static,
// DNS or etcd member source. Guard() (capi/capi_util.h) keeps every C++
// exception inside.
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "capi/capi_names.h"
#include "capi/capi_util.h"
#include "capi/json.h"
#include "capi/kvharbor_c.h"
#include "cluster/member_source.h"
#include "cluster/registrar.h"
#include "kvharbor/cluster_client.h"

struct kvh_cluster {
  std::unique_ptr<kvharbor::ClusterClient> cluster;
};

using kvharbor::ClusterClient;
namespace cluster = kvharbor::cluster;

namespace {

std::vector<std::string> CommaList(const char* text) {
  return absl::StrSplit(text, ',', absl::SkipWhitespace());
}

absl::StatusOr<std::shared_ptr<cluster::MemberSource>> MemberSourceFrom(
    const kvh_cluster_options& o, absl::Duration etcd_timeout) {
  const int given = int{o.members != nullptr} + int{o.dns != nullptr} +
                    int{o.etcd != nullptr};
  if (given != 1) {
    return absl::InvalidArgumentError(
        "options.members/dns/etcd: give exactly one of them");
  }
  if (o.etcd_prefix != nullptr && o.etcd == nullptr) {
    return absl::InvalidArgumentError("options.etcd_prefix: needs etcd");
  }
  if (o.members != nullptr) {
    auto src = cluster::StaticMemberSource::Create(CommaList(o.members),
                                                   "options.members");
    if (!src.ok()) return src.status();
    return std::shared_ptr<cluster::MemberSource>(std::move(*src));
  }
  if (o.dns != nullptr) {
    auto src = cluster::DnsMemberSource::Create(o.dns);
    if (!src.ok()) {
      return absl::Status(
          src.status().code(),
          absl::StrCat("options.dns: ", src.status().message()));
    }
    return std::shared_ptr<cluster::MemberSource>(std::move(*src));
  }
  cluster::EtcdOptions etcd;
  etcd.endpoints = CommaList(o.etcd);
  etcd.request_timeout = etcd_timeout;
  KVH_TRY(cluster::ValidateEtcdOptions(etcd, "options.etcd"));
  auto src = cluster::EtcdMemberSource::Create(
      std::move(etcd),
      o.etcd_prefix != nullptr ? o.etcd_prefix : cluster::kDefaultKeyPrefix);
  if (!src.ok()) return src.status();
  return std::shared_ptr<cluster::MemberSource>(std::move(*src));
}

absl::StatusOr<absl::Duration> PositiveMs(int64_t ms, absl::Duration dflt,
                                          absl::string_view field) {
  if (ms < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", ms, " must not be negative"));
  }
  return ms == 0 ? dflt : absl::Milliseconds(ms);
}

absl::Status CheckCluster(const kvh_cluster* c, int64_t timeout_ms,
                          CallOptions* call) {
  if (c == nullptr || c->cluster == nullptr) {
    return absl::InvalidArgumentError("cluster: must not be null");
  }
  return CheckTimeout(timeout_ms, call);
}

// CheckCluster, and the namespace and tokens every token call names.
absl::Status CheckTokenCall(const kvh_cluster* c, const char* ns,
                            const int32_t* tokens, size_t num_tokens,
                            int64_t timeout_ms, CallOptions* call) {
  KVH_TRY(CheckCluster(c, timeout_ms, call));
  KVH_TRY(NotNull(ns, "ns"));
  return CheckTokens(tokens, num_tokens);
}

// ... and the match result and member name a match or lookup returns, and
// its destination `dst` (named `dst_field`) when it has room.
absl::Status CheckMatchCall(const kvh_cluster* c, const char* ns,
                            const int32_t* tokens, size_t num_tokens,
                            const kvh_match_result* out, char** member,
                            const void* dst, size_t dst_capacity,
                            const char* dst_field, int64_t timeout_ms,
                            CallOptions* call) {
  KVH_TRY(CheckTokenCall(c, ns, tokens, num_tokens, timeout_ms, call));
  KVH_TRY(NotNull(out, "out"));
  KVH_TRY(NotNull(member, "member"));
  return dst_capacity > 0 ? NotNull(dst, dst_field) : absl::OkStatus();
}

// A ClusterLease naming `member` for a fetch of `source` (a whole lease or
// handles; the cluster client fetches no page range of a lease).
absl::StatusOr<kvharbor::ClusterLease> LeaseFor(
    const char* member, const kvh_fetch_source* source) {
  KVH_TRY(NotNull(member, "member"));
  KVH_TRY(NotNull(source, "source"));
  if (source->start_page != 0 || source->page_count != 0) {
    return absl::InvalidArgumentError(
        "source.start_page: the cluster client fetches whole leases; give 0 "
        "(or the lease's handles)");
  }
  if (source->num_handles == 0) {
    return absl::InvalidArgumentError(
        "source.handles: give the matched handles (with lease_id for a "
        "lease): the cluster client fetches what the member matched");
  }
  KVH_TRY(NotNull(source->handles, "source.handles"));
  kvharbor::ClusterLease lease;
  lease.member = member;
  lease.lease.id = source->lease_id;
  lease.lease.pages.assign(source->handles,
                           source->handles + source->num_handles);
  return lease;
}

}  // namespace

extern "C" {

int kvh_cluster_connect(const kvh_cluster_options* options, kvh_cluster** out) {
  return Guard([&]() -> absl::Status {
    KVH_TRY(NotNull(options, "options"));
    KVH_TRY(NotNull(out, "out"));
    if (options->struct_size != sizeof(kvh_cluster_options)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "options.struct_size: ", options->struct_size, " is not ",
          sizeof(kvh_cluster_options), " (the ABI 4 kvh_cluster_options)"));
    }
    kvharbor::ClusterClientOptions o;
    KVH_TRY(kvharbor::capi::MakeClientOptions(options->client, "options.client",
                                              &o.client));
    auto member_timeout =
        PositiveMs(options->member_timeout_ms, absl::Seconds(1),
                   "options.member_timeout_ms");
    if (!member_timeout.ok()) return member_timeout.status();
    auto retry = PositiveMs(options->retry_down_after_ms, absl::Seconds(2),
                            "options.retry_down_after_ms");
    if (!retry.ok()) return retry.status();
    o.member_timeout = *member_timeout;
    o.retry_down_after = *retry;
    auto members = MemberSourceFrom(*options, *member_timeout);
    if (!members.ok()) return members.status();
    o.members = *std::move(members);
    auto c = ClusterClient::Create(std::move(o));
    if (!c.ok()) return c.status();
    auto handle = std::make_unique<kvh_cluster>();
    handle->cluster = std::move(*c);
    *out = handle.release();
    return absl::OkStatus();
  });
}

void kvh_cluster_close(kvh_cluster* c) { delete c; }

int kvh_cluster_create_namespace(kvh_cluster* c, const kvh_namespace_spec* spec,
                                 int64_t timeout_ms) {
  return Guard([&]() -> absl::Status {
    CallOptions call;
    KVH_TRY(CheckCluster(c, timeout_ms, &call));
    client::NamespaceSpec s;
    KVH_TRY(kvharbor::capi::MakeSpec(spec, &s));
    return c->cluster->CreateNamespace(s, call);
  });
}

int kvh_cluster_owner(kvh_cluster* c, const char* ns, const int32_t* tokens,
                      size_t num_tokens, int64_t timeout_ms, char** member) {
  return Guard([&]() -> absl::Status {
    CallOptions call;
    KVH_TRY(CheckTokenCall(c, ns, tokens, num_tokens, timeout_ms, &call));
    KVH_TRY(NotNull(member, "member"));
    auto r =
        c->cluster->Owner(ns, absl::MakeConstSpan(tokens, num_tokens), call);
    if (!r.ok()) return r.status();
    return ReturnString(*r, member);
  });
}

int kvh_cluster_match(kvh_cluster* c, const char* ns, const int32_t* tokens,
                      size_t num_tokens, int lock, int64_t lease_ttl_ms,
                      uint64_t* handles, size_t handles_capacity,
                      kvh_match_result* out, char** member,
                      int64_t timeout_ms) {
  return Guard([&]() -> absl::Status {
    CallOptions call;
    KVH_TRY(CheckMatchCall(c, ns, tokens, num_tokens, out, member, handles,
                           handles_capacity, "handles", timeout_ms, &call));
    if (lease_ttl_ms < 0) {
      return absl::InvalidArgumentError("lease_ttl_ms: must not be negative");
    }
    auto r =
        c->cluster->Match(ns, absl::MakeConstSpan(tokens, num_tokens),
                          lock != 0, absl::Milliseconds(lease_ttl_ms), call);
    if (!r.ok()) return r.status();
    if (r->lease.pages.size() > handles_capacity) {
      (void)c->cluster->Release(*r, call);
      return absl::OutOfRangeError(
          absl::StrCat("handles_capacity: ", handles_capacity, " is less than ",
                       r->lease.pages.size(), " matched pages"));
    }
    KVH_TRY(ReturnString(r->member, member));
    if (!r->lease.pages.empty()) {
      std::memcpy(handles, r->lease.pages.data(),
                  r->lease.pages.size() * sizeof(uint64_t));
    }
    kvharbor::capi::SetMatchResult(r->lease, out);
    return absl::OkStatus();
  });
}

int kvh_cluster_fetch(kvh_cluster* c, const char* ns, const char* member,
                      const kvh_fetch_source* source, void* dst,
                      size_t dst_capacity, kvh_fetch_result* out,
                      int64_t timeout_ms) {
  return Guard([&]() -> absl::Status {
    CallOptions call;
    KVH_TRY(CheckCluster(c, timeout_ms, &call));
    KVH_TRY(NotNull(ns, "ns"));
    KVH_TRY(NotNull(dst, "dst"));
    auto lease = LeaseFor(member, source);
    if (!lease.ok()) return lease.status();
    auto pages = c->cluster->Fetch(ns, *lease, call);
    if (!pages.ok()) return pages.status();
    uint64_t total = 0;
    for (const auto& p : *pages) total += p.size();
    if (total > dst_capacity) {
      return absl::InvalidArgumentError(absl::StrCat(
          "dst: holds ", dst_capacity, " bytes; the pages need ", total));
    }
    auto* d = static_cast<uint8_t*>(dst);
    for (const auto& p : *pages) {
      std::memcpy(d, p.data(), p.size());
      d += p.size();
    }
    if (out != nullptr) {
      out->num_pages = static_cast<uint32_t>(pages->size());
      out->page_bytes = pages->empty() ? 0 : (*pages)[0].size();
      out->bytes_written = total;
    }
    return absl::OkStatus();
  });
}

int kvh_cluster_release(kvh_cluster* c, const char* member, uint64_t lease_id,
                        int64_t timeout_ms) {
  return Guard([&]() -> absl::Status {
    CallOptions call;
    KVH_TRY(CheckCluster(c, timeout_ms, &call));
    KVH_TRY(NotNull(member, "member"));
    kvharbor::ClusterLease lease;
    lease.member = member;
    lease.lease.id = lease_id;
    return c->cluster->Release(lease, call);
  });
}

int kvh_cluster_lookup(kvh_cluster* c, const char* ns, const int32_t* tokens,
                       size_t num_tokens, void* dst, size_t dst_capacity,
                       kvh_match_result* out, char** member,
                       int64_t timeout_ms) {
  return Guard([&]() -> absl::Status {
    CallOptions call;
    KVH_TRY(CheckMatchCall(c, ns, tokens, num_tokens, out, member, dst,
                           dst_capacity, "dst", timeout_ms, &call));
    auto r =
        c->cluster->Lookup(ns, absl::MakeConstSpan(tokens, num_tokens), call);
    if (!r.ok()) return r.status();
    if (r->pages.size() > dst_capacity) {
      return absl::OutOfRangeError(
          absl::StrCat("dst_capacity: ", dst_capacity, " bytes is less than ",
                       r->pages.size(), " bytes of matched pages"));
    }
    KVH_TRY(ReturnString(r->member, member));
    if (!r->pages.empty()) std::memcpy(dst, r->pages.data(), r->pages.size());
    *out = kvh_match_result{};
    out->matched_tokens = r->matched_tokens;
    out->page_bytes = r->page_bytes;
    out->num_pages = r->page_bytes == 0 ? 0 : r->pages.size() / r->page_bytes;
    return absl::OkStatus();
  });
}

int kvh_cluster_insert(kvh_cluster* c, const char* ns, const int32_t* tokens,
                       size_t num_tokens, const void* pages, size_t pages_len,
                       uint64_t page_bytes, kvh_insert_result* out,
                       int* dropped, char** member, int64_t timeout_ms) {
  return Guard([&]() -> absl::Status {
    CallOptions call;
    KVH_TRY(CheckTokenCall(c, ns, tokens, num_tokens, timeout_ms, &call));
    KVH_TRY(NotNull(pages, "pages"));
    auto r = c->cluster->Insert(
        ns, absl::MakeConstSpan(tokens, num_tokens),
        absl::MakeConstSpan(static_cast<const uint8_t*>(pages), pages_len),
        page_bytes, call);
    if (!r.ok()) return r.status();
    if (member != nullptr) KVH_TRY(ReturnString(r->member, member));
    if (out != nullptr) kvharbor::capi::SetInsertResult(r->result, out);
    if (dropped != nullptr) *dropped = r->dropped ? 1 : 0;
    return absl::OkStatus();
  });
}

int kvh_cluster_status(kvh_cluster* c, int with_stats, char** status_json) {
  return Guard([&]() -> absl::Status {
    CallOptions call;
    KVH_TRY(CheckCluster(c, 0, &call));
    KVH_TRY(NotNull(status_json, "status_json"));
    return ReturnString(
        kvharbor::capi::ClusterStatusJson(c->cluster->source().Describe(),
                                          c->cluster->MemberStatus(with_stats)),
        status_json);
  });
}

}  // extern "C"
