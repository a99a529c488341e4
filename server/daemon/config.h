// Helpers for kvharbord's configuration: byte sizes as written in the config
// file and on the command line, and the default pool budget.
//
// LoadConfigFile and LoadConfigText fill DaemonOptions
// (server/daemon/daemon_options.h) from YAML. Stateless functions;
// thread-safe.
#ifndef KVHARBOR_SERVER_DAEMON_CONFIG_H_
#define KVHARBOR_SERVER_DAEMON_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/daemon/daemon_options.h"

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

// Loads a YAML config file into options (every field validated; errors name
// the field, e.g. "config: store.pool_budget_bytes: ..."). Keys absent from
// the file leave `options` unchanged; unknown keys are errors. See
// deploy/kvharbord.example.yaml for the format.
absl::Status LoadConfigFile(const std::string& path, DaemonOptions* options);
// The same for YAML text already in memory; `source` names it in errors
// (LoadConfigFile passes the path).
absl::Status LoadConfigText(absl::string_view text, absl::string_view source,
                            DaemonOptions* options);

}  // namespace kvharbor

#endif  // KVHARBOR_SERVER_DAEMON_CONFIG_H_
