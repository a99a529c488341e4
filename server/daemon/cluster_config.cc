#include "server/daemon/cluster_config.h"

#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "yaml-cpp/yaml.h"

namespace kvharbor {

namespace {

absl::Status Error(absl::string_view key, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("config: cluster.", key, ": ", what));
}

absl::StatusOr<std::string> ScalarAt(const YAML::Node& n, const char* key) {
  if (!n[key].IsScalar()) return Error(key, "must be a single value");
  return n[key].Scalar();
}

}  // namespace

absl::Status LoadClusterConfig(const YAML::Node& n,
                               std::optional<cluster::RegistrarOptions>* out) {
  if (n.IsNull()) return absl::OkStatus();
  if (!n.IsMap()) {
    return absl::InvalidArgumentError("config: cluster: must be a mapping");
  }
  for (const auto& kv : n) {
    const std::string key = kv.first.IsScalar() ? kv.first.Scalar() : "?";
    if (key != "etcd_endpoints" && key != "key_prefix" &&
        key != "lease_ttl_s" && key != "advertise") {
      return Error(key,
                   "unknown key (known: etcd_endpoints, key_prefix, "
                   "lease_ttl_s, advertise)");
    }
  }
  cluster::RegistrarOptions o;
  const YAML::Node eps = n["etcd_endpoints"];
  if (!eps || !eps.IsSequence() || eps.size() == 0) {
    return Error("etcd_endpoints",
                 "required: a list of http://HOST:PORT (etcd's client URLs)");
  }
  for (size_t i = 0; i < eps.size(); ++i) {
    if (!eps[i].IsScalar()) {
      return Error(absl::StrCat("etcd_endpoints[", i, "]"),
                   "must be a single value");
    }
    o.etcd.endpoints.push_back(eps[i].Scalar());
  }
  if (n["key_prefix"]) {
    absl::StatusOr<std::string> v = ScalarAt(n, "key_prefix");
    if (!v.ok()) return v.status();
    o.key_prefix = *v;
  }
  if (n["advertise"]) {
    absl::StatusOr<std::string> v = ScalarAt(n, "advertise");
    if (!v.ok()) return v.status();
    o.advertise = *v;
  }
  if (n["lease_ttl_s"]) {
    absl::StatusOr<std::string> v = ScalarAt(n, "lease_ttl_s");
    if (!v.ok()) return v.status();
    int64_t s = 0;
    if (!absl::SimpleAtoi(*v, &s)) {
      return Error("lease_ttl_s", absl::StrCat("'", *v, "' is not a number"));
    }
    o.lease_ttl = absl::Seconds(s);
  }
  absl::Status s = cluster::ValidateRegistrarOptions(o, "config");
  if (!s.ok()) return s;
  *out = std::move(o);
  return absl::OkStatus();
}

}  // namespace kvharbor
