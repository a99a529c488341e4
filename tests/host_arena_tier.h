// A stand-in device tier for the CPU tests of same-host zero copy
// (GetDeviceHandles, stage_cold, placed uploads): pools that say kDevice but
// live in one host "arena", so a test can read and write what the offsets
// point at. No GPU encoder or decoder (the namespace codes on the CPU); an
// IPC export whose handle is fixed bytes and whose base is the arena's
// address; ChecksumPages on the CPU unless `gpu_checksums` is false (then
// the namespace reads pages back, as with a tier that cannot). The real
// tier is cuda/tier/device_tier.h, checked on the GPU machine (tests/cuda).
// Test-only, header-only. The tier's counters are atomic; pools follow the
// PagePool contract.
#ifndef KVHARBOR_TESTS_HOST_ARENA_TIER_H_
#define KVHARBOR_TESTS_HOST_ARENA_TIER_H_

#include <xxh3.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/memory/page_pool.h"
#include "core/store/device_tier.h"

namespace kvharbor {
namespace testing {

// A PagePool that says kDevice but lives in a host arena shared with its
// siblings, like DevicePagePool's ranges of one cudaMalloc.
class HostArenaPool final : public SlotPagePool {
 public:
  HostArenaPool(uint8_t* base, size_t slot_bytes, uint32_t capacity)
      : SlotPagePool("host arena pool", base, slot_bytes, capacity) {}
  MemoryKind kind() const override { return MemoryKind::kDevice; }
  absl::Status Write(uint32_t slot, size_t offset, const uint8_t* src,
                     size_t n) override {
    std::memcpy(Data(slot) + offset, src, n);
    return absl::OkStatus();
  }
  absl::Status Read(uint32_t slot, uint8_t* dst) override {
    std::memcpy(dst, Data(slot), slot_bytes());
    return absl::OkStatus();
  }
};

class HostArenaTier final : public DeviceTier {
 public:
  explicit HostArenaTier(size_t bytes, bool gpu_checksums = true)
      : arena_(bytes), gpu_checksums_(gpu_checksums) {}
  std::string Describe() const override { return "host arena (test)"; }
  uint64_t arena_bytes() const override { return arena_.size(); }
  absl::StatusOr<std::unique_ptr<PagePool>> CreatePool(
      size_t slot_bytes, uint32_t capacity) override {
    const size_t n = slot_bytes * capacity;
    if (arena_.size() - used_ < n + 256) {
      return absl::ResourceExhaustedError("host arena full");
    }
    // Not at offset 0, so an offset computed from the pool (not the arena)
    // would be caught.
    used_ += 256;
    auto pool = std::make_unique<HostArenaPool>(arena_.data() + used_,
                                                slot_bytes, capacity);
    used_ += n;
    return std::unique_ptr<PagePool>(std::move(pool));
  }
  absl::StatusOr<std::unique_ptr<PageBatchEncoder>> CreateEncoder(
      const DeviceEncoderParams&) override {
    return std::unique_ptr<PageBatchEncoder>();
  }
  absl::StatusOr<std::unique_ptr<PageBatchDecoder>> CreateDecoder(
      const DeviceEncoderParams&) override {
    return std::unique_ptr<PageBatchDecoder>();
  }
  absl::StatusOr<DeviceIpcExport> ExportIpc() override {
    DeviceIpcExport e;
    e.handle = std::string(64, 'h');
    e.device = 3;
    e.device_uuid = std::string(16, 'u');
    e.arena_bytes = arena_.size();
    e.arena_base = reinterpret_cast<uintptr_t>(arena_.data());
    return e;
  }
  absl::StatusOr<std::vector<uint64_t>> ChecksumPages(
      absl::Span<const uint8_t* const> pages, uint64_t bytes) override {
    if (!gpu_checksums_) return DeviceTier::ChecksumPages(pages, bytes);
    checksummed_pages_ += pages.size();
    std::vector<uint64_t> out;
    for (const uint8_t* p : pages) out.push_back(XXH3_64bits(p, bytes));
    return out;
  }
  const uint8_t* base() const { return arena_.data(); }
  uint8_t* mutable_base() { return arena_.data(); }
  // Pages ChecksumPages hashed (the "GPU" path).
  uint64_t checksummed_pages() const { return checksummed_pages_.load(); }

 private:
  std::vector<uint8_t> arena_;
  size_t used_ = 0;
  const bool gpu_checksums_;
  std::atomic<uint64_t> checksummed_pages_{0};
};

}  // namespace testing
}  // namespace kvharbor

#endif  // KVHARBOR_TESTS_HOST_ARENA_TIER_H_
