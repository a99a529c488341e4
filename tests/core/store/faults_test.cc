// Faults of the tiered store, injected where they really happen: disk-full
// and failing writes through the disk tier's FileOps (core/base/file_ops.h),
// and corrupted bytes in a host-compressed buffer or a disk file. Each must end
// with the page servable byte-exact from where it was, or a clean miss, and
// be counted; corrupt bytes are never served.
#include <errno.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
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

// The page files of `dir`, smallest first (a page with a shorter prefix
// has the smaller file).
std::vector<fs::path> PageFilesBySize(const std::string& dir) {
  std::vector<fs::path> files = PageFiles(dir);
  std::sort(files.begin(), files.end(), [](const auto& x, const auto& y) {
    return fs::file_size(x) < fs::file_size(y);
  });
  return files;
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
  // The demotion stops at the first refused batch and says so; nothing is
  // dropped: the refused pages stay in the host tier, the rest raw.
  absl::StatusOr<DemoteOutcome> d = ns->tiers().Demote(Tier::kDisk);
  CHECK(d.status().code() == absl::StatusCode::kUnavailable);
  CHECK(absl::StrContains(d.status().message(), "refused 2 page writes"));
  CHECK(absl::StrContains(d.status().message(), "no page was dropped"));
  CHECK(ops->injected > 0);
  REQUIRE(ns->CheckInvariants().ok());
  NamespaceStats k = ns->Counters();
  CHECK(k.disk_write_errors == 2);  // one batch (tier_batch_pages 2)
  CHECK(k.tiers[0].pages == 1);
  CHECK(k.tiers[1].pages == 2);
  CHECK(k.tiers[2].pages == 0);
  CHECK(PageFiles(dir.path).empty());  // no torn file, no temp file
  CHECK(!log.empty());
  std::vector<Tier> tiers;
  CHECK(Fetch(*ns, Seq(0, 12), FetchFormat::kRaw, &tiers) == a);
  // The coldest pages (the tail) went first.
  CHECK(tiers == std::vector<Tier>{Tier::kRaw, Tier::kHostCompressed,
                                   Tier::kHostCompressed});
  // The disk recovers: the same pages now go to disk, still byte-exact.
  ops->fault = Fault::kNone;
  REQUIRE(ns->tiers().DemoteAll(Tier::kDisk).ok());
  REQUIRE(ns->CheckInvariants().ok());
  CHECK(ns->Counters().tiers[2].pages == 3);
  CHECK(Fetch(*ns, Seq(0, 12), FetchFormat::kRaw) == a);
}

TEST_CASE("faults: a full disk over the host budget drops pages cleanly") {
  // An insert's room-making (MakeRoom) must keep the host tier within its
  // budget: with the disk refusing, its coldest pages go. (Demote does not
  // drop; see "a read-only disk_dir" below.)
  TempDir dir;
  const uint64_t pb = Geo().PageBytes();
  const std::string a = Pages(4, 22);
  auto ops = std::make_shared<FaultyFileOps>();
  auto ns = MakeWithOps(pb + pb / 2, dir.path, ops, nullptr);
  Insert(*ns, Seq(0, 16), a);
  ops->fault = FaultyFileOps::Fault::kDiskFull;
  ns->tiers().MakeRoom(8);
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

TEST_CASE("faults: a page changed in memory is never written to disk") {
  // A host-compressed buffer, or a raw page (what a client writing into a
  // shared arena would do; the arena is sealed now, this guards the tier
  // moves themselves): bytes that no longer hash to what was stored are
  // dropped and counted, never given a fresh checksum in a new tier.
  const bool raw = GENERATE(false, true);
  TempDir dir;
  const uint64_t pb = Geo().PageBytes();
  const std::string a = Pages(2, 24), b = Pages(1, 25);
  auto ns = Make(Config(16 * pb, dir.path), 8);
  Insert(*ns, Seq(0, 8), a);
  Insert(*ns, Seq(90, 4), b);
  if (!raw) REQUIRE(*ns->tiers().DemoteAll(Tier::kHostCompressed) == 3);
  auto m = ns->Match(Seq(90, 4), false, absl::ZeroDuration());
  REQUIRE(m->pages.size() == 1);
  if (raw) {
    auto pinned = ns->PinPages(m->pages);
    REQUIRE(pinned.ok());
    const_cast<uint8_t*>(pinned->data(0))[7] ^= 0x01;
  } else {
    CorruptHostBuffer(*ns, m->pages[0]);
  }
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
  const std::vector<fs::path> files = PageFilesBySize(dir.path);
  REQUIRE(files.size() == 2);
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

TEST_CASE("faults: a corrupt disk page under leases goes when they end") {
  // Found by a hostile client: Match(lock) + Fetch + Release in a loop kept
  // a corrupt disk page leased at every read, so it was never dropped.
  TempDir dir;
  const uint64_t pb = Geo().PageBytes();
  const std::string a = Pages(2, 29);
  auto ns = Make(Config(pb, dir.path), 8);
  Insert(*ns, Seq(0, 8), a);
  REQUIRE(*ns->tiers().DemoteAll(Tier::kDisk) > 0);
  REQUIRE(ns->Counters().tiers[2].pages == 2);
  const std::vector<fs::path> files = PageFilesBySize(dir.path);
  REQUIRE(files.size() == 2);
  FlipByte(files[1], 20);  // the second page (the longer prefix)
  auto first = ns->Match(Seq(0, 8), true, absl::ZeroDuration());
  auto second = ns->Match(Seq(0, 8), true, absl::ZeroDuration());
  REQUIRE(first->pages.size() == 2);
  CHECK(ns->PinLease(first->lease_id, 0, 0).status().code() ==
        absl::StatusCode::kDataLoss);
  CHECK(ns->Counters().corrupt_dropped == 0);  // two leases hold it
  // A new Match stops before it: no new lease keeps it alive.
  auto third = ns->Match(Seq(0, 8), true, absl::ZeroDuration());
  CHECK(third->matched_tokens == 4);
  CHECK(third->pages.size() == 1);
  REQUIRE(ns->Release(first->lease_id).ok());
  CHECK(ns->Counters().corrupt_dropped == 0);  // the second lease remains
  // Its lease is not renewed by reading it: it fails, and the page goes
  // when the lease ends (here by expiry, through the reaper).
  CHECK(ns->PinLease(second->lease_id, 0, 0).status().code() ==
        absl::StatusCode::kDataLoss);
  CHECK(ns->ReapExpiredLeases(absl::InfiniteFuture()) == 2);
  CHECK(ns->Counters().corrupt_dropped == 1);
  CHECK(ns->Counters().cached_pages == 1);
  CHECK(!fs::exists(files[1]));
  REQUIRE(ns->CheckInvariants().ok());
  CHECK(ns->Match(Seq(0, 8), false, absl::ZeroDuration())->matched_tokens == 4);
  CHECK(Fetch(*ns, Seq(0, 8), FetchFormat::kRaw) == a.substr(0, pb));
}

// Makes `dir` read-only for real: a read-only bind mount of it onto itself
// (root), else mode 0555 (not root: the mode binds). False when neither can
// be done here.
bool MakeReadOnly(const std::string& dir) {
  if (::mount(dir.c_str(), dir.c_str(), nullptr, MS_BIND, nullptr) == 0) {
    if (::mount(nullptr, dir.c_str(), nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY,
                nullptr) == 0) {
      return true;
    }
    ::umount2(dir.c_str(), MNT_DETACH);
  }
  return geteuid() != 0 && ::chmod(dir.c_str(), 0555) == 0;
}
void MakeWritable(const std::string& dir) {
  if (::umount2(dir.c_str(), MNT_DETACH) != 0) ::chmod(dir.c_str(), 0700);
}

TEST_CASE("faults: a read-only disk_dir: Demote says what it did, drops none") {
  // Reproduces the finding: 32 pages, 16 fit the host tier; Demote to disk
  // on a read-only disk answered OK with pages_moved 16 while 32 pages
  // vanished, those already in the host tier included.
  TempDir dir;
  const uint64_t pb = Geo().PageBytes();
  const std::string a = Pages(32, 32);
  NamespaceConfig c = Config(16 * pb, dir.path + "/disk");
  c.tier_batch_pages = 8;
  std::vector<std::string> log;
  auto ns = Make(std::move(c), 32, &log);
  Insert(*ns, Seq(0, 128), a);
  if (!MakeReadOnly(dir.path + "/disk")) {
    WARN("cannot make a directory read-only here; not checked");
    return;
  }
  // To the host tier: it takes what fits (16 pages' worth of identity
  // buffers, a little larger than raw pages), then the next batch would
  // have to go to disk, which refuses: the demotion stops and says so.
  absl::StatusOr<DemoteOutcome> host =
      ns->tiers().Demote(Tier::kHostCompressed);
  const uint64_t in_host = ns->Counters().tiers[1].pages;
  absl::StatusOr<DemoteOutcome> d = ns->tiers().Demote(Tier::kDisk);
  MakeWritable(dir.path + "/disk");
  INFO(host.status().ToString());
  INFO(d.status().ToString());
  CHECK(in_host >= 14);
  CHECK(host.status().code() == absl::StatusCode::kUnavailable);
  CHECK(absl::StrContains(host.status().message(),
                          absl::StrCat("after ", in_host,
                                       " pages moved to host_compressed and "
                                       "0 to disk")));
  CHECK(d.status().code() == absl::StatusCode::kUnavailable);
  CHECK(absl::StrContains(d.status().message(), "Read-only file system"));
  CHECK(absl::StrContains(d.status().message(),
                          "after 0 pages moved to host_compressed and 0 to "
                          "disk; no page was dropped: 32 pages stay"));
  REQUIRE(ns->CheckInvariants().ok());
  NamespaceStats k = ns->Counters();
  CHECK(k.cached_pages == 32);
  CHECK(k.tiers[1].pages == in_host);
  CHECK(k.tiers[2].pages == 0);
  CHECK(k.disk_write_errors == 16);  // one batch of 8 per Demote
  CHECK(Fetch(*ns, Seq(0, 128), FetchFormat::kRaw) == a);
  // Writable again: everything goes to disk.
  absl::StatusOr<DemoteOutcome> again = ns->tiers().Demote(Tier::kDisk);
  REQUIRE(again.ok());
  CHECK(again->to_disk == 32);
  CHECK(again->to_host_compressed == 32 - in_host);  // those still raw
  CHECK(again->pages_left == 0);
  CHECK(ns->Counters().tiers[2].pages == 32);
  CHECK(Fetch(*ns, Seq(0, 128), FetchFormat::kRaw) == a);
}

TEST_CASE("faults: page files are 0600 and directories 0700, any umask") {
  const mode_t mask = GENERATE(mode_t{022}, mode_t{0}, mode_t{077});
  const mode_t old = ::umask(mask);
  TempDir dir;
  const uint64_t pb = Geo().PageBytes();
  {
    auto ns = Make(Config(pb, dir.path + "/disk"), 8);
    Insert(*ns, Seq(0, 8), Pages(2, 33));
    REQUIRE(*ns->tiers().DemoteAll(Tier::kDisk) > 0);
  }
  ::umask(old);
  struct stat st;
  REQUIRE(::stat((dir.path + "/disk").c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0700);
  const std::vector<fs::path> files = PageFiles(dir.path + "/disk");
  REQUIRE(files.size() == 2);
  for (const fs::path& f : files) {
    REQUIRE(::stat(f.c_str(), &st) == 0);
    CHECK((st.st_mode & 07777) == 0600);
  }
}

TEST_CASE("faults: a leased corrupt page is refused, dropped at release") {
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
  REQUIRE(ns->Release(m->lease_id).ok());      // the lease ends: it goes
  CHECK(ns->Counters().corrupt_dropped == 1);
  CHECK(ns->PinPages(m->pages).status().code() == absl::StatusCode::kNotFound);
  CHECK(ns->Counters().cached_pages == 0);
  REQUIRE(ns->CheckInvariants().ok());
}

}  // namespace
}  // namespace kvharbor
