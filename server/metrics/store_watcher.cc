#include "server/metrics/store_watcher.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

namespace kvharbor {

namespace {

// A burst is at least this fraction of the namespace's capacity in pages,
// and at least kMinBurstPages, within one window.
constexpr uint64_t kBurstCapacityDivisor = 10;
constexpr uint64_t kMinBurstPages = 16;

}  // namespace

StoreWatcher::StoreWatcher(const Store* store, absl::Duration window)
    : store_(store), window_(window) {}

int StoreWatcher::Poll(absl::Time now) {
  const bool first = window_start_ == absl::InfinitePast();
  if (!first && now - window_start_ < window_) return 0;
  const double seconds = absl::ToDoubleSeconds(now - window_start_);
  window_start_ = now;
  int lines = 0;
  std::map<std::string, Seen> next;
  for (const std::shared_ptr<Namespace>& ns : store_->List()) {
    const NamespaceStats c = ns->Counters();
    const Seen now_seen{c.evicted_pages, c.demoted_pages, c.corrupt_dropped};
    auto it = seen_.find(ns->name());
    // A namespace new since the last window starts from zero; one that was
    // recreated under the same name has counters below the ones seen.
    Seen before;
    if (it != seen_.end() && it->second.evicted <= now_seen.evicted &&
        it->second.demoted <= now_seen.demoted &&
        it->second.corrupt <= now_seen.corrupt) {
      before = it->second;
    }
    next.emplace(ns->name(), now_seen);
    const uint64_t corrupt = now_seen.corrupt - before.corrupt;
    if (corrupt > 0) {
      spdlog::warn(
          "namespace '{}': {} corrupt disk page(s) found and dropped "
          "({} in total)",
          ns->name(), corrupt, now_seen.corrupt);
      ++lines;
    }
    if (first) continue;  // no window to measure a burst in yet
    const uint64_t evicted = now_seen.evicted - before.evicted;
    const uint64_t demoted = now_seen.demoted - before.demoted;
    const uint64_t threshold =
        std::max(kMinBurstPages, c.capacity_pages / kBurstCapacityDivisor);
    if (evicted + demoted >= threshold) {
      spdlog::info(
          "namespace '{}': eviction burst: {} page(s) evicted and {} demoted "
          "in the last {:.1f}s (capacity {} pages, {} free)",
          ns->name(), evicted, demoted, seconds, c.capacity_pages,
          c.free_pages);
      ++lines;
    }
  }
  seen_ = std::move(next);
  return lines;
}

}  // namespace kvharbor
