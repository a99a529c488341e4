#include "client/cuda/insert_staging.h"

#include <cuda_runtime_api.h>

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cuda/kernels/cuda_check.h"

namespace kvharbor {
namespace client {

namespace {

// Regions are sized in whole steps so that inserts of slightly different
// lengths reuse one region (a new one costs a registration with the
// daemon and a cudaHostRegister of every page).
constexpr uint64_t kRegionStep = uint64_t{64} << 20;

}  // namespace

InsertStaging::~InsertStaging() { Drop(); }

void InsertStaging::Drop() {
  if (cuda_registered_) cudaHostUnregister(region_->data());
  cuda_registered_ = false;
  region_.reset();
}

absl::StatusOr<StagingRegion*> InsertStaging::Region(const NamespaceInfo& info,
                                                     uint64_t bytes) {
  if (info.staging_socket.empty()) {
    return absl::FailedPreconditionError(
        "the daemon serves no staging socket (it needs store.host_ipc_socket "
        "and host pools)");
  }
  if (info.staging_socket == refused_socket_ &&
      info.daemon_id == refused_daemon_) {
    return absl::FailedPreconditionError(refused_why_);
  }
  if (region_ != nullptr &&
      (region_->socket_path() != info.staging_socket ||
       region_->daemon_id() != info.daemon_id || region_->size() < bytes)) {
    Drop();
  }
  if (region_ == nullptr) {
    const uint64_t size = (bytes + kRegionStep - 1) / kRegionStep * kRegionStep;
    absl::StatusOr<std::unique_ptr<StagingRegion>> made =
        StagingRegion::Create(info.staging_socket, size);
    absl::Status why = made.status();
    if (made.ok() && (*made)->daemon_id() != info.daemon_id) {
      why = absl::FailedPreconditionError(absl::StrCat(
          "the staging socket ", info.staging_socket,
          " on this host belongs to another daemon (the namespace's daemon is "
          "on another host)"));
    }
    if (!why.ok()) {
      refused_socket_ = info.staging_socket;
      refused_daemon_ = info.daemon_id;
      refused_why_ = std::string(why.message());
      return absl::FailedPreconditionError(refused_why_);
    }
    region_ = *std::move(made);
  }
  if (!cuda_registered_) {
    KVH_CUDA_RETURN_IF_ERROR(cudaHostRegister(region_->data(), region_->size(),
                                              cudaHostRegisterPortable));
    cuda_registered_ = true;
  }
  return region_.get();
}

}  // namespace client
}  // namespace kvharbor
