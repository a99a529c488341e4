// LoadConfigFile / LoadConfigText (declared in server/daemon/config.h) and the
// helpers of config.h.
#include "server/daemon/config.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/base/status_macros.h"
#include "core/codec/codec.h"
#include "server/daemon/cluster_config.h"
#include "yaml-cpp/yaml.h"

namespace kvharbor {

absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text,
                                       absl::string_view field) {
  absl::string_view t = absl::StripAsciiWhitespace(text);
  static constexpr std::pair<const char*, int> kUnits[] = {
      {"KiB", 10}, {"MiB", 20}, {"GiB", 30}, {"TiB", 40}, {"B", 0}};
  int shift = 0;
  for (const auto& [suffix, bits] : kUnits) {
    if (absl::EndsWith(t, suffix)) {
      t.remove_suffix(strlen(suffix));
      t = absl::StripTrailingAsciiWhitespace(t);
      shift = bits;
      break;
    }
  }
  uint64_t value = 0;
  if (t.empty() ||
      t.find_first_not_of("0123456789") != absl::string_view::npos ||
      !absl::SimpleAtoi(t, &value) ||
      (shift > 0 && value > (std::numeric_limits<uint64_t>::max() >> shift))) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": '", text,
        "' is not a byte size (an integer, optionally with KiB, MiB, GiB or "
        "TiB)"));
  }
  return value << shift;
}

std::string HumanBytes(uint64_t bytes) {
  static constexpr const char* kNames[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double v = static_cast<double>(bytes);
  int unit = -1;
  while (v >= 1024 && unit < 3) {
    v /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.2f %s", v, kNames[unit]);
}

uint64_t PhysicalRamBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size);
}

uint64_t DefaultPoolBudgetBytes() {
  constexpr uint64_t kCap = uint64_t{4} << 30;
  const uint64_t ram = PhysicalRamBytes();
  if (ram == 0) return kCap;
  return std::min(kCap, ram / 4);
}

namespace {

std::string Join(absl::string_view path, absl::string_view key) {
  return path.empty() ? std::string(key) : absl::StrCat(path, ".", key);
}

absl::Status Error(absl::string_view path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("config: ", path, ": ", what));
}

// A mapping (null counts as empty) whose keys are all in `allowed`.
absl::Status CheckMap(const YAML::Node& node, absl::string_view path,
                      std::initializer_list<const char*> allowed) {
  if (node.IsNull()) return absl::OkStatus();
  if (!node.IsMap()) {
    return Error(path.empty() ? "(top level)" : path, "must be a mapping");
  }
  for (const auto& kv : node) {
    const std::string key = kv.first.IsScalar() ? kv.first.Scalar() : "?";
    bool known = false;
    for (const char* a : allowed) known = known || key == a;
    if (!known) {
      return Error(Join(path, key),
                   absl::StrCat("unknown key (known: ",
                                absl::StrJoin(allowed, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Scalar(const YAML::Node& node,
                                   absl::string_view path) {
  if (!node.IsScalar()) return Error(path, "must be a single value");
  return node.Scalar();
}

absl::StatusOr<bool> Bool(const YAML::Node& node, absl::string_view path) {
  KVH_ASSIGN_OR_RETURN(std::string text, Scalar(node, path));
  if (text != "true" && text != "false") {
    return Error(path, absl::StrCat("'", text, "' is not true or false"));
  }
  return text == "true";
}

absl::StatusOr<uint64_t> Unsigned(const YAML::Node& node,
                                  absl::string_view path, uint64_t min,
                                  uint64_t max) {
  KVH_ASSIGN_OR_RETURN(std::string text, Scalar(node, path));
  uint64_t v = 0;
  if (text.find_first_not_of("0123456789") != std::string::npos ||
      !absl::SimpleAtoi(text, &v)) {
    return Error(path, absl::StrCat("'", text, "' is not a whole number"));
  }
  if (v < min || v > max) {
    return Error(path,
                 absl::StrCat(v, " is out of range [", min, ", ", max, "]"));
  }
  return v;
}

absl::StatusOr<uint64_t> Bytes(const YAML::Node& node, absl::string_view path) {
  KVH_ASSIGN_OR_RETURN(std::string text, Scalar(node, path));
  return ParseByteSize(text, absl::StrCat("config: ", path));
}

absl::StatusOr<absl::Duration> Millis(const YAML::Node& node,
                                      absl::string_view path, uint64_t min) {
  KVH_ASSIGN_OR_RETURN(uint64_t ms,
                       Unsigned(node, path, min, uint64_t{1} << 32));
  return absl::Milliseconds(static_cast<int64_t>(ms));
}

// store.host_ipc_socket (a path) and store.host_ipc_socket_mode (octal
// permission bits as text, e.g. "0660"); ValidateHostIpcOptions checks them
// further.
absl::Status LoadHostIpc(const YAML::Node& n, HostIpcOptions* h) {
  if (n["host_ipc_socket"]) {
    KVH_ASSIGN_OR_RETURN(h->socket,
                         Scalar(n["host_ipc_socket"], "store.host_ipc_socket"));
  }
  if (n["host_ipc_socket_mode"]) {
    const char* path = "store.host_ipc_socket_mode";
    KVH_ASSIGN_OR_RETURN(std::string text,
                         Scalar(n["host_ipc_socket_mode"], path));
    if (text.empty() || text.size() > 4 ||
        text.find_first_not_of("01234567") != std::string::npos) {
      return Error(path, absl::StrCat("'", text,
                                      "' is not an octal file mode such as "
                                      "0600 or 0660"));
    }
    h->socket_mode =
        static_cast<uint32_t>(std::strtoul(text.c_str(), nullptr, 8));
  }
  return absl::OkStatus();
}

absl::Status LoadStore(const YAML::Node& n, StoreOptions* s,
                       HostIpcOptions* host_ipc, bool* device_pool_auto) {
  KVH_RETURN_IF_ERROR(CheckMap(
      n, "store",
      {"pool_budget_bytes", "default_namespace_bytes", "default_lease_ttl_ms",
       "max_lease_ttl_ms", "max_tokens_per_request", "device_pool_bytes",
       "device", "allow_ipc", "promote_on_fetch", "host_ipc_socket",
       "host_ipc_socket_mode"}));
  if (n.IsNull()) return absl::OkStatus();
  KVH_RETURN_IF_ERROR(LoadHostIpc(n, host_ipc));
  if (n["pool_budget_bytes"]) {
    KVH_ASSIGN_OR_RETURN(
        s->pool_budget_bytes,
        Bytes(n["pool_budget_bytes"], "store.pool_budget_bytes"));
  }
  if (n["default_namespace_bytes"]) {
    KVH_ASSIGN_OR_RETURN(
        s->default_namespace_bytes,
        Bytes(n["default_namespace_bytes"], "store.default_namespace_bytes"));
  }
  if (n["default_lease_ttl_ms"]) {
    KVH_ASSIGN_OR_RETURN(
        s->default_lease_ttl,
        Millis(n["default_lease_ttl_ms"], "store.default_lease_ttl_ms", 1));
  }
  if (n["max_lease_ttl_ms"]) {
    KVH_ASSIGN_OR_RETURN(s->max_lease_ttl, Millis(n["max_lease_ttl_ms"],
                                                  "store.max_lease_ttl_ms", 1));
  }
  if (n["max_tokens_per_request"]) {
    KVH_ASSIGN_OR_RETURN(uint64_t v, Unsigned(n["max_tokens_per_request"],
                                              "store.max_tokens_per_request", 1,
                                              kMaxTokensPerRequestLimit));
    s->max_tokens_per_request = static_cast<uint32_t>(v);
  }
  if (n["device_pool_bytes"]) {
    // "auto" (kvharbord's default): a device pool sized from the GPU's free
    // memory when there is a GPU (server/daemon/device_setup.h).
    const char* path = "store.device_pool_bytes";
    KVH_ASSIGN_OR_RETURN(std::string text,
                         Scalar(n["device_pool_bytes"], path));
    *device_pool_auto = text == "auto";
    if (!*device_pool_auto) {
      KVH_ASSIGN_OR_RETURN(s->device_pool_bytes,
                           ParseByteSize(text, absl::StrCat("config: ", path)));
    }
  }
  if (n["device"]) {
    KVH_ASSIGN_OR_RETURN(
        uint64_t v, Unsigned(n["device"], "store.device", 0, kMaxDeviceIndex));
    s->device = static_cast<int>(v);
  }
  if (n["allow_ipc"]) {
    KVH_ASSIGN_OR_RETURN(s->allow_ipc, Bool(n["allow_ipc"], "store.allow_ipc"));
  }
  if (n["promote_on_fetch"]) {
    KVH_ASSIGN_OR_RETURN(s->promote_on_fetch,
                         Bool(n["promote_on_fetch"], "store.promote_on_fetch"));
  }
  return absl::OkStatus();
}

absl::Status LoadFetch(const YAML::Node& n, DaemonOptions* o) {
  KVH_RETURN_IF_ERROR(
      CheckMap(n, "fetch", {"default_chunk_bytes", "max_chunk_bytes"}));
  if (n.IsNull()) return absl::OkStatus();
  for (auto [key, out] : {std::pair<const char*, uint32_t*>{
                              "default_chunk_bytes", &o->default_chunk_bytes},
                          {"max_chunk_bytes", &o->max_chunk_bytes}}) {
    if (!n[key]) continue;
    const std::string path = Join("fetch", key);
    KVH_ASSIGN_OR_RETURN(uint64_t v, Bytes(n[key], path));
    if (v > kMaxChunkBytesLimit) {
      return Error(
          path, absl::StrCat(v, " is over the limit of ", kMaxChunkBytesLimit));
    }
    *out = static_cast<uint32_t>(v);
  }
  return absl::OkStatus();
}

// limits.keepalive: durations in milliseconds; their ranges are checked by
// ValidateLimits, with the same key names.
absl::Status LoadKeepalive(const YAML::Node& n, KeepaliveOptions* k) {
  KVH_RETURN_IF_ERROR(CheckMap(
      n, "limits.keepalive",
      {"time_ms", "timeout_ms", "min_client_ping_interval_ms",
       "max_ping_strikes", "permit_without_calls", "max_connection_idle_ms",
       "max_connection_age_ms", "max_connection_age_grace_ms"}));
  if (n.IsNull()) return absl::OkStatus();
  for (auto [key, out] :
       {std::pair<const char*, absl::Duration*>{"time_ms", &k->time},
        {"timeout_ms", &k->timeout},
        {"min_client_ping_interval_ms", &k->min_client_ping_interval},
        {"max_connection_idle_ms", &k->max_connection_idle},
        {"max_connection_age_ms", &k->max_connection_age},
        {"max_connection_age_grace_ms", &k->max_connection_age_grace}}) {
    if (!n[key]) continue;
    KVH_ASSIGN_OR_RETURN(*out,
                         Millis(n[key], Join("limits.keepalive", key), 0));
  }
  if (n["max_ping_strikes"]) {
    KVH_ASSIGN_OR_RETURN(
        uint64_t v, Unsigned(n["max_ping_strikes"],
                             "limits.keepalive.max_ping_strikes", 0, 1000));
    k->max_ping_strikes = static_cast<uint32_t>(v);
  }
  if (n["permit_without_calls"]) {
    KVH_ASSIGN_OR_RETURN(k->permit_without_calls,
                         Bool(n["permit_without_calls"],
                              "limits.keepalive.permit_without_calls"));
  }
  return absl::OkStatus();
}

// The limits: section (server/daemon/limits.h); ValidateLimits checks the
// values.
absl::Status LoadLimits(const YAML::Node& n, LimitsOptions* l) {
  KVH_RETURN_IF_ERROR(CheckMap(
      n, "limits",
      {"max_receive_message_bytes", "max_concurrent_streams",
       "resource_quota_bytes", "max_threads", "max_in_flight_calls",
       "max_in_flight_calls_per_tenant", "max_in_flight_calls_per_connection",
       "upload_idle_timeout_ms", "fetch_idle_timeout_ms", "keepalive"}));
  if (n.IsNull()) return absl::OkStatus();
  for (auto [key, out] :
       {std::pair<const char*, uint64_t*>{"max_receive_message_bytes",
                                          &l->max_receive_message_bytes},
        {"resource_quota_bytes", &l->resource_quota_bytes}}) {
    if (!n[key]) continue;
    KVH_ASSIGN_OR_RETURN(*out, Bytes(n[key], Join("limits", key)));
  }
  for (auto [key, out] :
       {std::pair<const char*, uint32_t*>{"max_concurrent_streams",
                                          &l->max_concurrent_streams},
        {"max_threads", &l->max_threads},
        {"max_in_flight_calls", &l->max_in_flight_calls},
        {"max_in_flight_calls_per_tenant", &l->max_in_flight_calls_per_tenant},
        {"max_in_flight_calls_per_connection",
         &l->max_in_flight_calls_per_connection}}) {
    if (!n[key]) continue;
    KVH_ASSIGN_OR_RETURN(uint64_t v,
                         Unsigned(n[key], Join("limits", key), 0, UINT32_MAX));
    *out = static_cast<uint32_t>(v);
  }
  for (auto [key, out] :
       {std::pair<const char*, absl::Duration*>{"upload_idle_timeout_ms",
                                                &l->upload_idle_timeout},
        {"fetch_idle_timeout_ms", &l->fetch_idle_timeout}}) {
    if (!n[key]) continue;
    KVH_ASSIGN_OR_RETURN(*out, Millis(n[key], Join("limits", key), 0));
  }
  if (n["keepalive"]) {
    KVH_RETURN_IF_ERROR(LoadKeepalive(n["keepalive"], &l->keepalive));
  }
  return absl::OkStatus();
}

absl::StatusOr<Geometry> LoadGeometry(const YAML::Node& n,
                                      const std::string& path) {
  if (!n) return Error(path, "required");
  KVH_RETURN_IF_ERROR(CheckMap(n, path,
                               {"num_layers", "num_kv_heads", "head_dim",
                                "page_size", "dtype", "layout", "rope_theta"}));
  if (!n.IsMap()) return Error(path, "must be a mapping");
  Geometry g;
  for (auto [key, out] :
       {std::pair<const char*, uint32_t*>{"num_layers", &g.num_layers},
        {"num_kv_heads", &g.num_kv_heads},
        {"head_dim", &g.head_dim},
        {"page_size", &g.page_size}}) {
    if (!n[key]) return Error(Join(path, key), "required");
    KVH_ASSIGN_OR_RETURN(uint64_t v,
                         Unsigned(n[key], Join(path, key), 0, UINT32_MAX));
    *out = static_cast<uint32_t>(v);
  }
  if (!n["dtype"]) return Error(Join(path, "dtype"), "required");
  KVH_ASSIGN_OR_RETURN(std::string dtype,
                       Scalar(n["dtype"], Join(path, "dtype")));
  absl::StatusOr<DType> parsed = ParseDType(dtype);
  if (!parsed.ok()) {
    return Error(Join(path, "dtype"),
                 absl::StrCat("unknown value '", dtype,
                              "' (want bf16, fp16, fp32 or fp8_e4m3)"));
  }
  g.dtype = *parsed;
  if (n["layout"]) {
    KVH_ASSIGN_OR_RETURN(std::string layout,
                         Scalar(n["layout"], Join(path, "layout")));
    if (layout == PageLayoutName(PageLayout::kKvLayerTokenHeadDim)) {
      g.layout = PageLayout::kKvLayerTokenHeadDim;
    } else if (layout == PageLayoutName(PageLayout::kLayerKvTokenHeadDim)) {
      g.layout = PageLayout::kLayerKvTokenHeadDim;
    } else {
      return Error(
          Join(path, "layout"),
          absl::StrCat("unknown value '", layout, "' (want ",
                       PageLayoutName(PageLayout::kKvLayerTokenHeadDim), " or ",
                       PageLayoutName(PageLayout::kLayerKvTokenHeadDim), ")"));
    }
  }
  if (n["rope_theta"]) {
    KVH_ASSIGN_OR_RETURN(std::string text,
                         Scalar(n["rope_theta"], Join(path, "rope_theta")));
    if (!absl::SimpleAtof(text, &g.rope_theta)) {
      return Error(Join(path, "rope_theta"),
                   absl::StrCat("'", text, "' is not a number"));
    }
  }
  KVH_RETURN_IF_ERROR(g.Validate(absl::StrCat("config: ", path)));
  return g;
}

// Codec, calibration and tier keys of namespace entry `e` (docs/tiers.md),
// checked here so that errors name the config key, not the spec field.
absl::Status LoadNamespaceTiers(const YAML::Node& e, const std::string& path,
                                NamespaceSpec* spec) {
  if (e["codec"]) {
    KVH_ASSIGN_OR_RETURN(spec->codec, Scalar(e["codec"], Join(path, "codec")));
  }
  // The codecs and which take a calibration come from the registry, so a
  // new codec needs no change here.
  const CodecRegistry& codecs = CodecRegistry::Default();
  const absl::StatusOr<bool> calibrated =
      codecs.TakesCalibration(spec->codec.empty() ? "identity" : spec->codec);
  if (!calibrated.ok()) {
    return Error(Join(path, "codec"),
                 absl::StrCat("unknown value '", spec->codec, "' (want ",
                              absl::StrJoin(codecs.Names(), ", "), ")"));
  }
  if (e["calibration_path"]) {
    KVH_ASSIGN_OR_RETURN(
        spec->calibration_path,
        Scalar(e["calibration_path"], Join(path, "calibration_path")));
    if (!*calibrated) {
      return Error(Join(path, "calibration_path"),
                   "only a calibrated codec takes a calibration (kvtc, "
                   "int8_c8, commvq)");
    }
  } else if (*calibrated) {
    return Error(Join(path, "calibration_path"),
                 absl::StrCat("required by codec ", spec->codec));
  }
  if (e["host_compressed_bytes"]) {
    KVH_ASSIGN_OR_RETURN(
        spec->host_compressed_bytes,
        Bytes(e["host_compressed_bytes"], Join(path, "host_compressed_bytes")));
  }
  if (e["disk_dir"]) {
    KVH_ASSIGN_OR_RETURN(spec->disk_dir,
                         Scalar(e["disk_dir"], Join(path, "disk_dir")));
    if (spec->disk_dir.empty()) {
      return Error(Join(path, "disk_dir"), "empty (leave the key out)");
    }
    if (spec->host_compressed_bytes == 0) {
      return Error(Join(path, "disk_dir"),
                   "a disk tier needs host_compressed_bytes > 0");
    }
  }
  if (e["disk_bytes"]) {
    KVH_ASSIGN_OR_RETURN(spec->disk_bytes,
                         Bytes(e["disk_bytes"], Join(path, "disk_bytes")));
    if (spec->disk_dir.empty()) {
      return Error(Join(path, "disk_bytes"), "set without disk_dir");
    }
  }
  return absl::OkStatus();
}

absl::Status LoadNamespaces(const YAML::Node& n,
                            std::vector<NamespaceSpec>* out) {
  if (n.IsNull()) return absl::OkStatus();
  if (!n.IsSequence()) return Error("namespaces", "must be a list");
  std::set<std::string> names;
  std::set<std::string> disk_dirs;
  out->clear();
  for (size_t i = 0; i < n.size(); ++i) {
    const std::string path = absl::StrCat("namespaces[", i, "]");
    const YAML::Node& e = n[i];
    KVH_RETURN_IF_ERROR(
        CheckMap(e, path,
                 {"name", "geometry", "capacity_bytes", "codec",
                  "calibration_path", "host_compressed_bytes", "disk_dir",
                  "disk_bytes", "kvcm_path", "tenant", "key_kind"}));
    if (!e.IsMap()) return Error(path, "must be a mapping");
    NamespaceSpec spec;
    if (!e["name"]) return Error(Join(path, "name"), "required");
    KVH_ASSIGN_OR_RETURN(spec.name, Scalar(e["name"], Join(path, "name")));
    KVH_RETURN_IF_ERROR(ValidateNamespaceName(
        spec.name, absl::StrCat("config: ", Join(path, "name"))));
    if (!names.insert(spec.name).second) {
      return Error(Join(path, "name"),
                   absl::StrCat("'", spec.name, "' appears twice"));
    }
    KVH_ASSIGN_OR_RETURN(spec.geometry,
                         LoadGeometry(e["geometry"], Join(path, "geometry")));
    if (e["capacity_bytes"]) {
      KVH_ASSIGN_OR_RETURN(
          spec.capacity_bytes,
          Bytes(e["capacity_bytes"], Join(path, "capacity_bytes")));
    }
    KVH_RETURN_IF_ERROR(LoadNamespaceTiers(e, path, &spec));
    if (e["kvcm_path"]) {
      // The file itself is read and checked when the namespace is created.
      KVH_ASSIGN_OR_RETURN(spec.kvcm_path,
                           Scalar(e["kvcm_path"], Join(path, "kvcm_path")));
      if (spec.kvcm_path.empty()) {
        return Error(Join(path, "kvcm_path"), "empty (leave the key out)");
      }
    }
    if (e["key_kind"]) {
      KVH_ASSIGN_OR_RETURN(const std::string kind,
                           Scalar(e["key_kind"], Join(path, "key_kind")));
      absl::StatusOr<KeyKind> parsed = ParseKeyKind("key_kind", kind);
      if (!parsed.ok()) {
        return Error(Join(path, "key_kind"),
                     absl::StrCat("'", kind,
                                  "' (want tokens, page_keys or page_hashes)"));
      }
      spec.key_kind = *parsed;
    }
    if (e["tenant"]) {
      // The owner when tokens are on (security.tokens_file); the same
      // character rules as namespace names.
      KVH_ASSIGN_OR_RETURN(spec.tenant,
                           Scalar(e["tenant"], Join(path, "tenant")));
      KVH_RETURN_IF_ERROR(ValidateNamespaceName(
          spec.tenant, absl::StrCat("config: ", Join(path, "tenant"))));
    }
    if (!spec.disk_dir.empty() && !disk_dirs.insert(spec.disk_dir).second) {
      return Error(Join(path, "disk_dir"),
                   absl::StrCat("'", spec.disk_dir,
                                "' is used by another namespace (each needs "
                                "its own)"));
    }
    out->push_back(std::move(spec));
  }
  return absl::OkStatus();
}

// metrics.listen, metrics.require_token and log.format / log.level; their
// values are checked by
// ValidateDaemonOptions, with the same key names.
absl::Status LoadObservability(const YAML::Node& root, DaemonOptions* o) {
  if (const YAML::Node m = root["metrics"]) {
    KVH_RETURN_IF_ERROR(CheckMap(m, "metrics", {"listen", "require_token"}));
    if (!m.IsNull() && m["listen"]) {
      KVH_ASSIGN_OR_RETURN(o->metrics_listen,
                           Scalar(m["listen"], "metrics.listen"));
    }
    if (!m.IsNull() && m["require_token"]) {
      KVH_ASSIGN_OR_RETURN(o->metrics_require_token,
                           Bool(m["require_token"], "metrics.require_token"));
    }
  }
  if (const YAML::Node l = root["log"]) {
    KVH_RETURN_IF_ERROR(CheckMap(l, "log", {"format", "level"}));
    if (!l.IsNull() && l["format"]) {
      KVH_ASSIGN_OR_RETURN(o->log_format, Scalar(l["format"], "log.format"));
    }
    if (!l.IsNull() && l["level"]) {
      KVH_ASSIGN_OR_RETURN(o->log_level, Scalar(l["level"], "log.level"));
    }
  }
  return absl::OkStatus();
}

// security.tls.* and security.tokens_file; the files themselves are checked
// by ValidateSecurityOptions (server/security/security.h), with the same key
// names.
absl::Status LoadSecurity(const YAML::Node& n, SecurityOptions* s) {
  KVH_RETURN_IF_ERROR(CheckMap(n, "security", {"tls", "tokens_file"}));
  if (n.IsNull()) return absl::OkStatus();
  if (n["tokens_file"]) {
    KVH_ASSIGN_OR_RETURN(s->tokens_file,
                         Scalar(n["tokens_file"], "security.tokens_file"));
  }
  const YAML::Node t = n["tls"];
  if (!t) return absl::OkStatus();
  KVH_RETURN_IF_ERROR(CheckMap(
      t, "security.tls",
      {"cert_file", "key_file", "client_ca_file", "require_client_cert"}));
  if (t.IsNull()) return absl::OkStatus();
  for (auto [key, out] :
       {std::pair<const char*, std::string*>{"cert_file", &s->tls_cert_file},
        {"key_file", &s->tls_key_file},
        {"client_ca_file", &s->tls_client_ca_file}}) {
    if (t[key]) {
      KVH_ASSIGN_OR_RETURN(*out, Scalar(t[key], Join("security.tls", key)));
    }
  }
  if (t["require_client_cert"]) {
    KVH_ASSIGN_OR_RETURN(
        s->tls_require_client_cert,
        Bool(t["require_client_cert"], "security.tls.require_client_cert"));
  }
  return absl::OkStatus();
}

// The data_plane: section (docs/data_plane.md).
absl::Status LoadDataPlane(const YAML::Node& n, DataPlaneOptions* d) {
  KVH_RETURN_IF_ERROR(CheckMap(
      n, "data_plane", {"listen", "max_connections", "allow_plaintext"}));
  if (n.IsNull()) return absl::OkStatus();
  if (n["listen"]) {
    KVH_ASSIGN_OR_RETURN(d->listen, Scalar(n["listen"], "data_plane.listen"));
    absl::string_view host;
    int port = 0;
    if (!d->listen.empty() && !SplitHostPort(d->listen, &host, &port)) {
      return Error("data_plane.listen",
                   absl::StrCat("'", d->listen, "' is not HOST:PORT"));
    }
  }
  if (n["max_connections"]) {
    KVH_ASSIGN_OR_RETURN(
        uint64_t v,
        Unsigned(n["max_connections"], "data_plane.max_connections", 1, 4096));
    d->max_connections = static_cast<uint32_t>(v);
  }
  if (n["allow_plaintext"]) {
    KVH_ASSIGN_OR_RETURN(
        d->allow_plaintext,
        Bool(n["allow_plaintext"], "data_plane.allow_plaintext"));
  }
  return absl::OkStatus();
}

absl::Status LoadTop(const YAML::Node& root, DaemonOptions* o) {
  KVH_RETURN_IF_ERROR(
      CheckMap(root, "",
               {"listen", "store", "fetch", "namespaces", "drain_timeout_ms",
                "lease_reap_interval_ms", "metrics", "log", "limits",
                "security", "cluster", "data_plane"}));
  if (root.IsNull()) return absl::OkStatus();  // an empty file
  if (root["listen"]) {
    KVH_ASSIGN_OR_RETURN(o->listen, Scalar(root["listen"], "listen"));
  }
  if (root["store"])
    KVH_RETURN_IF_ERROR(LoadStore(root["store"], &o->store, &o->host_ipc,
                                  &o->device_pool_auto));
  if (root["fetch"]) KVH_RETURN_IF_ERROR(LoadFetch(root["fetch"], o));
  if (root["limits"])
    KVH_RETURN_IF_ERROR(LoadLimits(root["limits"], &o->limits));
  if (root["namespaces"]) {
    KVH_RETURN_IF_ERROR(LoadNamespaces(root["namespaces"], &o->namespaces));
  }
  if (root["drain_timeout_ms"]) {
    KVH_ASSIGN_OR_RETURN(o->drain_timeout, Millis(root["drain_timeout_ms"],
                                                  "drain_timeout_ms", 0));
  }
  if (root["lease_reap_interval_ms"]) {
    KVH_ASSIGN_OR_RETURN(
        o->lease_reap_interval,
        Millis(root["lease_reap_interval_ms"], "lease_reap_interval_ms", 1));
  }
  if (root["security"]) {
    KVH_RETURN_IF_ERROR(LoadSecurity(root["security"], &o->security));
  }
  if (root["cluster"]) {
    KVH_RETURN_IF_ERROR(LoadClusterConfig(root["cluster"], &o->cluster));
  }
  if (root["data_plane"]) {
    KVH_RETURN_IF_ERROR(LoadDataPlane(root["data_plane"], &o->data_plane));
  }
  return LoadObservability(root, o);
}

}  // namespace

absl::Status LoadConfigFile(const std::string& path, DaemonOptions* options) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("config: cannot read '", path,
                                            "': ", std::strerror(errno)));
  }
  std::stringstream text;
  text << in.rdbuf();
  return LoadConfigText(text.str(), path, options);
}

absl::Status LoadConfigText(absl::string_view text, absl::string_view source,
                            DaemonOptions* options) {
  DaemonOptions parsed = *options;
  try {
    const YAML::Node root = YAML::Load(std::string(text));
    KVH_RETURN_IF_ERROR(LoadTop(root, &parsed));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("config: '", source, "': ", e.what()));
  }
  KVH_RETURN_IF_ERROR(ValidateDaemonOptions(parsed, "config"));
  *options = std::move(parsed);
  return absl::OkStatus();
}

}  // namespace kvharbor
