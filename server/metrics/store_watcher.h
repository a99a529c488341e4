// StoreWatcher: turns changes in the store's counters into log lines for
// notable events, so that nothing is logged per RPC:
//   - an eviction burst: a namespace evicted or demoted at least 10% of its
//     capacity (and at least 16 pages) within one window -> one info line
//     per namespace and window;
//   - corrupt data found: a namespace's corrupt_dropped counter grew -> one
//     warn line.
// The Daemon's background thread calls Poll; windows are closed by Poll
// calls at least `window` apart.
//
// Not thread-safe: one caller (the Daemon's reaper thread). The Store must
// outlive the watcher.
#ifndef KVHARBOR_SERVER_METRICS_STORE_WATCHER_H_
#define KVHARBOR_SERVER_METRICS_STORE_WATCHER_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/time/time.h"
#include "core/store/store.h"

namespace kvharbor {

class StoreWatcher {
 public:
  StoreWatcher(const Store* store, absl::Duration window);

  // Logs what happened since the last window closed, when `now` ends one.
  // Returns the number of lines logged.
  int Poll(absl::Time now);

 private:
  struct Seen {
    uint64_t evicted = 0;
    uint64_t demoted = 0;
    uint64_t corrupt = 0;
  };

  const Store* const store_;
  const absl::Duration window_;
  absl::Time window_start_ = absl::InfinitePast();
  std::map<std::string, Seen> seen_;  // by namespace, at the window's start
};

}  // namespace kvharbor

#endif  // KVHARBOR_SERVER_METRICS_STORE_WATCHER_H_
