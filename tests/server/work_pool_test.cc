// WorkPool (server/rpc/work_pool.h): jobs round-robin over tenants, on threads
// of a lower priority, and every queued job runs before the pool is gone.
#include "server/rpc/work_pool.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace kvharbor {
namespace {

int ThreadNice() {
  return getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)));
}

TEST_CASE("WorkPool takes jobs round-robin over tenants", "[server]") {
  absl::Mutex mu;
  std::vector<std::string> order;
  absl::Notification started, go;
  {
    WorkPool pool(1);
    // Hold the only thread while the queues fill.
    pool.Run("x", [&] {
      started.Notify();
      go.WaitForNotification();
    });
    started.WaitForNotification();
    for (const char* job : {"a1", "a2", "a3"}) {
      pool.Run("a", [&, job] {
        absl::MutexLock l(&mu);
        order.push_back(job);
      });
    }
    pool.Run("b", [&] {
      absl::MutexLock l(&mu);
      order.push_back("b1");
    });
    CHECK(pool.queued() == 4);
    go.Notify();
  }  // the destructor runs what is queued
  // b's one job waits for one of a's, not for all three.
  CHECK(order == std::vector<std::string>{"a1", "b1", "a2", "a3"});
}

TEST_CASE("WorkPool threads run at a lower priority", "[server]") {
  const int mine = ThreadNice();
  std::atomic<int> theirs{-100};
  {
    WorkPool pool(2);
    CHECK(pool.threads() == 2);
    pool.Run("", [&] { theirs = ThreadNice(); });
  }
  CHECK(theirs == std::min(mine + WorkPool::kNiceIncrement, 19));
  CHECK(ThreadNice() == mine);  // the caller's thread is unchanged
}

}  // namespace
}  // namespace kvharbor
