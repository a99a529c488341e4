// The plain uint64 counters of NamespaceStats and GlobalStats (types/stats.h)
// as tables of {name, member}, under the names their kvharbor.v1 messages,
// the C ABI's JSON and the CLI give them. The server's conversion to proto,
// the SDK's from proto and the C ABI's JSON walk these tables instead of
// repeating the fields one by one, so a new counter is added here once.
// tests/server/convert_test.cc checks every name against the proto
// descriptor (a uint64 field of that name) and that the proto has no uint64
// field the table misses.
//
// constexpr data; no state.
#ifndef KVHARBOR_TYPES_STATS_FIELDS_H_
#define KVHARBOR_TYPES_STATS_FIELDS_H_

#include <cstdint>

#include "absl/strings/string_view.h"
#include "types/stats.h"

namespace kvharbor {

template <typename Stats>
struct CounterField {
  absl::string_view name;
  uint64_t Stats::*member;
};

// NamespaceStats' counters in kvharbor.v1.NamespaceStats field order (name,
// tiers, calibration and codecs are not plain counters).
inline constexpr CounterField<NamespaceStats> kNamespaceCounters[] = {
    {"capacity_pages", &NamespaceStats::capacity_pages},
    {"free_pages", &NamespaceStats::free_pages},
    {"cached_pages", &NamespaceStats::cached_pages},
    {"evictable_pages", &NamespaceStats::evictable_pages},
    {"protected_pages", &NamespaceStats::protected_pages},
    {"hit_tokens", &NamespaceStats::hit_tokens},
    {"miss_tokens", &NamespaceStats::miss_tokens},
    {"inserted_pages", &NamespaceStats::inserted_pages},
    {"dedup_pages", &NamespaceStats::dedup_pages},
    {"evicted_pages", &NamespaceStats::evicted_pages},
    {"bytes_in", &NamespaceStats::bytes_in},
    {"bytes_out", &NamespaceStats::bytes_out},
    {"active_leases", &NamespaceStats::active_leases},
    {"index_nodes", &NamespaceStats::index_nodes},
    {"index_memory_bytes", &NamespaceStats::index_memory_bytes},
    {"page_bytes", &NamespaceStats::page_bytes},
    {"uploads_in_flight", &NamespaceStats::uploads_in_flight},
    {"demoted_pages", &NamespaceStats::demoted_pages},
    {"promoted_pages", &NamespaceStats::promoted_pages},
    {"disk_write_errors", &NamespaceStats::disk_write_errors},
    {"corrupt_dropped", &NamespaceStats::corrupt_dropped},
    {"host_ipc_bytes", &NamespaceStats::host_ipc_bytes},
    {"memory_bytes", &NamespaceStats::memory_bytes},
};

// GlobalStats' counters (uptime_seconds is signed and not in the table).
inline constexpr CounterField<GlobalStats> kGlobalCounters[] = {
    {"pool_budget_bytes", &GlobalStats::pool_budget_bytes},
    {"pool_reserved_bytes", &GlobalStats::pool_reserved_bytes},
    {"namespaces", &GlobalStats::namespaces},
    {"hit_tokens", &GlobalStats::hit_tokens},
    {"miss_tokens", &GlobalStats::miss_tokens},
    {"bytes_in", &GlobalStats::bytes_in},
    {"bytes_out", &GlobalStats::bytes_out},
    {"cached_pages", &GlobalStats::cached_pages},
    {"active_leases", &GlobalStats::active_leases},
    {"memory_used_bytes", &GlobalStats::memory_used_bytes},
};

}  // namespace kvharbor

#endif  // KVHARBOR_TYPES_STATS_FIELDS_H_
