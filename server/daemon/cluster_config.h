// The `cluster:` section of kvharbord's YAML config: etcd membership
// (cluster/registrar.h). Kept apart from config.cc so that the cluster keys
// live in one place. Stateless; thread-safe.
#ifndef KVHARBOR_SERVER_DAEMON_CLUSTER_CONFIG_H_
#define KVHARBOR_SERVER_DAEMON_CLUSTER_CONFIG_H_

#include <optional>

#include "absl/status/status.h"
#include "cluster/registrar.h"

namespace YAML {
class Node;
}  // namespace YAML

namespace kvharbor {

// cluster:
//   etcd_endpoints: [http://HOST:PORT, ...]   # required
//   key_prefix: /kvharbor/members/            # optional
//   lease_ttl_s: 10                           # optional, [1, 3600]
//   advertise: HOST:PORT                      # optional: the listen address
// Errors read "config: cluster.<key>: ...". A null section leaves `out`
// unset (no membership).
absl::Status LoadClusterConfig(const YAML::Node& node,
                               std::optional<cluster::RegistrarOptions>* out);

}  // namespace kvharbor

#endif  // KVHARBOR_SERVER_DAEMON_CLUSTER_CONFIG_H_
