// HostBlock: one large host allocation for the bytes a fetch materialises
// (device pages read back, cold pages decoded).
//
// A fresh multi-GiB allocation faulted in 4 KiB pages from user space costs
// more than copying into it (measured on the GPU machine: a 4 GiB device
// hit spent most of its time in first-touch page faults). HostBlock maps
// anonymous memory, asks for transparent huge pages (MADV_HUGEPAGE) and has
// the kernel populate it in one call (MADV_POPULATE_WRITE, Linux 5.14+);
// where either advice is refused the memory is simply faulted on first
// touch, as with new[].
//
// Memory: owns the mapping, unmapped by the destructor. Thread-safety:
// immutable after Create; distinct blocks are independent.
#ifndef KVHARBOR_CORE_MEMORY_HOST_BLOCK_H_
#define KVHARBOR_CORE_MEMORY_HOST_BLOCK_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"

namespace kvharbor {

class HostBlock {
 public:
  // ResourceExhausted when the mapping fails; `bytes` > 0.
  static absl::StatusOr<std::unique_ptr<HostBlock>> Create(size_t bytes);
  ~HostBlock();
  HostBlock(const HostBlock&) = delete;
  HostBlock& operator=(const HostBlock&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  HostBlock(uint8_t* data, size_t mapped, size_t size)
      : data_(data), mapped_(mapped), size_(size) {}
  uint8_t* const data_;
  const size_t mapped_;
  const size_t size_;
};

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_MEMORY_HOST_BLOCK_H_
