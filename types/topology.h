// Topology: which part of which model a namespace's pages hold -- the model
// id, the layer range a process owns (its pipeline stage) and the KV-head
// range it owns (its tensor-parallel rank) -- and NamespaceIdentityDiff, the
// one place that decides whether two namespace specs describe the same pages
// (issue 32 item 2). Processes whose pages differ in any of these, or in the
// geometry (the KV dtype included) or key kind, must never read each other's
// pages, so the daemon refuses a CreateNamespace that claims an existing
// namespace with another identity, naming the first differing field
// (core/store/store.cc). Mirrors kvharbor.v1.Topology; the SDK, the C ABI
// and the Python client fill the same fields.
//
// Plain values and pure functions (copyable, thread-compatible).
#ifndef KVHARBOR_TYPES_TOPOLOGY_H_
#define KVHARBOR_TYPES_TOPOLOGY_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "types/geometry.h"
#include "types/key_kind.h"

namespace kvharbor {

// Longest Topology::model, in bytes.
inline constexpr size_t kMaxModelIdBytes = 256;

struct Topology {
  // The model as the engine names it ("" = not given).
  std::string model;
  // Layers of the whole model (0 = layer_end) and the model layers
  // [layer_begin, layer_end) the pages hold (layer_end 0 = layer_begin +
  // geometry.num_layers).
  uint32_t total_layers = 0;
  uint32_t layer_begin = 0;
  uint32_t layer_end = 0;
  // The same for KV heads (per layer).
  uint32_t total_kv_heads = 0;
  uint32_t kv_head_begin = 0;
  uint32_t kv_head_end = 0;

  // This topology with its defaults filled in for `geometry` (unset = the
  // whole model), checked: InvalidArgument naming "<prefix>.<field>" for a
  // range whose width is not the geometry's num_layers / num_kv_heads, a
  // total below the range's end, or a model id over kMaxModelIdBytes.
  absl::StatusOr<Topology> Resolved(const Geometry& geometry,
                                    absl::string_view prefix) const;

  bool operator==(const Topology& o) const {
    return model == o.model && total_layers == o.total_layers &&
           layer_begin == o.layer_begin && layer_end == o.layer_end &&
           total_kv_heads == o.total_kv_heads &&
           kv_head_begin == o.kv_head_begin && kv_head_end == o.kv_head_end;
  }
};

// What makes two namespaces hold the same pages: geometry, key kind and
// (resolved) topology.
struct NamespaceIdentity {
  Geometry geometry;
  KeyKind key_kind = KeyKind::kTokens;
  Topology topology;  // resolved
};

// The first field in which `claimed` differs from `existing`, as a spec
// field path ("geometry.dtype", "key_kind", "topology.layer_begin", ...),
// followed by ": " and both values ("existing ..., this spec ..."); "" when
// they are the same.
std::string NamespaceIdentityDiff(const NamespaceIdentity& existing,
                                  const NamespaceIdentity& claimed);

}  // namespace kvharbor

#endif  // KVHARBOR_TYPES_TOPOLOGY_H_
