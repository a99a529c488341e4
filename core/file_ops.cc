#include "core/file_ops.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>

namespace kvharbor {

namespace {

class SystemFileOps final : public FileOps {
 public:
  int Open(const char* path, int flags, mode_t mode) const override {
    return ::open(path, flags, mode);
  }
  ssize_t Write(int fd, const void* data, size_t n) const override {
    return ::write(fd, data, n);
  }
  int Fsync(int fd) const override { return ::fsync(fd); }
  int Close(int fd) const override { return ::close(fd); }
  int Rename(const char* from, const char* to) const override {
    return std::rename(from, to);
  }
  int Unlink(const char* path) const override { return ::unlink(path); }
};

}  // namespace

const std::shared_ptr<const FileOps>& RealFileOps() {
  // Leaked on purpose: disk tiers may outlive static destruction order.
  static const auto* ops =
      new std::shared_ptr<const FileOps>(std::make_shared<SystemFileOps>());
  return *ops;
}

}  // namespace kvharbor
