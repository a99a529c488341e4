#include "server/daemon/daemon_options.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "server/daemon/logging.h"
#include "server/rpc/service.h"

namespace kvharbor {

namespace {

absl::Status Invalid(absl::string_view prefix, absl::string_view field,
                     absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(prefix, ": ", field, ": ", what));
}

// The store: section's fields that the daemon checks (namespace specs are
// checked by the store itself).
absl::Status ValidateStoreSection(const StoreOptions& s,
                                  absl::string_view prefix) {
  if (s.pool_budget_bytes == 0) {
    return Invalid(prefix, "store.pool_budget_bytes", "must be > 0");
  }
  if (s.device < 0 || s.device > kMaxDeviceIndex) {
    return Invalid(
        prefix, "store.device",
        absl::StrCat(s.device, " is out of range [0, ", kMaxDeviceIndex, "]"));
  }
  if (s.default_lease_ttl <= absl::ZeroDuration()) {
    return Invalid(prefix, "store.default_lease_ttl_ms", "must be > 0");
  }
  if (s.max_lease_ttl < s.default_lease_ttl) {
    return Invalid(
        prefix, "store.max_lease_ttl_ms",
        absl::StrCat(absl::ToInt64Milliseconds(s.max_lease_ttl),
                     " is less than default_lease_ttl_ms (",
                     absl::ToInt64Milliseconds(s.default_lease_ttl), ")"));
  }
  if (s.max_tokens_per_request == 0 ||
      s.max_tokens_per_request > kMaxTokensPerRequestLimit) {
    return Invalid(
        prefix, "store.max_tokens_per_request",
        absl::StrCat(s.max_tokens_per_request, " is out of range [1, ",
                     kMaxTokensPerRequestLimit, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateDaemonOptions(const DaemonOptions& o,
                                   absl::string_view prefix) {
  absl::string_view host;
  int port = 0;
  if (!SplitHostPort(o.listen, &host, &port)) {
    return Invalid(prefix, "listen",
                   absl::StrCat("'", o.listen,
                                "' is not HOST:PORT (PORT 0..65535; 0 picks a "
                                "free port)"));
  }
  KVH_RETURN_IF_ERROR(
      ValidateSecurityOptions(o.security, host, o.namespaces, prefix));
  if (!o.metrics_listen.empty() &&
      !SplitHostPort(o.metrics_listen, &host, &port)) {
    return Invalid(prefix, "metrics.listen",
                   absl::StrCat("'", o.metrics_listen,
                                "' is not HOST:PORT (PORT 0..65535; 0 picks a "
                                "free port; empty serves no metrics)"));
  }
  if (o.metrics_require_token && o.security.tokens_file.empty()) {
    return Invalid(prefix, "metrics.require_token",
                   "needs security.tokens_file (the token must be a "
                   "daemon_admin entry of it)");
  }
  KVH_RETURN_IF_ERROR(ValidateLogOptions(o.log_format, o.log_level, prefix));
  KVH_RETURN_IF_ERROR(ValidateHostIpcOptions(o.host_ipc, prefix));
  KVH_RETURN_IF_ERROR(ValidateStoreSection(o.store, prefix));
  if (o.max_chunk_bytes < kMinChunkBytes ||
      o.max_chunk_bytes > kMaxChunkBytesLimit) {
    return Invalid(
        prefix, "fetch.max_chunk_bytes",
        absl::StrCat(o.max_chunk_bytes, " is out of range [", kMinChunkBytes,
                     ", ", kMaxChunkBytesLimit, "]"));
  }
  if (o.default_chunk_bytes < kMinChunkBytes ||
      o.default_chunk_bytes > o.max_chunk_bytes) {
    return Invalid(prefix, "fetch.default_chunk_bytes",
                   absl::StrCat(o.default_chunk_bytes, " is out of range [",
                                kMinChunkBytes,
                                ", max_chunk_bytes=", o.max_chunk_bytes, "]"));
  }
  if (o.drain_timeout < absl::ZeroDuration()) {
    return Invalid(prefix, "drain_timeout_ms", "must be >= 0");
  }
  if (o.lease_reap_interval <= absl::ZeroDuration() ||
      o.lease_reap_interval > absl::Minutes(1)) {
    return Invalid(prefix, "lease_reap_interval_ms",
                   "must be in (0, 60000] milliseconds");
  }
  if (o.cluster.has_value()) {
    KVH_RETURN_IF_ERROR(cluster::ValidateRegistrarOptions(*o.cluster, prefix));
  }
  return ValidateLimits(o.limits, o.store.max_tokens_per_request, prefix);
}

}  // namespace kvharbor
