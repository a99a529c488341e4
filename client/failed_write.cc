#include "client/failed_write.h"

#include <atomic>
#include <string>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"

namespace kvharbor {
namespace client {

grpc::Status FinishAfterFailedWrite(grpc::ClientContext* ctx,
                                    absl::FunctionRef<grpc::Status()> finish,
                                    absl::string_view call,
                                    absl::Duration grace) {
  absl::Notification finished;
  std::atomic<bool> cancelled{false};
  // A thread only on this rare path: the sync API's Finish() takes no
  // timeout, and the call's deadline cannot be shortened once it started.
  std::thread watchdog([&] {
    if (!finished.WaitForNotificationWithTimeout(grace)) {
      cancelled.store(true);
      ctx->TryCancel();
    }
  });
  const grpc::Status status = finish();
  finished.Notify();
  watchdog.join();
  if (cancelled.load() && status.error_code() == grpc::StatusCode::CANCELLED) {
    return grpc::Status(
        grpc::StatusCode::UNAVAILABLE,
        absl::StrFormat("%s: gRPC refused a write and the daemon sent no "
                        "status within %s, so the call was cancelled (the "
                        "connection failed; retry the call)",
                        call, absl::FormatDuration(grace)));
  }
  return status;
}

}  // namespace client
}  // namespace kvharbor
