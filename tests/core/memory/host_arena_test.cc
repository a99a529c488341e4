// HostArena (the shared memfd of store.host_ipc_socket) and host pools cut
// from it: ranges are page-aligned, first fit, merged when given back and
// punched out of the file (a reader of the memfd sees zeros there), and a
// store with an arena cuts every namespace's pool from it.
#include "core/memory/host_arena.h"

#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
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

  // What the daemon writes, a read-only mapping of the memfd sees; a range
  // given back is punched out and reads zero.
  std::memset(arena.base() + *r2, 0xab, 3 * page);
  const void* ro =
      mmap(nullptr, arena.bytes(), PROT_READ, MAP_SHARED, arena.fd(), 0);
  REQUIRE(ro != MAP_FAILED);
  const uint8_t* view = static_cast<const uint8_t*>(ro);
  CHECK(view[*r2 + 5] == 0xab);
  arena.Give(*r2, 3 * page);
  CHECK(view[*r2 + 5] == 0);
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

}  // namespace
}  // namespace kvharbor
