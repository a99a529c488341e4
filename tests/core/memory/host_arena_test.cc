// HostArena (the shared memfd of store.host_ipc_socket) and host pools cut
// from it: ranges are page-aligned, first fit and merged when given back; a
// store with an arena cuts every namespace's pool from it; and the memfd is
// sealed, so that no client -- the daemon's uid, another uid, or root --
// can write into it through a descriptor it got or reopened.
#include "core/memory/host_arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "core/memory/page_pool.h"
#include "core/store/store.h"

namespace kvharbor {
namespace {

TEST_CASE("HostArena hands out aligned ranges and takes them back",
          "[core][host_arena]") {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  absl::StatusOr<std::shared_ptr<HostArena>> a0 = HostArena::Create(0);
  CHECK(a0.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StartsWith(a0.status().message(), "store.pool_budget_bytes"));

  absl::StatusOr<std::shared_ptr<HostArena>> a = HostArena::Create(10 * page);
  REQUIRE(a.ok());
  HostArena& arena = **a;
  CHECK(arena.bytes() == 10 * page);
  CHECK(arena.fd() >= 0);
  absl::StatusOr<uint64_t> r1 = arena.Take(1);  // rounded up to a page
  absl::StatusOr<uint64_t> r2 = arena.Take(3 * page);
  REQUIRE(r1.ok());
  REQUIRE(r2.ok());
  CHECK(*r1 == 0);
  CHECK(*r2 == page);
  CHECK(arena.free_bytes() == 6 * page);
  absl::StatusOr<uint64_t> big = arena.Take(7 * page);
  CHECK(big.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(absl::StrContains(big.status().message(), "largest range"));

  // What the daemon writes, a read-only mapping of the memfd sees.
  std::memset(arena.base() + *r2, 0xab, 3 * page);
  const void* ro =
      mmap(nullptr, arena.bytes(), PROT_READ, MAP_SHARED, arena.fd(), 0);
  REQUIRE(ro != MAP_FAILED);
  const uint8_t* view = static_cast<const uint8_t*>(ro);
  CHECK(view[*r2 + 5] == 0xab);
  arena.Give(*r2, 3 * page);
  munmap(const_cast<void*>(ro), arena.bytes());

  // Given back ranges merge, so the whole arena fits again.
  arena.Give(*r1, 1);
  CHECK(arena.free_bytes() == 10 * page);
  absl::StatusOr<uint64_t> all = arena.Take(10 * page);
  REQUIRE(all.ok());
  CHECK(*all == 0);
}

TEST_CASE("Host pools cut from one arena, and a store with an arena",
          "[core][host_arena]") {
  absl::StatusOr<std::shared_ptr<HostArena>> a =
      HostArena::Create(uint64_t{1} << 20);
  REQUIRE(a.ok());
  {
    absl::StatusOr<std::unique_ptr<HostPagePool>> p1 =
        HostPagePool::Create(512, 16, *a);
    absl::StatusOr<std::unique_ptr<HostPagePool>> p2 =
        HostPagePool::Create(512, 16, *a);
    REQUIRE(p1.ok());
    REQUIRE(p2.ok());
    CHECK((*p1)->arena() == a->get());
    CHECK((*p2)->arena_offset() >= (*p1)->arena_offset() + 512 * 16);
    CHECK((*p2)->Data(3) ==
          (*a)->base() + (*p2)->arena_offset() + 3 * uint64_t{512});
    std::vector<uint8_t> page(512, 7), back(512);
    REQUIRE((*p2)->Write(3, 0, page.data(), page.size()).ok());
    REQUIRE((*p2)->Read(3, back.data()).ok());
    CHECK(back == page);
    absl::StatusOr<std::unique_ptr<HostPagePool>> none =
        HostPagePool::Create(512, 1 << 20, *a);
    CHECK(none.status().code() == absl::StatusCode::kResourceExhausted);
  }
  CHECK((*a)->free_bytes() == (*a)->bytes());  // pools gave their ranges back

  StoreOptions o;
  o.pool_budget_bytes = uint64_t{1} << 20;
  o.host_arena = *a;
  Store store(o);
  NamespaceSpec spec;
  spec.name = "n";
  spec.geometry.num_layers = 1;
  spec.geometry.num_kv_heads = 1;
  spec.geometry.head_dim = 8;
  spec.geometry.page_size = 4;
  spec.geometry.dtype = DType::kFP32;
  spec.capacity_bytes = 64 * spec.geometry.PageBytes();
  REQUIRE(store.CreateNamespace(spec, false).ok());
  CHECK((*a)->free_bytes() < (*a)->bytes());
  REQUIRE(store.DeleteNamespace("n", /*force=*/true).ok());
}

// Every way a client could try to write through descriptor `ro` (what the
// socket hands out): reopening it O_RDWR through /proc/self/fd, a writable
// shared mapping, pwrite, ftruncate, punching a hole, upgrading a read-only
// mapping, removing the seals. Returns a bit per route that got through
// (0: none did), so a child process can report it in its exit status.
int WriteRoutesThatWork(int ro, uint64_t bytes) {
  int open_routes = 0;
  const std::string path = "/proc/self/fd/" + std::to_string(ro);
  for (int fd : {ro, open(path.c_str(), O_RDWR | O_CLOEXEC)}) {
    if (fd < 0) continue;  // the mode refused the reopening (not root)
    void* w = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (w != MAP_FAILED) {
      open_routes |= 1;
      munmap(w, bytes);
    }
    const char b = 1;
    if (pwrite(fd, &b, 1, 0) == 1) open_routes |= 2;
    if (ftruncate(fd, 0) == 0) open_routes |= 4;
    if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096) ==
        0) {
      open_routes |= 8;
    }
    void* r = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (r != MAP_FAILED) {
      if (mprotect(r, bytes, PROT_READ | PROT_WRITE) == 0) open_routes |= 16;
      munmap(r, bytes);
    }
    if (fcntl(fd, F_ADD_SEALS, 0) == 0 &&
        (fcntl(fd, F_GET_SEALS) & F_SEAL_FUTURE_WRITE) == 0) {
      open_routes |= 32;
    }
    if (fd != ro) close(fd);
  }
  return open_routes;
}

// Runs `fn` in a child process (as `uid` when it is not -1) and returns its
// exit status: fn's result, or 100+ when the child could not get going.
template <typename Fn>
int InChild(int uid, Fn fn) {
  const pid_t pid = fork();
  if (pid == 0) {
    if (uid >= 0 && (setgid(uid) != 0 || setuid(uid) != 0)) _exit(101);
    _exit(fn());
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) {
    return 102;
  }
  return WEXITSTATUS(status);
}

// A uid other than ours that exists on every Linux (nobody).
constexpr int kNobody = 65534;

TEST_CASE("the shared host arena is sealed against every client write route",
          "[core][host_arena][security]") {
  absl::StatusOr<std::shared_ptr<HostArena>> a =
      HostArena::Create(uint64_t{1} << 20);
  REQUIRE(a.ok());
  HostArena& arena = **a;
  struct stat st;
  REQUIRE(fstat(arena.fd(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0400);
  CHECK((fcntl(arena.fd(), F_GET_SEALS) & HostArena::RequiredSeals()) ==
        HostArena::RequiredSeals());
  // The daemon's mapping, made before the seal, still writes.
  std::memset(arena.base(), 0x5a, 4096);
  // What the socket hands out (server/local/host_ipc_server.cc).
  const int ro = open(("/proc/self/fd/" + std::to_string(arena.fd())).c_str(),
                      O_RDONLY | O_CLOEXEC);
  REQUIRE(ro >= 0);
  const int rw = arena.fd();
  const uint64_t bytes = arena.bytes();

  SECTION("this process's uid") {
    // Root here (CI runs as root): the mode does not stop the reopening,
    // only the seal stops the writes.
    CHECK(InChild(-1, [&] {
            close(rw);
            return WriteRoutesThatWork(ro, bytes);
          }) == 0);
  }
  SECTION("another uid") {
    if (geteuid() != 0) {
      WARN("not root: cannot switch to another uid; not checked");
      return;
    }
    CHECK(InChild(kNobody, [&] {
            close(rw);
            return WriteRoutesThatWork(ro, bytes);
          }) == 0);
  }
  SECTION("the same uid, not root: an arena made by nobody, used by nobody") {
    if (geteuid() != 0) {
      WARN("not root: cannot switch to another uid; not checked");
      return;
    }
    CHECK(InChild(kNobody, [] {
            absl::StatusOr<std::shared_ptr<HostArena>> mine =
                HostArena::Create(uint64_t{1} << 20);
            if (!mine.ok()) return 103;
            const int mine_ro =
                open(("/proc/self/fd/" + std::to_string((*mine)->fd())).c_str(),
                     O_RDONLY | O_CLOEXEC);
            if (mine_ro < 0) return 104;
            const int fd = (*mine)->fd();
            const uint64_t n = (*mine)->bytes();
            return InChild(-1, [&] {
              close(fd);
              return WriteRoutesThatWork(mine_ro, n);
            });
          }) == 0);
  }
  // Nothing got through: the bytes are still the daemon's.
  CHECK(arena.base()[0] == 0x5a);
  CHECK(arena.base()[4095] == 0x5a);
  close(ro);
}

}  // namespace
}  // namespace kvharbor
