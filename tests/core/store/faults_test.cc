// Faults of the tiered store, injected where they really happen: disk-full
// and failing writes through the disk tier's FileOps (core/base/file_ops.h),
// and corrupted bytes in a host-compressed buffer or a disk file. Each must end
// with the page servable byte-exact from where it was, or a clean miss, and
// be counted; corrupt bytes are never served.
#include <errno.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "core/base/file_ops.h"
#include "core/store/namespace.h"
#include "tests/core/store/tiers_test_util.h"
#include "tests/temp_dir.h"

namespace kvharbor {
namespace {

using namespace testing;  // NOLINT: the tier test helpers

// Forwards to the real calls unless a fault is switched on.
class FaultyFileOps final : public FileOps {
 public:
  enum class Fault { kNone, kDiskFull, kFsyncFails, kRenameFails };
  std::atomic<Fault> fault{Fault::kNone};
  mutable std::atomic<int> injected{0};

  int Open(const char* path, int flags, mode_t mode) const override {
    return real().Open(path, flags, mode);
  }
  ssize_t Write(int fd, const void* data, size_t n) const override {
    if (fault == Fault::kDiskFull) {
      // Like a filling disk: part of the data lands, then ENOSPC.
      if (n > 1) return real().Write(fd, data, n / 2);
      return Fail(ENOSPC);
    }
    return real().Write(fd, data, n);
  }
  int Fsync(int fd) const override {
    return fault == Fault::kFsyncFails ? Fail(EIO) : real().Fsync(fd);
  }
  int Close(int fd) const override { return real().Close(fd); }
  int Rename(const char* from, const char* to) const override {
    return fault == Fault::kRenameFails ? Fail(EROFS) : real().Rename(from, to);
  }
  int Unlink(const char* path) const override { return real().Unlink(path); }

 private:
  static const FileOps& real() { return *RealFileOps(); }
  int Fail(int err) const {
    ++injected;
    errno = err;
    return -1;
  }
};

std::shared_ptr<Namespace> MakeWithOps(uint64_t host_budget,
                                       const std::string& dir,
                                       std::shared_ptr<const FileOps> ops,
                                       std::vector<std::string>* log) {
  NamespaceConfig c = Config(host_budget, dir);
  c.file_ops = std::move(ops);
  return Make(std::move(c), 8, log);
}

bool HasTempFiles(const std::string& dir) {
  for (const auto& p : PageFiles(dir)) {
    if (p.extension() == ".tmp") return true;
  }
  return false;
}

TEST_CASE("faults: a full or failing disk keeps pages in the host tier") {
  using Fault = FaultyFileOps::Fault;
  const Fault fault =
      GENERATE(Fault::kDiskFull, Fault::kFsyncFails, Fault::kRenameFails);
  TempDir dir;
  const uint64_t pb = Geo().PageBytes();
  const std::string a = Pages(3, 21);
  auto ops = std::make_shared<FaultyFileOps>();
  std::vector<std::string> log;
  auto ns = MakeWithOps(8 * pb, dir.path, ops, &log);
  Insert(*ns, Seq(0, 12), a);
  ops->fault = fault;
  REQUIRE(ns->tiers().DemoteAll(Tier::kDisk).ok());
  CHECK(ops->injected > 0);
  REQUIRE(ns->CheckInvariants().ok());
  NamespaceStats k = ns->Counters();
  CHECK(k.disk_write_errors == 3);
  CHECK(k.tiers[1].pages == 3);
  CHECK(k.tiers[2].pages == 0);
  CHECK(PageFiles(dir.path).empty());  // no torn file, no temp file
  CHECK(!log.empty());
  std::vector<Tier> tiers;
  CHECK(Fetch(*ns, Seq(0, 12), FetchFormat::kRaw, &tiers) == a);
  CHECK(tiers == std::vector<Tier>(3, Tier::kHostCompressed));
  // The disk recovers: the same pages now go to disk, still byte-exact.
  ops->fault = Fault::kNone;
  REQUIRE(ns->tiers().DemoteAll(Tier::kDisk).ok());
  REQUIRE(ns->CheckInvariants().ok());
  CHECK(ns->Counters().tiers[2].pages == 3);
  CHECK(Fetch(*ns, Seq(0, 12), FetchFormat::kRaw) == a);
}

TEST_CASE("faults: a full disk over the host budget drops pages cleanly") {
  TempDir dir;
  const uint64_t pb = Geo().PageBytes();
  const std::string a = Pages(4, 22);
  auto ops = std::make_shared<FaultyFileOps>();
  auto ns = MakeWithOps(pb + pb / 2, dir.path, ops, nullptr);
  Insert(*ns, Seq(0, 16), a);
  ops->fault = FaultyFileOps::Fault::kDiskFull;
  REQUIRE(ns->tiers().DemoteAll(Tier::kDisk).ok());
  REQUIRE(ns->CheckInvariants().ok());
  NamespaceStats k = ns->Counters();
  CHECK(k.disk_write_errors > 0);
  CHECK(k.tiers[2].pages == 0);
  CHECK(k.tiers[1].bytes <= pb + pb / 2);
  CHECK(k.tiers[1].pages < 4);
  CHECK(!HasTempFiles(dir.path));
  // What is left is a servable prefix; the rest is a clean miss.
  auto m = ns->Match(Seq(0, 16), false, absl::ZeroDuration());
  REQUIRE(m.ok());
  CHECK(m->matched_tokens == k.tiers[1].pages * 4);
  if (m->matched_tokens > 0) {
    CHECK(Fetch(*ns, Seq(0, 16), FetchFormat::kRaw) ==
          a.substr(0, m->matched_tokens / 4 * pb));
  }
}

// Flips one byte of the stored buffer of the page `h` in the host tier, as
// a memory fault would: the buffer a COMPRESSED pin shares with the tier.
void CorruptHostBuffer(Namespace& ns, PageHandle h) {
  auto pinned =
      ns.PinPages(absl::MakeConstSpan(&h, 1), FetchFormat::kCompressed);
  REQUIRE(pinned.ok());
  REQUIRE(pinned->tier(0) == Tier::kHostCompressed);
  const absl::string_view b = pinned->bytes(0);
  REQUIRE(b.size() > 40);
  const_cast<char*>(b.data())[b.size() / 2] ^= 0x10;
}

TEST_CASE("faults: a corrupted host-compressed buffer is a counted miss") {
  const uint64_t pb = Geo().PageBytes();
  const std::string a = Pages(3, 23);
  std::vector<std::string> log;
  auto ns = Make(Config(16 * pb), 8, &log);
  Insert(*ns, Seq(0, 12), a);
  REQUIRE(*ns->tiers().DemoteAll(Tier::kHostCompressed) == 3);
  auto m = ns->Match(Seq(0, 12), false, absl::ZeroDuration());
  REQUIRE(m->pages.size() == 3);
  CorruptHostBuffer(*ns, m->pages[1]);
  const FetchFormat format =
      GENERATE(FetchFormat::kRaw, FetchFormat::kCompressed);
  auto pinned = ns->PinPages(m->pages, format);
  CHECK(pinned.status().code() == absl::StatusCode::kDataLoss);
  CHECK(ns->Counters().corrupt_dropped == 1);
  REQUIRE(ns->CheckInvariants().ok());
  // Page 1 and the page extending it are gone; page 0 is intact.
  auto again = ns->Match(Seq(0, 12), false, absl::ZeroDuration());
  CHECK(again->matched_tokens == 4);
  CHECK(Fetch(*ns, Seq(0, 12), FetchFormat::kRaw) == a.substr(0, pb));
  CHECK(ns->PinPages(absl::MakeConstSpan(&m->pages[1], 1), format)
            .status()
            .code() == absl::StatusCode::kNotFound);
  CHECK(log.size() == 1);
}

TEST_CASE("faults: a corrupted host buffer is never written to disk") {
  TempDir dir;
  const uint64_t pb = Geo().PageBytes();
  const std::string a = Pages(2, 24), b = Pages(1, 25);
  auto ns = Make(Config(16 * pb, dir.path), 8);
  Insert(*ns, Seq(0, 8), a);
  Insert(*ns, Seq(90, 4), b);
  REQUIRE(*ns->tiers().DemoteAll(Tier::kHostCompressed) == 3);
  auto m = ns->Match(Seq(90, 4), false, absl::ZeroDuration());
  REQUIRE(m->pages.size() == 1);
  CorruptHostBuffer(*ns, m->pages[0]);
  REQUIRE(ns->tiers().DemoteAll(Tier::kDisk).ok());
  REQUIRE(ns->CheckInvariants().ok());
  NamespaceStats k = ns->Counters();
  CHECK(k.corrupt_dropped == 1);
  CHECK(k.tiers[2].pages == 2);
  CHECK(PageFiles(dir.path).size() == 2);
  CHECK(ns->Match(Seq(90, 4), false, absl::ZeroDuration())->matched_tokens ==
        0);
  CHECK(Fetch(*ns, Seq(0, 8), FetchFormat::kRaw) == a);
}

TEST_CASE("faults: a corrupted disk file is a counted miss, never served") {
  TempDir dir;
  const uint64_t pb = Geo().PageBytes();
  const std::string a = Pages(2, 26);
  std::vector<std::string> log;
  auto ns = Make(Config(pb, dir.path), 8, &log);
  Insert(*ns, Seq(0, 8), a);
  REQUIRE(*ns->tiers().DemoteAll(Tier::kDisk) > 0);
  REQUIRE(ns->Counters().tiers[2].pages == 2);
  // Corrupt the second page's file (the longer prefix: the larger file).
  std::vector<fs::path> files = PageFiles(dir.path);
  REQUIRE(files.size() == 2);
  std::sort(files.begin(), files.end(), [](const auto& x, const auto& y) {
    return fs::file_size(x) < fs::file_size(y);
  });
  const size_t from_end = GENERATE(size_t{1}, size_t{20}, size_t{400});
  FlipByte(files[1], from_end);
  auto m = ns->Match(Seq(0, 8), false, absl::ZeroDuration());
  REQUIRE(m->pages.size() == 2);
  CHECK(ns->PinPages(m->pages, FetchFormat::kRaw).status().code() ==
        absl::StatusCode::kDataLoss);
  CHECK(ns->Counters().corrupt_dropped == 1);
  CHECK(!fs::exists(files[1]));
  REQUIRE(ns->CheckInvariants().ok());
  CHECK(ns->Match(Seq(0, 8), false, absl::ZeroDuration())->matched_tokens == 4);
  CHECK(Fetch(*ns, Seq(0, 8), FetchFormat::kRaw) == a.substr(0, pb));
  CHECK(!log.empty());
}

TEST_CASE("faults: a leased corrupt page is refused, dropped after release") {
  const uint64_t pb = Geo().PageBytes();
  auto ns = Make(Config(16 * pb), 8);
  Insert(*ns, Seq(0, 8), Pages(2, 27));
  REQUIRE(*ns->tiers().DemoteAll(Tier::kHostCompressed) == 2);
  auto m = ns->Match(Seq(0, 8), true, absl::ZeroDuration());
  REQUIRE(m->lease_id != 0);
  CorruptHostBuffer(*ns, m->pages[0]);
  CHECK(ns->PinLease(m->lease_id, 0, 0).status().code() ==
        absl::StatusCode::kDataLoss);
  CHECK(ns->Counters().corrupt_dropped == 0);  // leased: cannot go yet
  REQUIRE(ns->Release(m->lease_id).ok());
  CHECK(ns->PinPages(m->pages).status().code() == absl::StatusCode::kDataLoss);
  CHECK(ns->Counters().corrupt_dropped == 1);
  CHECK(ns->Counters().cached_pages == 0);
  REQUIRE(ns->CheckInvariants().ok());
}

}  // namespace
}  // namespace kvharbor
