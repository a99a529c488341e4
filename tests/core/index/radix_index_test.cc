// Tests of RadixIndex: one case per operation, then a brute-force reference
// model driven by long random operation sequences.
#include "core/index/radix_index.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/index/page_key.h"

namespace kvharbor {
namespace {

using Tokens = std::vector<Token>;
using Handles = std::vector<PageHandle>;

Handles Range(PageHandle first, size_t n) {
  Handles h(n);
  std::iota(h.begin(), h.end(), first);
  return h;
}

template <typename T>
std::vector<T> Concat(const std::vector<T>& a, const std::vector<T>& b) {
  std::vector<T> out = a;
  out.insert(out.end(), b.begin(), b.end());
  return out;
}

// Tokens of `pages` pages, page i filled with base + i.
Tokens PagesOf(uint32_t page_size, Token base, size_t pages) {
  Tokens t;
  for (size_t i = 0; i < pages; ++i) t.insert(t.end(), page_size, base + i);
  return t;
}

RadixIndex::InsertResult MustInsert(RadixIndex& index, const Tokens& tokens,
                                    const Handles& pages) {
  auto r = index.Insert(tokens, pages);
  REQUIRE(r.ok());
  REQUIRE(index.CheckInvariants().ok());
  return *r;
}

TEST_CASE("RadixIndex: the seed's example tree (page_size 1)") {
  RadixIndex index(1);
  MustInsert(index, {1, 2, 3, 4}, {10, 11, 12, 13});
  auto r2 = MustInsert(index, {1, 2, 3, 4, 5}, {20, 21, 22, 23, 24});
  CHECK(r2.already_present_tokens == 4);
  auto r3 = MustInsert(index, {1, 6, 7}, {30, 31, 32});
  CHECK(r3.already_present_tokens == 1);
  // root -> [1] -> {[2 3 4] -> [5], [6 7]}
  CHECK(index.node_count() == 4);
  CHECK(index.total_pages() == 7);
  CHECK(index.evictable_pages() == 7);

  Handles pages;
  auto m = index.Match({1, 2, 3, 4, 5, 9}, &pages);
  CHECK(m.matched_tokens == 5);
  CHECK(pages == Handles{10, 11, 12, 13, 24});
  pages.clear();
  m = index.Match({1, 6, 7}, &pages);
  CHECK(m.matched_tokens == 3);
  CHECK(pages == Handles{10, 31, 32});

  const std::string dump = index.Dump(100);
  INFO(dump);
  CHECK(dump.find("\n  [1] pages=1 (10)") != std::string::npos);
  CHECK(dump.find("\n    [2 3 4] pages=3 (11 12 13)") != std::string::npos);
  CHECK(dump.find("\n      [5] pages=1 (24)") != std::string::npos);
  CHECK(dump.find("\n    [6 7] pages=2 (31 32)") != std::string::npos);
  CHECK(index.Dump(2).find("2 more nodes") != std::string::npos);
}

TEST_CASE("RadixIndex: a match ending inside a node splits it") {
  RadixIndex index(4);
  const Tokens a = PagesOf(4, 100, 3);
  MustInsert(index, a, {1, 2, 3});
  Tokens q(a.begin(), a.begin() + 8);
  q.insert(q.end(), {7, 7, 7, 7});
  Handles pages;
  auto m = index.Match(q, &pages);
  REQUIRE(index.CheckInvariants().ok());
  CHECK(m.matched_tokens == 8);
  CHECK(pages == Handles{1, 2});
  CHECK(index.node_count() == 2);
  CHECK(index.PeekMatchTokens(q) == 8);
  // The returned node covers exactly the two matched pages.
  index.Lock(m.node);
  CHECK(index.protected_pages() == 2);
  CHECK(index.evictable_pages() == 1);
  REQUIRE(index.CheckInvariants().ok());
  index.Unlock(m.node);
  CHECK(index.protected_pages() == 0);
  REQUIRE(index.CheckInvariants().ok());
}

TEST_CASE("RadixIndex: a handle locked before a split unlocks afterwards") {
  RadixIndex index(2);
  auto r = MustInsert(index, PagesOf(2, 1, 4), {1, 2, 3, 4});
  index.Lock(r.node);
  CHECK(index.protected_pages() == 4);
  Handles pages;
  index.Match(PagesOf(2, 1, 2), &pages);  // splits the locked node
  CHECK(index.node_count() == 2);
  REQUIRE(index.CheckInvariants().ok());
  index.Unlock(r.node);
  CHECK(index.protected_pages() == 0);
  CHECK(index.evictable_pages() == 4);
  REQUIRE(index.CheckInvariants().ok());
  Handles evicted;
  CHECK(index.Evict(10, &evicted) == 4);
  CHECK(index.node_count() == 0);
}

TEST_CASE("RadixIndex: insert deduplicates against what is present") {
  RadixIndex index(4);
  const Tokens a = PagesOf(4, 0, 3);
  MustInsert(index, a, {1, 2, 3});
  Tokens b(a.begin(), a.begin() + 8);
  b.insert(b.end(), {9, 9, 9, 9, 8, 8, 8, 8});
  auto r = MustInsert(index, b, {11, 12, 13, 14});
  CHECK(r.already_present_tokens == 8);
  CHECK(index.total_pages() == 5);
  Handles pages;
  CHECK(index.Match(b, &pages).matched_tokens == 16);
  CHECK(pages == Handles{1, 2, 13, 14});  // 11, 12 stayed the caller's
  auto again = MustInsert(index, b, {21, 22, 23, 24});
  CHECK(again.already_present_tokens == 16);
  CHECK(again.node == index.Match(b, nullptr).node);
  CHECK(index.total_pages() == 5);
}

TEST_CASE("RadixIndex: bad inserts are rejected and change nothing") {
  RadixIndex index(4);
  MustInsert(index, PagesOf(4, 0, 2), {1, 2});
  const std::string before = index.Dump(100);
  auto bad_len = index.Insert(PagesOf(4, 50, 2), {5});
  REQUIRE(bad_len.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(bad_len.status().message()).find("pages.size()") !=
        std::string::npos);
  Tokens partial = PagesOf(4, 50, 1);
  partial.push_back(3);
  CHECK(index.Insert(partial, {5}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  auto held = index.Insert(PagesOf(4, 60, 2), {7, 2});
  REQUIRE(held.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(held.status().message()).find("pages[1]") !=
        std::string::npos);
  CHECK(index.Insert(PagesOf(4, 60, 3), {7, 8, 7}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  // pages[0] is present (caller keeps 9) yet 9 is also given for a new page.
  Tokens ext = Concat(PagesOf(4, 0, 1), PagesOf(4, 70, 1));
  CHECK(index.Insert(ext, {9, 9}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(index.Dump(100) == before);
  CHECK(index.total_pages() == 2);
  REQUIRE(index.CheckInvariants().ok());
  MustInsert(index, PagesOf(4, 60, 3), {7, 8, 9});  // handles were released
}

TEST_CASE("RadixIndex: a trailing partial page is ignored") {
  RadixIndex index(4);
  const Tokens a = PagesOf(4, 0, 2);
  MustInsert(index, a, {1, 2});
  Tokens q = a;
  q.insert(q.end(), {1, 1});
  CHECK(index.PeekMatchTokens(q) == 8);
  Handles pages;
  CHECK(index.Match(q, &pages).matched_tokens == 8);
  CHECK(pages.size() == 2);
  CHECK(index.Match(Tokens{0, 0, 0}, nullptr).matched_tokens == 0);
  Tokens q2(a.begin(), a.begin() + 7);  // one full page plus 3 tokens
  CHECK(index.PeekMatchTokens(q2) == 4);
}

TEST_CASE("RadixIndex: a locked prefix is never evicted") {
  RadixIndex index(1);
  MustInsert(index, {1, 2, 3}, {1, 2, 3});
  MustInsert(index, {5, 6}, {5, 6});
  index.Lock(index.Match({1, 2}, nullptr).node);
  CHECK(index.protected_pages() == 2);
  Handles evicted;
  CHECK(index.Evict(100, &evicted) == 3);
  std::sort(evicted.begin(), evicted.end());
  CHECK(evicted == Handles{3, 5, 6});
  CHECK(index.total_pages() == 2);
  CHECK(index.Evict(1, &evicted) == 0);
  REQUIRE(index.CheckInvariants().ok());
}

TEST_CASE("RadixIndex: eviction follows LRU order and trims tails") {
  RadixIndex index(2);
  MustInsert(index, PagesOf(2, 10, 3), {1, 2, 3});
  MustInsert(index, PagesOf(2, 20, 3), {4, 5, 6});
  MustInsert(index, PagesOf(2, 30, 3), {7, 8, 9});
  index.Match(PagesOf(2, 10, 3), nullptr);  // 10.. is now the newest
  Handles evicted;
  CHECK(index.Evict(2, &evicted) == 2);
  CHECK(evicted == Handles{6, 5});  // tail first, of the oldest leaf
  CHECK(index.node_count() == 3);
  Handles pages;
  CHECK(index.PeekMatchTokens(PagesOf(2, 20, 3)) == 2);
  evicted.clear();
  CHECK(index.Evict(3, &evicted) == 3);
  CHECK(evicted == Handles{4, 9, 8});
  evicted.clear();
  CHECK(index.Evict(100, &evicted) == 4);
  CHECK(evicted == Handles{7, 3, 2, 1});
  CHECK(index.total_pages() == 0);
  CHECK(index.node_count() == 0);
  REQUIRE(index.CheckInvariants().ok());
}

TEST_CASE("RadixIndex: a parent left childless is evicted in turn") {
  RadixIndex index(1);
  MustInsert(index, {1, 2, 3, 4}, {1, 2, 3, 4});
  MustInsert(index, {1, 2, 5}, {9, 10, 11});  // splits: [1 2] {[3 4], [5]}
  MustInsert(index, {7}, {7});                // newest
  CHECK(index.node_count() == 4);
  Handles evicted;
  // Leaves by age: [3 4], then [5]; then [1 2] becomes a leaf older than [7].
  CHECK(index.Evict(5, &evicted) == 5);
  CHECK(evicted == Handles{4, 3, 11, 2, 1});
  CHECK(index.node_count() == 1);
  REQUIRE(index.CheckInvariants().ok());

  // A locked parent stays when its children go.
  RadixIndex locked(1);
  MustInsert(locked, {1, 2}, {1, 2});
  MustInsert(locked, {1, 2, 3}, {0, 100, 3});
  auto m = locked.Match({1, 2}, nullptr);
  locked.Lock(m.node);
  evicted.clear();
  CHECK(locked.Evict(10, &evicted) == 1);
  CHECK(evicted == Handles{3});
  CHECK(locked.total_pages() == 2);
  locked.Unlock(m.node);
  REQUIRE(locked.CheckInvariants().ok());
  CHECK(locked.evictable_pages() == 2);
  evicted.clear();
  CHECK(locked.EvictAll(&evicted) == 2);
  CHECK(evicted == Handles{2, 1});
}

TEST_CASE("RadixIndex: erasing a middle page removes its descendants") {
  RadixIndex index(2);
  const Tokens a = PagesOf(2, 0, 5);
  MustInsert(index, a, Range(100, 5));
  Tokens b(a.begin(), a.begin() + 8);
  b.insert(b.end(), {50, 50, 51, 51});
  MustInsert(index, b, Range(200, 6));  // branch after page 3: 204, 205
  MustInsert(index, PagesOf(2, 70, 2), {300, 301});
  Handles removed;
  REQUIRE(index.Erase({102, 999}, &removed).ok());
  std::sort(removed.begin(), removed.end());
  CHECK(removed == Handles{102, 103, 104, 204, 205});
  REQUIRE(index.CheckInvariants().ok());
  CHECK(index.total_pages() == 4);
  Handles pages;
  CHECK(index.Match(b, &pages).matched_tokens == 4);
  CHECK(pages == Handles{100, 101});
  // Erasing a node's first page removes the node itself.
  removed.clear();
  REQUIRE(index.Erase({300}, &removed).ok());
  CHECK(removed == Handles{301, 300});
  CHECK(index.node_count() == 1);
  REQUIRE(index.CheckInvariants().ok());
}

TEST_CASE("RadixIndex: erasing a locked page fails and changes nothing") {
  RadixIndex index(1);
  MustInsert(index, {1, 2, 3}, {1, 2, 3});
  MustInsert(index, {8, 9}, {8, 9});
  auto m = index.Match({1, 2}, nullptr);
  index.Lock(m.node);
  const std::string before = index.Dump(100);
  Handles removed;
  absl::Status s = index.Erase({8, 3, 2}, &removed);
  REQUIRE(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(s.message()).find("handle 2") != std::string::npos);
  CHECK(removed.empty());
  CHECK(index.Dump(100) == before);
  CHECK(index.total_pages() == 5);
  REQUIRE(index.CheckInvariants().ok());
  // The unlocked tail of the locked path can go.
  REQUIRE(index.Erase({3}, &removed).ok());
  CHECK(removed == Handles{3});
  index.Unlock(m.node);
  REQUIRE(index.Erase({1}, &removed).ok());
  CHECK(index.total_pages() == 2);
  REQUIRE(index.CheckInvariants().ok());
}

TEST_CASE("RadixIndex: wide fan-out uses the child index") {
  RadixIndex index(4);
  const Tokens common = PagesOf(4, 0, 2);
  PageHandle next = 1;
  MustInsert(index, common, {next, next + 1});
  next += 2;
  for (int i = 0; i < 40; ++i) {
    Tokens t = Concat(common, PagesOf(4, 1000 + 10 * i, 2));
    MustInsert(index, t, {0, 1000000, next, next + 1});
    next += 2;
  }
  CHECK(index.node_count() == 41);
  for (int i = 0; i < 40; ++i) {
    Tokens t = Concat(common, PagesOf(4, 1000 + 10 * i, 3));
    Handles pages;
    CHECK(index.Match(t, &pages).matched_tokens == 16);
    CHECK(pages.back() == PageHandle(4 + 2 * i));
  }
  Tokens miss =
      Concat(common, Tokens{1000, 1000, 1000, 1001});  // first token hits
  CHECK(index.PeekMatchTokens(miss) == 8);
  Handles evicted;
  CHECK(index.Evict(70, &evicted) == 70);  // 5 children left: index kept
  REQUIRE(index.CheckInvariants().ok());
  CHECK(index.Evict(2, &evicted) == 2);  // 4 left: index dropped
  REQUIRE(index.CheckInvariants().ok());
  CHECK(index.PeekMatchTokens(Concat(common, PagesOf(4, 1390, 2))) == 16);
  CHECK(index.Evict(100, &evicted) == 10);
  CHECK(index.node_count() == 0);
}

TEST_CASE("RadixIndex: memory stays within 8 bytes per token beyond ids") {
  RadixIndex index(16);
  std::mt19937 rng(7);
  PageHandle next = 0;
  Tokens base(16 * 256);
  for (Token& t : base) t = static_cast<Token>(rng() % 50000);
  size_t cached_tokens = 0;
  for (int s = 0; s < 64; ++s) {
    Tokens t(base.begin(), base.begin() + 16 * (rng() % 256));
    for (int i = 0; i < 16 * 64; ++i) t.push_back(rng() % 50000);
    auto r = index.Insert(t, Range(next, t.size() / 16));
    REQUIRE(r.ok());
    next += t.size() / 16;
    cached_tokens += t.size() - r->already_present_tokens;
  }
  REQUIRE(index.CheckInvariants().ok());
  CHECK(index.total_pages() * 16 == cached_tokens);
  const double beyond =
      static_cast<double>(index.MemoryBytes()) / cached_tokens - 4.0;
  INFO("bytes per cached token beyond the ids: " << beyond);
  CHECK(beyond > 0.5);  // at least the handles are counted
  CHECK(beyond <= 8.0);
}

// ---------------------------------------------------------------------------
// Reference model: every cached page keyed by its full token prefix.

struct ModelPage {
  PageHandle handle = 0;
  int locks = 0;
  uint64_t last_access = 0;
};

class Model {
 public:
  explicit Model(uint32_t page_size) : ps_(page_size) {}

  Tokens Prefix(const Tokens& t, size_t pages) const {
    return Tokens(t.begin(), t.begin() + pages * ps_);
  }
  // Pages of the longest cached prefix of t, and their handles.
  size_t Match(const Tokens& t, Handles* handles) const {
    size_t j = 0;
    for (; (j + 1) * ps_ <= t.size(); ++j) {
      auto it = pages_.find(Prefix(t, j + 1));
      if (it == pages_.end()) break;
      if (handles != nullptr) handles->push_back(it->second.handle);
    }
    return j;
  }
  void Touch(const Tokens& t, size_t pages) {
    for (size_t j = 1; j <= pages; ++j) pages_[Prefix(t, j)].last_access = now_;
  }
  void Tick() { ++now_; }
  void Add(const Tokens& t, size_t page, PageHandle h) {
    pages_[Prefix(t, page + 1)] = ModelPage{h, 0, now_};
    by_handle_[h] = Prefix(t, page + 1);
  }
  void AddLocks(const Tokens& t, size_t pages, int delta) {
    for (size_t j = 1; j <= pages; ++j) pages_.at(Prefix(t, j)).locks += delta;
  }
  bool IsLeaf(std::map<Tokens, ModelPage>::const_iterator it) const {
    auto next = std::next(it);
    return next == pages_.end() || next->first.size() <= it->first.size() ||
           !std::equal(it->first.begin(), it->first.end(), next->first.begin());
  }
  // Evicts the least recently used unlocked leaf page; false when none.
  bool EvictOne(Handles* out) {
    auto best = pages_.end();
    int ties = 0;
    for (auto it = pages_.begin(); it != pages_.end(); ++it) {
      if (it->second.locks != 0 || !IsLeaf(it)) continue;
      if (best == pages_.end() ||
          it->second.last_access < best->second.last_access) {
        best = it;
        ties = 0;
      } else if (it->second.last_access == best->second.last_access) {
        ++ties;
      }
    }
    if (best == pages_.end()) return false;
    REQUIRE(ties == 0);  // the LRU order must be total
    out->push_back(best->second.handle);
    by_handle_.erase(best->second.handle);
    pages_.erase(best);
    return true;
  }
  bool Locked(PageHandle h) const {
    auto it = by_handle_.find(h);
    return it != by_handle_.end() && pages_.at(it->second).locks > 0;
  }
  void Erase(PageHandle h, Handles* out) {
    auto hit = by_handle_.find(h);
    if (hit == by_handle_.end()) return;
    const Tokens key = hit->second;
    auto it = pages_.find(key);
    while (it != pages_.end() && it->first.size() >= key.size() &&
           std::equal(key.begin(), key.end(), it->first.begin())) {
      out->push_back(it->second.handle);
      by_handle_.erase(it->second.handle);
      it = pages_.erase(it);
    }
  }
  size_t Count(bool locked) const {
    size_t n = 0;
    for (const auto& [k, p] : pages_) n += (p.locks > 0) == locked;
    return n;
  }
  const std::map<Tokens, ModelPage>& pages() const { return pages_; }
  bool Holds(PageHandle h) const { return by_handle_.count(h) > 0; }

 private:
  const uint32_t ps_;
  uint64_t now_ = 0;
  std::map<Tokens, ModelPage> pages_;
  std::map<PageHandle, Tokens> by_handle_;
};

// What a run exercised, so a run that silently stops covering a path fails.
struct RunStats {
  size_t splits = 0, matched_pages = 0, present_pages = 0, evicted = 0;
  size_t erased = 0, erase_refused = 0, bad_inserts = 0, locks = 0;
  size_t max_pages = 0;
};

struct HeldLock {
  RadixNode* node;
  Tokens tokens;
  size_t pages;
};

// Keys a page-key run draws its pages from: few, so that prefixes are
// shared, and such that a byte-wise prefix, a trailing NUL, the longest
// length and one differing last byte each make a different key.
const std::vector<std::string>& RunKeys() {
  static const auto* keys = new std::vector<std::string>{
      "a",
      "b",
      "ab",
      std::string("a\0", 2),
      std::string(kMaxPageKeyBytes, 'x'),
      std::string(kMaxPageKeyBytes - 1, 'x') + "y",
  };
  return *keys;
}

class RandomRun {
 public:
  // `page_keys`: a page-key namespace's index (core/index/page_key.h): each
  // page is one key of RunKeys(), kPageKeyWords words; page_size is unused.
  RandomRun(uint32_t page_size, uint32_t seed, bool page_keys = false)
      : ps_(page_keys ? kPageKeyWords : page_size),
        keys_(page_keys),
        index_(ps_),
        model_(ps_),
        rng_(seed) {}

  size_t Rand(size_t n) { return rng_() % n; }

  Tokens RandomTokens(size_t pages) {
    Tokens t;
    if (keys_) {
      for (size_t i = 0; i < pages; ++i) {
        REQUIRE(AppendPageKey(RunKeys()[Rand(RunKeys().size())], i, "keys", &t)
                    .ok());
      }
      return t;
    }
    t.resize(pages * ps_);
    for (Token& x : t) x = static_cast<Token>(Rand(3));
    return t;
  }
  // Changes one element: a token, or a whole page's key.
  void Mutate(Tokens* t) {
    if (!keys_) {
      (*t)[Rand(t->size())] = static_cast<Token>(Rand(3));
      return;
    }
    const Tokens page = RandomTokens(1);
    std::copy(page.begin(), page.end(),
              t->begin() + Rand(t->size() / ps_) * ps_);
  }
  // Mostly extensions or mutations of cached prefixes, to force sharing and
  // splits; sometimes a trailing partial page.
  Tokens Query(bool allow_partial) {
    Tokens t;
    const auto& pages = model_.pages();
    if (!pages.empty() && Rand(4) != 0) {
      auto it = pages.begin();
      std::advance(it, Rand(pages.size()));
      t = it->first;
      if (Rand(3) == 0) Mutate(&t);
      t = Concat(t, RandomTokens(Rand(4)));
    } else {
      t = RandomTokens(1 + Rand(6));
    }
    // Keys are whole pages: a page-key namespace has no partial page.
    if (allow_partial && !keys_ && ps_ > 1 && Rand(4) == 0) t.push_back(0);
    return t;
  }

  void DoMatch() {
    const Tokens q = Query(true);
    Handles want, got;
    const size_t want_pages = model_.Match(q, &want);
    REQUIRE(index_.PeekMatchTokens(q) == want_pages * ps_);
    got.push_back(12345);  // Match appends
    const size_t nodes_before = index_.node_count();
    auto m = index_.Match(q, &got);
    stats_.splits += index_.node_count() - nodes_before;
    stats_.matched_pages += want_pages;
    model_.Tick();
    model_.Touch(q, want_pages);
    REQUIRE(m.matched_tokens == want_pages * ps_);
    REQUIRE(got == Concat(Handles{12345}, want));
    MaybeLock(m.node, q, want_pages);
  }

  void DoInsert() {
    Tokens t = Query(false);
    const size_t n = t.size() / ps_;
    Handles h = Range(next_handle_, n);
    next_handle_ += n;
    const size_t present = model_.Match(t, nullptr);
    if (n > present && Rand(10) == 0) {  // a handle the index already holds
      const auto& pages = model_.pages();
      if (!pages.empty()) {
        h[present + Rand(n - present)] = pages.begin()->second.handle;
        REQUIRE(index_.Insert(t, h).status().code() ==
                absl::StatusCode::kInvalidArgument);
        ++stats_.bad_inserts;
        return;
      }
    }
    auto r = index_.Insert(t, h);
    REQUIRE(r.ok());
    model_.Tick();
    REQUIRE(r->already_present_tokens == present * ps_);
    stats_.present_pages += present;
    for (size_t j = present; j < n; ++j) model_.Add(t, j, h[j]);
    model_.Touch(t, n);
    MaybeLock(r->node, t, n);
  }

  void MaybeLock(RadixNode* node, const Tokens& t, size_t pages) {
    if (held_.size() >= 6 || Rand(3) != 0) return;
    index_.Lock(node);
    model_.AddLocks(t, pages, +1);
    held_.push_back({node, t, pages});
    ++stats_.locks;
  }

  void DoUnlock() {
    if (held_.empty()) return;
    const size_t i = Rand(held_.size());
    index_.Unlock(held_[i].node);
    model_.AddLocks(held_[i].tokens, held_[i].pages, -1);
    held_.erase(held_.begin() + i);
  }

  void DoEvict(bool all) {
    Handles want, got;
    const size_t k = all ? model_.Count(false) : 1 + Rand(12);
    while (want.size() < k && model_.EvictOne(&want)) {
    }
    const size_t n = all ? index_.EvictAll(&got) : index_.Evict(k, &got);
    REQUIRE(n == want.size());
    REQUIRE(got == want);  // exact LRU order, tails first
    stats_.evicted += n;
  }

  void DoErase() {
    Handles targets;
    const auto& pages = model_.pages();
    for (size_t i = 0, n = 1 + Rand(3); i < n && !pages.empty(); ++i) {
      auto it = pages.begin();
      std::advance(it, Rand(pages.size()));
      targets.push_back(it->second.handle);
    }
    if (Rand(4) == 0) targets.push_back(next_handle_ + 1000);  // unknown
    bool locked = false;
    for (PageHandle h : targets) locked = locked || model_.Locked(h);
    Handles got, want;
    absl::Status s = index_.Erase(targets, &got);
    if (locked) {
      REQUIRE(s.code() == absl::StatusCode::kFailedPrecondition);
      REQUIRE(got.empty());
      ++stats_.erase_refused;
      return;
    }
    REQUIRE(s.ok());
    for (PageHandle h : targets) model_.Erase(h, &want);
    std::sort(got.begin(), got.end());
    std::sort(want.begin(), want.end());
    REQUIRE(got == want);
    stats_.erased += got.size();
  }

  void CheckAgainstModel(bool full) {
    absl::Status s = index_.CheckInvariants();
    INFO(s.message());
    REQUIRE(s.ok());
    REQUIRE(index_.total_pages() == model_.pages().size());
    REQUIRE(index_.evictable_pages() == model_.Count(false));
    REQUIRE(index_.protected_pages() == model_.Count(true));
    if (!full) return;
    for (auto it = model_.pages().begin(); it != model_.pages().end(); ++it) {
      if (model_.IsLeaf(it)) {
        REQUIRE(index_.PeekMatchTokens(it->first) == it->first.size());
      }
    }
  }

  void Run(int steps) {
    for (int step = 0; step < steps; ++step) {
      const size_t op = Rand(1000);
      const size_t size = model_.pages().size();
      INFO("step " << step << " op " << op);
      if (op < 300) {
        DoMatch();
      } else if (op < 550) {
        DoInsert();
      } else if (op < 650) {
        DoUnlock();
      } else if (op < 900) {
        // Grow to a few dozen pages, hover below ~150.
        if (size > (op < 775 ? 40u : 150u)) {
          DoEvict(false);
        } else {
          DoInsert();
        }
      } else if (op < 995) {
        DoErase();
      } else {
        DoEvict(true);
      }
      CheckAgainstModel(step % 20 == 0);
      stats_.max_pages = std::max(stats_.max_pages, model_.pages().size());
    }
    while (!held_.empty()) DoUnlock();
    DoEvict(true);
    CheckAgainstModel(true);
    REQUIRE(index_.total_pages() == 0);
    REQUIRE(index_.node_count() == 0);
  }

  const RunStats& stats() const { return stats_; }

 private:
  const uint32_t ps_;
  const bool keys_;
  RadixIndex index_;
  Model model_;
  std::mt19937_64 rng_;
  PageHandle next_handle_ = 1;
  std::vector<HeldLock> held_;
  RunStats stats_;
};

// Runs `run` and checks that it exercised every path.
void RunAndCheckCoverage(RandomRun& run) {
  run.Run(3000);
  const RunStats& st = run.stats();
  INFO("splits " << st.splits << " matched " << st.matched_pages << " present "
                 << st.present_pages << " evicted " << st.evicted << " erased "
                 << st.erased << " refused " << st.erase_refused << " bad "
                 << st.bad_inserts << " locks " << st.locks << " max_pages "
                 << st.max_pages);
  CHECK(st.splits > 0);
  CHECK(st.present_pages > 0);
  CHECK(st.evicted > 0);
  CHECK(st.erased > 0);
  CHECK(st.erase_refused > 0);
  CHECK(st.bad_inserts > 0);
  CHECK(st.locks > 0);
}

TEST_CASE("RadixIndex: random operations agree with a reference model") {
  const uint32_t page_size = GENERATE(1u, 2u, 4u);
  const uint32_t seed = GENERATE(1u, 2u, 3u, 4u, 5u);
  INFO("page_size " << page_size << " seed " << seed);
  RandomRun run(page_size, seed);
  RunAndCheckCoverage(run);
}

TEST_CASE("RadixIndex: page-key sequences agree with the reference model") {
  // The conformance run of the token namespaces, with each page one opaque
  // key of 1..32 bytes (core/index/page_key.h): longest consecutive prefix,
  // dedup, locks, exact LRU eviction of leaves, erase.
  const uint32_t seed = GENERATE(1u, 2u, 3u, 4u, 5u);
  INFO("seed " << seed);
  RandomRun run(1, seed, /*page_keys=*/true);
  RunAndCheckCoverage(run);
}

// ---------------------------------------------------------------------------
// Page keys.

Tokens Keys(const std::vector<std::string>& keys) {
  Tokens t;
  REQUIRE(EncodePageKeys(keys, "page_keys", &t).ok());
  return t;
}

TEST_CASE("PageKey: encoding is exact and checks lengths") {
  const std::string k32(kMaxPageKeyBytes, '\xff');
  for (const std::string& k :
       {std::string("a"), std::string("a\0", 2), std::string(31, 'z'), k32}) {
    Tokens t;
    REQUIRE(AppendPageKey(k, 0, "page_keys", &t).ok());
    REQUIRE(t.size() == kPageKeyWords);
    CHECK(DecodePageKey(t.data()) == k);
  }
  CHECK(Keys({"ab"}) != Keys({std::string("ab\0", 3)}));
  CHECK(Keys({"a", "b"}) != Keys({"ab"}));
  Tokens t = Keys({"x"});
  absl::Status empty = EncodePageKeys(std::vector<std::string>{"ok", ""},
                                      "header.page_keys", &t);
  CHECK(empty.code() == absl::StatusCode::kInvalidArgument);
  CHECK(empty.message() ==
        "header.page_keys[1]: a page key of 0 bytes; keys are 1..32 bytes");
  absl::Status longer = EncodePageKeys(
      std::vector<std::string>{std::string(33, 'k')}, "page_keys", &t);
  CHECK(longer.message() ==
        "page_keys[0]: a page key of 33 bytes; keys are 1..32 bytes");
  CHECK(t == Keys({"x"}));  // nothing appended on an error
  Tokens bad(kPageKeyWords, 0);
  CHECK(DecodePageKey(bad.data()).empty());
}

TEST_CASE("RadixIndex: page-key namespaces match by whole keys") {
  RadixIndex index(kPageKeyWords);
  const Tokens abc = Keys({"key-a", "key-b", "key-c"});
  MustInsert(index, abc, {1, 2, 3});
  Handles pages;
  // A key that extends a stored key's bytes is another key.
  CHECK(
      index.Match(Keys({"key-a", "key-bb", "key-c"}), &pages).matched_tokens ==
      kPageKeyWords);
  CHECK(pages == Handles{1});
  pages.clear();
  CHECK(index.Match(Concat(abc, Keys({"key-d"})), &pages).matched_tokens ==
        3 * kPageKeyWords);
  CHECK(pages == Handles{1, 2, 3});
  auto r = MustInsert(index, Keys({"key-a", "key-b", "other"}), {7, 8, 9});
  CHECK(r.already_present_tokens == 2 * kPageKeyWords);
  const std::string dump = index.Dump(10, /*page_keys=*/true);
  INFO(dump);
  // "key-a" (split off by the first match), then "key-b" with two children.
  CHECK(dump.find("\n  [6b65792d61] pages=1 (1)") != std::string::npos);
  CHECK(dump.find("\n    [6b65792d62] pages=1 (2)") != std::string::npos);
  CHECK(dump.find("[6f74686572] pages=1 (9)") != std::string::npos);
}

// ---------------------------------------------------------------------------
// Long chains (issue 18): Match, the tiers of its pages and every per-handle
// call are linear in the pages, and a walk can be stopped.

// Seconds `f` takes.
template <typename F>
double SecondsOf(F f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

TEST_CASE("RadixIndex: a 1M-page chain matches in linear time") {
  constexpr size_t kPages = size_t{1} << 20;
  // One node of 1M pages (one insert) and a chain of 1024 nodes (appends).
  const bool appended = GENERATE(false, true);
  INFO((appended ? "appended in 1024-page turns" : "one insert"));
  RadixIndex index(1);
  Tokens tokens(kPages);
  std::iota(tokens.begin(), tokens.end(), 0);
  const Handles handles = Range(1, kPages);
  if (appended) {
    for (size_t n = 1024; n <= kPages; n += 1024) {
      REQUIRE(index
                  .Insert(absl::MakeConstSpan(tokens).first(n),
                          absl::MakeConstSpan(handles).first(n))
                  .ok());
    }
  } else {
    REQUIRE(index.Insert(tokens, handles).ok());
  }
  Handles pages;
  std::vector<Tier> tiers;
  size_t matched = 0;
  // What the daemon's Match does: the walk, each page's tier, a lock; then
  // a lease's Fetch resolves every handle (TierOf).
  const double seconds = SecondsOf([&] {
    auto m =
        index.Match(tokens, &pages, &tiers, [] { return absl::OkStatus(); });
    REQUIRE(m.ok());
    matched = m->matched_tokens;
    index.Lock(m->node);
    for (PageHandle h : pages) REQUIRE(index.TierOf(h).ok());
    index.Unlock(m->node);
  });
  CHECK(matched == kPages);
  CHECK(pages == handles);
  CHECK(tiers.size() == kPages);
  // ~30 ms on a build machine; the quadratic search took 63.7 s. The bound
  // leaves room for a loaded, sanitized or unoptimized build.
  INFO("Match + lock + TierOf of 1M pages: " << seconds << " s");
  CHECK(seconds < 5.0);
  // A split in the middle of the one big node rewrites only the prefix's
  // entries; every handle still finds its page.
  index.Match(absl::MakeConstSpan(tokens).first(kPages / 2 + 1), nullptr);
  REQUIRE(index.CheckInvariants().ok());
  CHECK(*index.TierOf(handles.back()) == Tier::kRaw);
}

TEST_CASE("RadixIndex: a stopped walk changes nothing") {
  RadixIndex index(1);
  Tokens tokens(1 << 20);
  std::iota(tokens.begin(), tokens.end(), 5);
  REQUIRE(index.Insert(tokens, Range(1, tokens.size())).ok());
  REQUIRE(index.Insert(Tokens{1, 2}, {0, 1 << 21}).ok());  // a second leaf
  const std::string before = index.Dump(10);
  int polls = 0;
  Handles pages{42};
  std::vector<Tier> tiers;
  // A query ending inside the node would split it, had the walk finished.
  auto m = index.Match(absl::MakeConstSpan(tokens).first(tokens.size() - 3),
                       &pages, &tiers, [&] {
                         ++polls;
                         return absl::DeadlineExceededError("Match: deadline");
                       });
  CHECK(m.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(polls == 1);
  CHECK(pages == Handles{42});
  CHECK(tiers.empty());
  CHECK(index.Dump(10) == before);
  REQUIRE(index.CheckInvariants().ok());
  // LRU order unchanged: the big leaf is still the older one.
  Handles evicted;
  CHECK(index.Evict(1, &evicted) == 1);
  CHECK(evicted == Handles{tokens.size()});
  // A short walk never polls.
  polls = 0;
  auto ok = index.Match(Tokens{1, 2}, &pages, nullptr, [&] {
    ++polls;
    return absl::CancelledError("");
  });
  REQUIRE(ok.ok());
  CHECK(ok->matched_tokens == 2);
  CHECK(polls == 0);
}

}  // namespace
}  // namespace kvharbor
