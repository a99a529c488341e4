#include "types/topology.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvharbor {
namespace {

// Resolves one range [*begin, *end) of `width` items out of *total, whose
// fields are named <prefix>.<begin_name> etc.
absl::Status ResolveRange(absl::string_view prefix, absl::string_view what,
                          absl::string_view geometry_field, uint32_t width,
                          uint32_t* total, uint32_t* begin, uint32_t* end) {
  const absl::string_view end_name =
      what == "layer" ? "layer_end" : "kv_head_end";
  const absl::string_view total_name =
      what == "layer" ? "total_layers" : "total_kv_heads";
  if (*end == 0) {
    *end = *begin + width;
  } else if (*end <= *begin || *end - *begin != width) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s.%s: %ss [%u, %u) are not the %u of geometry.%s (a page holds "
        "exactly the %ss of the range)",
        prefix, end_name, what, *begin, *end, width, geometry_field, what));
  }
  if (*total == 0) {
    *total = *end;
  } else if (*total < *end) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s.%s: %u, but the range ends at %s %u", prefix,
                        total_name, *total, what, *end));
  }
  return absl::OkStatus();
}

std::string Range(uint32_t begin, uint32_t end, uint32_t total) {
  return absl::StrFormat("[%u, %u) of %u", begin, end, total);
}

}  // namespace

absl::StatusOr<Topology> Topology::Resolved(const Geometry& geometry,
                                            absl::string_view prefix) const {
  Topology t = *this;
  if (t.model.size() > kMaxModelIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s.model: %u bytes, over the limit of %u", prefix,
                        t.model.size(), kMaxModelIdBytes));
  }
  absl::Status s =
      ResolveRange(prefix, "layer", "num_layers", geometry.num_layers,
                   &t.total_layers, &t.layer_begin, &t.layer_end);
  if (!s.ok()) return s;
  s = ResolveRange(prefix, "kv_head", "num_kv_heads", geometry.num_kv_heads,
                   &t.total_kv_heads, &t.kv_head_begin, &t.kv_head_end);
  if (!s.ok()) return s;
  return t;
}

std::string NamespaceIdentityDiff(const NamespaceIdentity& existing,
                                  const NamespaceIdentity& claimed) {
  const auto diff = [](absl::string_view field, const auto& a, const auto& b) {
    return absl::StrCat(field, ": existing ", a, ", this spec ", b);
  };
  const Geometry& g = existing.geometry;
  const Geometry& h = claimed.geometry;
  if (g.dtype != h.dtype) {
    return diff("geometry.dtype", DTypeName(g.dtype), DTypeName(h.dtype));
  }
  if (g.num_layers != h.num_layers) {
    return diff("geometry.num_layers", g.num_layers, h.num_layers);
  }
  if (g.num_kv_heads != h.num_kv_heads) {
    return diff("geometry.num_kv_heads", g.num_kv_heads, h.num_kv_heads);
  }
  if (g.head_dim != h.head_dim) {
    return diff("geometry.head_dim", g.head_dim, h.head_dim);
  }
  if (g.page_size != h.page_size) {
    return diff("geometry.page_size", g.page_size, h.page_size);
  }
  if (g.Resolved().layout != h.Resolved().layout) {
    return diff("geometry.layout", PageLayoutName(g.Resolved().layout),
                PageLayoutName(h.Resolved().layout));
  }
  if (g.rope_theta != h.rope_theta) {
    return diff("geometry.rope_theta", g.rope_theta, h.rope_theta);
  }
  if (existing.key_kind != claimed.key_kind) {
    return diff("key_kind", KeyKindName(existing.key_kind),
                KeyKindName(claimed.key_kind));
  }
  const Topology& t = existing.topology;
  const Topology& u = claimed.topology;
  if (t.model != u.model) {
    return diff("topology.model", absl::StrCat("'", t.model, "'"),
                absl::StrCat("'", u.model, "'"));
  }
  const std::string layers = Range(t.layer_begin, t.layer_end, t.total_layers);
  const std::string claimed_layers =
      Range(u.layer_begin, u.layer_end, u.total_layers);
  if (t.layer_begin != u.layer_begin) {
    return diff("topology.layer_begin", "layers " + layers,
                "layers " + claimed_layers);
  }
  if (t.total_layers != u.total_layers) {
    return diff("topology.total_layers", "layers " + layers,
                "layers " + claimed_layers);
  }
  const std::string heads =
      Range(t.kv_head_begin, t.kv_head_end, t.total_kv_heads);
  const std::string claimed_heads =
      Range(u.kv_head_begin, u.kv_head_end, u.total_kv_heads);
  if (t.kv_head_begin != u.kv_head_begin) {
    return diff("topology.kv_head_begin", "KV heads " + heads,
                "KV heads " + claimed_heads);
  }
  if (t.total_kv_heads != u.total_kv_heads) {
    return diff("topology.total_kv_heads", "KV heads " + heads,
                "KV heads " + claimed_heads);
  }
  return "";
}

}  // namespace kvharbor
