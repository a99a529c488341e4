// Statistics of the daemon: per namespace (with its tiers and calibration)
// and store-wide. One definition for both ends: the daemon's core fills them
// (Namespace::Counters, Store::Counters), the server converts them to and the
// SDK from kvharbor.v1.NamespaceStats / TierStats / GlobalStats, and the SDK
// returns them (Client::Stats), which the CLI and the C ABI's JSON (read by
// the Python client) show.
//
// Plain values that own their members; header only, no state.
#ifndef KVHARBOR_TYPES_STATS_H_
#define KVHARBOR_TYPES_STATS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "types/enum_names.h"
#include "types/tier.h"

namespace kvharbor {

// Online calibration state of a namespace (values match
// kvharbor.v1.CalibrationState; never renumber).
enum class CalibrationState : int {
  kNone = 0,         // no online calibration
  kSampling = 1,     // collecting rows, pages evicted with the fallback
  kCalibrating = 2,  // a calibration is queued or running
  kReady = 3,        // calibrated (or uploaded); evicting with KVTC
};

inline absl::string_view CalibrationStateName(CalibrationState s) {
  return EnumName(s, {"none", "sampling", "calibrating", "ready"});
}

// What a calibration expected when it was made (Codec::calibration_estimate;
// KVTC calibration file version 2; all zero when unknown, e.g. fp8 or a
// version 1 file). Relative errors are sqrt(squared error / total variance)
// over the calibration's rows.
struct CalibrationEstimate {
  double target_ratio = 0;    // the ratio asked for
  double expected_ratio = 0;  // raw / stored bytes over one page per buffer
  double keys_rel_error = 0;
  double values_rel_error = 0;
};

// Where a namespace's calibration stands (kvharbor.v1.CalibrationStats).
struct CalibrationStats {
  CalibrationState state = CalibrationState::kNone;
  uint64_t tokens_seen = 0;      // inserted tokens the sampler was offered
  uint64_t tokens_sampled = 0;   // tokens in its reservoir
  std::string codec;             // the codec evictions use now
  uint64_t fingerprint = 0;      // its calibration (0 = none)
  bool pinned = false;           // against online recalibration
  CalibrationEstimate expected;  // what the active calibration expected
};

// The cold pages one codec encoded, over every cold tier (a namespace with
// online calibration holds pages of its fallback codec and of kvtc;
// kvharbor.v1.CodecStats).
struct CodecStats {
  std::string codec;   // Codec::name()
  uint64_t pages = 0;  // raw bytes: pages x NamespaceStats::page_bytes
  uint64_t bytes = 0;  // codec buffer bytes
};

struct TierStats {
  Tier tier = Tier::kRaw;
  uint64_t pages = 0;
  uint64_t bytes = 0;  // raw: page bytes; cold tiers: codec buffer bytes
};

// One namespace (kvharbor.v1.NamespaceStats).
struct NamespaceStats {
  std::string name;
  uint64_t capacity_pages = 0;
  uint64_t free_pages = 0;
  uint64_t cached_pages = 0;
  uint64_t evictable_pages = 0;
  uint64_t protected_pages = 0;
  uint64_t hit_tokens = 0;
  uint64_t miss_tokens = 0;
  uint64_t inserted_pages = 0;
  uint64_t dedup_pages = 0;
  uint64_t evicted_pages = 0;
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
  // Page bytes of the leases GetHostHandles described (same-host Fetch: the
  // client copies them out of shared memory; the daemon does not see the
  // copy, so these are bytes offered, not bytes_out).
  uint64_t host_ipc_bytes = 0;
  // Bytes the namespace holds in the daemon's memory budget (written raw
  // pages, slot and index metadata, host-compressed buffers:
  // Namespace::memory_bytes).
  uint64_t memory_bytes = 0;
  uint64_t active_leases = 0;
  uint64_t index_nodes = 0;
  uint64_t index_memory_bytes = 0;
  uint64_t page_bytes = 0;
  uint64_t uploads_in_flight = 0;
  // One per tier, hottest first: the daemon reports all kNumTiers, so
  // tiers[static_cast<int>(t)] is tier t.
  std::vector<TierStats> tiers;
  uint64_t demoted_pages = 0;  // moves to a colder tier
  // Cold pages made raw again: by an insert extending them, or by a RAW
  // fetch with promote_on_fetch.
  uint64_t promoted_pages = 0;
  uint64_t disk_write_errors = 0;
  // Cold pages dropped because their stored bytes failed a checksum: a
  // host-compressed buffer or disk file found corrupt when fetched or moved,
  // or a disk file at warm restart.
  uint64_t corrupt_dropped = 0;
  CalibrationStats calibration;
  // Cold pages by codec, sorted by name; codecs without pages are absent.
  std::vector<CodecStats> codecs;
};

// The whole daemon, or (for a non-admin caller) its tenant's namespaces
// (kvharbor.v1.GlobalStats).
struct GlobalStats {
  uint64_t pool_budget_bytes = 0;
  // Capacities reserved up front: only with a shared host arena or a
  // device pool.
  uint64_t pool_reserved_bytes = 0;
  // Held in the memory budget now (MemoryBudget::used; the caller's
  // tenant's namespaces' unless a daemon admin).
  uint64_t memory_used_bytes = 0;
  uint64_t namespaces = 0;
  uint64_t hit_tokens = 0;
  uint64_t miss_tokens = 0;
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
  uint64_t cached_pages = 0;
  uint64_t active_leases = 0;
  int64_t uptime_seconds = 0;  // of the daemon (0 from the core's store)
};

}  // namespace kvharbor

#endif  // KVHARBOR_TYPES_STATS_H_
