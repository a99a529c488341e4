#include "capi/json.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

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
  Object& Str(const char* key, const std::string& v) {
    return Raw(key, JsonString(v));
  }
  Object& Raw(const char* key, const std::string& json) {
    parts_.push_back(absl::StrCat("\"", key, "\": ", json));
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

std::string TiersJson(const std::vector<client::TierStats>& tiers) {
  std::vector<std::string> items;
  items.reserve(tiers.size());
  for (const client::TierStats& t : tiers) {
    items.push_back(Object()
                        .Signed("tier", static_cast<int>(t.tier))
                        .Str("name", std::string(client::TierName(t.tier)))
                        .Num("pages", t.pages)
                        .Num("bytes", t.bytes)
                        .Done());
  }
  return absl::StrCat("[", absl::StrJoin(items, ", "), "]");
}

std::string NamespaceStatsJson(const client::NamespaceStats& s) {
  return Object()
      .Str("name", s.name)
      .Num("capacity_pages", s.capacity_pages)
      .Num("free_pages", s.free_pages)
      .Num("cached_pages", s.cached_pages)
      .Num("evictable_pages", s.evictable_pages)
      .Num("protected_pages", s.protected_pages)
      .Num("hit_tokens", s.hit_tokens)
      .Num("miss_tokens", s.miss_tokens)
      .Num("inserted_pages", s.inserted_pages)
      .Num("dedup_pages", s.dedup_pages)
      .Num("evicted_pages", s.evicted_pages)
      .Num("bytes_in", s.bytes_in)
      .Num("bytes_out", s.bytes_out)
      .Num("host_ipc_bytes", s.host_ipc_bytes)
      .Num("active_leases", s.active_leases)
      .Num("index_nodes", s.index_nodes)
      .Num("index_memory_bytes", s.index_memory_bytes)
      .Num("page_bytes", s.page_bytes)
      .Num("uploads_in_flight", s.uploads_in_flight)
      .Raw("tiers", TiersJson(s.tiers))
      .Num("demoted_pages", s.demoted_pages)
      .Num("promoted_pages", s.promoted_pages)
      .Num("disk_write_errors", s.disk_write_errors)
      .Num("corrupt_dropped", s.corrupt_dropped)
      .Done();
}

std::string GlobalStatsJson(const client::GlobalStats& g) {
  return Object()
      .Num("pool_budget_bytes", g.pool_budget_bytes)
      .Num("pool_reserved_bytes", g.pool_reserved_bytes)
      .Num("namespaces", g.namespaces)
      .Num("hit_tokens", g.hit_tokens)
      .Num("miss_tokens", g.miss_tokens)
      .Num("bytes_in", g.bytes_in)
      .Num("bytes_out", g.bytes_out)
      .Num("cached_pages", g.cached_pages)
      .Num("active_leases", g.active_leases)
      .Signed("uptime_seconds", g.uptime_seconds)
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
      .Str("key_kind", std::string(KeyKindName(info.spec.key_kind)))
      .Raw("stats", NamespaceStatsJson(info.stats))
      .Done();
}

std::string NamespaceListJson(const std::vector<client::NamespaceInfo>& list) {
  std::vector<std::string> items;
  items.reserve(list.size());
  for (const client::NamespaceInfo& info : list) {
    items.push_back(NamespaceInfoJson(info));
  }
  return absl::StrCat("[", absl::StrJoin(items, ", "), "]");
}

std::string StatsJson(const client::Stats& stats) {
  std::vector<std::string> items;
  items.reserve(stats.namespaces.size());
  for (const client::NamespaceStats& n : stats.namespaces) {
    items.push_back(NamespaceStatsJson(n));
  }
  return Object()
      .Raw("global", GlobalStatsJson(stats.global))
      .Raw("namespaces", absl::StrCat("[", absl::StrJoin(items, ", "), "]"))
      .Done();
}

std::string TransferResultJson(const client::TransferResult& r) {
  std::vector<std::string> stages, fallbacks;
  for (const auto& [name, seconds] : r.stages) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.9g", seconds);
    stages.push_back(absl::StrCat(JsonString(name), ": ", buf));
  }
  for (const std::string& f : r.fallbacks) fallbacks.push_back(JsonString(f));
  char seconds[32];
  std::snprintf(seconds, sizeof(seconds), "%.9g", r.seconds);
  return Object()
      .Str("path", r.path)
      .Num("pages", r.pages)
      .Num("bytes_moved", r.bytes_moved)
      .Raw("seconds", seconds)
      .Raw("stages", absl::StrCat("{", absl::StrJoin(stages, ", "), "}"))
      .Raw("fallbacks", absl::StrCat("[", absl::StrJoin(fallbacks, ", "), "]"))
      .Done();
}

}  // namespace capi
}  // namespace kvharbor
