// Status propagation helpers for absl::Status / absl::StatusOr.
//
// Header-only; no state. KVH_RETURN_IF_ERROR returns a non-OK status from the
// enclosing function; KVH_ASSIGN_OR_RETURN unwraps a StatusOr or returns its
// error. Both evaluate their argument exactly once.
#ifndef KVHARBOR_CORE_BASE_STATUS_MACROS_H_
#define KVHARBOR_CORE_BASE_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define KVH_STATUS_CONCAT_INNER_(a, b) a##b
#define KVH_STATUS_CONCAT_(a, b) KVH_STATUS_CONCAT_INNER_(a, b)

#define KVH_RETURN_IF_ERROR(expr)              \
  do {                                         \
    const absl::Status kvh_status_ = (expr);   \
    if (!kvh_status_.ok()) return kvh_status_; \
  } while (0)

#define KVH_ASSIGN_OR_RETURN(lhs, expr)                                        \
  KVH_ASSIGN_OR_RETURN_IMPL_(KVH_STATUS_CONCAT_(kvh_statusor_, __LINE__), lhs, \
                             expr)

#define KVH_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()

#endif  // KVHARBOR_CORE_BASE_STATUS_MACROS_H_
