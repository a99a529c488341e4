#include "core/store/online_calibrator.h"

#include <utility>

#include "core/store/namespace.h"

namespace kvharbor {

OnlineCalibrator::OnlineCalibrator(OnlineCalibrateFn fn)
    : fn_(std::move(fn)), thread_([this] { Loop(); }) {}

OnlineCalibrator::~OnlineCalibrator() {
  stop_.store(true);
  {
    absl::MutexLock l(&mu_);  // wakes the loop's Await
  }
  thread_.join();
}

void OnlineCalibrator::Enqueue(std::weak_ptr<Namespace> ns) {
  absl::MutexLock l(&mu_);
  queue_.push_back(std::move(ns));
}

size_t OnlineCalibrator::pending() const {
  absl::MutexLock l(&mu_);
  return queue_.size() + running_;
}

void OnlineCalibrator::Loop() {
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_.load() || !queue_.empty();
  };
  const std::function<bool()> cancelled = [this] { return stop_.load(); };
  while (true) {
    std::shared_ptr<Namespace> ns;
    {
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(&ready));
      if (stop_.load()) return;
      ns = queue_.front().lock();
      queue_.pop_front();
      if (ns == nullptr) continue;
      ++running_;
    }
    if (!ns->deleted()) {
      // A deleted namespace's result is dropped, like a cancelled one's.
      ns->calibrations().RunJob(fn_,
                                [&] { return ns->deleted() || cancelled(); });
    }
    ns.reset();
    absl::MutexLock l(&mu_);
    --running_;
  }
}

}  // namespace kvharbor
