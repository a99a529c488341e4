// NamespaceSpec: what a namespace is created with (name, geometry, capacity,
// codec and calibration, tiers, fetch transform, online calibration, key
// kind, topology), one type for the daemon's core (core/store/store.h creates
// namespaces from it), the SDK (client::NamespaceSpec is this type) and the
// wire message kvharbor.v1.NamespaceSpec, which server/rpc/convert.cc (the
// daemon) and client/proto_convert.cc (the SDK) convert it to and from. A
// new spec field is declared here once.
//
// Header only; a plain value (owns its strings, copyable,
// thread-compatible).
#ifndef KVHARBOR_TYPES_NAMESPACE_SPEC_H_
#define KVHARBOR_TYPES_NAMESPACE_SPEC_H_

#include <cstdint>
#include <string>

#include "types/geometry.h"
#include "types/key_kind.h"
#include "types/online_calibration.h"
#include "types/topology.h"

namespace kvharbor {

struct NamespaceSpec {
  // 1..128 characters of [A-Za-z0-9_.-]; unique in the daemon.
  std::string name;
  Geometry geometry;
  uint64_t capacity_bytes = 0;  // 0 = the daemon's default share
  // "" = identity; or a calibrated codec: "kvtc", "int8_c8", "commvq"
  // (any name in the daemon's CodecRegistry::Default()).
  std::string codec;
  // Calibration (calibrated codecs only, required there): a path on the
  // daemon's machine (kvtc: calibration file; int8_c8: msmodelslim export
  // directory; commvq: codebook file), or the codec's canonical calibration
  // bytes inline, as GetCalibration returns them (exactly one of the two;
  // core/codec/codec_calibrations.h). Never returned by the daemon.
  std::string calibration_path;
  std::string calibration;
  // Tiers (docs/tiers.md): host-compressed budget (0 = no cold tiers), disk
  // directory on the daemon's machine ("" = none) and disk budget (0 =
  // unlimited).
  uint64_t host_compressed_bytes = 0;
  std::string disk_dir;
  uint64_t disk_bytes = 0;
  // Returned by the daemon: fingerprint of the calibration evictions use
  // now (0 = none). Ignored at creation.
  uint64_t calibration_fingerprint = 0;
  // KVCM compressor weights (a KVCM .bin file on the daemon's machine; "" =
  // none), checked against the geometry at creation: enables the lossy,
  // length-changing KVCM fetch transform (core/transform/kvcm_compressor.h).
  std::string kvcm_path;
  // Owning tenant ("" = none: the daemon runs without authentication). Set
  // by the daemon's server from the caller's token (or its config file),
  // never sent by the SDK nor returned; only that tenant's tokens can reach
  // the namespace (docs/operations.md).
  std::string tenant;
  // Online calibration (codec kvtc; docs/calibration.md): with no
  // calibration given, pages are evicted with fp8 until the first one is
  // made from inserted pages; with one, it is replaced once by the online
  // one unless pinned.
  OnlineCalibrationOptions online_calibration;
  // Token ids (the default) or one opaque page key per page
  // (docs/engines_api.md): a page-key namespace's Match and Insert take a
  // Sequence::OfKeys.
  KeyKind key_kind = KeyKind::kTokens;
  // The model, layer range (pipeline stage) and KV-head range
  // (tensor-parallel rank) the pages belong to (types/topology.h); unset =
  // the whole model. Returned resolved by the daemon.
  Topology topology;
};

}  // namespace kvharbor

#endif  // KVHARBOR_TYPES_NAMESPACE_SPEC_H_
