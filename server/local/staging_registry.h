// StagingRegistry: the staging regions that same-host clients registered on
// the daemon's staging socket (server/local/staging_server.h), looked up by
// the Insert calls that name them (InsertHeader.staging).
//
// A region is a read-only mapping of the client's own sealed memfd: the
// daemon only reads it, and no client ever gets access to the daemon's
// memory this way. A registration is identified by a random 64-bit id and
// authorized by a random 128-bit key, both from getrandom(2) and known only
// to the registering client (its socket connection is private). The first
// Insert that uses a region binds it to that caller's tenant: a call of
// another tenant is refused even with the right key. One Insert at a time
// reads a region (Acquire hands out an exclusive Use). Unregistering (the
// client's connection closed) removes the entry at once; the mapping itself
// lives until the last Use of it ends, so an Insert reading it never sees
// it unmapped.
//
// Thread-safe: one leaf mutex; Use is released from any thread.
#ifndef KVHARBOR_SERVER_LOCAL_STAGING_REGISTRY_H_
#define KVHARBOR_SERVER_LOCAL_STAGING_REGISTRY_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "types/staging_wire.h"

namespace kvharbor {

// A read-only mapping of `bytes` bytes; unmapped when destroyed.
class StagingMapping {
 public:
  StagingMapping(const uint8_t* base, uint64_t bytes)
      : base_(base), bytes_(bytes) {}
  ~StagingMapping();
  StagingMapping(const StagingMapping&) = delete;
  StagingMapping& operator=(const StagingMapping&) = delete;

  const uint8_t* data() const { return base_; }
  uint64_t size() const { return bytes_; }

 private:
  const uint8_t* const base_;
  const uint64_t bytes_;
};

using StagingKey = std::array<uint8_t, kStagingKeyBytes>;

class StagingRegistry {
 public:
  struct Grant {
    uint64_t id = 0;
    StagingKey key{};
  };

  // One Insert's exclusive hold on a region; releasing it (destruction)
  // lets the next Insert use the region.
  class Use {
   public:
    ~Use();
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;
    // Bytes [offset, offset + length) of the region; InvalidArgument naming
    // `field` when they do not lie in it.
    absl::StatusOr<absl::Span<const uint8_t>> Bytes(
        uint64_t offset, uint64_t length, absl::string_view field) const;
    uint64_t size() const;

   private:
    friend class StagingRegistry;
    struct Slot;
    explicit Use(std::shared_ptr<Slot> slot) : slot_(std::move(slot)) {}
    std::shared_ptr<Slot> slot_;
  };

  // At most `max_regions` registered at once (ResourceExhausted beyond).
  explicit StagingRegistry(size_t max_regions) : max_regions_(max_regions) {}
  StagingRegistry(const StagingRegistry&) = delete;
  StagingRegistry& operator=(const StagingRegistry&) = delete;

  // Registers `mapping` under a new random id and key.
  absl::StatusOr<Grant> Add(std::unique_ptr<StagingMapping> mapping);
  // Unregisters `id` (no-op when unknown). A Use held now stays valid.
  void Remove(uint64_t id);
  // The region `id` for one Insert of `tenant`. NotFound naming
  // header.staging.id when no region `id` is registered or `key` is not its
  // key (the two are not told apart); PermissionDenied when the region
  // serves another tenant; FailedPrecondition while another Insert uses it.
  absl::StatusOr<std::unique_ptr<Use>> Acquire(uint64_t id,
                                               absl::string_view key,
                                               absl::string_view tenant);
  size_t size() const;

 private:
  const size_t max_regions_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Use::Slot>> regions_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace kvharbor

#endif  // KVHARBOR_SERVER_LOCAL_STAGING_REGISTRY_H_
