#include "capi/json.h"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "capi/kvharbor_c.h"
#include "types/stats_fields.h"

namespace kvharbor {
namespace capi {
namespace {

// Appends `"key": value` pairs to one JSON object.
class Object {
 public:
  Object& Num(const char* key, uint64_t v) { return Raw(key, absl::StrCat(v)); }
  Object& Signed(const char* key, int64_t v) {
    return Raw(key, absl::StrCat(v));
  }
  Object& Float(const char* key, float v) {
    // %.9g round-trips a float exactly.
    if (!std::isfinite(v)) return Raw(key, "null");
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.9g", static_cast<double>(v));
    return Raw(key, buf);
  }
  Object& Double(const char* key, double v) {
    if (!std::isfinite(v)) return Raw(key, "null");
    char buf[40];
    std::snprintf(buf, sizeof(buf), "%.17g", v);
    return Raw(key, buf);
  }
  Object& Bool(const char* key, bool v) {
    return Raw(key, v ? "true" : "false");
  }
  Object& Str(const char* key, const std::string& v) {
    return Raw(key, JsonString(v));
  }
  Object& Raw(absl::string_view key, const std::string& json) {
    parts_.push_back(absl::StrCat("\"", key, "\": ", json));
    return *this;
  }
  // Every counter of `table` (types/stats_fields.h) under its name.
  template <typename Stats, size_t N>
  Object& Counters(const Stats& stats, const CounterField<Stats> (&table)[N]) {
    for (const CounterField<Stats>& field : table) {
      Raw(field.name, absl::StrCat(stats.*field.member));
    }
    return *this;
  }
  std::string Done() const {
    return absl::StrCat("{", absl::StrJoin(parts_, ", "), "}");
  }

 private:
  std::vector<std::string> parts_;
};

std::string GeometryJson(const client::Geometry& g) {
  return Object()
      .Num("num_layers", g.num_layers)
      .Num("num_kv_heads", g.num_kv_heads)
      .Num("head_dim", g.head_dim)
      .Num("page_size", g.page_size)
      .Signed("dtype", static_cast<int>(g.dtype))
      .Signed("layout", static_cast<int>(g.layout))
      .Float("rope_theta", g.rope_theta)
      .Done();
}

// A JSON array of one value per item (`json_of` gives it).
template <typename T, typename Fn>
std::string ArrayJson(const std::vector<T>& items, Fn json_of) {
  std::vector<std::string> out;
  out.reserve(items.size());
  for (const T& item : items) out.push_back(json_of(item));
  return absl::StrCat("[", absl::StrJoin(out, ", "), "]");
}

std::string TiersJson(const std::vector<client::TierStats>& tiers) {
  return ArrayJson(tiers, [](const client::TierStats& t) {
    return Object()
        .Signed("tier", static_cast<int>(t.tier))
        .Str("name", std::string(client::TierName(t.tier)))
        .Num("pages", t.pages)
        .Num("bytes", t.bytes)
        .Done();
  });
}

std::string CodecsJson(const std::vector<client::CodecStats>& codecs) {
  return ArrayJson(codecs, [](const client::CodecStats& c) {
    return Object()
        .Str("codec", c.codec)
        .Num("pages", c.pages)
        .Num("bytes", c.bytes)
        .Done();
  });
}

std::string CalibrationJson(const client::NamespaceStats& s) {
  return Object()
      .Signed("state", static_cast<int>(s.calibration.state))
      .Num("tokens_seen", s.calibration.tokens_seen)
      .Num("tokens_sampled", s.calibration.tokens_sampled)
      .Str("codec", s.calibration.codec)
      .Num("fingerprint", s.calibration.fingerprint)
      .Bool("pinned", s.calibration.pinned)
      .Double("target_ratio", s.calibration.expected.target_ratio)
      .Double("expected_ratio", s.calibration.expected.expected_ratio)
      .Double("keys_rel_error", s.calibration.expected.keys_rel_error)
      .Double("values_rel_error", s.calibration.expected.values_rel_error)
      .Done();
}

std::string NamespaceStatsJson(const client::NamespaceStats& s) {
  Object obj;
  obj.Str("name", s.name).Counters(s, kNamespaceCounters);
  return obj.Raw("tiers", TiersJson(s.tiers))
      .Raw("codecs", CodecsJson(s.codecs))
      .Raw("calibration", CalibrationJson(s))
      .Done();
}

std::string OnlineCalibrationJson(const client::OnlineCalibration& o) {
  Object obj;
  obj.Bool("enabled", o.enabled)
      .Num("min_tokens", o.min_tokens)
      .Num("max_sample_tokens", o.max_sample_tokens)
      .Double("target_ratio", o.target_ratio)
      .Signed("row_kind", o.row_kind == client::KvtcRowKind::kPerPage
                              ? KVH_KVTC_ROWS_PER_PAGE
                              : KVH_KVTC_ROWS_PER_TOKEN)
      .Signed("rope_style", static_cast<int>(o.rope_style))
      .Num("sink_tokens", o.sink_tokens);
  return obj.Done();
}

std::string Hex(const std::string& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

std::string GlobalStatsJson(const client::GlobalStats& g) {
  Object obj;
  obj.Counters(g, kGlobalCounters);
  return obj.Signed("uptime_seconds", g.uptime_seconds).Done();
}

// The fields a page of DeviceHandles and of HostHandles both have.
template <typename Page>
Object PageObject(const Page& p) {
  Object obj;
  obj.Num("handle", p.handle).Num("offset", p.offset).Num("bytes", p.bytes);
  return obj;
}

// Adds the arena size, lease expiry and pages every handles answer has.
template <typename Handles>
std::string HandlesJson(const Handles& h, Object obj,
                        const std::string& pages) {
  return obj.Num("arena_bytes", h.arena_bytes)
      .Signed("lease_expires_unix_ms", absl::ToUnixMillis(h.lease_expiry))
      .Raw("pages", pages)
      .Done();
}

}  // namespace

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += "\"";
  return out;
}

namespace {

std::string TopologyJson(const client::Topology& t) {
  return Object()
      .Str("model", t.model)
      .Num("total_layers", t.total_layers)
      .Num("layer_begin", t.layer_begin)
      .Num("layer_end", t.layer_end)
      .Num("total_kv_heads", t.total_kv_heads)
      .Num("kv_head_begin", t.kv_head_begin)
      .Num("kv_head_end", t.kv_head_end)
      .Done();
}

}  // namespace

std::string NamespaceInfoJson(const client::NamespaceInfo& info) {
  return Object()
      .Str("name", info.spec.name)
      .Raw("geometry", GeometryJson(info.spec.geometry))
      .Num("capacity_bytes", info.spec.capacity_bytes)
      .Str("codec", info.spec.codec)
      .Num("calibration_fingerprint", info.spec.calibration_fingerprint)
      .Num("host_compressed_bytes", info.spec.host_compressed_bytes)
      .Str("disk_dir", info.spec.disk_dir)
      .Num("disk_bytes", info.spec.disk_bytes)
      .Str("kvcm_path", info.spec.kvcm_path)
      .Raw("online_calibration",
           OnlineCalibrationJson(info.spec.online_calibration))
      .Str("key_kind", std::string(KeyKindName(info.spec.key_kind)))
      .Raw("topology", TopologyJson(info.spec.topology))
      .Raw("stats", NamespaceStatsJson(info.stats))
      .Done();
}

std::string NamespaceListJson(const std::vector<client::NamespaceInfo>& list) {
  return ArrayJson(list, [](const client::NamespaceInfo& info) {
    return NamespaceInfoJson(info);
  });
}

std::string StatsJson(const client::Stats& stats) {
  return Object()
      .Raw("global", GlobalStatsJson(stats.global))
      .Raw("namespaces", ArrayJson(stats.namespaces, NamespaceStatsJson))
      .Done();
}

std::string TransferResultJson(const client::TransferResult& r) {
  std::vector<std::string> stages;
  for (const auto& [name, seconds] : r.stages) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.9g", seconds);
    stages.push_back(absl::StrCat(JsonString(name), ": ", buf));
  }
  char seconds[32];
  std::snprintf(seconds, sizeof(seconds), "%.9g", r.seconds);
  return Object()
      .Str("path", r.path)
      .Num("pages", r.pages)
      .Num("bytes_moved", r.bytes_moved)
      .Num("h2d_bytes", r.h2d_bytes)
      .Raw("seconds", seconds)
      .Raw("stages", absl::StrCat("{", absl::StrJoin(stages, ", "), "}"))
      .Raw("fallbacks", ArrayJson(r.fallbacks, JsonString))
      .Done();
}

std::string CalibrationListJson(
    const std::vector<client::CalibrationInfo>& list) {
  return ArrayJson(list, [](const client::CalibrationInfo& c) {
    return Object()
        .Str("codec", c.codec)
        .Num("fingerprint", c.fingerprint)
        .Str("source", c.source)
        .Signed("created_unix_ms", c.created_unix_ms)
        .Bool("active", c.active)
        .Bool("pinned", c.pinned)
        .Num("pages", c.pages)
        .Done();
  });
}

std::string HostHandlesJson(const client::HostHandles& h) {
  const std::string pages = ArrayJson(h.pages, [](const client::HostPage& p) {
    return PageObject(p).Num("checksum", p.checksum).Done();
  });
  Object obj;
  obj.Str("socket_path", h.socket_path).Num("daemon_id", h.daemon_id);
  return HandlesJson(h, std::move(obj), pages);
}

std::string DeviceHandlesJson(const client::DeviceHandles& h) {
  const std::string pages = ArrayJson(h.pages, [](const client::DevicePage& p) {
    return PageObject(p).Done();
  });
  Object obj;
  obj.Str("ipc_handle", Hex(h.ipc_handle))
      .Signed("device", h.device)
      .Str("device_uuid", Hex(h.device_uuid));
  return HandlesJson(h, std::move(obj), pages);
}

std::string ClusterStatusJson(const std::string& source,
                              const std::vector<ClusterMemberStatus>& members) {
  const std::string items =
      ArrayJson(members, [](const ClusterMemberStatus& m) {
        Object obj;
        obj.Str("address", m.address)
            .Signed("epoch", m.epoch)
            .Bool("up", m.up)
            .Num("calls", m.calls)
            .Num("failures", m.failures)
            .Num("down_misses", m.down_misses)
            .Num("dropped_inserts", m.dropped_inserts);
        if (m.stats.ok()) {
          obj.Raw("stats", StatsJson(*m.stats));
        } else {
          obj.Raw("stats", "null")
              .Str("stats_error", std::string(m.stats.status().message()));
        }
        return obj.Done();
      });
  return Object().Str("source", source).Raw("members", items).Done();
}

}  // namespace capi
}  // namespace kvharbor
