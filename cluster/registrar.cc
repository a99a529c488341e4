#include "cluster/registrar.h"

#include <unistd.h>

#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace kvharbor {
namespace cluster {

absl::Status ValidateRegistrarOptions(const RegistrarOptions& options,
                                      absl::string_view prefix) {
  absl::Status s = ValidateEtcdOptions(
      options.etcd, absl::StrCat(prefix, ": cluster.etcd_endpoints"));
  if (!s.ok()) return s;
  if (options.key_prefix.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, ": cluster.key_prefix: must not be empty"));
  }
  if (options.lease_ttl < absl::Seconds(1) ||
      options.lease_ttl > absl::Hours(1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, ": cluster.lease_ttl_s: must be in [1, 3600] seconds"));
  }
  if (!options.advertise.empty() &&
      options.advertise.rfind(':') == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, ": cluster.advertise: '", options.advertise,
                     "' is not HOST:PORT"));
  }
  return absl::OkStatus();
}

MemberRegistrar::MemberRegistrar(RegistrarOptions options)
    : options_(std::move(options)),
      key_(options_.key_prefix + options_.advertise),
      etcd_(options_.etcd) {}

absl::StatusOr<std::unique_ptr<MemberRegistrar>> MemberRegistrar::Start(
    RegistrarOptions options) {
  absl::Status s = ValidateRegistrarOptions(options, "options");
  if (!s.ok()) return s;
  if (options.advertise.empty()) {
    return absl::InvalidArgumentError(
        "options: cluster.advertise: required (HOST:PORT)");
  }
  std::unique_ptr<MemberRegistrar> r(new MemberRegistrar(std::move(options)));
  s = r->Register();
  if (!s.ok()) return s;
  r->thread_ = std::thread([p = r.get()] { p->KeepAliveLoop(); });
  return r;
}

absl::Status MemberRegistrar::Register() {
  absl::StatusOr<int64_t> lease = etcd_.GrantLease(options_.lease_ttl);
  if (!lease.ok()) return lease.status();
  const nlohmann::json value = {
      {"address", options_.advertise},
      {"pid", static_cast<int64_t>(getpid())},
      {"registered_unix_ms", absl::ToUnixMillis(absl::Now())}};
  absl::Status s = etcd_.Put(key_, value.dump(), *lease);
  if (!s.ok()) {
    etcd_.RevokeLease(*lease).IgnoreError();
    return s;
  }
  lease_ = *lease;
  ++registrations_;
  return absl::OkStatus();
}

void MemberRegistrar::KeepAliveLoop() {
  // Three renewals per TTL: one lost renewal (etcd busy, a dropped
  // connection) never lets the key expire.
  const absl::Duration period = options_.lease_ttl / 3;
  while (!stop_.WaitForNotificationWithTimeout(period)) {
    absl::StatusOr<absl::Duration> ttl = etcd_.KeepAlive(lease_.load());
    if (ttl.ok()) continue;
    ++keepalive_failures_;
    // NOT_FOUND: the lease expired while etcd was unreachable; our key went
    // with it. Register again (new lease, same key) so that we rejoin.
    if (absl::IsNotFound(ttl.status())) Register().IgnoreError();
  }
}

void MemberRegistrar::Stop() {
  if (!thread_.joinable()) return;
  stop_.Notify();
  thread_.join();
  // Revoking deletes the key now instead of after the TTL.
  etcd_.RevokeLease(lease_.load()).IgnoreError();
}

MemberRegistrar::~MemberRegistrar() { Stop(); }

}  // namespace cluster
}  // namespace kvharbor
