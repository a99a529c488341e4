// FinishAfterFailedWrite: ends a client-streaming gRPC call after gRPC
// refused one of its writes, without waiting forever and without sending
// the daemon a half-close it would take as the client's own end of data.
//
// A refused Write usually means the daemon already ended the call, and
// Finish() returns the daemon's status at once. gRPC can also refuse a write
// while the call is still open at the daemon: seen against a daemon under the
// smallest limits.resource_quota_bytes, where the client had received GOAWAY
// and the daemon had the Insert header and went on waiting for data. Finish()
// alone then waits out the daemon's upload idle timeout or the call's
// deadline; WritesDone() first would end the upload short, and the daemon
// rightly refuses that with INVALID_ARGUMENT ("chunk.data: the stream ended
// after 0 of N bytes"), blaming the client for bytes gRPC never delivered.
//
// Internal to the SDK and its tests (includes gRPC). Thread safety: the
// caller owns `ctx` and the stream; a helper thread only calls
// ctx->TryCancel(), which gRPC allows from any thread.
#ifndef KVHARBOR_CLIENT_FAILED_WRITE_H_
#define KVHARBOR_CLIENT_FAILED_WRITE_H_

#include <grpcpp/grpcpp.h>

#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace kvharbor {
namespace client {

// How long a call whose write gRPC refused may take to deliver its status
// (normally it is already there) before it is cancelled.
inline constexpr absl::Duration kFailedWriteGrace = absl::Seconds(2);

// Runs `finish` (the stream's Finish()) and returns its status. If no status
// arrived within `grace`, the call is cancelled (the daemon aborts what it
// had staged: an Insert that was never half-closed stores nothing) and the
// result is UNAVAILABLE, naming `call` and saying that the connection
// failed, which a caller may retry.
grpc::Status FinishAfterFailedWrite(grpc::ClientContext* ctx,
                                    absl::FunctionRef<grpc::Status()> finish,
                                    absl::string_view call,
                                    absl::Duration grace = kFailedWriteGrace);

}  // namespace client
}  // namespace kvharbor

#endif  // KVHARBOR_CLIENT_FAILED_WRITE_H_
