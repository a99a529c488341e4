// JSON text of the SDK's result types, for the C ABI (capi/kvharbor_c.h):
// namespace descriptions, stats, calibration lists, same-host handles and
// cluster status cross the ABI as JSON so that fields can be added without
// changing a struct. Pure functions returning owned strings;
// thread-safe.
#ifndef KVHARBOR_CAPI_JSON_H_
#define KVHARBOR_CAPI_JSON_H_

#include <string>
#include <vector>

#include "kvharbor/cluster_client.h"
#include "kvharbor/types.h"

namespace kvharbor {
namespace capi {

// {"name", "geometry": {...}, "capacity_bytes", "codec",
// "calibration_fingerprint", "host_compressed_bytes", "disk_dir",
// "disk_bytes", "kvcm_path", "online_calibration": {...}, "stats": {...}};
// stats hold "tiers": [{"tier", "name", "pages", "bytes"}, ...], the tier
// counters and "calibration": {"state", "tokens_seen", "tokens_sampled",
// "codec", "fingerprint", "pinned"}.
std::string NamespaceInfoJson(const client::NamespaceInfo& info);
// [NamespaceInfoJson, ...]
std::string NamespaceListJson(const std::vector<client::NamespaceInfo>& list);
// {"global": {...}, "namespaces": [{...}, ...]}
std::string StatsJson(const client::Stats& stats);
// {"path", "pages", "bytes_moved", "h2d_bytes", "seconds", "stages": {name:
// seconds}, "fallbacks": [...]}
std::string TransferResultJson(const client::TransferResult& r);
// [{"codec", "fingerprint", "source", "created_unix_ms", "active",
// "pinned", "pages"}, ...]
std::string CalibrationListJson(
    const std::vector<client::CalibrationInfo>& list);
// capi/kvharbor_c.h kvh_get_host_handles / kvh_get_device_handles; binary
// fields (the IPC handle, the device UUID) as lowercase hex.
std::string HostHandlesJson(const client::HostHandles& h);
std::string DeviceHandlesJson(const client::DeviceHandles& h);
// {"source", "members": [{"address", ..., "stats": StatsJson or null}]}
std::string ClusterStatusJson(const std::string& source,
                              const std::vector<ClusterMemberStatus>& members);
// A JSON string literal (quoted, escaped) of arbitrary bytes.
std::string JsonString(const std::string& s);

}  // namespace capi
}  // namespace kvharbor

#endif  // KVHARBOR_CAPI_JSON_H_
