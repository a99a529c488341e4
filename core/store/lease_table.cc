#include "core/store/lease_table.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"

namespace kvharbor {

LeaseTable::LeaseTable(std::string ns_name, absl::Duration default_ttl,
                       absl::Duration max_ttl)
    : ns_name_(std::move(ns_name)),
      default_ttl_(default_ttl),
      max_ttl_(max_ttl) {}

absl::Duration LeaseTable::ClampTtl(absl::Duration ttl) const {
  if (ttl <= absl::ZeroDuration()) ttl = default_ttl_;
  return std::min(ttl, max_ttl_);
}

absl::Status LeaseTable::NotFound(uint64_t id) const {
  return absl::NotFoundError(absl::StrFormat(
      "lease_id: %u is not an active lease of namespace '%s'", id, ns_name_));
}

uint64_t LeaseTable::Add(Nodes nodes, std::vector<PageHandle> pages,
                         absl::Duration ttl, absl::Time* expiry) {
  *expiry = absl::Now() + ClampTtl(ttl);
  absl::MutexLock l(&mu_);
  uint64_t id;
  do {
    id = absl::Uniform<uint64_t>(rng_);
  } while (id == 0 || leases_.contains(id));
  page_refs_ += pages.size();
  node_refs_ += nodes.size();
  leases_.emplace(id, Lease{std::move(nodes), std::move(pages), *expiry});
  return id;
}

absl::StatusOr<LeaseTable::Nodes> LeaseTable::Remove(uint64_t id) {
  absl::MutexLock l(&mu_);
  auto it = leases_.find(id);
  if (it == leases_.end()) return NotFound(id);
  Nodes nodes = std::move(it->second.nodes);
  page_refs_ -= it->second.pages.size();
  node_refs_ -= nodes.size();
  leases_.erase(it);
  return nodes;
}

std::vector<LeaseTable::Nodes> LeaseTable::RemoveExpired(absl::Time now) {
  std::vector<Nodes> nodes;
  absl::MutexLock l(&mu_);
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.expiry < now) {
      page_refs_ -= it->second.pages.size();
      node_refs_ -= it->second.nodes.size();
      nodes.push_back(std::move(it->second.nodes));
      leases_.erase(it++);
    } else {
      ++it;
    }
  }
  return nodes;
}

std::vector<LeaseTable::Nodes> LeaseTable::RemoveAll() {
  std::vector<Nodes> nodes;
  absl::MutexLock l(&mu_);
  for (auto& [id, lease] : leases_) nodes.push_back(std::move(lease.nodes));
  leases_.clear();
  page_refs_ = 0;
  node_refs_ = 0;
  return nodes;
}

bool LeaseTable::Contains(uint64_t id) const {
  absl::MutexLock l(&mu_);
  return leases_.contains(id);
}

size_t LeaseTable::size() const {
  absl::MutexLock l(&mu_);
  return leases_.size();
}

uint64_t LeaseTable::page_refs() const {
  absl::MutexLock l(&mu_);
  return page_refs_;
}

uint64_t LeaseTable::bytes() const {
  absl::MutexLock l(&mu_);
  return page_refs_ * sizeof(PageHandle) + node_refs_ * sizeof(RadixNode*) +
         leases_.size() * kRecordBytes;
}

absl::StatusOr<LeaseTable::Lease> LeaseTable::Get(uint64_t id) const {
  absl::MutexLock l(&mu_);
  auto it = leases_.find(id);
  if (it == leases_.end()) return NotFound(id);
  return it->second;
}

absl::StatusOr<std::vector<PageHandle>> LeaseTable::Slice(
    uint64_t id, uint32_t start, uint32_t count) const {
  absl::MutexLock l(&mu_);
  auto it = leases_.find(id);
  if (it == leases_.end()) return NotFound(id);
  const std::vector<PageHandle>& pages = it->second.pages;
  if (start >= pages.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "start_page: %u is past the lease's %u pages", start, pages.size()));
  }
  if (count == 0) count = static_cast<uint32_t>(pages.size() - start);
  if (count > pages.size() - start) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "page_count: %u pages from start_page %u run past the lease's %u "
        "pages",
        count, start, pages.size()));
  }
  return std::vector<PageHandle>(pages.begin() + start,
                                 pages.begin() + start + count);
}

absl::StatusOr<absl::Time> LeaseTable::Extend(uint64_t id, absl::Duration ttl) {
  const absl::Time expiry = absl::Now() + ClampTtl(ttl);
  absl::MutexLock l(&mu_);
  auto it = leases_.find(id);
  if (it == leases_.end()) return NotFound(id);
  it->second.expiry = expiry;
  return expiry;
}

void LeaseTable::ReplaceHandle(PageHandle old_h, PageHandle new_h) {
  absl::MutexLock l(&mu_);
  for (auto& [id, lease] : leases_) {
    std::replace(lease.pages.begin(), lease.pages.end(), old_h, new_h);
  }
}

}  // namespace kvharbor
