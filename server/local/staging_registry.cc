#include "server/local/staging_registry.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/random_bytes.h"

namespace kvharbor {

struct StagingRegistry::Use::Slot {
  Slot(std::unique_ptr<StagingMapping> m, const StagingKey& k)
      : mapping(std::move(m)), key(k) {}
  const std::unique_ptr<StagingMapping> mapping;
  const StagingKey key;
  // Set by the first Acquire (under the registry's mutex); read there only.
  std::optional<std::string> tenant;
  std::atomic<bool> in_use{false};
};

namespace {

// Compares every byte whatever the first difference, so that the time taken
// tells nothing about how much of a guessed key was right.
bool SameKey(const StagingKey& key, absl::string_view given) {
  if (given.size() != key.size()) return false;
  uint8_t diff = 0;
  for (size_t i = 0; i < key.size(); ++i) {
    diff |= key[i] ^ static_cast<uint8_t>(given[i]);
  }
  return diff == 0;
}

}  // namespace

StagingMapping::~StagingMapping() {
  munmap(const_cast<uint8_t*>(base_), bytes_);
}

StagingRegistry::Use::~Use() { slot_->in_use.store(false); }

uint64_t StagingRegistry::Use::size() const { return slot_->mapping->size(); }

absl::StatusOr<absl::Span<const uint8_t>> StagingRegistry::Use::Bytes(
    uint64_t offset, uint64_t length, absl::string_view field) const {
  const uint64_t size = slot_->mapping->size();
  if (offset > size || size - offset < length) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %u bytes at offset %u do not lie in the %u-byte staging region",
        field, length, offset, size));
  }
  return absl::MakeConstSpan(slot_->mapping->data() + offset, length);
}

absl::StatusOr<StagingRegistry::Grant> StagingRegistry::Add(
    std::unique_ptr<StagingMapping> mapping) {
  Grant g;
  absl::MutexLock l(&mu_);
  if (regions_.size() >= max_regions_) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "staging: %u regions are registered, the daemon's maximum; close "
        "one first",
        regions_.size()));
  }
  do {
    if (absl::Status s = FillRandom(&g.id, sizeof(g.id), "staging"); !s.ok())
      return s;
  } while (g.id == 0 || regions_.contains(g.id));
  if (absl::Status s = FillRandom(g.key.data(), g.key.size(), "staging");
      !s.ok()) {
    return s;
  }
  regions_.emplace(g.id,
                   std::make_shared<Use::Slot>(std::move(mapping), g.key));
  return g;
}

void StagingRegistry::Remove(uint64_t id) {
  std::shared_ptr<Use::Slot> gone;
  absl::MutexLock l(&mu_);
  auto it = regions_.find(id);
  if (it == regions_.end()) return;
  // Unmapped outside the lock when no Use holds it any more.
  gone = std::move(it->second);
  regions_.erase(it);
}

absl::StatusOr<std::unique_ptr<StagingRegistry::Use>> StagingRegistry::Acquire(
    uint64_t id, absl::string_view key, absl::string_view tenant) {
  absl::MutexLock l(&mu_);
  auto it = regions_.find(id);
  if (it == regions_.end() || !SameKey(it->second->key, key)) {
    return absl::NotFoundError(absl::StrFormat(
        "header.staging.id: no staging region %016x with that key is "
        "registered on this daemon (it is unregistered when its client's "
        "connection to the staging socket closes)",
        id));
  }
  Use::Slot& slot = *it->second;
  if (slot.tenant.has_value() && *slot.tenant != tenant) {
    return absl::PermissionDeniedError(
        "header.staging: the staging region serves another tenant (a region "
        "serves the tenant whose Insert used it first)");
  }
  if (slot.in_use.exchange(true)) {
    return absl::FailedPreconditionError(
        "header.staging: another Insert is reading this staging region; one "
        "Insert at a time uses a region");
  }
  slot.tenant = std::string(tenant);
  return std::unique_ptr<Use>(new Use(it->second));
}

size_t StagingRegistry::size() const {
  absl::MutexLock l(&mu_);
  return regions_.size();
}

}  // namespace kvharbor
