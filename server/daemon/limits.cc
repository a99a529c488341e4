#include "server/daemon/limits.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/resource_quota.h>

#include <climits>
#include <initializer_list>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "server/daemon/config.h"

namespace kvharbor {

namespace {

// gRPC takes its sizes and times as int.
constexpr int64_t kIntMax = INT_MAX;

absl::Status Invalid(absl::string_view prefix, absl::string_view field,
                     absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(prefix, ": limits.", field, ": ", what));
}

absl::Status CheckRange(absl::string_view prefix, absl::string_view field,
                        uint64_t v, uint64_t min, uint64_t max) {
  if (v < min || v > max) {
    return Invalid(prefix, field,
                   absl::StrCat(v, " is out of range [", min, ", ", max, "]"));
  }
  return absl::OkStatus();
}

absl::Status ValidateKeepalive(const KeepaliveOptions& k,
                               absl::string_view prefix) {
  // Durations in milliseconds, with the smallest value that makes sense.
  const std::initializer_list<std::tuple<const char*, absl::Duration, int64_t>>
      kDurations = {
          // A ping more often than every second only adds load.
          {"keepalive.time_ms", k.time, 1000},
          {"keepalive.timeout_ms", k.timeout, 1},
          {"keepalive.min_client_ping_interval_ms", k.min_client_ping_interval,
           0},
          {"keepalive.max_connection_idle_ms", k.max_connection_idle, 0},
          {"keepalive.max_connection_age_ms", k.max_connection_age, 0},
          {"keepalive.max_connection_age_grace_ms", k.max_connection_age_grace,
           0},
      };
  for (const auto& [field, d, min_ms] : kDurations) {
    const int64_t ms = absl::ToInt64Milliseconds(d);
    if (ms < 0) return Invalid(prefix, field, "must be >= 0");
    KVH_RETURN_IF_ERROR(CheckRange(prefix, field, static_cast<uint64_t>(ms),
                                   static_cast<uint64_t>(min_ms), kIntMax));
  }
  if (k.max_connection_age_grace > absl::ZeroDuration() &&
      k.max_connection_age == absl::ZeroDuration()) {
    return Invalid(prefix, "keepalive.max_connection_age_grace_ms",
                   "set without max_connection_age_ms (connections then "
                   "never age)");
  }
  return CheckRange(prefix, "keepalive.max_ping_strikes", k.max_ping_strikes, 0,
                    1000);
}

int Ms(absl::Duration d) {
  return static_cast<int>(absl::ToInt64Milliseconds(d));
}

}  // namespace

uint64_t HeaderBytesFor(uint32_t max_tokens) {
  // A packed repeated int32 costs at most 5 bytes per id; the namespace
  // name and framing fit in the 4 KiB. An Insert header's page checksums
  // (8 bytes per page) come on top; docs/operations.md says so.
  return uint64_t{5} * max_tokens + (4 << 10);
}

absl::Status ValidateLimits(const LimitsOptions& l,
                            uint32_t max_tokens_per_request,
                            absl::string_view prefix) {
  KVH_RETURN_IF_ERROR(CheckRange(
      prefix, "max_receive_message_bytes", l.max_receive_message_bytes,
      kMinReceiveMessageBytes, kMaxReceiveMessageBytesLimit));
  const uint64_t header = HeaderBytesFor(max_tokens_per_request);
  if (l.max_receive_message_bytes < header) {
    return Invalid(
        prefix, "max_receive_message_bytes",
        absl::StrCat(l.max_receive_message_bytes,
                     " is too small for a request with "
                     "store.max_tokens_per_request=",
                     max_tokens_per_request, " tokens (needs ", header,
                     "); raise it or lower store.max_tokens_per_request"));
  }
  KVH_RETURN_IF_ERROR(CheckRange(prefix, "max_concurrent_streams",
                                 l.max_concurrent_streams, 1,
                                 kMaxConcurrentStreamsLimit));
  if (l.resource_quota_bytes != 0 &&
      l.resource_quota_bytes < kMinResourceQuotaBytes) {
    return Invalid(
        prefix, "resource_quota_bytes",
        absl::StrCat(l.resource_quota_bytes, " is below the minimum of ",
                     kMinResourceQuotaBytes, " (0 = no quota)"));
  }
  if (l.max_threads != 0) {
    KVH_RETURN_IF_ERROR(
        CheckRange(prefix, "max_threads", l.max_threads, 2, kMaxThreadsLimit));
  }
  KVH_RETURN_IF_ERROR(CheckRange(prefix, "max_in_flight_calls",
                                 l.max_in_flight_calls, 1,
                                 kMaxInFlightCallsLimit));
  KVH_RETURN_IF_ERROR(CheckRange(prefix, "max_in_flight_calls_per_tenant",
                                 l.max_in_flight_calls_per_tenant, 0,
                                 kMaxInFlightCallsLimit));
  KVH_RETURN_IF_ERROR(CheckRange(prefix, "max_in_flight_calls_per_connection",
                                 l.max_in_flight_calls_per_connection, 0,
                                 kMaxInFlightCallsLimit));
  for (const auto& [field, d] :
       {std::pair<const char*, absl::Duration>{"upload_idle_timeout_ms",
                                               l.upload_idle_timeout},
        {"fetch_idle_timeout_ms", l.fetch_idle_timeout}}) {
    const int64_t ms = absl::ToInt64Milliseconds(d);
    if (ms < 0) return Invalid(prefix, field, "must be >= 0 (0: never)");
    KVH_RETURN_IF_ERROR(
        CheckRange(prefix, field, static_cast<uint64_t>(ms), 0, kIntMax));
  }
  return ValidateKeepalive(l.keepalive, prefix);
}

void ApplyLimits(const LimitsOptions& l, grpc::ServerBuilder* builder) {
  builder->SetMaxReceiveMessageSize(
      static_cast<int>(l.max_receive_message_bytes));
  builder->AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                              static_cast<int>(l.max_concurrent_streams));
  if (l.resource_quota_bytes != 0 || l.max_threads != 0) {
    grpc::ResourceQuota quota("kvharbord");
    if (l.resource_quota_bytes != 0) {
      quota.Resize(static_cast<size_t>(l.resource_quota_bytes));
    }
    if (l.max_threads != 0)
      quota.SetMaxThreads(static_cast<int>(l.max_threads));
    builder->SetResourceQuota(quota);
  }
  const KeepaliveOptions& k = l.keepalive;
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, Ms(k.time));
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, Ms(k.timeout));
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS,
                              k.permit_without_calls ? 1 : 0);
  builder->AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
      Ms(k.min_client_ping_interval));
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES,
                              static_cast<int>(k.max_ping_strikes));
  // gRPC's own defaults for these are "never"; set only what was asked.
  for (const auto& [arg, d] :
       {std::pair<const char*, absl::Duration>{GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                                               k.max_connection_idle},
        {GRPC_ARG_MAX_CONNECTION_AGE_MS, k.max_connection_age},
        {GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS, k.max_connection_age_grace}}) {
    if (d > absl::ZeroDuration()) builder->AddChannelArgument(arg, Ms(d));
  }
}

std::string LimitsSummary(const LimitsOptions& l) {
  return absl::StrCat(
      "max message ", HumanBytes(l.max_receive_message_bytes), ", ",
      l.max_concurrent_streams, " streams/connection, ", l.max_in_flight_calls,
      " calls in flight (", l.max_in_flight_calls_per_tenant, " per tenant, ",
      l.max_in_flight_calls_per_connection,
      " per connection), idle uploads/fetches cancelled after ",
      absl::FormatDuration(l.upload_idle_timeout), "/",
      absl::FormatDuration(l.fetch_idle_timeout), ", resource quota ",
      l.resource_quota_bytes == 0 ? std::string("none")
                                  : HumanBytes(l.resource_quota_bytes),
      ", keepalive ", absl::FormatDuration(l.keepalive.time));
}

}  // namespace kvharbor
