// The SDK against an in-process daemon: namespaces, Match and leases, dedup,
// eviction, stats consistency, errors, deadlines and concurrent clients.
#include <atomic>
#include <catch2/catch.hpp>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kvharbor/client.h"
#include "tests/client/client_test_util.h"

namespace kvharbor {
namespace {

using client::DType;
using client::FetchSource;
using testing::Connect;
using testing::CreateNs;
using testing::MakeSpec;
using testing::RandomBytes;
using testing::StartTestDaemon;
using testing::TokenRange;

// 2 * 2 layers * 4 tokens * 2 heads * 32 dim * 2 bytes = 2 KiB pages.
constexpr uint32_t kPageSize = 4;
client::NamespaceSpec SmallSpec(const std::string& name,
                                uint64_t capacity = 0) {
  return MakeSpec(name, 2, 2, 32, kPageSize, DType::kBF16, capacity);
}

TEST_CASE("namespace create, describe, list and delete", "[client]") {
  std::unique_ptr<Daemon> daemon = StartTestDaemon();
  std::unique_ptr<Client> c = Connect(*daemon);
  client::NamespaceSpec spec = SmallSpec("alpha", 1 << 20);
  spec.geometry.rope_theta = 10000.0f;
  absl::StatusOr<client::CreateNamespaceResult> r = c->CreateNamespace(spec);
  REQUIRE(r.ok());
  CHECK(r->created);
  CHECK(r->info.spec.name == "alpha");
  CHECK(r->info.spec.geometry.rope_theta == 10000.0f);
  CHECK(r->info.stats.capacity_pages == (1 << 20) / spec.geometry.PageBytes());

  // Again: ALREADY_EXISTS, or created=false with if_not_exists.
  CHECK(c->CreateNamespace(spec).status().code() ==
        absl::StatusCode::kAlreadyExists);
  r = c->CreateNamespace(spec, /*if_not_exists=*/true);
  REQUIRE(r.ok());
  CHECK_FALSE(r->created);

  REQUIRE(c->CreateNamespace(SmallSpec("beta")).ok());
  absl::StatusOr<std::vector<client::NamespaceInfo>> list = c->ListNamespaces();
  REQUIRE(list.ok());
  REQUIRE(list->size() == 2);
  CHECK((*list)[0].spec.name == "alpha");
  CHECK((*list)[1].spec.name == "beta");

  absl::StatusOr<client::NamespaceInfo> info = c->DescribeNamespace("alpha");
  REQUIRE(info.ok());
  CHECK(info->spec.geometry.num_layers == 2);
  CHECK(info->spec.geometry.dtype == DType::kBF16);
  CHECK(info->stats.page_bytes == spec.geometry.PageBytes());

  // A bad geometry is INVALID_ARGUMENT naming the field.
  client::NamespaceSpec bad = SmallSpec("gamma");
  bad.geometry.head_dim = 0;
  absl::Status s = c->CreateNamespace(bad).status();
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message().find("head_dim") != absl::string_view::npos);

  REQUIRE(c->DeleteNamespace("beta").ok());
  CHECK(c->DescribeNamespace("beta").status().code() ==
        absl::StatusCode::kNotFound);
  CHECK(c->DeleteNamespace("beta").code() == absl::StatusCode::kNotFound);
}

TEST_CASE("match, leases, extend, release and expiry", "[client]") {
  std::unique_ptr<Daemon> daemon = StartTestDaemon();
  std::unique_ptr<Client> c = Connect(*daemon);
  const uint64_t pb = CreateNs(*c, SmallSpec("ns"));
  const std::vector<int32_t> tokens = TokenRange(8 * kPageSize, 100);
  const std::vector<uint8_t> data = RandomBytes(8 * pb, 1);
  REQUIRE(c->Insert("ns", tokens, data, pb).ok());

  // Miss: nothing matched, no lease even with lock.
  absl::StatusOr<client::Lease> miss =
      c->Match("ns", TokenRange(64, 5000), /*lock=*/true);
  REQUIRE(miss.ok());
  CHECK(miss->matched_tokens == 0);
  CHECK(miss->pages.empty());
  CHECK_FALSE(miss->locked());

  // A prefix of 3 pages and a partial page.
  std::vector<int32_t> prompt(tokens.begin(),
                              tokens.begin() + 3 * kPageSize + 2);
  absl::StatusOr<client::Lease> l =
      c->Match("ns", prompt, true, absl::Seconds(5));
  REQUIRE(l.ok());
  CHECK(l->matched_tokens == 3 * kPageSize);
  REQUIRE(l->pages.size() == 3);
  REQUIRE(l->locked());
  CHECK(l->expiry > absl::Now() + absl::Seconds(3));
  CHECK(l->expiry < absl::Now() + absl::Seconds(6));

  absl::StatusOr<absl::Time> extended =
      c->ExtendLease(l->id, absl::Seconds(60));
  REQUIRE(extended.ok());
  CHECK(*extended > absl::Now() + absl::Seconds(50));

  absl::StatusOr<std::vector<std::vector<uint8_t>>> pages =
      c->Fetch("ns", FetchSource::FromLease(l->id));
  REQUIRE(pages.ok());
  REQUIRE(pages->size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    CHECK(std::equal(data.begin() + i * pb, data.begin() + (i + 1) * pb,
                     (*pages)[i].begin()));
  }

  REQUIRE(c->Release(l->id).ok());
  CHECK(c->Release(l->id).code() == absl::StatusCode::kNotFound);
  CHECK(c->Fetch("ns", FetchSource::FromLease(l->id)).status().code() ==
        absl::StatusCode::kNotFound);
  CHECK(c->ExtendLease(l->id, absl::Seconds(1)).status().code() ==
        absl::StatusCode::kNotFound);

  // A short lease runs out and the reaper drops it.
  absl::StatusOr<client::Lease> shortl =
      c->Match("ns", tokens, true, absl::Milliseconds(100));
  REQUIRE(shortl.ok());
  REQUIRE(shortl->locked());
  absl::Status fetched = absl::OkStatus();
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (fetched.ok() && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(50));
    fetched = c->Fetch("ns", FetchSource::FromLease(shortl->id)).status();
  }
  CHECK(fetched.code() == absl::StatusCode::kNotFound);
}

// Namespace "ns" (16 pages of room) after: sequence a (6 pages) inserted
// twice, sequence b (a's first 4 pages + 2 more) inserted with page_bytes
// looked up by the SDK; Match of a (24 tokens hit), of an unknown prompt (8
// missed), of b with a lease; Fetch of the lease's first 2 pages. A second
// namespace "other" stays empty.
struct Populated {
  std::unique_ptr<Daemon> daemon;
  std::unique_ptr<Client> c;
  uint64_t pb = 0;
  std::vector<int32_t> a, b;
  client::Lease lease;
};

Populated Populate() {
  Populated p;
  p.daemon = StartTestDaemon();
  p.c = Connect(*p.daemon);
  Client& c = *p.c;
  const uint64_t page_bytes = SmallSpec("x").geometry.PageBytes();
  const uint64_t pb = p.pb = CreateNs(c, SmallSpec("ns", 16 * page_bytes));
  REQUIRE(CreateNs(c, SmallSpec("other")) == pb);

  p.a = TokenRange(6 * kPageSize, 1);
  const std::vector<uint8_t> da = RandomBytes(6 * pb, 2);
  absl::StatusOr<client::InsertResult> r = c.Insert("ns", p.a, da, pb);
  REQUIRE(r.ok());
  CHECK(r->pages_stored == 6);
  // The same sequence again: all deduplicated.
  r = c.Insert("ns", p.a, da, pb);
  REQUIRE(r.ok());
  CHECK(r->pages_stored == 0);
  CHECK(r->already_present_tokens == p.a.size());
  // page_bytes 0: the SDK looks the page size up itself.
  p.b = p.a;
  p.b.resize(4 * kPageSize);
  for (int i = 0; i < 2 * static_cast<int>(kPageSize); ++i) {
    p.b.push_back(7000 + i);
  }
  std::vector<uint8_t> db(da.begin(), da.begin() + 4 * pb);
  const std::vector<uint8_t> tail = RandomBytes(2 * pb, 3);
  db.insert(db.end(), tail.begin(), tail.end());
  r = c.Insert("ns", p.b, db, /*page_bytes=*/0);
  REQUIRE(r.ok());
  CHECK(r->pages_stored == 2);
  CHECK(r->already_present_tokens == 4 * kPageSize);

  REQUIRE(c.Match("ns", p.a).ok());
  REQUIRE(c.Match("ns", TokenRange(8, 90000)).ok());
  absl::StatusOr<client::Lease> lease = c.Match("ns", p.b, true);
  REQUIRE(lease.ok());
  REQUIRE(lease->pages.size() == 6);
  p.lease = *lease;
  std::vector<uint8_t> two(2 * pb);
  REQUIRE(c.FetchInto("ns", FetchSource::FromLease(p.lease.id, 0, 2),
                      absl::MakeSpan(two))
              .ok());
  return p;
}

TEST_CASE("dedup and stats stay consistent", "[client]") {
  Populated p = Populate();
  const uint64_t pb = p.pb;
  absl::StatusOr<client::Stats> st = p.c->Stats("ns");
  REQUIRE(st.ok());
  REQUIRE(st->namespaces.size() == 1);
  // A copy: `st` is assigned again below.
  const client::NamespaceStats s = st->namespaces[0];
  CHECK(s.name == "ns");
  CHECK(s.page_bytes == pb);
  CHECK(s.capacity_pages == 16);
  CHECK(s.inserted_pages == 8);
  CHECK(s.dedup_pages == 6 + 4);
  CHECK(s.cached_pages == 8);
  CHECK(s.free_pages == s.capacity_pages - s.cached_pages);
  CHECK(s.evictable_pages + s.protected_pages == s.cached_pages);
  CHECK(s.protected_pages == 6);
  CHECK(s.active_leases == 1);
  CHECK(s.hit_tokens == p.a.size() + p.b.size());
  CHECK(s.miss_tokens == 8);
  CHECK(s.bytes_in == (6 + 6 + 6) * pb);
  CHECK(s.bytes_out == 2 * pb);

  st = p.c->Stats();
  REQUIRE(st.ok());
  REQUIRE(st->namespaces.size() == 2);
  CHECK(st->global.namespaces == 2);
  CHECK(st->global.cached_pages == 8);
  CHECK(st->global.active_leases == 1);
  CHECK(st->global.hit_tokens == s.hit_tokens);
  CHECK(st->global.miss_tokens == s.miss_tokens);
  CHECK(st->global.bytes_in == s.bytes_in);
  CHECK(st->global.bytes_out == s.bytes_out);
  // Capacities are caps (private pools): nothing reserved; the budget
  // holds the namespaces' written pages and metadata.
  CHECK(st->global.pool_reserved_bytes == 0);
  CHECK(st->global.memory_used_bytes ==
        st->namespaces[0].memory_bytes + st->namespaces[1].memory_bytes);
  CHECK(st->global.memory_used_bytes > 0);

  absl::StatusOr<client::TreeDump> tree = p.c->DumpTree("ns");
  REQUIRE(tree.ok());
  CHECK(tree->nodes >= 2);  // a and b diverge after 4 pages
  CHECK(p.c->DumpTree("nope").status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("eviction: by page, bytes and all; leases protect", "[client]") {
  Populated p = Populate();
  Client& c = *p.c;
  const client::Lease& lease = p.lease;
  // Evicting a leased page is refused; EvictAll spares the leased ones.
  CHECK(c.EvictPages("ns", {lease.pages[5]}).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<client::EvictResult> ev = c.EvictAll("ns");
  REQUIRE(ev.ok());
  CHECK(ev->pages_evicted == 2);  // a's pages 5 and 6
  CHECK(ev->bytes_freed == 2 * p.pb);
  REQUIRE(c.Release(lease.id).ok());
  // A handle and everything after it.
  ev = c.EvictPages("ns", {lease.pages[4]});
  REQUIRE(ev.ok());
  CHECK(ev->pages_evicted == 2);
  // Stale handles are NOT_FOUND, never other pages' bytes.
  CHECK(
      c.Fetch("ns", FetchSource::FromPages({lease.pages[4]})).status().code() ==
      absl::StatusCode::kNotFound);
  ev = c.EvictBytes("ns", 1);
  REQUIRE(ev.ok());
  CHECK(ev->pages_evicted == 1);
  ev = c.EvictAll("ns");
  REQUIRE(ev.ok());
  CHECK(ev->pages_evicted == 3);

  absl::StatusOr<client::Stats> st = c.Stats("ns");
  REQUIRE(st.ok());
  const client::NamespaceStats& s = st->namespaces[0];
  CHECK(s.cached_pages == 0);
  CHECK(s.evicted_pages == 8);
  CHECK(s.free_pages == 16);
  CHECK(s.active_leases == 0);
  absl::StatusOr<client::Lease> m = c.Match("ns", p.a);
  REQUIRE(m.ok());
  CHECK(m->matched_tokens == 0);
}

TEST_CASE("bad input gets errors that name the field", "[client]") {
  std::unique_ptr<Daemon> daemon = StartTestDaemon();
  std::unique_ptr<Client> c = Connect(*daemon);
  const uint64_t pb = CreateNs(*c, SmallSpec("ns"));
  const std::vector<int32_t> tokens = TokenRange(2 * kPageSize, 1);
  const std::vector<uint8_t> data = RandomBytes(2 * pb, 1);

  // Client-side checks.
  absl::Status s =
      c->Insert("ns", tokens, absl::MakeConstSpan(data.data(), pb + 1), pb)
          .status();
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message().find("pages") != absl::string_view::npos);
  std::vector<absl::Span<const uint8_t>> uneven = {
      absl::MakeConstSpan(data.data(), pb),
      absl::MakeConstSpan(data.data(), pb - 1)};
  CHECK(c->Insert("ns", tokens, uneven).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(c->Fetch("ns", FetchSource{}).status().code() ==
        absl::StatusCode::kInvalidArgument);

  // Daemon-side checks come back with their code and message.
  s = c->Insert("ns", TokenRange(kPageSize + 1, 1), data, pb).status();
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  // Fewer pages than the tokens need: the SDK names the pages it was given
  // (not the checksums it computed itself), looking the page size up or
  // not.
  for (uint64_t page_bytes : {uint64_t{0}, pb}) {
    s = c->Insert("ns", TokenRange(3 * kPageSize, 1), data, page_bytes)
            .status();
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(
        s.message().find("pages: 2 page(s) given for the 3 pages of tokens") !=
        absl::string_view::npos);
  }
  s = c->Match("missing", tokens).status();
  CHECK(s.code() == absl::StatusCode::kNotFound);
  CHECK(s.message().find("namespace") != absl::string_view::npos);
  CHECK(c->Match("ns", {}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(c->Release(0).code() == absl::StatusCode::kInvalidArgument);
  CHECK(c->EvictBytes("ns", 0).status().code() ==
        absl::StatusCode::kInvalidArgument);

  // A destination too small for what the lease holds: an error, and no
  // byte written past it.
  REQUIRE(c->Insert("ns", tokens, data, pb).ok());
  absl::StatusOr<client::Lease> l = c->Match("ns", tokens, true);
  REQUIRE(l.ok());
  std::vector<uint8_t> small(pb + pb / 2 + 64, 0x5A);
  s = c->FetchInto("ns", FetchSource::FromLease(l->id),
                   absl::MakeSpan(small.data(), pb + pb / 2))
          .status();
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message().find("dst") != absl::string_view::npos);
  CHECK(std::all_of(small.end() - 64, small.end(),
                    [](uint8_t b) { return b == 0x5A; }));
  std::vector<uint8_t> one(pb);
  uint8_t* ptrs[] = {one.data()};
  s = c->FetchInto("ns", FetchSource::FromLease(l->id), ptrs, pb).status();
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message().find("page_dsts") != absl::string_view::npos);
  // The lease still works afterwards.
  CHECK(c->Fetch("ns", FetchSource::FromLease(l->id)).ok());

  // Options are checked when the client is made.
  ClientOptions bad;
  bad.insert_chunk_bytes = 0;
  CHECK(Client::Create(bad).status().code() ==
        absl::StatusCode::kInvalidArgument);
  bad = ClientOptions();
  bad.address = "";
  CHECK(Client::Create(bad).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("deadlines: a tiny deadline is DEADLINE_EXCEEDED, not a hang",
          "[client][deadline]") {
  std::unique_ptr<Daemon> daemon = StartTestDaemon();
  std::unique_ptr<Client> c = Connect(*daemon);
  const uint64_t pb =
      CreateNs(*c, MakeSpec("big", 16, 8, 128, 16, DType::kFP32, 64 << 20));
  const std::vector<int32_t> tokens = TokenRange(8 * 16, 1);
  const std::vector<uint8_t> data = RandomBytes(8 * pb, 9);  // 16 MiB
  REQUIRE(c->Insert("big", tokens, data, pb).ok());
  absl::StatusOr<client::Lease> l = c->Match("big", tokens, true);
  REQUIRE(l.ok());

  // A deadline that has passed (or a zero timeout) fails every kind of call
  // without doing it.
  const absl::Time start = absl::Now();
  const CallOptions zero = CallOptions::Timeout(absl::ZeroDuration());
  const CallOptions past = CallOptions::Deadline(start - absl::Seconds(1));
  std::vector<int32_t> other = TokenRange(8 * 16, 50000);
  std::vector<uint8_t> out(8 * pb);
  for (const CallOptions& expired : {zero, past}) {
    CHECK(c->Match("big", tokens, false, absl::ZeroDuration(), expired)
              .status()
              .code() == absl::StatusCode::kDeadlineExceeded);
    CHECK(c->Stats("", expired).status().code() ==
          absl::StatusCode::kDeadlineExceeded);
    CHECK(c->ListNamespaces(expired).status().code() ==
          absl::StatusCode::kDeadlineExceeded);
    CHECK(c->Insert("big", other, data, pb, expired).status().code() ==
          absl::StatusCode::kDeadlineExceeded);
    CHECK(c->FetchInto("big", FetchSource::FromLease(l->id),
                       absl::MakeSpan(out), expired)
              .status()
              .code() == absl::StatusCode::kDeadlineExceeded);
  }
  // A 1 us deadline cannot cover moving 16 MiB: the calls stop with
  // DEADLINE_EXCEEDED (a call fast enough to beat its deadline would be OK;
  // these cannot be).
  const CallOptions tiny = CallOptions::Timeout(absl::Microseconds(1));
  CHECK(c->FetchInto("big", FetchSource::FromLease(l->id), absl::MakeSpan(out),
                     tiny)
            .status()
            .code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(c->Insert("big", other, data, pb, tiny).status().code() ==
        absl::StatusCode::kDeadlineExceeded);
  // The client-wide default applies to calls that set no deadline.
  ClientOptions o;
  o.default_timeout = absl::Microseconds(1);
  std::unique_ptr<Client> hasty = Connect(*daemon, o);
  CHECK(hasty->Fetch("big", FetchSource::FromLease(l->id)).status().code() ==
        absl::StatusCode::kDeadlineExceeded);
  CHECK(absl::Now() - start < absl::Seconds(10));

  // A deadline mid-stream: a 16 MiB fetch in 1 KiB chunks does not finish
  // in 2 ms, and the call comes back promptly.
  ClientOptions slow;
  slow.fetch_chunk_bytes = 1024;
  std::unique_ptr<Client> sc = Connect(*daemon, slow);
  const absl::Time t0 = absl::Now();
  CHECK(sc->FetchInto("big", FetchSource::FromLease(l->id), absl::MakeSpan(out),
                      CallOptions::Timeout(absl::Milliseconds(2)))
            .status()
            .code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(absl::Now() - t0 < absl::Seconds(10));
  // The aborted calls left nothing behind: no upload (the daemon aborts it
  // once it sees the cancellation, which may trail the client's error), the
  // same pages.
  absl::StatusOr<client::Stats> st = c->Stats("big");
  for (int i = 0; i < 200 && st.ok() && st->namespaces[0].uploads_in_flight;
       ++i) {
    absl::SleepFor(absl::Milliseconds(10));
    st = c->Stats("big");
  }
  REQUIRE(st.ok());
  CHECK(st->namespaces[0].uploads_in_flight == 0);
  CHECK(st->namespaces[0].cached_pages == 8);
  absl::StatusOr<client::Lease> none = c->Match("big", other);
  REQUIRE(none.ok());
  CHECK(none->matched_tokens == 0);
}

TEST_CASE("an unreachable daemon is UNAVAILABLE", "[client]") {
  // Bind-and-close would race; port 1 on loopback is never a daemon.
  ClientOptions o;
  o.address = "127.0.0.1:1";
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Create(o);
  REQUIRE(c.ok());
  CHECK((*c)->ListNamespaces().status().code() ==
        absl::StatusCode::kUnavailable);
  CHECK((*c)->Fetch("ns", FetchSource::FromPages({1})).status().code() ==
        absl::StatusCode::kUnavailable);
  const std::vector<uint8_t> page(64);
  CHECK((*c)->Insert("ns", TokenRange(4, 0), page, 64).status().code() ==
        absl::StatusCode::kUnavailable);
}

TEST_CASE("concurrent clients from several threads", "[client][concurrency]") {
  std::unique_ptr<Daemon> daemon = StartTestDaemon();
  std::unique_ptr<Client> shared = Connect(*daemon);
  const uint64_t pb = CreateNs(*shared, SmallSpec("ns", 8 << 20));
  // A prefix every thread shares, then a per-thread suffix.
  const std::vector<int32_t> prefix = TokenRange(4 * kPageSize, 1);
  const std::vector<uint8_t> prefix_data = RandomBytes(4 * pb, 77);

  REQUIRE(shared->Insert("ns", prefix, prefix_data, pb).ok());

  constexpr int kThreads = 8;
  constexpr int kRounds = 20;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Half the threads share one Client, the rest have their own.
      std::unique_ptr<Client> own;
      Client* c = shared.get();
      if (t % 2 == 1) {
        own = Connect(*daemon);
        c = own.get();
      }
      for (int r = 0; r < kRounds; ++r) {
        std::vector<int32_t> tokens = prefix;
        const std::vector<int32_t> suffix =
            TokenRange(3 * kPageSize, 100000 * (t + 1) + 1000 * r);
        tokens.insert(tokens.end(), suffix.begin(), suffix.end());
        std::vector<uint8_t> data = prefix_data;
        const std::vector<uint8_t> tail = RandomBytes(3 * pb, t * 1000 + r);
        data.insert(data.end(), tail.begin(), tail.end());
        absl::StatusOr<client::InsertResult> ins =
            c->Insert("ns", tokens, data, pb);
        absl::StatusOr<client::Lease> l = c->Match("ns", tokens, true);
        if (!ins.ok() || !l.ok() || l->pages.size() != 7) {
          ++failures;
          continue;
        }
        std::vector<uint8_t> out(7 * pb);
        absl::StatusOr<client::FetchResult> f = c->FetchInto(
            "ns", FetchSource::FromLease(l->id), absl::MakeSpan(out));
        if (!f.ok() || out != data) ++failures;
        if (!c->Release(l->id).ok()) ++failures;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  CHECK(failures.load() == 0);
  absl::StatusOr<client::Stats> st = shared->Stats("ns");
  REQUIRE(st.ok());
  const client::NamespaceStats& s = st->namespaces[0];
  CHECK(s.active_leases == 0);
  CHECK(s.inserted_pages == 4 + kThreads * kRounds * 3);
  CHECK(s.dedup_pages == kThreads * kRounds * 4);
  CHECK(s.bytes_out == uint64_t{kThreads} * kRounds * 7 * pb);
}

}  // namespace
}  // namespace kvharbor
