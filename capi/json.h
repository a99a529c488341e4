// JSON text of the SDK's result types, for the C ABI (capi/kvharbor_c.h):
// namespace descriptions and stats cross the ABI as JSON so that fields can
// be added without changing a struct. Pure functions returning owned strings;
// thread-safe.
#ifndef KVHARBOR_CAPI_JSON_H_
#define KVHARBOR_CAPI_JSON_H_

#include <string>
#include <vector>

#include "client/types.h"

namespace kvharbor {
namespace capi {

// {"name", "geometry": {...}, "capacity_bytes", "codec",
// "calibration_fingerprint", "host_compressed_bytes", "disk_dir",
// "disk_bytes", "stats": {...}}; stats hold "tiers": [{"tier", "name",
// "pages", "bytes"}, ...] and the tier counters.
std::string NamespaceInfoJson(const client::NamespaceInfo& info);
// [NamespaceInfoJson, ...]
std::string NamespaceListJson(const std::vector<client::NamespaceInfo>& list);
// {"global": {...}, "namespaces": [{...}, ...]}
std::string StatsJson(const client::Stats& stats);
// {"path", "pages", "bytes_moved", "seconds", "stages": {name: seconds},
// "fallbacks": [...]}
std::string TransferResultJson(const client::TransferResult& r);
// A JSON string literal (quoted, escaped) of arbitrary bytes.
std::string JsonString(const std::string& s);

}  // namespace capi
}  // namespace kvharbor

#endif  // KVHARBOR_CAPI_JSON_H_
