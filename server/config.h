// Helpers for kvharbord's configuration: byte sizes as written in the config
// file and on the command line, and the default pool budget.
//
// LoadConfigFile itself is declared in server/daemon.h (it fills
// DaemonOptions). Stateless functions; thread-safe.
#ifndef KVHARBOR_SERVER_CONFIG_H_
#define KVHARBOR_SERVER_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvharbor {

// "4294967296", "4GiB", "512MiB", "64KiB", "1TiB" (binary units only, no
// fractions). The error names `field`.
absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text,
                                       absl::string_view field);

// "4.00 GiB"-style rendering for logs.
std::string HumanBytes(uint64_t bytes);

// The pool budget without configuration: min(4 GiB, 25% of physical RAM).
uint64_t DefaultPoolBudgetBytes();
// The machine's physical memory (sysconf; not a container's limit); 0 when
// unknown. kvharbord refuses a store.pool_budget_bytes larger than it.
uint64_t PhysicalRamBytes();

}  // namespace kvharbor

#endif  // KVHARBOR_SERVER_CONFIG_H_
