// OnlineCalibrator: the store's background thread that runs the online KVTC
// calibrations namespaces request (core/calibration/online_calibration.h). One
// thread per store: calibrations are CPU-heavy and rare, so they run one at a
// time instead of competing with request threads.
//
// It holds namespaces only by weak pointer while queued; a running job
// holds a shared pointer (the namespace's memory stays until the job sees
// the deletion and returns) and is cancelled between calibration stages when
// the namespace is deleted or the calibrator is destroyed.
//
// Thread-safe. The destructor cancels the running job and joins the thread.
#ifndef KVHARBOR_CORE_STORE_ONLINE_CALIBRATOR_H_
#define KVHARBOR_CORE_STORE_ONLINE_CALIBRATOR_H_

#include <atomic>
#include <deque>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "core/calibration/online_calibration.h"

namespace kvharbor {

class Namespace;

class OnlineCalibrator {
 public:
  explicit OnlineCalibrator(OnlineCalibrateFn fn = RunOnlineKvtcCalibration);
  ~OnlineCalibrator();
  OnlineCalibrator(const OnlineCalibrator&) = delete;
  OnlineCalibrator& operator=(const OnlineCalibrator&) = delete;

  void Enqueue(std::weak_ptr<Namespace> ns);
  // Jobs queued or running (for tests and stats).
  size_t pending() const;

 private:
  void Loop();

  const OnlineCalibrateFn fn_;
  mutable absl::Mutex mu_;
  std::deque<std::weak_ptr<Namespace>> queue_ ABSL_GUARDED_BY(mu_);
  size_t running_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_STORE_ONLINE_CALIBRATOR_H_
