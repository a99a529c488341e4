// kvharbord's memory under a small load stays within its pool budget plus
// the overhead docs/operations.md ("Sizing") states, measured on the real
// process from /proc (bench/server_memory_under_load.cc measures the same
// under a heavier load, against an idle daemon).
#include <catch2/catch.hpp>
#include <string>

#include "absl/strings/str_cat.h"
#include "tests/server/memory_load.h"
#include "tests/server/subprocess.h"

#ifndef KVHARBORD_PATH
#error "KVHARBORD_PATH (the built kvharbord) must be defined by the build"
#endif

namespace kvharbor {
namespace testing {
namespace {

// Sanitizer builds (of this test and of kvharbord alike) add shadow memory
// and quarantines that have nothing to do with the daemon's own use.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

// docs/operations.md, "Sizing": RSS <= pool budget + 32 MiB + 12 MiB per
// concurrent call (1 MiB chunks), with malloc arenas bounded. With 8 clients
// that is pool + 128 MiB, so a leak of the pool's size (128 MiB) on top of
// the idle daemon's own ~24 MiB fails the check.
constexpr uint64_t StatedOverheadBytes(int calls) {
  return (uint64_t{32} << 20) + static_cast<uint64_t>(calls) * (12 << 20);
}

TEST_CASE("kvharbord's RSS under load stays within pool + stated overhead",
          "[server][process][memory]") {
  if (kSanitized) {
    WARN("skipped: RSS of a sanitizer build says nothing about the daemon's");
    return;
  }
  constexpr uint64_t kPool = 128 << 20;
  // One malloc arena. By default glibc gives each daemon thread that
  // allocates its own arena (up to 8 per core), and each keeps the 1 MiB
  // message buffers it freed; how many threads gRPC runs at once, and so how
  // many arenas hold buffers, follows how the scheduler interleaves them,
  // which other processes change. With other test suites running beside it
  // on 2 cores, VmHWM of this load ranged over 185..240 MiB (bound 256) with
  // default arenas (29 runs) and over 177..193 MiB with one (21 runs); the
  // bound and the load are the same either way.
  Kvharbord proc(KVHARBORD_PATH,
                 {absl::StrCat("--pool_bytes=", kPool),
                  absl::StrCat("--default_namespace_bytes=", kPool)},
                 /*output_path=*/"", {"MALLOC_ARENA_MAX=1"});
  REQUIRE(proc.started());
  REQUIRE(proc.Connect() != nullptr);
  MemorySampler sampler({proc.pid()}, absl::Milliseconds(20));
  LoadOptions o;
  o.address = proc.address();
  o.clients = 8;
  o.duration = absl::Seconds(10);
  absl::StatusOr<LoadStats> stats = RunLoad(o, kPool);
  sampler.Stop();
  REQUIRE(stats.ok());
  // The load did fill the pool (so a leak of the pool's size would show):
  // more bytes were inserted than the pool holds.
  const uint64_t page_bytes = LoadGeometry().PageBytes();
  CHECK(stats->ok / 4 * o.pages_per_request * page_bytes > kPool);
  const ProcMemory peak = sampler.peak(0);
  const ProcMemory now = ReadProcMemory(proc.pid());
  INFO("peak RSS " << peak.rss_bytes << ", VmHWM " << now.hwm_bytes << ", pool "
                   << kPool << ", ops " << stats->ops);
  CHECK(peak.rss_bytes > kPool / 2);  // the pool is really in use
  CHECK(now.hwm_bytes <= kPool + StatedOverheadBytes(o.clients));
}

}  // namespace
}  // namespace testing
}  // namespace kvharbor
