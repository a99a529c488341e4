// Core stress test: the storage core (Store, Namespace, its tiers) driven
// from many threads at once with every operation the RPCs map to, then
// checked for leaks and corruption.
//
// Workers mix: Match with and without leases (short leases are left to
// expire and be reaped, i.e. deadlines), raw and compressed reads of pinned
// pages, two-phase inserts (some abandoned mid-upload or broken by a wrong
// checksum, i.e. cancellations; some appends that skip the prefix a Match
// just found, page after page or layer by layer, refused when it was
// evicted in between), evictions by page and by bytes, demotion to
// the host-compressed and disk tiers, and namespaces created and deleted
// while others use them. Page bytes are a function of the token prefix they
// end, so every page read is checked: byte-exact for raw pages and lossless
// codecs, within the fp8 error bound for lossy cold pages. One namespace is
// keyed by page keys (each page's key: the bytes of its tokens, so key
// sequences share prefixes exactly as token sequences do), one by page
// hashes (each page's key: the 128-bit XXH3 of its token prefix, so each
// page is found alone, as engines' chained page hashes are). After the run: no
// lease or upload left, Namespace::CheckInvariants (slot table, pool, index
// and cold tiers agree; every slot free or referenced exactly once),
// evictable + protected = cached pages, and every stored page still exact.
//
// scripts/test.sh runs it under ThreadSanitizer (linked against an
// instrumented abseil, so absl::Mutex is visible to TSan) for
// KVHARBOR_CORE_STRESS_SECONDS (default 30) with KVHARBOR_CORE_STRESS_THREADS
// workers (default 12); CTest runs it briefly in the other builds.
#include <xxh3.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "core/codec/codec.h"
#include "core/codec/envelope.h"
#include "core/index/page_key.h"
#include "core/store/store.h"
#include "tests/stress/stress_keys.h"
#include "tests/temp_dir.h"
#include "types/layer_range.h"

namespace kvharbor {
namespace testing {
namespace {

constexpr absl::Duration kShortTtl = absl::Milliseconds(30);
constexpr absl::Duration kLongTtl = absl::Seconds(20);

Geometry StressGeometry() {  // FP32 so that the fp8 bound is easy to check
  Geometry g;
  g.num_layers = 2;
  g.num_kv_heads = 2;
  g.head_dim = 8;
  g.page_size = kPageSize;
  g.dtype = DType::kFP32;
  return g;
}
const size_t kPageBytes = StressGeometry().PageBytes();

std::vector<SeqKey> AllKeys() {
  std::vector<SeqKey> keys;
  for (uint32_t t = 0; t < kTrunks; ++t)
    for (uint32_t p = 1; p <= kMaxPages; ++p)
      for (uint32_t at = 0; at <= p; ++at)
        for (uint32_t b = 0; b < (at == p ? 1 : kBranches); ++b)
          keys.push_back({t, p, at, b});
  return keys;
}

// Page `page` of `tokens`: floats in [-2, 2), a function of tokens[0, end of
// that page) only, so identical prefixes carry identical bytes.
std::string PageBytes(const std::vector<Token>& tokens, size_t page) {
  uint64_t s = 0x6b76686172626f72ull;
  for (size_t i = 0; i < (page + 1) * kPageSize; ++i) {
    s = Mix(s ^ static_cast<uint32_t>(tokens[i]));
  }
  std::string out(kPageBytes, '\0');
  for (size_t i = 0; i < kPageBytes; i += 4) {
    s = Mix(s);
    const float v = static_cast<float>(s >> 40) / float(1 << 22) - 2.0f;
    std::memcpy(&out[i], &v, 4);
  }
  return out;
}

// "" when `got` is page `page` of `tokens`: byte-exact, or with `lossy`
// within the fp8 codec's bound (core/codec/fp8/fp8_codec.h: |x - x'| <=
// max|block| * 2^-4; the page's maximum bounds every block's).
std::string CheckPage(const std::vector<Token>& tokens, size_t page,
                      absl::string_view got, bool lossy) {
  const std::string want = PageBytes(tokens, page);
  if (got.size() != want.size()) {
    return absl::StrFormat("page %d: %d bytes, want %d", page, got.size(),
                           want.size());
  }
  if (!lossy) {
    return std::memcmp(got.data(), want.data(), want.size()) == 0
               ? ""
               : absl::StrFormat("page %d of token %d: bytes differ", page,
                                 tokens[0]);
  }
  const size_t n = want.size() / 4;
  std::vector<float> w(n), g(n);
  std::memcpy(w.data(), want.data(), want.size());
  std::memcpy(g.data(), got.data(), got.size());
  float max_abs = 0;
  for (float v : w) max_abs = std::max(max_abs, std::fabs(v));
  for (size_t i = 0; i < n; ++i) {
    if (!(std::fabs(g[i] - w[i]) <= max_abs / 16)) {
      return absl::StrFormat("page %d element %d: %g, want %g (fp8 bound %g)",
                             page, i, g[i], w[i], max_abs / 16);
    }
  }
  return "";
}

// Problems seen by the workers (Catch2 v2 assertions are not thread-safe).
class Failures {
 public:
  void Add(std::string what) {
    absl::MutexLock l(&mu_);
    if (list_.size() < 20) list_.push_back(std::move(what));
    ++count_;
  }
  std::string Summary() const {
    absl::MutexLock l(&mu_);
    std::string s = absl::StrCat(count_, " failures");
    for (const auto& f : list_) absl::StrAppend(&s, "\n  ", f);
    return s;
  }
  size_t count() const {
    absl::MutexLock l(&mu_);
    return count_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> list_ ABSL_GUARDED_BY(mu_);
  size_t count_ ABSL_GUARDED_BY(mu_) = 0;
};

struct Tally {  // what the run did; the test fails if a kind never ran
  std::atomic<uint64_t> pages_verified{0}, inserts{0}, abandoned{0}, broken{0},
      leases{0}, released{0}, evictions{0}, demotions{0}, creates{0},
      deletes{0}, reaped{0}, dir_busy{0}, full_mid_upload{0}, appends{0},
      append_refused{0};
};

struct NsKind {
  std::string name;
  std::string codec;  // "" identity
  uint32_t pages;
  uint64_t host_bytes;  // 0: no tiers
  bool disk;
  bool churn;  // created and deleted during the run
  bool page_keys = false;
  bool page_hashes = false;  // keys are chained hashes of the token prefix
};

const std::vector<NsKind>& Kinds() {
  static const auto* kinds = new std::vector<NsKind>{
      {"flat", "", 24, 0, false, false},
      {"tiered", "", 10, 6 * 1024, true, false},
      {"lossy", "fp8", 10, 2 * 1024, true, false},
      {"churn0", "", 8, 4 * 1024, false, true},
      {"churn1", "fp8", 8, 1024, true, true},
      {"keys", "", 12, 4 * 1024, true, false, true},
      {"hashes", "", 12, 4 * 1024, true, false, false, true},
  };
  return *kinds;
}

NamespaceSpec SpecOf(const NsKind& k, const std::string& dir) {
  NamespaceSpec s;
  s.name = k.name;
  s.geometry = StressGeometry();
  s.capacity_bytes = k.pages * kPageBytes;
  s.codec = k.codec;
  s.key_kind = k.page_hashes ? KeyKind::kPageHashes
               : k.page_keys ? KeyKind::kPageKeys
                             : KeyKind::kTokens;
  s.host_compressed_bytes = k.host_bytes;
  if (k.disk) {
    s.disk_dir = dir + "/" + k.name;
    s.disk_bytes = 8 * kPageBytes;
  }
  return s;
}

bool Lossy(const Namespace& ns) { return ns.config().codec == "fp8"; }

// The elements `ns` is keyed by: the tokens, or one key per page made of
// the page's token bytes, or (page hashes) the 128-bit XXH3 of the token
// prefix through the end of the page, which names the page and every page
// before it as an engine's chained page hash does.
std::vector<Token> Elements(const Namespace& ns,
                            const std::vector<Token>& tokens) {
  if (ns.key_kind() == KeyKind::kTokens) return tokens;
  std::vector<Token> out;
  for (size_t p = 0; p < tokens.size() / kPageSize; ++p) {
    std::string key(
        reinterpret_cast<const char*>(tokens.data() + p * kPageSize),
        kPageSize * sizeof(Token));
    if (ns.key_kind() == KeyKind::kPageHashes) {
      const XXH128_hash_t h =
          XXH3_128bits(tokens.data(), (p + 1) * kPageSize * sizeof(Token));
      key.assign(reinterpret_cast<const char*>(&h), sizeof(h));
    }
    if (!AppendPageKey(key, p, "page_keys", &out).ok()) std::abort();
  }
  return out;
}

// Pages [from, n) of `bytes` (n pages) layer by layer: for each layer, for
// each page, K then V of that layer.
std::string LayerMajor(const std::string& bytes, size_t from) {
  const Geometry g = StressGeometry();
  const uint64_t kvb = KvLayerBytes(g);
  std::string out;
  for (uint32_t l = 0; l < g.num_layers; ++l) {
    for (size_t p = from; p < bytes.size() / kPageBytes; ++p) {
      for (int kv = 0; kv < 2; ++kv) {
        out.append(bytes, p * kPageBytes + KvLayerOffset(g, l, kv), kvb);
      }
    }
  }
  return out;
}

class Runner {
 public:
  explicit Runner(std::string dir) : dir_(std::move(dir)) {
    StoreOptions o;
    o.pool_budget_bytes = 64 << 20;
    o.default_lease_ttl = absl::Seconds(2);
    o.max_lease_ttl = absl::Minutes(1);
    o.log = [](const std::string&, const std::string&) {};
    store_ = std::make_unique<Store>(std::move(o));
  }
  Store& store() { return *store_; }
  Failures& failures() { return failures_; }
  Tally& tally() { return tally_; }
  const std::string& dir() const { return dir_; }

  void Create(const NsKind& k) {
    auto r = store_->CreateNamespace(SpecOf(k, dir_), /*if_not_exists=*/true);
    // A deleted namespace still held by requests keeps its disk directory.
    if (k.churn && absl::IsFailedPrecondition(r.status())) {
      ++tally_.dir_busy;
      return;
    }
    if (!r.ok()) return Fail("CreateNamespace " + k.name, r.status());
    if (r->second) ++tally_.creates;
  }
  void Fail(const std::string& what, const absl::Status& s) {
    failures_.Add(absl::StrCat(what, ": ", s.ToString()));
  }
  // Reads pinned pages [first, first + n) of `tokens`; checks each one.
  void Verify(const Namespace& ns, const std::vector<Token>& tokens,
              size_t first, const Namespace::PinnedPages& pinned);
  void Read(Namespace& ns, const std::vector<Token>& tokens, bool compressed);
  void LeaseRead(Namespace& ns, const std::vector<Token>& tokens,
                 std::mt19937_64& rng);
  void Insert(Namespace& ns, const std::vector<Token>& tokens,
              std::mt19937_64& rng);
  void Evict(Namespace& ns, const std::vector<Token>& tokens,
             std::mt19937_64& rng);
  void Worker(int id, const std::atomic<bool>& stop);
  void Churn(const std::atomic<bool>& stop);
  void Reaper(const std::atomic<bool>& stop);
  // After the run: no lease or upload, invariants, every page exact.
  void CheckQuiescent();

 private:
  const std::string dir_;
  std::unique_ptr<Store> store_;
  Failures failures_;
  Tally tally_;
};

void Runner::Verify(const Namespace& ns, const std::vector<Token>& tokens,
                    size_t first, const Namespace::PinnedPages& pinned) {
  for (size_t i = 0; i < pinned.size(); ++i) {
    const absl::string_view b = pinned.bytes(i);
    if (XXH3_64bits(b.data(), b.size()) != pinned.checksum(i)) {
      failures_.Add(absl::StrCat(ns.name(), ": checksum mismatch"));
      continue;
    }
    std::string err;
    if (pinned.format() == FetchFormat::kRaw) {
      err = CheckPage(tokens, first + i, b,
                      Lossy(ns) && pinned.tier(i) != Tier::kRaw);
    } else {
      std::string raw(kPageBytes, '\0');
      const auto buffer = absl::MakeConstSpan(
          reinterpret_cast<const uint8_t*>(b.data()), b.size());
      // A page-hash page keeps the position it had in the Insert that
      // stored it (its key does not say where it is): decode at the
      // buffer's own position, as the SDK's decoder does.
      uint64_t position = (first + i) * kPageSize;
      if (ns.key_kind() == KeyKind::kPageHashes) {
        absl::StatusOr<ParsedEnvelope> env = ParseEnvelope(buffer);
        if (env.ok()) position = env->position(0);
      }
      const MutablePageRef ref{reinterpret_cast<uint8_t*>(&raw[0]), position};
      const absl::Status s = ns.calibrations().tier_codec()->Decode(
          buffer, absl::MakeConstSpan(&ref, 1), nullptr);
      err =
          s.ok() ? CheckPage(tokens, first + i, raw, Lossy(ns)) : s.ToString();
    }
    if (!err.empty()) failures_.Add(absl::StrCat(ns.name(), ": ", err));
    ++tally_.pages_verified;
  }
}

void Runner::Read(Namespace& ns, const std::vector<Token>& tokens,
                  bool compressed) {
  auto m = ns.Match(Elements(ns, tokens), /*lock=*/false, absl::ZeroDuration());
  if (!m.ok()) return Fail("Match", m.status());
  if (m->pages.empty()) return;
  auto pinned = ns.PinPages(
      m->pages, compressed ? FetchFormat::kCompressed : FetchFormat::kRaw);
  // Without a lease the pages may be evicted before they are pinned.
  if (absl::IsNotFound(pinned.status())) return;
  if (!pinned.ok()) return Fail(ns.name() + ": PinPages", pinned.status());
  Verify(ns, tokens, 0, *pinned);
}

void Runner::LeaseRead(Namespace& ns, const std::vector<Token>& tokens,
                       std::mt19937_64& rng) {
  const bool expire = rng() % 4 == 0;  // left to its TTL: a deadline
  auto m = ns.Match(Elements(ns, tokens), /*lock=*/true,
                    expire ? kShortTtl : kLongTtl);
  if (!m.ok()) return Fail("Match(lock)", m.status());
  if (m->lease_id == 0) return;
  ++tally_.leases;
  const uint32_t n = static_cast<uint32_t>(m->pages.size());
  const uint32_t start = static_cast<uint32_t>(rng() % n);
  const uint32_t count = static_cast<uint32_t>(rng() % (n - start + 1));
  auto pinned = ns.PinLease(
      m->lease_id, start, count,
      rng() % 3 == 0 ? FetchFormat::kCompressed : FetchFormat::kRaw);
  if (pinned.ok()) {
    Verify(ns, tokens, start, *pinned);
  } else if (!absl::IsNotFound(pinned.status()) || !expire) {
    // A long lease can only vanish when churn deleted the namespace.
    if (!ns.deleted()) Fail(ns.name() + ": PinLease", pinned.status());
  }
  if (expire) return;
  if (rng() % 4 == 0) {
    auto e = store_->ExtendLease(m->lease_id, kLongTtl);
    if (!e.ok() && !ns.deleted()) Fail("ExtendLease", e.status());
  }
  // Releasing through the store (lease id only) or the namespace, as the
  // Release RPC and namespace deletion do.
  const absl::Status s =
      rng() % 2 == 0 ? store_->Release(m->lease_id) : ns.Release(m->lease_id);
  if (s.ok()) {
    ++tally_.released;
  } else if (!ns.deleted()) {
    Fail("Release", s);
  }
}

void Runner::Insert(Namespace& ns, const std::vector<Token>& tokens,
                    std::mt19937_64& rng) {
  const size_t pages = tokens.size() / kPageSize;
  std::string bytes;
  std::vector<uint64_t> sums;
  for (size_t p = 0; p < pages; ++p) {
    const std::string page = PageBytes(tokens, p);
    sums.push_back(XXH3_64bits(page.data(), page.size()));
    bytes += page;
  }
  const int fate = static_cast<int>(rng() % 10);  // 0: abandon, 1: break
  // The last page's checksum: only pages not cached yet are checked (the
  // bytes of cached ones are discarded).
  if (fate == 1) sums.back() ^= 1;
  if (fate > 1 && rng() % 2 == 0) sums.clear();  // checksums are optional
  const std::vector<Token> elements = Elements(ns, tokens);
  Namespace::InsertSpec spec;
  spec.elements = elements;
  // An append of what a Match just found cached (evicted in between: a
  // refusal), page after page or layer by layer.
  const bool append = rng() % 3 == 0;
  if (append) {
    auto m = ns.Match(elements, /*lock=*/false, absl::ZeroDuration());
    if (!m.ok()) return Fail("Match", m.status());
    spec.skip_pages =
        static_cast<uint32_t>(std::min(m->pages.size(), pages - 1));
    spec.layer_major = rng() % 2 == 0;
    bytes.erase(0, spec.skip_pages * kPageBytes);
    if (spec.layer_major) bytes = LayerMajor(bytes, 0);
    if (!sums.empty()) sums.erase(sums.begin(), sums.begin() + spec.skip_pages);
  }
  spec.checksums = sums;
  auto up = ns.BeginInsert(spec);
  // Every slot reserved or locked by others: a legitimate refusal.
  if (absl::IsResourceExhausted(up.status())) return;
  if (append && absl::IsFailedPrecondition(up.status())) {
    ++tally_.append_refused;
    return;
  }
  if (!up.ok()) return Fail("BeginInsert", up.status());
  const size_t stop_at = fate == 0 ? rng() % bytes.size() : bytes.size();
  size_t off = 0;
  while (off < stop_at) {
    const size_t n = std::min<size_t>(stop_at - off, 1 + rng() % 1500);
    const absl::Status s =
        (*up)->Write(off, absl::string_view(bytes).substr(off, n));
    if (!s.ok()) {
      if (fate == 1 && absl::IsDataLoss(s)) {
        ++tally_.broken;
      } else if (absl::IsResourceExhausted(s)) {
        // Slots are reserved as bytes arrive: others' uploads in progress
        // and leases may hold every slot by then, a legitimate refusal.
        ++tally_.full_mid_upload;
      } else {
        Fail("Upload::Write", s);
      }
      return;  // destroying the dead upload frees its slots
    }
    off += n;
  }
  if (fate == 0) {
    ++tally_.abandoned;  // the upload dies here, mid-way
    return;
  }
  if (fate == 1) {
    if (!(*up)->page_cached(static_cast<uint32_t>(pages - 1))) {
      Fail("Upload::Write", absl::InternalError("wrong checksum accepted"));
    }
    return;
  }
  auto c = (*up)->Commit();
  if (!c.ok()) return Fail("Commit", c.status());
  ++tally_.inserts;
  if (append) ++tally_.appends;
}

void Runner::Evict(Namespace& ns, const std::vector<Token>& tokens,
                   std::mt19937_64& rng) {
  switch (rng() % 4) {
    case 0: {
      auto m =
          ns.Match(Elements(ns, tokens), /*lock=*/false, absl::ZeroDuration());
      if (!m.ok()) return Fail("Match", m.status());
      if (m->pages.empty()) return;
      const PageHandle h = m->pages[rng() % m->pages.size()];
      auto e = ns.EvictPages(absl::MakeConstSpan(&h, 1));
      // Leased (FailedPrecondition) or already gone (NotFound) are answers.
      if (!e.ok() && !absl::IsFailedPrecondition(e.status()) &&
          !absl::IsNotFound(e.status())) {
        Fail("EvictPages", e.status());
      }
      break;
    }
    case 1:
      ns.EvictBytes((1 + rng() % 3) * kPageBytes);
      break;
    case 2:
      if (ns.tiered()) {
        const Tier to = ns.config().disk_dir.empty() || rng() % 2 == 0
                            ? Tier::kHostCompressed
                            : Tier::kDisk;
        auto d = ns.tiers().DemoteAll(to);
        if (!d.ok()) return Fail("DemoteAll", d.status());
        ++tally_.demotions;
      }
      break;
    default:
      if (ns.tiered()) ns.tiers().EnforceBudgets();
      if (rng() % 8 == 0) ns.EvictAll();
      break;
  }
  ++tally_.evictions;
}

void Runner::Worker(int id, const std::atomic<bool>& stop) {
  std::mt19937_64 rng(0x5eed + id);
  const std::vector<SeqKey> keys = AllKeys();
  while (!stop.load()) {
    const NsKind& kind = Kinds()[rng() % Kinds().size()];
    auto got = store_->Get(kind.name);
    if (!got.ok()) {
      if (!kind.churn) Fail("Get " + kind.name, got.status());
      continue;
    }
    Namespace& ns = **got;
    const std::vector<Token> tokens = MakeTokens(keys[rng() % keys.size()]);
    const int op = static_cast<int>(rng() % 100);
    if (op < 25) {
      Read(ns, tokens, rng() % 3 == 0);
    } else if (op < 45) {
      LeaseRead(ns, tokens, rng);
    } else if (op < 78) {
      Insert(ns, tokens, rng);
    } else if (op < 93) {
      Evict(ns, tokens, rng);
    } else if (op < 97) {
      // Introspection RPCs (Stats, TreeDump) read under the same locks.
      (void)ns.Counters();
      (void)ns.DumpTree(16);
      (void)store_->Counters();
      const absl::Status s = ns.CheckInvariants();
      if (!s.ok()) Fail("CheckInvariants " + ns.name(), s);
    } else {
      tally_.reaped += store_->ReapExpiredLeases(absl::Now());
    }
  }
}

void Runner::Churn(const std::atomic<bool>& stop) {
  std::mt19937_64 rng(0xc4a2);
  while (!stop.load()) {
    for (const NsKind& k : Kinds()) {
      if (!k.churn) continue;
      if (rng() % 2 == 0) {
        Create(k);
        continue;
      }
      const bool force = rng() % 2 == 0;
      const absl::Status s = store_->DeleteNamespace(k.name, force);
      if (s.ok()) {
        ++tally_.deletes;
      } else if (!absl::IsNotFound(s) &&
                 !(absl::IsFailedPrecondition(s) && !force)) {
        Fail("DeleteNamespace " + k.name, s);
      }
    }
    absl::SleepFor(absl::Milliseconds(5 + rng() % 20));
  }
}

void Runner::Reaper(const std::atomic<bool>& stop) {
  while (!stop.load()) {  // the daemon's periodic lease reaper
    tally_.reaped += store_->ReapExpiredLeases(absl::Now());
    absl::SleepFor(absl::Milliseconds(10));
  }
}

void Runner::CheckQuiescent() {
  absl::SleepFor(kShortTtl * 2);
  tally_.reaped += store_->ReapExpiredLeases(absl::Now());
  for (const auto& ns : store_->List()) {
    const NamespaceStats c = ns->Counters();
    const uint64_t tiers =
        c.tiers[0].pages + c.tiers[1].pages + c.tiers[2].pages;
    if (c.active_leases != 0 || c.uploads_in_flight != 0 ||
        c.protected_pages != 0 || c.evictable_pages != c.cached_pages ||
        tiers != c.cached_pages) {
      failures_.Add(absl::StrFormat(
          "%s after the run: %d leases, %d uploads, %d protected + %d "
          "evictable pages, %d cached, %d in tiers",
          ns->name(), c.active_leases, c.uploads_in_flight, c.protected_pages,
          c.evictable_pages, c.cached_pages, tiers));
    }
    const absl::Status s = ns->CheckInvariants();
    if (!s.ok()) Fail("CheckInvariants " + ns->name(), s);
    for (const SeqKey& k : AllKeys()) {
      const std::vector<Token> tokens = MakeTokens(k);
      Read(*ns, tokens, /*compressed=*/false);
      Read(*ns, tokens, /*compressed=*/true);
    }
  }
}

TEST_CASE("core stress: every Store/Namespace operation from many threads") {
  const int seconds = EnvInt("KVHARBOR_CORE_STRESS_SECONDS", 30);
  const int threads = EnvInt("KVHARBOR_CORE_STRESS_THREADS", 12);
  TempDir dir;
  Runner r(dir.path);
  for (const NsKind& k : Kinds()) r.Create(k);
  REQUIRE(r.failures().count() == 0);

  std::atomic<bool> stop{false};
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) {
    pool.emplace_back([&r, &stop, i] { r.Worker(i, stop); });
  }
  pool.emplace_back([&r, &stop] { r.Churn(stop); });
  pool.emplace_back([&r, &stop] { r.Reaper(stop); });
  absl::SleepFor(absl::Seconds(seconds));
  stop.store(true);
  for (auto& t : pool) t.join();
  r.CheckQuiescent();

  const Tally& t = r.tally();
  const std::string summary = absl::StrFormat(
      "core stress: %d s, %d threads: verified %d pages; %d inserts, %d "
      "abandoned, %d broken; %d leases, %d released, %d reaped; %d "
      "evictions, %d demotions; %d creates, %d deletes, %d refused (disk "
      "directory busy); %d uploads refused mid-way (namespace full); %d "
      "appends, %d refused (prefix gone); %s",
      seconds, threads, t.pages_verified.load(), t.inserts.load(),
      t.abandoned.load(), t.broken.load(), t.leases.load(), t.released.load(),
      t.reaped.load(), t.evictions.load(), t.demotions.load(), t.creates.load(),
      t.deletes.load(), t.dir_busy.load(), t.full_mid_upload.load(),
      t.appends.load(), t.append_refused.load(), r.failures().Summary());
  std::printf("%s\n", summary.c_str());
  INFO(summary);
  CHECK(r.failures().count() == 0);
  // Each kind of operation must have happened, or the run proved nothing.
  CHECK(t.pages_verified > 0);
  CHECK(t.inserts > 0);
  CHECK(t.abandoned > 0);
  CHECK(t.broken > 0);
  CHECK(t.released > 0);
  CHECK(t.reaped > 0);
  CHECK(t.demotions > 0);
  CHECK(t.deletes > 0);
  CHECK(t.creates > Kinds().size());
  CHECK(t.appends > 0);
}

}  // namespace
}  // namespace testing
}  // namespace kvharbor
