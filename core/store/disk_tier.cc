#include "core/store/disk_tier.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxh3.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/byte_io.h"
#include "core/base/status_macros.h"

namespace kvharbor {

namespace {

constexpr char kMagic[8] = {'K', 'V', 'H', 'P', 'A', 'G', 'E', '1'};
constexpr uint32_t kVersion = 1;
constexpr uint32_t kMaxCodecName = 64;
constexpr char kPrefix[] = "page-";
constexpr char kSuffix[] = ".kvh";
constexpr char kTmpSuffix[] = ".tmp";

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::InternalError(
      absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

}  // namespace

std::string SerializeDiskPage(const DiskPage& page) {
  ByteWriter w;
  w.PutBytes(kMagic, sizeof(kMagic));
  w.Put<uint32_t>(kVersion);
  w.Put<uint32_t>(static_cast<uint32_t>(page.codec.size()));
  w.PutBytes(page.codec.data(), page.codec.size());
  w.Put<uint64_t>(page.calibration_fingerprint);
  w.Put<uint64_t>(page.first_position);
  w.Put<uint64_t>(page.tokens.size());
  w.PutBytes(page.tokens.data(), page.tokens.size() * sizeof(Token));
  w.Put<uint64_t>(page.buffer.size());
  w.PutBytes(page.buffer.data(), page.buffer.size());
  w.Put<uint64_t>(XXH3_64bits(w.bytes().data(), w.size()));
  return w.Release();
}

absl::StatusOr<DiskPage> ParseDiskPage(absl::string_view bytes) {
  if (bytes.size() < sizeof(kMagic) + sizeof(uint64_t)) {
    return absl::DataLossError(
        absl::StrCat("disk page: ", bytes.size(), " bytes is too short"));
  }
  const size_t body = bytes.size() - sizeof(uint64_t);
  uint64_t stored;
  std::memcpy(&stored, bytes.data() + body, sizeof(stored));
  if (XXH3_64bits(bytes.data(), body) != stored) {
    return absl::DataLossError("disk page: checksum mismatch");
  }
  ByteReader r(
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes.data()), body),
      "disk page");
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError("disk page: bad magic");
  }
  KVH_RETURN_IF_ERROR(r.Skip(sizeof(kMagic), "magic"));
  uint32_t version = 0, codec_len = 0;
  KVH_RETURN_IF_ERROR(r.Read(&version, "version"));
  if (version != kVersion) {
    return absl::DataLossError(
        absl::StrCat("disk page: version ", version, " unsupported"));
  }
  KVH_RETURN_IF_ERROR(r.Read(&codec_len, "codec_len"));
  if (codec_len > kMaxCodecName) {
    return absl::DataLossError("disk page: codec_len too large");
  }
  DiskPage page;
  KVH_RETURN_IF_ERROR(r.Need(codec_len, "codec"));
  page.codec.assign(reinterpret_cast<const char*>(r.cursor()), codec_len);
  KVH_RETURN_IF_ERROR(r.Skip(codec_len, "codec"));
  uint64_t num_tokens = 0, buffer_len = 0;
  KVH_RETURN_IF_ERROR(
      r.Read(&page.calibration_fingerprint, "calibration_fingerprint"));
  KVH_RETURN_IF_ERROR(r.Read(&page.first_position, "first_position"));
  KVH_RETURN_IF_ERROR(r.Read(&num_tokens, "num_tokens"));
  if (num_tokens == 0 || num_tokens > r.remaining() / sizeof(Token)) {
    return absl::DataLossError("disk page: num_tokens out of range");
  }
  page.tokens.resize(num_tokens);
  std::memcpy(page.tokens.data(), r.cursor(), num_tokens * sizeof(Token));
  KVH_RETURN_IF_ERROR(r.Skip(num_tokens * sizeof(Token), "tokens"));
  KVH_RETURN_IF_ERROR(r.Read(&buffer_len, "buffer_len"));
  if (buffer_len != r.remaining()) {
    return absl::DataLossError("disk page: buffer_len disagrees with size");
  }
  page.buffer.assign(reinterpret_cast<const char*>(r.cursor()), buffer_len);
  // The elements are token ids or encoded page keys (any int32 words):
  // the namespace that indexes them checks them for its key kind
  // (Namespace::LoadDiskTier); the checksum above covers their bytes.
  return page;
}

absl::StatusOr<std::unique_ptr<DiskTier>> DiskTier::Open(
    std::string dir, absl::string_view field,
    std::shared_ptr<const FileOps> ops) {
  if (dir.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": empty"));
  }
  if (MakePrivateDirectory(dir) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": cannot create '", dir, "': ", std::strerror(errno)));
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", dir, "' is not a directory"));
  }
  if (ops == nullptr) ops = RealFileOps();
  return std::unique_ptr<DiskTier>(
      new DiskTier(std::move(dir), std::move(ops)));
}

std::string DiskTier::PathOf(uint64_t id) const {
  return absl::StrFormat("%s/%s%016x%s", dir_, kPrefix, id, kSuffix);
}

absl::Status DiskTier::Write(uint64_t id, const DiskPage& page) const {
  return WriteFileAtomically(*ops_, dir_, PathOf(id), SerializeDiskPage(page));
}

absl::StatusOr<int> DiskTier::OpenPage(uint64_t id) const {
  const std::string path = PathOf(id);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errno("open", path);
  return fd;
}

absl::StatusOr<DiskPage> DiskTier::ReadOpened(int fd) {
  KVH_ASSIGN_OR_RETURN(const std::string bytes,
                       ReadAllAndClose(fd, "disk page"));
  return ParseDiskPage(bytes);
}

void DiskTier::Remove(uint64_t id) const { ops_->Unlink(PathOf(id).c_str()); }

DiskTier::ScanResult DiskTier::Scan() const {
  ScanResult out;
  for (const std::string& name : ListDirectory(dir_)) {
    const std::string path = absl::StrCat(dir_, "/", name);
    if (absl::StartsWith(name, kPrefix) && absl::EndsWith(name, kTmpSuffix)) {
      ops_->Unlink(path.c_str());
      out.dropped.push_back(absl::StrCat("removed unfinished write ", path));
      continue;
    }
    uint64_t id = 0;
    if (!ParseHexFileName(name, kPrefix, kSuffix, &id)) continue;  // not ours
    absl::StatusOr<DiskPage> page = [&]() -> absl::StatusOr<DiskPage> {
      KVH_ASSIGN_OR_RETURN(int fd, OpenPage(id));
      return ReadOpened(fd);
    }();
    if (!page.ok()) {
      ops_->Unlink(path.c_str());
      out.dropped.push_back(absl::StrCat("dropped corrupt disk page ", path,
                                         ": ", page.status().message()));
      continue;
    }
    out.max_id = std::max(out.max_id, id);
    out.pages.emplace_back(id, *std::move(page));
  }
  return out;
}

}  // namespace kvharbor
