// What the C ABI's translation units share (capi/kvharbor_c.cc,
// kvharbor_c_layout.cc, kvharbor_c_tiers.cc, kvharbor_c_cluster.cc,
// kvharbor_c_engine.cc): the kvh_client handle, the thread-local last error,
// Guard (statuses and exceptions to status codes, nothing thrown across the
// extern "C" boundary) and the argument checks every call makes. Internal to
// libkvharbor_c. Thread-safe as the ABI says.
#ifndef KVHARBOR_CAPI_CAPI_UTIL_H_
#define KVHARBOR_CAPI_CAPI_UTIL_H_

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "capi/kvharbor_c.h"
#include "kvharbor/client.h"
#include "types/kv_layout.h"

namespace kvharbor {
namespace capi {
// The GPU transfers of a client (capi/kvharbor_c_layout.cc), made on first
// use.
struct GpuTransfers;
}  // namespace capi
}  // namespace kvharbor

struct kvh_client {
  std::unique_ptr<kvharbor::Client> client;
  absl::Mutex gpu_mu;
  std::shared_ptr<kvharbor::capi::GpuTransfers> gpu ABSL_GUARDED_BY(gpu_mu);
};

namespace kvharbor {
namespace capi {

struct LastError {
  int code = KVH_OK;
  std::string message;
};

inline LastError& Last() {
  thread_local LastError last;
  return last;
}

inline int Fail(const absl::Status& s) {
  LastError& last = Last();
  last.code = static_cast<int>(s.code());
  last.message = std::string(s.message());
  return last.code;
}

// Runs `body` (returning absl::Status), mapping exceptions to statuses.
template <typename F>
int Guard(F&& body) {
  try {
    absl::Status s = body();
    return s.ok() ? KVH_OK : Fail(s);
  } catch (const std::bad_alloc&) {
    return Fail(absl::ResourceExhaustedError("out of memory"));
  } catch (const std::exception& e) {
    return Fail(absl::InternalError(absl::StrCat("exception: ", e.what())));
  } catch (...) {
    return Fail(absl::InternalError("unknown exception"));
  }
}

inline absl::Status NotNull(const void* p, const char* field) {
  if (p != nullptr) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, ": must not be null"));
}

inline absl::Status CheckClient(const kvh_client* c) {
  if (c == nullptr || c->client == nullptr) {
    return absl::InvalidArgumentError("client: must not be null");
  }
  return absl::OkStatus();
}

inline absl::Status CheckTimeout(int64_t timeout_ms, CallOptions* call) {
  if (timeout_ms < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("timeout_ms: ", timeout_ms, " must not be negative"));
  }
  if (timeout_ms > 0) {
    *call = CallOptions::Timeout(absl::Milliseconds(timeout_ms));
  }
  return absl::OkStatus();
}

// The checks most calls begin with: the client, the argument `arg` (named
// `field`: the namespace, or an out parameter) not null, and the timeout,
// made into `call`.
inline absl::Status CheckCall(const kvh_client* c, const void* arg,
                              int64_t timeout_ms, CallOptions* call,
                              const char* field = "ns") {
  absl::Status s = CheckClient(c);
  if (s.ok()) s = NotNull(arg, field);
  return s.ok() ? CheckTimeout(timeout_ms, call) : s;
}

// Copies `s` into a malloc'ed C string for a char** out parameter.
inline absl::Status ReturnString(const std::string& s, char** out) {
  char* p = static_cast<char*>(std::malloc(s.size() + 1));
  if (p == nullptr) return absl::ResourceExhaustedError("out of memory");
  std::memcpy(p, s.data(), s.size());
  p[s.size()] = '\0';
  *out = p;
  return absl::OkStatus();
}

// A call's answer as JSON (`to_json` makes it) into a string the caller frees
// with kvh_string_free, or the call's error.
template <typename T, typename ToJson>
absl::Status ReturnJson(const absl::StatusOr<T>& r, ToJson to_json,
                        char** out) {
  if (!r.ok()) return r.status();
  return ReturnString(to_json(*r), out);
}

inline absl::Status CheckTokens(const int32_t* tokens, size_t n) {
  if (n == 0) return absl::InvalidArgumentError("num_tokens: must be > 0");
  return NotNull(tokens, "tokens");
}

// A kvh_kv_layout as the SDK's PagedKvLayout (capi/kvharbor_c_layout.cc);
// INVALID_ARGUMENT naming layout.<field>.
absl::Status MakeLayout(const kvh_kv_layout* in, PagedKvLayout* out);

inline void SetInsertResult(const client::InsertResult& r,
                            kvh_insert_result* out) {
  out->already_present_tokens = r.already_present_tokens;
  out->pages_stored = r.pages_stored;
  out->pages_evicted = r.pages_evicted;
}

// ---- capi/capi_util.cc ----
const char* OrEmpty(const char* s);
// A malloc'ed copy of `s` (for strings inside out structs); null when out of
// memory.
char* CopyString(const std::string& s);
// Checks a kvh_fetch_source and views it as the SDK's FetchSource.
absl::Status MakeSource(const kvh_fetch_source* in, client::FetchSource* out);
// `v` if it is KVH_MODE_AUTO, _ON or _OFF; INVALID_ARGUMENT naming `field`.
absl::Status CheckMode(int v, absl::string_view field, int* out);
// A default deadline in milliseconds (0 = none), named `field` in errors.
absl::StatusOr<absl::Duration> DefaultTimeout(int64_t ms,
                                              absl::string_view field);
// ClientOptions from kvh_connect_options of the ABI 3, 4, 5 or 6 size (NULL =
// all unset, no default deadline); errors name `field`.<member>.
absl::Status MakeClientOptions(const kvh_connect_options* in,
                               absl::string_view field, ClientOptions* out);
void SetFetchResult(const client::FetchResult& r, kvh_fetch_result* out);
// `r`'s status; when it is OK, its counts into `out` (may be null).
absl::Status ReturnFetch(const absl::StatusOr<client::FetchResult>& r,
                         kvh_fetch_result* out);
absl::Status ReturnInsert(const absl::StatusOr<client::InsertResult>& r,
                          kvh_insert_result* out);
// What a fetch call unpacks: its source (MakeSource) and deadline.
struct FetchCall {
  client::FetchSource source;
  CallOptions call;
};
// Checks the client, `ns` and the destination `dst` (named `dst_field`) of a
// fetch call, then unpacks its source and deadline.
absl::Status MakeFetchCall(const kvh_client* c, const char* ns, const void* dst,
                           const char* dst_field,
                           const kvh_fetch_source* source, int64_t timeout_ms,
                           FetchCall* out);
void SetMatchResult(const client::Lease& r, kvh_match_result* out);
// Fills the SDK's NamespaceSpec from a kvh_namespace_spec of a size this
// library knows (ABI 2 or 5; INVALID_ARGUMENT naming "spec.struct_size"
// otherwise).
absl::Status MakeSpec(const kvh_namespace_spec* in, client::NamespaceSpec* out);

}  // namespace capi
}  // namespace kvharbor

// Early return of a failed absl::Status inside a Guard body.
#define KVH_TRY(expr)                \
  do {                               \
    absl::Status kvh_s_ = (expr);    \
    if (!kvh_s_.ok()) return kvh_s_; \
  } while (0)

#endif  // KVHARBOR_CAPI_CAPI_UTIL_H_
