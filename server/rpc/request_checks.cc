#include "server/rpc/request_checks.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "types/bulk_wire.h"

namespace kvharbor {

absl::Status CheckLeaseId(uint64_t lease_id) {
  if (lease_id == 0) {
    return absl::InvalidArgumentError(
        "lease_id: 0 is not a lease (use the id Match(lock=true) returned)");
  }
  return absl::OkStatus();
}

absl::Status CheckBulk(const v1::BulkTransfer& bulk, absl::string_view field) {
  if (bulk.connections() == 0 || bulk.connections() > kBulkMaxConnections) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".connections: ", bulk.connections(),
                     " is not 1 to ", kBulkMaxConnections));
  }
  if (bulk.stripe_pages() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".stripe_pages: must be >= 1"));
  }
  return absl::OkStatus();
}

absl::Status NameField(const absl::Status& status, absl::string_view field) {
  if (status.ok() || absl::StartsWith(status.message(), field)) return status;
  absl::string_view msg = status.message();
  const size_t colon = msg.find(": ");
  if (colon != absl::string_view::npos &&
      absl::EndsWith(field, absl::StrCat(".", msg.substr(0, colon)))) {
    // "namespace: x" for field "header.namespace".
    return absl::Status(status.code(), absl::StrCat(field, msg.substr(colon)));
  }
  return absl::Status(status.code(), absl::StrCat(field, ": ", msg));
}

absl::Status UnderPrefix(const absl::Status& status, absl::string_view prefix) {
  absl::string_view msg = status.message();
  const size_t end = msg.find_first_not_of("abcdefghijklmnopqrstuvwxyz_");
  if (status.ok() || end == 0 || end == absl::string_view::npos ||
      (msg[end] != ':' && msg[end] != '[')) {
    return status;
  }
  return absl::Status(status.code(), absl::StrCat(prefix, ".", msg));
}

absl::StatusOr<std::shared_ptr<Namespace>> FindNamespace(
    const Store& store, absl::string_view name, absl::string_view field,
    const Caller& caller) {
  KVH_RETURN_IF_ERROR(ValidateNamespaceName(name, field));
  absl::StatusOr<std::shared_ptr<Namespace>> ns = store.Get(name);
  if (ns.ok() && !caller.Sees((*ns)->config().tenant)) {
    // Another tenant's namespace reads exactly like a missing one.
    ns = absl::NotFoundError(
        absl::StrCat("namespace: '", name, "' does not exist"));
  }
  if (!ns.ok()) return NameField(ns.status(), field);
  return ns;
}

std::vector<std::shared_ptr<Namespace>> VisibleNamespaces(
    const Store& store, const Caller& caller) {
  std::vector<std::shared_ptr<Namespace>> out = store.List();
  out.erase(std::remove_if(out.begin(), out.end(),
                           [&](const std::shared_ptr<Namespace>& ns) {
                             return !caller.Sees(ns->config().tenant);
                           }),
            out.end());
  return out;
}

}  // namespace kvharbor
