// Uses the installed SDK the way an application would: makes a Client for a
// port where no daemon listens and expects UNAVAILABLE, not a hang or crash.
#include <kvharbor/client.h>

#include <cstdio>
#include <vector>

int main() {
  kvharbor::ClientOptions options;
  options.address = "127.0.0.1:1";
  options.default_timeout = absl::Seconds(20);
  absl::StatusOr<std::unique_ptr<kvharbor::Client>> client =
      kvharbor::Client::Create(options);
  if (!client.ok()) {
    std::fprintf(stderr, "Create: %s\n", client.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<kvharbor::client::Lease> lease =
      (*client)->Match("ns", std::vector<int32_t>{1, 2, 3, 4});
  if (lease.status().code() != absl::StatusCode::kUnavailable) {
    std::fprintf(stderr, "Match: want UNAVAILABLE, got %s\n",
                 lease.status().ToString().c_str());
    return 1;
  }
  // The value types and helpers link too.
  absl::StatusOr<kvharbor::client::DType> dtype =
      kvharbor::client::ParseDType("fp16");
  if (!dtype.ok() || kvharbor::client::DTypeSize(*dtype) != sizeof(short)) {
    std::fprintf(stderr, "ParseDType/DTypeSize disagree\n");
    return 1;
  }
  std::printf("consumer ok: %s\n", lease.status().ToString().c_str());
  return 0;
}
