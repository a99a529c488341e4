#include "core/base/file_ops.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

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

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::InternalError(
      absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

absl::Status WriteAll(const FileOps& ops, int fd, absl::string_view data,
                      const std::string& p) {
  while (!data.empty()) {
    const ssize_t n = ops.Write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Errno("write", p);
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

}  // namespace

int FileOps::Fchmod(int fd, mode_t mode) const { return ::fchmod(fd, mode); }

int MakePrivateDirectory(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0) return errno == EEXIST ? 0 : -1;
  return ::chmod(dir.c_str(), 0700);  // the umask may have taken bits away
}

const std::shared_ptr<const FileOps>& RealFileOps() {
  // Leaked on purpose: disk tiers may outlive static destruction order.
  static const auto* ops =
      new std::shared_ptr<const FileOps>(std::make_shared<SystemFileOps>());
  return *ops;
}

absl::Status WriteFileAtomically(const FileOps& ops, const std::string& dir,
                                 const std::string& path,
                                 absl::string_view bytes) {
  const std::string tmp = path + ".tmp";
  const int fd =
      ops.Open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("open", tmp);
  // The umask can only take bits away; fchmod makes it exactly 0600 (a file
  // left from an earlier run keeps its mode through O_TRUNC otherwise).
  absl::Status s =
      ops.Fchmod(fd, 0600) == 0 ? absl::OkStatus() : Errno("fchmod", tmp);
  if (s.ok()) s = WriteAll(ops, fd, bytes, tmp);
  if (s.ok() && ops.Fsync(fd) != 0) s = Errno("fsync", tmp);
  if (ops.Close(fd) != 0 && s.ok()) s = Errno("close", tmp);
  if (s.ok() && ops.Rename(tmp.c_str(), path.c_str()) != 0) {
    s = Errno("rename", tmp);
  }
  if (!s.ok()) {
    ops.Unlink(tmp.c_str());
    return s;
  }
  // The rename is durable only once the directory entry is.
  const int dfd = ops.Open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
  if (dfd >= 0) {
    ops.Fsync(dfd);
    ops.Close(dfd);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadAllAndClose(int fd, absl::string_view what) {
  std::string bytes;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return absl::DataLossError(
          absl::StrCat(what, ": read: ", std::strerror(err)));
    }
    if (n == 0) break;
    bytes.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return bytes;
}

std::vector<std::string> ListDirectory(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return names;
  while (const dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
  ::closedir(d);
  return names;
}

bool ParseHexFileName(absl::string_view name, absl::string_view prefix,
                      absl::string_view suffix, uint64_t* id) {
  if (name.size() <= prefix.size() + suffix.size() ||
      !absl::StartsWith(name, prefix) || !absl::EndsWith(name, suffix)) {
    return false;
  }
  name.remove_prefix(prefix.size());
  name.remove_suffix(suffix.size());
  return absl::SimpleHexAtoi(name, id);
}

}  // namespace kvharbor
