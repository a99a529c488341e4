// Concurrency stress test: an in-process daemon on a free loopback port and
// several client threads (sharing two SDK clients and a raw stub) issuing a
// random mix of every RPC for a bounded time against small pools, so that
// eviction, tier moves, lease expiry, namespace deletion and cancelled
// streams all race with each other. Afterwards the daemon must be settled
// and consistent: no lease or upload left, every slot free or referenced
// once (Namespace::CheckInvariants), counters agreeing with the tree and the
// store's budget, and every page still byte-exact.
//
// Page bytes are a pure function of the token prefix they end (a hash of
// it), so identical prefixes inserted by different threads carry identical
// bytes (dedup is invisible) and any fetched page can be verified.
//
// KVHARBOR_STRESS_SECONDS (default 3), KVHARBOR_STRESS_THREADS (default 8)
// and KVHARBOR_STRESS_SEED (default: random, printed) tune the run. Worker
// threads never call Catch2 macros (not thread-safe): they record what they
// see and the main thread checks it.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kvharbor/client.h"
#include "kvharbor/v1/kvharbor.grpc.pb.h"
#include "server/daemon/daemon.h"
#include "spdlog/spdlog.h"
#include "tests/stress/stress_test_util.h"

namespace kvharbor {
namespace testing {
namespace {

namespace v1 = ::kvharbor::v1;
using absl::StatusCode;
using client::FetchFormat;
using client::FetchSource;
using client::Tier;

std::string ChurnName(int i) { return absl::StrCat("churn", i); }

enum Counter {
  kInsertOk,
  kInsertExhausted,
  kMatchHit,
  kLeaseTaken,
  kLeasePagesVerified,
  kCompressedPagesVerified,
  kHandlePagesVerified,
  kStaleHandles,
  kEvictOk,
  kDemotedPages,
  kNsCreated,
  kNsDeleted,
  kCancelledStreams,
  kTinyDeadlineCalls,
  kDeadlineExceeded,
  kExtendOk,
  kReleaseOk,
  kStatsOk,
  kNumCounters
};
constexpr const char* kCounterNames[kNumCounters] = {
    "insert_ok",         "insert_exhausted", "match_hit",
    "lease_taken",       "lease_pages_ok",   "compressed_pages_ok",
    "handle_pages_ok",   "stale_handles",    "evict_ok",
    "demoted_pages",     "ns_created",       "ns_deleted",
    "cancelled_streams", "tiny_deadlines",   "deadline_exceeded",
    "extend_ok",         "release_ok",       "stats_ok"};

// Each of these must be seen at least once: every kind of operation
// happened and did its job. A slow build (sanitizers) runs past the time
// asked for until they all are, up to four times as long.
constexpr Counter kRequired[] = {kInsertOk,
                                 kLeaseTaken,
                                 kLeasePagesVerified,
                                 kCompressedPagesVerified,
                                 kHandlePagesVerified,
                                 kEvictOk,
                                 kDemotedPages,
                                 kNsCreated,
                                 kNsDeleted,
                                 kCancelledStreams,
                                 kTinyDeadlineCalls,
                                 kReleaseOk,
                                 kExtendOk,
                                 kStatsOk};

// What the workers saw: counters and unexpected outcomes.
class Recorder {
 public:
  void Add(Counter c, uint64_t n = 1) {
    counts_[c].fetch_add(n, std::memory_order_relaxed);
  }
  uint64_t Get(Counter c) const {
    return counts_[c].load(std::memory_order_relaxed);
  }
  bool AllRequiredSeen() const {
    for (Counter c : kRequired) {
      if (Get(c) == 0) return false;
    }
    return true;
  }
  void Unexpected(const std::string& what) {
    absl::MutexLock l(&mu_);
    ++unexpected_;
    if (messages_.size() < 20) messages_.push_back(what);
  }
  uint64_t unexpected() const {
    absl::MutexLock l(&mu_);
    return unexpected_;
  }
  std::string Report() const {
    std::string s;
    for (int i = 0; i < kNumCounters; ++i) {
      absl::StrAppend(&s, kCounterNames[i], "=", Get(Counter(i)), " ");
    }
    absl::MutexLock l(&mu_);
    for (const std::string& m : messages_) absl::StrAppend(&s, "\n  ", m);
    return s;
  }

 private:
  std::atomic<uint64_t> counts_[kNumCounters] = {};
  mutable absl::Mutex mu_;
  uint64_t unexpected_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> messages_ ABSL_GUARDED_BY(mu_);
};

struct Shared {
  Recorder rec;
  std::vector<Client*> clients;
  std::unique_ptr<v1::KvHarbor::Stub> stub;
  std::string disk_dir;
};

struct HeldLease {
  client::Lease lease;
  std::string ns;
  std::vector<int32_t> tokens;
  // Long TTL in a namespace nobody deletes, never touched by a call that
  // may have failed half-way: it must stay fetchable until released.
  bool strict = false;
};

// One call's context: which namespace and whether its deadline is tiny.
struct Ctx {
  std::string ns;
  bool churn = false;
  bool tiny = false;
  CallOptions call;
};

class Worker {
 public:
  Worker(Shared* shared, int id, uint64_t seed)
      : s_(shared),
        c_(*shared->clients[id % shared->clients.size()]),
        rng_(seed) {}

  void Run(absl::Time end, absl::Time cap) {
    while (absl::Now() < end ||
           (absl::Now() < cap && !s_->rec.AllRequiredSeen())) {
      Step();
    }
    for (HeldLease& h : held_) ReleaseHeld(h);
    held_.clear();
  }

 private:
  uint32_t Rand(uint32_t n) { return static_cast<uint32_t>(rng_() % n); }

  std::vector<int32_t> RandomTokens() {
    SeqKey k;
    k.trunk = Rand(kTrunks);
    k.pages = 1 + Rand(kMaxPages);
    k.branch_at = Rand(k.pages + 1);
    k.branch = Rand(kBranches);
    return MakeTokens(k);
  }

  Ctx Pick(bool allow_tiny = true) {
    Ctx x;
    const uint32_t r = Rand(10);
    x.churn = r >= 8;
    x.ns = r < 4 ? kFlat : r < 8 ? kTiered : ChurnName(Rand(kChurnNamespaces));
    x.tiny = allow_tiny && Rand(8) == 0;
    if (x.tiny) {
      x.call = CallOptions::Timeout(absl::Microseconds(Rand(1500)));
      s_->rec.Add(kTinyDeadlineCalls);
    }
    return x;
  }

  // True when `st` is OK; records it as unexpected unless its code is in
  // `allowed`, or explained by a tiny deadline or a churned namespace.
  bool Check(const absl::Status& st, const Ctx& x, const char* op,
             std::initializer_list<StatusCode> allowed = {}) {
    if (st.ok()) return true;
    const StatusCode code = st.code();
    if (std::find(allowed.begin(), allowed.end(), code) != allowed.end()) {
      return false;
    }
    if (x.tiny && (code == StatusCode::kDeadlineExceeded ||
                   code == StatusCode::kCancelled)) {
      s_->rec.Add(kDeadlineExceeded);
      return false;
    }
    if (x.churn && (code == StatusCode::kNotFound ||
                    code == StatusCode::kFailedPrecondition ||
                    code == StatusCode::kResourceExhausted)) {
      return false;
    }
    s_->rec.Unexpected(absl::StrCat(op, " on ", x.ns, x.tiny ? " (tiny)" : "",
                                    ": ", st.ToString()));
    return false;
  }

  void Step() {
    switch (Rand(16)) {
      case 0:
      case 1:
      case 2:
        return Insert();
      case 3:
      case 4:
        return MatchAndFetchHandles();
      case 5:
      case 6:
        return TakeLease();
      case 7:
      case 8:
        return UseLease();
      case 9:
        return ReleaseOne();
      case 10:
        return Evict();
      case 11:
        return Demote();
      case 12:
        return Churn();
      case 13:
        return CancelledInsert();
      case 14:
        return CancelledFetch();
      default:
        return Introspect();
    }
  }

  void Insert() {
    Ctx x = Pick();
    const std::vector<int32_t> tokens = RandomTokens();
    const std::vector<uint8_t> pages = Pages(tokens);
    auto r = c_.Insert(x.ns, tokens, pages, kPageBytes, x.call);
    if (Check(r.status(), x, "Insert", {StatusCode::kResourceExhausted})) {
      s_->rec.Add(kInsertOk);
    } else if (r.status().code() == StatusCode::kResourceExhausted) {
      s_->rec.Add(kInsertExhausted);
    }
  }

  void VerifyPages(const std::vector<std::vector<uint8_t>>& got,
                   const std::vector<int32_t>& tokens, size_t first,
                   const Ctx& x, Counter counter, const char* op) {
    for (size_t i = 0; i < got.size(); ++i) {
      if (got[i].size() != kPageBytes ||
          !PageMatches(tokens, first + i, got[i].data())) {
        s_->rec.Unexpected(absl::StrCat(op, " on ", x.ns, ": page ", first + i,
                                        " of a ", tokens.size(),
                                        "-token prompt has wrong bytes"));
        return;
      }
    }
    s_->rec.Add(counter, got.size());
  }

  // Unleased handles may go stale (evicted) at any time, but what comes
  // back must be exactly the matched prefix's pages.
  void MatchAndFetchHandles() {
    Ctx x = Pick();
    const std::vector<int32_t> tokens = RandomTokens();
    auto m =
        c_.Match(x.ns, tokens, /*lock=*/false, absl::ZeroDuration(), x.call);
    if (!Check(m.status(), x, "Match") || m->pages.empty()) return;
    s_->rec.Add(kMatchHit);
    if (m->matched_tokens != m->pages.size() * kPageSize) {
      s_->rec.Unexpected("Match: matched_tokens disagrees with pages");
    }
    if (Rand(4) == 0) {
      auto e = c_.EvictPages(x.ns, {m->pages.back()}, x.call);
      if (Check(e.status(), x, "EvictPages",
                {StatusCode::kFailedPrecondition, StatusCode::kNotFound})) {
        s_->rec.Add(kEvictOk);
      }
      return;
    }
    Ctx f = Pick();
    f.ns = x.ns;
    f.churn = x.churn;
    const FetchFormat format = x.ns == kTiered && Rand(2) == 0
                                   ? FetchFormat::kCompressed
                                   : FetchFormat::kRaw;
    auto got = c_.Fetch(x.ns, FetchSource::FromPages(m->pages), format, f.call);
    if (Check(got.status(), f, "Fetch(pages)", {StatusCode::kNotFound})) {
      VerifyPages(*got, tokens, 0, f, kHandlePagesVerified, "Fetch(pages)");
    } else if (got.status().code() == StatusCode::kNotFound) {
      s_->rec.Add(kStaleHandles);
    }
  }

  void TakeLease() {
    if (held_.size() >= 3) return ReleaseOne();
    Ctx x = Pick();
    const bool long_ttl = !x.tiny && Rand(3) != 0;
    const std::vector<int32_t> tokens = RandomTokens();
    auto m = c_.Match(x.ns, tokens, /*lock=*/true,
                      long_ttl ? kLongTtl : kShortTtl, x.call);
    if (!Check(m.status(), x, "Match(lock)") || !m->locked()) return;
    s_->rec.Add(kLeaseTaken);
    HeldLease h{*m, x.ns, tokens, long_ttl && !x.churn};
    held_.push_back(std::move(h));
  }

  void UseLease() {
    if (held_.empty()) return TakeLease();
    HeldLease& h = held_[Rand(held_.size())];
    Ctx x = Pick();
    x.ns = h.ns;
    x.churn = !h.strict;  // expired or deleted with its namespace
    if (Rand(4) == 0) {
      auto t = c_.ExtendLease(h.lease.id, kLongTtl, x.call);
      if (Check(t.status(), x, "ExtendLease")) s_->rec.Add(kExtendOk);
      if (x.tiny) h.strict = false;
      return;
    }
    const uint32_t n = h.lease.pages.size();
    const uint32_t start = Rand(n);
    const uint32_t count = Rand(n - start + 1);  // 0 = to the end
    const FetchFormat format = h.ns == kTiered && Rand(2) == 0
                                   ? FetchFormat::kCompressed
                                   : FetchFormat::kRaw;
    auto got = c_.Fetch(h.ns, FetchSource::FromLease(h.lease.id, start, count),
                        format, x.call);
    if (!Check(got.status(), x, "Fetch(lease)")) return;
    const size_t want = count == 0 ? n - start : count;
    if (got->size() != want) {
      s_->rec.Unexpected(
          absl::StrCat("Fetch(lease): ", got->size(), " pages, want ", want));
      return;
    }
    VerifyPages(*got, h.tokens, start, x,
                format == FetchFormat::kCompressed ? kCompressedPagesVerified
                                                   : kLeasePagesVerified,
                "Fetch(lease)");
  }

  // `retry`: an earlier Release may have happened without the client
  // learning it (tiny deadline), so NotFound is fine.
  void ReleaseHeld(const HeldLease& h, bool retry = false) {
    Ctx x;
    x.ns = h.ns;
    x.churn = !h.strict || retry;
    if (Check(c_.Release(h.lease.id), x, "Release")) s_->rec.Add(kReleaseOk);
  }

  void ReleaseOne() {
    if (held_.empty()) return;
    const size_t i = Rand(held_.size());
    HeldLease h = std::move(held_[i]);
    held_.erase(held_.begin() + i);
    Ctx x = Pick();
    x.ns = h.ns;
    x.churn = !h.strict;
    if (Check(c_.Release(h.lease.id, x.call), x, "Release")) {
      s_->rec.Add(kReleaseOk);
    } else if (x.tiny) {
      ReleaseHeld(h, /*retry=*/true);
    }
  }

  void Evict() {
    Ctx x = Pick();
    absl::StatusOr<client::EvictResult> e =
        Rand(3) == 0 ? c_.EvictAll(x.ns, x.call)
                     : c_.EvictBytes(x.ns, (1 + Rand(4)) * kPageBytes, x.call);
    if (Check(e.status(), x, "Evict")) s_->rec.Add(kEvictOk);
  }

  void Demote() {
    Ctx x = Pick();
    if (x.ns == kFlat) x.ns = kTiered;
    const Tier to =
        x.ns == kTiered && Rand(2) == 0 ? Tier::kDisk : Tier::kHostCompressed;
    auto moved = c_.Demote(x.ns, to, x.call);
    if (Check(moved.status(), x, "Demote")) {
      s_->rec.Add(kDemotedPages, *moved);
    }
  }

  void Churn() {
    Ctx x = Pick();
    x.ns = ChurnName(Rand(kChurnNamespaces));
    x.churn = true;
    if (Rand(2) == 0) {
      auto r = c_.CreateNamespace(Spec(x.ns, 6, 4 * kPageBytes, ""),
                                  /*if_not_exists=*/true, x.call);
      if (Check(r.status(), x, "CreateNamespace") && r->created) {
        s_->rec.Add(kNsCreated);
      }
    } else {
      const absl::Status st = c_.DeleteNamespace(x.ns, Rand(2) == 0, x.call);
      if (Check(st, x, "DeleteNamespace")) s_->rec.Add(kNsDeleted);
    }
  }

  // Raw stream: the header and half the bytes, then a client cancel. The
  // daemon must drop the upload without leaking its reserved slots.
  void CancelledInsert() {
    Ctx x = Pick(/*allow_tiny=*/false);
    const std::vector<int32_t> tokens = RandomTokens();
    const std::vector<uint8_t> pages = Pages(tokens);
    grpc::ClientContext ctx;
    v1::InsertResponse resp;
    auto writer = s_->stub->Insert(&ctx, &resp);
    v1::InsertRequest header;
    header.mutable_header()->set_namespace_(x.ns);
    for (int32_t t : tokens) header.mutable_header()->add_token_ids(t);
    bool open = writer->Write(header);
    const size_t half = pages.size() / 2;
    for (size_t off = 0; open && off < half; off += 700) {
      v1::InsertRequest chunk;
      chunk.mutable_chunk()->set_offset(off);
      chunk.mutable_chunk()->set_data(
          reinterpret_cast<const char*>(pages.data()) + off,
          std::min<size_t>(700, half - off));
      open = writer->Write(chunk);
    }
    ctx.TryCancel();
    const grpc::Status st = writer->Finish();
    if (st.error_code() == grpc::StatusCode::CANCELLED) {
      s_->rec.Add(kCancelledStreams);
    } else if (st.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED &&
               !(x.churn && st.error_code() == grpc::StatusCode::NOT_FOUND)) {
      s_->rec.Unexpected(absl::StrCat("cancelled Insert on ", x.ns, ": ",
                                      st.error_code(), " ",
                                      st.error_message()));
    }
  }

  // Raw stream: a lease fetch read for one chunk, then cancelled.
  void CancelledFetch() {
    if (held_.empty()) return TakeLease();
    const HeldLease& h = held_[Rand(held_.size())];
    grpc::ClientContext ctx;
    v1::FetchRequest req;
    req.set_namespace_(h.ns);
    req.set_lease_id(h.lease.id);
    req.set_max_chunk_bytes(1024);
    auto reader = s_->stub->Fetch(&ctx, req);
    v1::FetchResponse chunk;
    reader->Read(&chunk);
    ctx.TryCancel();
    while (reader->Read(&chunk)) {
    }
    const grpc::Status st = reader->Finish();
    if (st.error_code() == grpc::StatusCode::CANCELLED) {
      s_->rec.Add(kCancelledStreams);
    } else if (!st.ok() &&
               !(!h.strict && st.error_code() == grpc::StatusCode::NOT_FOUND)) {
      s_->rec.Unexpected(absl::StrCat("cancelled Fetch on ", h.ns, ": ",
                                      st.error_code(), " ",
                                      st.error_message()));
    }
  }

  // Counters are snapshots taken under the namespace's lock, so they agree
  // with each other even mid-run.
  void Introspect() {
    Ctx x = Pick();
    switch (Rand(3)) {
      case 0: {
        auto st = c_.Stats("", x.call);
        if (!Check(st.status(), x, "Stats")) return;
        for (const client::NamespaceStats& n : st->namespaces) {
          uint64_t tiers = 0;
          for (const client::TierStats& t : n.tiers) tiers += t.pages;
          if (n.free_pages > n.capacity_pages || tiers != n.cached_pages ||
              n.evictable_pages + n.protected_pages != n.cached_pages) {
            s_->rec.Unexpected(
                absl::StrCat("Stats: ", n.name, " counters disagree"));
          }
        }
        s_->rec.Add(kStatsOk);
        return;
      }
      case 1: {
        auto t = c_.DumpTree(x.ns, 0, x.call);
        Check(t.status(), x, "DumpTree");
        return;
      }
      default: {
        auto d = c_.DescribeNamespace(x.ns, x.call);
        Check(d.status(), x, "DescribeNamespace");
        auto l = c_.ListNamespaces(x.call);
        Check(l.status(), x, "ListNamespaces");
        return;
      }
    }
  }

  Shared* s_;
  Client& c_;
  std::mt19937_64 rng_;
  std::vector<HeldLease> held_;
};

// Waits (bounded) until no namespace holds a lease, an upload or a pin.
bool WaitSettled(Store& store, absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  while (true) {
    bool busy = false;
    for (const auto& ns : store.List()) {
      // Pins of fetches the client already gave up on end a little later.
      const NamespaceStats c = ns->Counters();
      busy |= c.active_leases > 0 || c.uploads_in_flight > 0 ||
              c.free_pages + c.tiers[0].pages != c.capacity_pages;
    }
    if (!busy) return true;
    if (absl::Now() > end) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
}

void CheckNamespace(Namespace& ns) {
  INFO("namespace " << ns.name());
  const absl::Status inv = ns.CheckInvariants();
  INFO(inv.ToString());
  CHECK(inv.ok());
  const NamespaceStats c = ns.Counters();
  CHECK(c.active_leases == 0);
  CHECK(c.uploads_in_flight == 0);
  CHECK(c.protected_pages == 0);
  CHECK(c.evictable_pages == c.cached_pages);
  CHECK(c.tiers[0].pages + c.tiers[1].pages + c.tiers[2].pages ==
        c.cached_pages);
  CHECK(c.free_pages + c.tiers[0].pages == c.capacity_pages);
  CHECK(c.tiers[0].bytes == c.tiers[0].pages * kPageBytes);
  if (!ns.tiered()) CHECK(c.tiers[0].pages == c.cached_pages);
}

void CheckStore(Store& store) {
  uint64_t held = 0;
  const auto all = store.List();
  for (const auto& ns : all) {
    CheckNamespace(*ns);
    held += ns->memory_bytes();
  }
  const GlobalStats c = store.Counters();
  CHECK(c.active_leases == 0);
  CHECK(c.namespaces == all.size());
  // Capacities are caps (host pools without an arena): nothing reserved;
  // what the namespaces hold is in the budget (deleted ones still held by
  // late requests may hold some too).
  CHECK(c.pool_reserved_bytes == 0);
  CHECK(c.memory_used_bytes >= held);
}

// Every cached prefix of every possible prompt, fetched through a lease
// (raw, and compressed where the namespace tiers), must be byte-exact.
uint64_t VerifyAllPages(Client& c, const std::string& ns, bool tiered) {
  uint64_t verified = 0;
  for (uint32_t trunk = 0; trunk < kTrunks; ++trunk) {
    for (uint32_t at = 0; at <= kMaxPages; ++at) {
      for (uint32_t br = 0; br < kBranches; ++br) {
        const std::vector<int32_t> tokens =
            MakeTokens({trunk, kMaxPages, at, br});
        auto m = c.Match(ns, tokens, /*lock=*/true);
        REQUIRE(m.ok());
        if (!m->locked()) continue;
        for (FetchFormat f : {FetchFormat::kRaw, FetchFormat::kCompressed}) {
          if (f == FetchFormat::kCompressed && !tiered) continue;
          auto got = c.Fetch(ns, FetchSource::FromLease(m->id), f);
          INFO(got.status().ToString());
          REQUIRE(got.ok());
          REQUIRE(got->size() == m->pages.size());
          for (size_t p = 0; p < got->size(); ++p) {
            CHECK(PageMatches(tokens, p, (*got)[p].data()));
            ++verified;
          }
        }
        REQUIRE(c.Release(m->id).ok());
      }
    }
  }
  return verified;
}

std::string MakeTempDir() {
  std::string tmpl =
      (std::filesystem::temp_directory_path() / "kvharbor_stress_XXXXXX")
          .string();
  REQUIRE(mkdtemp(tmpl.data()) != nullptr);
  return tmpl;
}

std::unique_ptr<Daemon> StartDaemon() {
  DaemonOptions options;
  options.listen = "127.0.0.1:0";
  options.store.pool_budget_bytes = 1 << 20;
  options.store.default_namespace_bytes = 64 << 10;
  options.lease_reap_interval = absl::Milliseconds(20);
  options.drain_timeout = absl::Seconds(2);
  auto daemon = Daemon::Start(options);
  INFO(daemon.status().ToString());
  REQUIRE(daemon.ok());
  return *std::move(daemon);
}

std::unique_ptr<Client> Connect(const Daemon& daemon) {
  ClientOptions co;
  co.address = daemon.address();
  co.insert_chunk_bytes = 700;  // several messages per page
  co.fetch_chunk_bytes = 1024;  // the minimum: two chunks per page
  auto c = Client::Create(co);
  REQUIRE(c.ok());
  return *std::move(c);
}

// The interleaving the stress run found: a lease on a cold page, then an
// insert below it stores that page raw again (a new slot, so a new handle).
// The lease must still fetch it.
TEST_CASE("A lease keeps its cold page when an insert promotes it",
          "[stress]") {
  spdlog::set_level(spdlog::level::warn);
  std::unique_ptr<Daemon> daemon = StartDaemon();
  std::unique_ptr<Client> c = Connect(*daemon);
  REQUIRE(
      c->CreateNamespace(Spec(kTiered, 4, 4 * (kPageBytes + 256), "")).ok());
  const std::vector<int32_t> two = MakeTokens({0, 2, 2, 0});
  const std::vector<int32_t> one(two.begin(), two.begin() + kPageSize);
  REQUIRE(c->Insert(kTiered, one, Pages(one), kPageBytes).ok());
  REQUIRE(*c->Demote(kTiered, Tier::kHostCompressed) == 1);
  auto lease = c->Match(kTiered, one, /*lock=*/true);
  REQUIRE(lease.ok());
  REQUIRE(lease->pages.size() == 1);
  CHECK(lease->page_tiers[0] == Tier::kHostCompressed);
  auto ins = c->Insert(kTiered, two, Pages(two), kPageBytes);
  INFO(ins.status().ToString());
  REQUIRE(ins.ok());
  for (FetchFormat f : {FetchFormat::kRaw, FetchFormat::kCompressed}) {
    auto got = c->Fetch(kTiered, FetchSource::FromLease(lease->id), f);
    INFO(got.status().ToString());
    REQUIRE(got.ok());
    REQUIRE(got->size() == 1);
    CHECK(PageMatches(one, 0, (*got)[0].data()));
  }
  CHECK(c->Release(lease->id).ok());
  auto ns = daemon->store().Get(kTiered);
  REQUIRE(ns.ok());
  CHECK((*ns)->CheckInvariants().ok());
  CHECK((*ns)->Counters().active_leases == 0);
}

TEST_CASE("Concurrent SDK calls keep the daemon consistent", "[stress]") {
  const int seconds = EnvInt("KVHARBOR_STRESS_SECONDS", 3);
  const int threads = std::max(1, EnvInt("KVHARBOR_STRESS_THREADS", 8));
  const uint64_t seed = EnvInt("KVHARBOR_STRESS_SEED", 0) != 0
                            ? EnvInt("KVHARBOR_STRESS_SEED", 0)
                            : std::random_device{}();
  INFO("KVHARBOR_STRESS_SEED=" << seed);
  spdlog::set_level(spdlog::level::warn);
  Shared shared;
  shared.disk_dir = MakeTempDir();

  std::unique_ptr<Daemon> daemon = StartDaemon();
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < 2; ++i) {
    clients.push_back(Connect(*daemon));
    shared.clients.push_back(clients.back().get());
  }
  shared.stub = v1::KvHarbor::NewStub(grpc::CreateChannel(
      daemon->address(), grpc::InsecureChannelCredentials()));
  Client& c = *clients[0];
  REQUIRE(c.CreateNamespace(Spec(kFlat, kFlatPages, 0, "")).ok());
  REQUIRE(c.CreateNamespace(Spec(kTiered, kTieredPages, 6 * (kPageBytes + 256),
                                 shared.disk_dir))
              .ok());

  const absl::Time end = absl::Now() + absl::Seconds(seconds);
  const absl::Time cap = absl::Now() + absl::Seconds(4 * seconds);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&shared, t, seed, end, cap] {
      Worker(&shared, t, Mix(seed + t)).Run(end, cap);
    });
  }
  for (std::thread& t : pool) t.join();
  const std::string report = shared.rec.Report();
  std::printf("stress: %d threads, %d s, seed %llu: %s\n", threads, seconds,
              static_cast<unsigned long long>(seed), report.c_str());
  INFO(report);
  CHECK(shared.rec.unexpected() == 0);

  Store& store = daemon->store();
  CHECK(WaitSettled(store, absl::Seconds(10)));
  CheckStore(store);
  uint64_t verified = 0;
  for (const auto& ns : store.List()) {
    verified += VerifyAllPages(c, ns->name(), ns->tiered());
  }
  CHECK(verified > 0);
  for (const auto& ns : store.List()) ns->EvictAll();
  for (const auto& ns : store.List()) {
    CHECK(ns->Counters().cached_pages == 0);
  }
  CheckStore(store);

  for (Counter k : kRequired) {
    INFO(kCounterNames[k]);
    CHECK(shared.rec.Get(k) > 0);
  }
  clients.clear();
  shared.clients.clear();
  daemon.reset();
  std::filesystem::remove_all(shared.disk_dir);
}

}  // namespace
}  // namespace testing
}  // namespace kvharbor
