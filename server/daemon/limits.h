// Limits: the `limits:` section of kvharbord's configuration -- what the
// daemon accepts per message, per connection and in total before it answers
// RESOURCE_EXHAUSTED or UNAVAILABLE instead of growing without bound.
//
// LimitsOptions is a plain value (part of DaemonOptions). ValidateLimits
// checks every field with a message naming it; ApplyLimits turns the gRPC
// ones (message size, streams per connection, ResourceQuota, keepalive) into
// ServerBuilder settings. The in-flight limits are enforced by the service's
// CallTracker (server/rpc/call_tracker.h) and the idle timeouts by its
// IdleWatchdog (server/rpc/idle_watchdog.h), not by gRPC. docs/operations.md
// ("Limits and overload") says what a client sees for each.
//
// Stateless functions; thread-safe. The ResourceQuota ApplyLimits creates is
// owned by the builder (and then by the server it builds).
#ifndef KVHARBOR_SERVER_DAEMON_LIMITS_H_
#define KVHARBOR_SERVER_DAEMON_LIMITS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace grpc {
class ServerBuilder;
}  // namespace grpc

namespace kvharbor {

// HTTP/2 keepalive and connection lifetime (config keys
// limits.keepalive.*_ms). A zero connection idle/age/grace means "never".
struct KeepaliveOptions {
  // The daemon pings a connection that was quiet this long, and closes it
  // when no answer comes within `timeout` (dead peers, half-open NAT state).
  absl::Duration time = absl::Minutes(1);
  absl::Duration timeout = absl::Seconds(20);
  // Client pings closer together than this are strikes; after
  // max_ping_strikes the daemon sends GOAWAY (ENHANCE_YOUR_CALM).
  absl::Duration min_client_ping_interval = absl::Seconds(10);
  uint32_t max_ping_strikes = 2;  // 0: unlimited
  // Whether client pings on a connection without calls are accepted (and
  // the daemon's own pings sent) at all.
  bool permit_without_calls = true;
  absl::Duration max_connection_idle = absl::ZeroDuration();
  absl::Duration max_connection_age = absl::ZeroDuration();
  // After max_connection_age, how long in-flight calls may still run.
  absl::Duration max_connection_age_grace = absl::ZeroDuration();
};

struct LimitsOptions {
  // Largest message a client may send (Insert chunk, Match/Insert header).
  // Bigger ones fail with RESOURCE_EXHAUSTED from gRPC itself.
  uint64_t max_receive_message_bytes = 16 << 20;
  // HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS: calls open at once on one
  // connection. gRPC clients queue calls beyond it until one ends.
  uint32_t max_concurrent_streams = 256;
  // Memory gRPC may use for its buffers (grpc::ResourceQuota); 0: no quota.
  uint64_t resource_quota_bytes = 0;
  // Threads gRPC may run (grpc::ResourceQuota::SetMaxThreads); 0: its
  // default.
  uint32_t max_threads = 0;
  // KvHarbor calls (unary and streams) in flight across all connections;
  // more get RESOURCE_EXHAUSTED naming this key.
  uint32_t max_in_flight_calls = 1024;
  // The same per tenant (only with bearer tokens; 0: no limit), so that one
  // tenant cannot take every place, and per connection (peer address; every
  // Unix-socket client shares one; 0: no limit).
  uint32_t max_in_flight_calls_per_tenant = 256;
  uint32_t max_in_flight_calls_per_connection = 256;
  // An Insert that receives no message, and a Fetch whose client takes no
  // chunk, for this long is cancelled (its slots or pins freed); zero:
  // never.
  absl::Duration upload_idle_timeout = absl::Seconds(30);
  absl::Duration fetch_idle_timeout = absl::Seconds(30);
  KeepaliveOptions keepalive;
};

// Bounds of the fields (the validation messages quote them).
inline constexpr uint64_t kMinReceiveMessageBytes = 64 << 10;
inline constexpr uint64_t kMaxReceiveMessageBytesLimit = 1 << 30;
inline constexpr uint64_t kMinResourceQuotaBytes = 1 << 20;
inline constexpr uint32_t kMaxConcurrentStreamsLimit = 1 << 20;
inline constexpr uint32_t kMaxInFlightCallsLimit = 1 << 20;
inline constexpr uint32_t kMaxThreadsLimit = 1 << 16;

// Bytes a Match or Insert header with `max_tokens` token ids may take on the
// wire (5 bytes per varint plus framing), so that the receive limit can be
// checked against store.max_tokens_per_request.
uint64_t HeaderBytesFor(uint32_t max_tokens);

// Messages read "<prefix>: limits.<field>: ...". `max_tokens_per_request`
// (store.max_tokens_per_request) must fit in one received message.
absl::Status ValidateLimits(const LimitsOptions& limits,
                            uint32_t max_tokens_per_request,
                            absl::string_view prefix);

// Sets message size, streams per connection, the ResourceQuota and keepalive
// on `builder`. `limits` must have passed ValidateLimits.
void ApplyLimits(const LimitsOptions& limits, grpc::ServerBuilder* builder);

// "max message 16.00 MiB, 256 streams/connection, ..." for the startup log.
std::string LimitsSummary(const LimitsOptions& limits);

}  // namespace kvharbor

#endif  // KVHARBOR_SERVER_DAEMON_LIMITS_H_
