// The C ABI of capi/kvharbor_c.h over kvharbor::Client: connection,
// namespaces, match, insert, fetch, tiers, eviction and introspection.
// Calibrations, compressed pages, transforms and same-host handles are in
// kvharbor_c_tiers.cc, the cluster client in kvharbor_c_cluster.cc. Every
// entry point runs its body through Guard() (capi/capi_util.h): nothing thrown
// ever crosses the extern "C" boundary.
#include "capi/kvharbor_c.h"

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "capi/capi_names.h"
#include "capi/capi_util.h"
#include "capi/json.h"
#include "kvharbor/client.h"

namespace kvharbor {
namespace capi {
namespace {

absl::Status CheckFormat(int format) {
  if (format == KVH_FETCH_RAW || format == KVH_FETCH_COMPRESSED) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("format: unknown value ", format));
}

// COMPRESSED: the SDK fetches codec buffers and decodes them; the raw pages
// are then placed like a RAW fetch places them (dst_of says where).
template <typename DstOf>
absl::StatusOr<client::FetchResult> FetchDecoded(Client& client, const char* ns,
                                                 const client::FetchSource& src,
                                                 const CallOptions& call,
                                                 DstOf dst_of) {
  absl::StatusOr<std::vector<std::vector<uint8_t>>> pages =
      client.Fetch(ns, src, client::FetchFormat::kCompressed, call);
  if (!pages.ok()) return pages.status();
  client::FetchResult r;
  r.num_pages = static_cast<uint32_t>(pages->size());
  r.page_bytes = pages->empty() ? 0 : (*pages)[0].size();
  for (uint32_t i = 0; i < r.num_pages; ++i) {
    absl::StatusOr<uint8_t*> dst = dst_of(i, (*pages)[i].size());
    if (!dst.ok()) return dst.status();
    std::memcpy(*dst, (*pages)[i].data(), (*pages)[i].size());
  }
  return r;
}

absl::Status CheckTier(int tier) {
  if (tier >= KVH_TIER_RAW && tier <= KVH_TIER_DISK) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("tier: unknown value ", tier));
}

void SetEvictResult(const client::EvictResult& r, kvh_evict_result* out) {
  out->pages_evicted = r.pages_evicted;
  out->bytes_freed = r.bytes_freed;
}

constexpr int kMaxMessageBytes = 1 << 30;

absl::Status ConnectWith(const char* address,
                         const kvharbor::ClientOptions& base,
                         kvh_client** out) {
  if (absl::Status s = NotNull(address, "address"); !s.ok()) return s;
  if (absl::Status s = NotNull(out, "out"); !s.ok()) return s;
  kvharbor::ClientOptions options = base;
  options.address = address;
  // GetCalibration returns a whole calibration in one message, and
  // compressed fetches (CPU or GPU decode) load it: a KVTC calibration of
  // an 8B model is hundreds of MiB, far above the SDK's 16 MiB default.
  options.max_message_bytes = kMaxMessageBytes;
  auto c = kvharbor::Client::Create(options);
  if (!c.ok()) return c.status();
  auto handle = std::make_unique<kvh_client>();
  handle->client = std::move(*c);
  *out = handle.release();
  return absl::OkStatus();
}

}  // namespace
}  // namespace capi
}  // namespace kvharbor

extern "C" {

const char* kvh_version(void) { return KVHARBOR_C_VERSION; }
int kvh_abi_version(void) { return KVH_ABI_VERSION; }
int kvh_last_error_code(void) { return kvharbor::capi::Last().code; }
const char* kvh_last_error_message(void) {
  return kvharbor::capi::Last().message.c_str();
}
void kvh_string_free(char* s) { std::free(s); }

int kvh_connect(const char* address, int64_t default_timeout_ms,
                kvh_client** out) {
  return Guard([&]() -> absl::Status {
    kvharbor::ClientOptions options;
    absl::StatusOr<absl::Duration> timeout =
        DefaultTimeout(default_timeout_ms, "default_timeout_ms");
    if (!timeout.ok()) return timeout.status();
    options.default_timeout = *timeout;
    return kvharbor::capi::ConnectWith(address, options, out);
  });
}

int kvh_connect_with(const char* address, const kvh_connect_options* in,
                     kvh_client** out) {
  return Guard([&]() -> absl::Status {
    kvharbor::ClientOptions options;
    KVH_TRY(kvharbor::capi::MakeClientOptions(in, "options", &options));
    return kvharbor::capi::ConnectWith(address, options, out);
  });
}

int kvh_wait_connected(kvh_client* c, int64_t timeout_ms) {
  return Guard([&]() -> absl::Status {
    KVH_TRY(CheckClient(c));
    if (timeout_ms < 0) {
      return absl::InvalidArgumentError("timeout_ms: must not be negative");
    }
    return c->client->WaitForConnected(absl::Now() +
                                       absl::Milliseconds(timeout_ms));
  });
}

void kvh_close(kvh_client* c) { delete c; }

int kvh_namespace_create(kvh_client* c, const char* name,
                         const kvh_geometry* geometry, uint64_t capacity_bytes,
                         const char* codec, int if_not_exists,
                         int64_t timeout_ms, int* created, char** info_json) {
  if (name == nullptr || geometry == nullptr) {
    return Guard([&]() -> absl::Status {
      KVH_TRY(NotNull(name, "name"));
      return NotNull(geometry, "geometry");
    });
  }
  kvh_namespace_spec spec = {};
  spec.struct_size = sizeof(spec);
  spec.name = name;
  spec.geometry = *geometry;
  spec.capacity_bytes = capacity_bytes;
  spec.codec = codec;
  return kvh_namespace_create_spec(c, &spec, if_not_exists, timeout_ms, created,
                                   info_json);
}

int kvh_namespace_create_spec(kvh_client* c, const kvh_namespace_spec* spec,
                              int if_not_exists, int64_t timeout_ms,
                              int* created, char** info_json) {
  return Guard([&]() -> absl::Status {
    KVH_TRY(CheckClient(c));
    client::NamespaceSpec s;
    KVH_TRY(kvharbor::capi::MakeSpec(spec, &s));
    CallOptions call;
    KVH_TRY(CheckTimeout(timeout_ms, &call));
    auto r = c->client->CreateNamespace(s, if_not_exists != 0, call);
    if (!r.ok()) return r.status();
    if (info_json != nullptr) {
      KVH_TRY(
          ReturnString(kvharbor::capi::NamespaceInfoJson(r->info), info_json));
    }
    if (created != nullptr) *created = r->created ? 1 : 0;
    return absl::OkStatus();
  });
}

int kvh_namespace_describe(kvh_client* c, const char* name, int64_t timeout_ms,
                           char** info_json) {
  return Guard([&]() -> absl::Status {
    CallOptions call;
    KVH_TRY(CheckCall(c, name, timeout_ms, &call, "name"));
    KVH_TRY(NotNull(info_json, "info_json"));
    return ReturnJson(c->client->DescribeNamespace(name, call),
                      kvharbor::capi::NamespaceInfoJson, info_json);
  });
}

int kvh_namespace_list(kvh_client* c, int64_t timeout_ms, char** list_json) {
  return Guard([&]() -> absl::Status {
    CallOptions call;
    KVH_TRY(CheckCall(c, list_json, timeout_ms, &call, "list_json"));
    return ReturnJson(c->client->ListNamespaces(call),
                      kvharbor::capi::NamespaceListJson, list_json);
  });
}

int kvh_namespace_delete(kvh_client* c, const char* name, int force,
                         int64_t timeout_ms) {
  return Guard([&]() -> absl::Status {
    CallOptions call;
    KVH_TRY(CheckCall(c, name, timeout_ms, &call, "name"));
    return c->client->DeleteNamespace(name, force != 0, call);
  });
}

int kvh_match(kvh_client* c, const char* ns, const int32_t* tokens,
              size_t num_tokens, int lock, int64_t lease_ttl_ms,
              uint64_t* handles, size_t handles_capacity, kvh_match_result* out,
              int64_t timeout_ms) {
  return kvh_match_tiers(c, ns, tokens, num_tokens, lock, lease_ttl_ms, handles,
                         nullptr, handles_capacity, out, timeout_ms);
}

int kvh_match_tiers(kvh_client* c, const char* ns, const int32_t* tokens,
                    size_t num_tokens, int lock, int64_t lease_ttl_ms,
                    uint64_t* handles, int32_t* page_tiers,
                    size_t handles_capacity, kvh_match_result* out,
                    int64_t timeout_ms) {
  // A token sequence of kvh_match_seq (capi/kvharbor_c_engine.cc).
  kvh_sequence seq = {};
  seq.struct_size = sizeof(seq);
  seq.tokens = tokens;
  seq.num_tokens = num_tokens;
  if (num_tokens == 0) {
    return Guard([] { return CheckTokens(nullptr, 0); });
  }
  return kvh_match_seq(c, ns, &seq, lock, lease_ttl_ms, handles, page_tiers,
                       handles_capacity, out, timeout_ms);
}

int kvh_release(kvh_client* c, uint64_t lease_id, int64_t timeout_ms) {
  return Guard([&]() -> absl::Status {
    KVH_TRY(CheckClient(c));
    CallOptions call;
    KVH_TRY(CheckTimeout(timeout_ms, &call));
    return c->client->Release(lease_id, call);
  });
}

int kvh_extend_lease(kvh_client* c, uint64_t lease_id, int64_t lease_ttl_ms,
                     int64_t* lease_expires_unix_ms, int64_t timeout_ms) {
  return Guard([&]() -> absl::Status {
    KVH_TRY(CheckClient(c));
    CallOptions call;
    KVH_TRY(CheckTimeout(timeout_ms, &call));
    if (lease_ttl_ms < 0) {
      return absl::InvalidArgumentError("lease_ttl_ms: must not be negative");
    }
    auto r = c->client->ExtendLease(lease_id, absl::Milliseconds(lease_ttl_ms),
                                    call);
    if (!r.ok()) return r.status();
    if (lease_expires_unix_ms != nullptr) {
      *lease_expires_unix_ms = absl::ToUnixMillis(*r);
    }
    return absl::OkStatus();
  });
}

int kvh_insert(kvh_client* c, const char* ns, const int32_t* tokens,
               size_t num_tokens, const void* pages, size_t pages_len,
               uint64_t page_bytes, kvh_insert_result* out,
               int64_t timeout_ms) {
  return Guard([&]() -> absl::Status {
    KVH_TRY(CheckClient(c));
    KVH_TRY(NotNull(ns, "ns"));
    KVH_TRY(CheckTokens(tokens, num_tokens));
    KVH_TRY(NotNull(pages, "pages"));
    CallOptions call;
    KVH_TRY(CheckTimeout(timeout_ms, &call));
    auto r = c->client->Insert(
        ns, absl::MakeConstSpan(tokens, num_tokens),
        absl::MakeConstSpan(static_cast<const uint8_t*>(pages), pages_len),
        page_bytes, call);
    return ReturnInsert(r, out);
  });
}

int kvh_insert_pages(kvh_client* c, const char* ns, const int32_t* tokens,
                     size_t num_tokens, const void* const* pages,
                     size_t num_pages, uint64_t page_bytes,
                     kvh_insert_result* out, int64_t timeout_ms) {
  return Guard([&]() -> absl::Status {
    KVH_TRY(CheckClient(c));
    KVH_TRY(NotNull(ns, "ns"));
    KVH_TRY(CheckTokens(tokens, num_tokens));
    KVH_TRY(NotNull(pages, "pages"));
    if (num_pages == 0) {
      return absl::InvalidArgumentError("num_pages: must be > 0");
    }
    if (page_bytes == 0) {
      return absl::InvalidArgumentError("page_bytes: must be > 0");
    }
    CallOptions call;
    KVH_TRY(CheckTimeout(timeout_ms, &call));
    std::vector<absl::Span<const uint8_t>> views;
    views.reserve(num_pages);
    for (size_t i = 0; i < num_pages; ++i) {
      if (pages[i] == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("pages[", i, "]: must not be null"));
      }
      views.emplace_back(static_cast<const uint8_t*>(pages[i]), page_bytes);
    }
    auto r = c->client->Insert(ns, absl::MakeConstSpan(tokens, num_tokens),
                               absl::MakeConstSpan(views), call);
    return ReturnInsert(r, out);
  });
}

int kvh_fetch(kvh_client* c, const char* ns, const kvh_fetch_source* source,
              int format, void* dst, size_t dst_capacity, kvh_fetch_result* out,
              int64_t timeout_ms) {
  return Guard([&]() -> absl::Status {
    kvharbor::capi::FetchCall f;
    KVH_TRY(kvharbor::capi::MakeFetchCall(c, ns, dst, "dst", source, timeout_ms,
                                          &f));
    KVH_TRY(kvharbor::capi::CheckFormat(format));
    auto r = format == KVH_FETCH_COMPRESSED
                 ? kvharbor::capi::FetchDecoded(
                       *c->client, ns, f.source, f.call,
                       [&](uint32_t i, uint64_t n) -> absl::StatusOr<uint8_t*> {
                         if (n > dst_capacity || i > (dst_capacity - n) / n) {
                           return absl::InvalidArgumentError(absl::StrCat(
                               "dst: holds ", dst_capacity, " bytes; page ", i,
                               " of ", n, " bytes does not fit"));
                         }
                         return static_cast<uint8_t*>(dst) + uint64_t{i} * n;
                       })
                 : c->client->FetchInto(
                       ns, f.source,
                       absl::MakeSpan(static_cast<uint8_t*>(dst), dst_capacity),
                       f.call);
    return ReturnFetch(r, out);
  });
}

int kvh_fetch_pages(kvh_client* c, const char* ns,
                    const kvh_fetch_source* source, int format,
                    void* const* page_dsts, size_t num_dsts,
                    uint64_t page_capacity, kvh_fetch_result* out,
                    int64_t timeout_ms) {
  return Guard([&]() -> absl::Status {
    kvharbor::capi::FetchCall f;
    KVH_TRY(kvharbor::capi::MakeFetchCall(c, ns, page_dsts, "page_dsts", source,
                                          timeout_ms, &f));
    KVH_TRY(kvharbor::capi::CheckFormat(format));
    auto r =
        format == KVH_FETCH_COMPRESSED
            ? kvharbor::capi::FetchDecoded(
                  *c->client, ns, f.source, f.call,
                  [&](uint32_t i, uint64_t n) -> absl::StatusOr<uint8_t*> {
                    if (i >= num_dsts || page_dsts[i] == nullptr) {
                      return absl::InvalidArgumentError(absl::StrCat(
                          "page_dsts: no destination for page ", i));
                    }
                    if (n > page_capacity) {
                      return absl::InvalidArgumentError(absl::StrCat(
                          "page_capacity: ", page_capacity,
                          " bytes is less than a page (", n, " bytes)"));
                    }
                    return static_cast<uint8_t*>(page_dsts[i]);
                  })
            : c->client->FetchInto(
                  ns, f.source,
                  absl::MakeConstSpan(
                      reinterpret_cast<uint8_t* const*>(page_dsts), num_dsts),
                  page_capacity, f.call);
    return ReturnFetch(r, out);
  });
}

int kvh_demote(kvh_client* c, const char* ns, int tier, uint64_t* pages_moved,
               int64_t timeout_ms) {
  return Guard([&]() -> absl::Status {
    CallOptions call;
    KVH_TRY(CheckCall(c, ns, timeout_ms, &call));
    KVH_TRY(kvharbor::capi::CheckTier(tier));
    auto r = c->client->Demote(ns, static_cast<client::Tier>(tier), call);
    if (!r.ok()) return r.status();
    if (pages_moved != nullptr) *pages_moved = *r;
    return absl::OkStatus();
  });
}

int kvh_evict_pages(kvh_client* c, const char* ns, const uint64_t* handles,
                    size_t num_handles, kvh_evict_result* out,
                    int64_t timeout_ms) {
  return Guard([&]() -> absl::Status {
    KVH_TRY(CheckClient(c));
    KVH_TRY(NotNull(ns, "ns"));
    if (num_handles == 0) {
      return absl::InvalidArgumentError("num_handles: must be > 0");
    }
    KVH_TRY(NotNull(handles, "handles"));
    CallOptions call;
    KVH_TRY(CheckTimeout(timeout_ms, &call));
    auto r = c->client->EvictPages(
        ns, absl::MakeConstSpan(handles, num_handles), call);
    if (!r.ok()) return r.status();
    if (out != nullptr) kvharbor::capi::SetEvictResult(*r, out);
    return absl::OkStatus();
  });
}

int kvh_evict_bytes(kvh_client* c, const char* ns, uint64_t bytes,
                    kvh_evict_result* out, int64_t timeout_ms) {
  return Guard([&]() -> absl::Status {
    CallOptions call;
    KVH_TRY(CheckCall(c, ns, timeout_ms, &call));
    auto r = c->client->EvictBytes(ns, bytes, call);
    if (!r.ok()) return r.status();
    if (out != nullptr) kvharbor::capi::SetEvictResult(*r, out);
    return absl::OkStatus();
  });
}

int kvh_evict_all(kvh_client* c, const char* ns, kvh_evict_result* out,
                  int64_t timeout_ms) {
  return Guard([&]() -> absl::Status {
    CallOptions call;
    KVH_TRY(CheckCall(c, ns, timeout_ms, &call));
    auto r = c->client->EvictAll(ns, call);
    if (!r.ok()) return r.status();
    if (out != nullptr) kvharbor::capi::SetEvictResult(*r, out);
    return absl::OkStatus();
  });
}

int kvh_stats(kvh_client* c, const char* ns, int64_t timeout_ms,
              char** stats_json) {
  return Guard([&]() -> absl::Status {
    CallOptions call;
    KVH_TRY(CheckCall(c, stats_json, timeout_ms, &call, "stats_json"));
    return ReturnJson(c->client->Stats(ns != nullptr ? ns : "", call),
                      kvharbor::capi::StatsJson, stats_json);
  });
}

int kvh_dump_tree(kvh_client* c, const char* ns, uint32_t max_nodes,
                  int64_t timeout_ms, char** text, uint64_t* nodes) {
  return Guard([&]() -> absl::Status {
    CallOptions call;
    KVH_TRY(CheckCall(c, ns, timeout_ms, &call));
    KVH_TRY(NotNull(text, "text"));
    auto r = c->client->DumpTree(ns, max_nodes, call);
    if (!r.ok()) return r.status();
    KVH_TRY(ReturnString(r->text, text));
    if (nodes != nullptr) *nodes = r->nodes;
    return absl::OkStatus();
  });
}

}  // extern "C"
