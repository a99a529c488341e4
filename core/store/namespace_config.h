// NamespaceConfig: what one namespace is made of (geometry, codec, tiers,
// calibration, callbacks), and the helpers the namespace and its parts
// (core/store/namespace.h, namespace_calibrations.h, namespace_tiers.h)
// share: token validation and the namespace's log lines. Its statistics are
// the shared NamespaceStats (types/stats.h).
//
// Plain values; a NamespaceConfig is immutable once the namespace is made,
// and its callbacks must be callable from any thread.
#ifndef KVHARBOR_CORE_STORE_NAMESPACE_CONFIG_H_
#define KVHARBOR_CORE_STORE_NAMESPACE_CONFIG_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/base/file_ops.h"
#include "core/calibration/online_calibration.h"
#include "core/codec/codec.h"
#include "core/index/radix_index.h"
#include "core/memory/memory_budget.h"
#include "core/store/device_tier.h"
#include "core/transform/kv_transform.h"
#include "types/geometry.h"
#include "types/key_kind.h"
#include "types/stats.h"
#include "types/tier.h"
#include "types/topology.h"

namespace kvharbor {

class Namespace;

struct NamespaceConfig {
  std::string name;
  std::string tenant;  // NamespaceSpec::tenant (core/store/store.h)
  Geometry geometry;
  uint64_t capacity_bytes = 0;  // resolved: capacity_pages * page bytes
  std::string codec = "identity";
  absl::Duration default_lease_ttl = absl::Seconds(30);
  absl::Duration max_lease_ttl = absl::Minutes(10);
  uint32_t max_tokens_per_request = 1 << 20;

  // ---- Tiers. With host_compressed_bytes == 0 there is no cold tier and
  // eviction drops pages. tier_codec also encodes COMPRESSED fetches of raw
  // pages; Create makes an identity codec when it is null.
  std::shared_ptr<const Codec> tier_codec;
  std::string calibration;  // calibration file bytes ("" for identity)
  uint64_t calibration_fingerprint = 0;
  uint64_t host_compressed_bytes = 0;  // budget of the host-compressed tier
  std::string disk_dir;                // "" = no disk tier
  uint64_t disk_bytes = 0;             // disk tier budget; 0 = unlimited
  uint32_t tier_batch_pages = 32;      // pages encoded per move batch
  // Online calibration (codec kvtc only). Without a calibration, tier_codec
  // is the fp8 fallback until the first calibration is installed.
  OnlineCalibrationOptions online;
  // Called (without any namespace lock) when the sample is big enough; the
  // store queues the namespace on its background calibrator. Null: nobody
  // calibrates (tests drive NamespaceCalibrations::RunJob themselves).
  std::function<void(std::weak_ptr<Namespace>)> request_calibration;
  // The disk tier's write-side file calls; null = the real ones (tests
  // inject disk-full and I/O faults here).
  std::shared_ptr<const FileOps> file_ops;
  // Device pools (core/store/device_tier.h): the tier that makes, for each
  // calibration the namespace uses, the GPU encoder that demotes raw pages
  // in batches and the GPU decoder that RAW fetches of cold pages use. Null,
  // or a calibration it has no GPU codec for: the CPU codec (over host
  // copies of device pages).
  std::shared_ptr<DeviceTier> device_tier;
  // store.promote_on_fetch: cold pages a RAW fetch decoded go back into the
  // pool (tier 0) when it has free slots (nothing is evicted for them).
  bool promote_on_fetch = false;
  // The store's memory budget (core/memory/memory_budget.h) this namespace
  // charges what it holds in host memory to; null: none (tests).
  std::shared_ptr<MemoryBudget> budget;
  // Called without any namespace lock when the budget has no room for new
  // pages: frees at least `bytes` from the namespaces holding the most (the
  // caller included) and returns what it freed. Null: nobody frees.
  std::function<uint64_t(uint64_t bytes)> reclaim;
  // Notable events (calibration switches): `log`; warnings (dropped disk
  // files, failed writes, failed calibrations): `warn`, or `log` when only
  // that is set. Null prints to stderr.
  std::function<void(const std::string&)> log;
  std::function<void(const std::string&)> warn;

  // ---- Fetch transform. The KVCM compressor built once from kvcm_path at
  // creation (null without one); immutable and shared by concurrent
  // fetches (KvTransform is thread-safe). The namespace itself never calls
  // it: the server applies it to fetched pages.
  std::string kvcm_path;
  std::shared_ptr<const KvTransform> kvcm;

  // Token ids or one opaque key per page (types/key_kind.h).
  KeyKind key_kind = KeyKind::kTokens;
  // The resolved topology (types/topology.h): part of the namespace's
  // identity, checked when a later CreateNamespace claims it.
  Topology topology;
};

enum class FetchFormat { kRaw, kCompressed };

// Checks a token list from a client: non-empty, at most `max_tokens`, no
// negative ids. `field` names it in the error ("token_ids").
absl::Status ValidateTokens(absl::Span<const Token> tokens, uint32_t max_tokens,
                            absl::string_view field);

// A warning of namespace `config` (dropped disk files, failed writes,
// failed calibrations): config.warn, else config.log, else stderr.
void LogWarning(const NamespaceConfig& config, const std::string& line);
// A notable event (calibration switches): config.log, else stderr.
void LogEvent(const NamespaceConfig& config, const std::string& line);

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_STORE_NAMESPACE_CONFIG_H_
