// RadixIndex implementation. See radix_index.h for the contract.
//
// Layout choices, and why:
//  - A node owns its key (tokens, a whole number of pages) and value (one
//    PageHandle per page) in two exactly sized vectors. Matching compares a
//    node's key with the query by one memcmp over all of it (a node that
//    matches, the common case, costs one call); when it differs, by memcmp
//    over 512-byte blocks, then locates the first differing token in the
//    differing block with SSE2 (16 tokens a step); only the page of the
//    first difference matters. On long prefixes
//    this compare is nearly the whole cost of Match, which then runs at the
//    memory bandwidth of reading query + key (8 bytes per token).
//  - Children live in an inline vector of Ref (O(1) removal through
//    pos_in_parent). A Ref caches the child's first token, page count and key
//    pointer, so the linear scan used up to kChildIndexMin children touches
//    no sibling node, and the chosen child's key is compared without waiting
//    for the child's node. The scan filters on the first token, then
//    compares the candidate's whole key in one go (a mismatch inside the
//    first page rejects it), so no page is read twice. Above kChildIndexMin
//    children a flat_hash_set of child pointers, hashed (XXH3) and compared
//    by the child's first page, serves lookups. Sibling first pages are
//    distinct, so the set is exact; no hash is trusted without a compare.
//  - Evictable leaves (no children, ref_count 0, not the root) sit in an
//    indexed binary min-heap by timestamp (each node knows its heap slot;
//    each slot carries its node's timestamp, so sifting never loads a node),
//    so lock/unlock/touch/insert adjust it in O(log leaves) and Evict pops
//    in O(log leaves) per leaf, never rebuilding.
//  - page_node maps every held PageHandle to its node and position, so that
//    TierOf, SetTier, Erase and the other per-handle calls find a page in
//    O(1) (a search of the node's values made Match with its per-page tiers,
//    and every per-page walk of a lease, quadratic on a long node: 63.7 s
//    for a 1M-page chain). A split moves the prefix pages to the new parent
//    and rewrites their entries' node; the pages that stay are found through
//    the node's base (RadixNode::base), untouched.
//  - Timestamps come from clock_, bumped once per Match/Insert; every node on
//    the path gets the same value, so a parent is never older than its child
//    and no two leaves share a timestamp (the LRU order is total).
//  - The root's ref_count counts every Lock (the root is on every path), which
//    lets Unlock(root) detect an unbalanced unlock.
#include "core/index/radix_index.h"

#include <algorithm>
#include <cstring>
#include <utility>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "absl/base/attributes.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "core/base/check.h"
#include "core/index/radix_index_internal.h"

namespace kvharbor {

using radix_internal::FindChild;
using radix_internal::kChildIndexDrop;
using radix_internal::kChildIndexMin;
using radix_internal::kInlineChildren;
using radix_internal::kNotInHeap;
using radix_internal::PushChildren;

namespace {

// Tokens per memcmp block in FirstMismatch.
constexpr size_t kCompareBlock = 128;
// A walk polls its keep_going after about kPollWork tokens compared, each
// node passed counting as kNodeWork more: ~0.1 ms of walking between polls,
// so a Match whose call ended stops within that.
constexpr size_t kPollWork = size_t{1} << 18;
constexpr size_t kNodeWork = 64;

absl::Status NeverStop() { return absl::OkStatus(); }
// Per heap allocation bookkeeping we charge in MemoryBytes (glibc chunk
// header plus rounding), so the figure is not flattering.
constexpr size_t kMallocOverhead = 16;

// Index of the first token where a[0..n) and b[0..n) differ, or n.
// Long runs go through libc's vectorised memcmp, whole and then in blocks;
// the block that differs is then searched 16 tokens at a time.
size_t FirstMismatch(const Token* a, const Token* b, size_t n) {
  // Most compares on a walk are of a whole node that matches: one memcmp
  // call over all of it is then the least work. Only a range that differs
  // (at most the walk's last node, or a sibling sharing a first token) is
  // read again below to find where.
  if (n >= kCompareBlock && std::memcmp(a, b, n * sizeof(Token)) == 0) {
    return n;
  }
  size_t i = 0;
  for (; i + kCompareBlock <= n; i += kCompareBlock) {
    if (std::memcmp(a + i, b + i, kCompareBlock * sizeof(Token)) != 0) break;
  }
  // The difference, if any, lies in [i, end).
  const size_t end = std::min(n, i + kCompareBlock);
#if defined(__SSE2__)
  for (; i + 16 <= end; i += 16) {
    const auto eq = [&](size_t k) {
      return _mm_cmpeq_epi32(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i + k)),
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i + k)));
    };
    const __m128i e0 = eq(0), e1 = eq(4), e2 = eq(8), e3 = eq(12);
    const __m128i all =
        _mm_and_si128(_mm_and_si128(e0, e1), _mm_and_si128(e2, e3));
    if (_mm_movemask_epi8(all) == 0xFFFF) continue;
    const uint64_t equal_bytes =
        uint64_t(uint32_t(_mm_movemask_epi8(e0))) |
        uint64_t(uint32_t(_mm_movemask_epi8(e1))) << 16 |
        uint64_t(uint32_t(_mm_movemask_epi8(e2))) << 32 |
        uint64_t(uint32_t(_mm_movemask_epi8(e3))) << 48;
    return i + static_cast<size_t>(__builtin_ctzll(~equal_bytes)) / 4;
  }
#endif
  for (; i + 2 <= end; i += 2) {
    uint64_t x, y;
    std::memcpy(&x, a + i, sizeof(x));
    std::memcpy(&y, b + i, sizeof(y));
    if (x != y) return a[i] != b[i] ? i : i + 1;
  }
  if (i < end && a[i] != b[i]) return i;
  return n;
}

}  // namespace

namespace {
using ChildRef = RadixNode::Ref;
using PageRef = RadixNode::PageRef;
}  // namespace

// ---------------------------------------------------------------------------
// Construction and tree plumbing.

namespace {

ChildRef RefOf(RadixNode* child) {
  return ChildRef{child->key[0], static_cast<uint32_t>(child->num_pages()),
                  child->key.data(), child};
}

}  // namespace

RadixIndex::RadixIndex(uint32_t page_size)
    : page_size_(page_size),
      root_(std::make_unique<RadixNode>()),
      impl_(std::make_unique<Impl>(size_t{page_size} * sizeof(Token))) {
  KVH_CHECK(page_size >= 1, "RadixIndex: page_size %u", page_size);
}

RadixIndex::~RadixIndex() {
  // Iterative, so a deep chain cannot overflow the stack.
  std::vector<RadixNode*> stack;
  PushChildren(root_.get(), &stack);
  while (!stack.empty()) {
    RadixNode* n = stack.back();
    stack.pop_back();
    PushChildren(n, &stack);
    delete n;
  }
}

namespace {

void BuildChildIndex(RadixNode* node, size_t page_bytes) {
  node->child_index = std::make_unique<RadixNode::ChildIndex>(
      node->children.size(), RadixNode::FirstPageHash{page_bytes},
      RadixNode::FirstPageEq{page_bytes});
  for (const ChildRef& c : node->children) node->child_index->insert(c.node);
}

void AddChild(RadixNode* node, RadixNode* child, size_t page_bytes) {
  child->parent = node;
  child->pos_in_parent = static_cast<uint32_t>(node->children.size());
  node->children.push_back(RefOf(child));
  if (node->child_index != nullptr) {
    node->child_index->insert(child);
  } else if (node->children.size() > kChildIndexMin) {
    BuildChildIndex(node, page_bytes);
  }
}

// `child`'s first page must still be the one it was indexed under.
void RemoveChild(RadixNode* node, RadixNode* child) {
  if (node->child_index != nullptr) node->child_index->erase(child);
  const ChildRef last = node->children.back();
  node->children[child->pos_in_parent] = last;
  last.node->pos_in_parent = child->pos_in_parent;
  node->children.pop_back();
  child->parent = nullptr;
  if (node->child_index != nullptr &&
      node->children.size() <= kChildIndexDrop) {
    node->child_index.reset();
  }
  if (node->children.empty()) node->children.shrink_to_fit();
}

// Puts `repl` where `old` is; both have the same first page.
void ReplaceChild(RadixNode* node, RadixNode* old, RadixNode* repl) {
  if (node->child_index != nullptr) {
    node->child_index->erase(old);
    node->child_index->insert(repl);
  }
  node->children[old->pos_in_parent] = RefOf(repl);
  repl->pos_in_parent = old->pos_in_parent;
  repl->parent = node;
  old->parent = nullptr;
}

// Shrinks a vector whose size fell well below its capacity.
template <typename T>
void MaybeShrink(std::vector<T>* v) {
  if (v->size() < v->capacity() / 2) v->shrink_to_fit();
}

}  // namespace

RadixNode* RadixIndex::SplitNode(RadixNode* node, size_t pages) {
  const size_t tokens = pages * page_size_;
  auto* prefix = new RadixNode;
  prefix->key.assign(node->key.begin(), node->key.begin() + tokens);
  prefix->value.assign(node->value.begin(), node->value.begin() + pages);
  prefix->tier.assign(node->tier.begin(), node->tier.begin() + pages);
  prefix->timestamp = node->timestamp;
  // A handle to `node` locked before the split unlocks node and every
  // ancestor, now including `prefix`: give prefix the same count.
  prefix->ref_count = node->ref_count;
  ReplaceChild(node->parent, node, prefix);
  node->key = std::vector<Token>(node->key.begin() + tokens, node->key.end());
  node->value =
      std::vector<PageHandle>(node->value.begin() + pages, node->value.end());
  node->tier = std::vector<Tier>(node->tier.begin() + pages, node->tier.end());
  AddChild(prefix, node, impl_->page_bytes);
  // The prefix pages keep their positions under the same base; the pages
  // that stay keep theirs too, node's base moving past the prefix.
  prefix->base = node->base;
  node->base += static_cast<uint32_t>(pages);
  for (PageHandle h : prefix->value) impl_->page_node[h].node = prefix;
  ++node_count_;
  return prefix;
}

void RadixIndex::Touch(RadixNode* node, uint64_t now) {
  node->timestamp = now;
  if (node->heap_pos != kNotInHeap) impl_->Fix(node);
}

namespace {

// The child of `node` whose key starts with the query's first page, and in
// `*m` how many whole pages of the query its key matches. The query is
// `tokens` from page `pos` of `total_pages` on.
// Without a child index, each child whose first token matches is compared
// from its first token on in one go, so the first page is not read twice;
// a mismatch inside the first page means a sibling that shares only the
// first token, and the scan goes on. Always inlined: a call per node costs
// Match ~5% at 4K tokens (measured with bench/match_bench).
ABSL_ATTRIBUTE_ALWAYS_INLINE inline const ChildRef* FindAndMatchChild(
    const RadixNode* node, const Token* tokens, size_t pos, size_t total_pages,
    size_t page_size, size_t* m) {
  // The query: the tokens from page `pos` on.
  const Token* query = tokens + pos * page_size;
  const size_t query_pages = total_pages - pos;
  if (node->child_index != nullptr) {
    const ChildRef* c = FindChild(node, query, page_size * sizeof(Token));
    if (c == nullptr) return nullptr;
    __builtin_prefetch(c->node);
    // The first page already compared equal when the index found it.
    const size_t n = std::min<size_t>(c->num_pages, query_pages) * page_size;
    *m = 1 +
         FirstMismatch(c->key + page_size, query + page_size, n - page_size) /
             page_size;
    return c;
  }
  for (const ChildRef& c : node->children) {
    if (c.first != query[0]) continue;
    __builtin_prefetch(c.node);
    const size_t n = std::min<size_t>(c.num_pages, query_pages) * page_size;
    const size_t same = FirstMismatch(c.key, query, n);
    if (same >= page_size) {
      *m = same / page_size;
      return &c;
    }
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<RadixIndex::MatchResult> RadixIndex::WalkAndSplit(
    absl::Span<const Token> tokens, uint64_t now,
    std::vector<PageHandle>* pages, std::vector<Tier>* tiers,
    absl::FunctionRef<absl::Status()> keep_going) {
  const size_t total_pages = tokens.size() / page_size_;
  // (node, pages matched in it); handles are copied and LRU times set after
  // the walk, so the walk's critical path is only refs -> key compare, and a
  // walk stopped by keep_going has changed nothing. The vector is Impl's,
  // reused: in match_bench's 4K-token, 256-sequence tree a walk passes 37
  // nodes on average, and a local inline buffer spilled to the heap.
  std::vector<std::pair<RadixNode*, size_t>>& path = impl_->path;
  path.clear();
  RadixNode* node = root_.get();
  size_t pos = 0;   // pages matched so far
  size_t work = 0;  // tokens compared (plus a charge per node) since a poll
  while (pos < total_pages) {
    size_t m = 0;
    const ChildRef* c = FindAndMatchChild(node, tokens.data(), pos, total_pages,
                                          page_size_, &m);
    if (c == nullptr) break;
    path.emplace_back(c->node, m);
    pos += m;
    work += m * page_size_ + kNodeWork;
    if (work >= kPollWork) {
      work = 0;
      if (absl::Status s = keep_going(); !s.ok()) return s;
    }
    if (m < c->num_pages) break;
    node = c->node;
  }
  if (pages != nullptr) pages->reserve(pages->size() + pos);
  if (tiers != nullptr) tiers->reserve(tiers->size() + pos);
  for (const auto& [n, m] : path) {
    if (pages != nullptr) {
      pages->insert(pages->end(), n->value.begin(), n->value.begin() + m);
    }
    if (tiers != nullptr) {
      tiers->insert(tiers->end(), n->tier.begin(), n->tier.begin() + m);
    }
    // A node matched in part is touched after the split below: only its
    // matched prefix is refreshed.
    if (m == n->num_pages()) Touch(n, now);
  }
  if (!path.empty() && path.back().second < path.back().first->num_pages()) {
    node = SplitNode(path.back().first, path.back().second);
    Touch(node, now);
  }
  return MatchResult{pos * page_size_, node};
}

// ---------------------------------------------------------------------------
// Public operations.

RadixIndex::MatchResult RadixIndex::Match(absl::Span<const Token> tokens,
                                          std::vector<PageHandle>* pages) {
  return *WalkAndSplit(tokens, ++clock_, pages, nullptr, NeverStop);
}

absl::StatusOr<RadixIndex::MatchResult> RadixIndex::Match(
    absl::Span<const Token> tokens, std::vector<PageHandle>* pages,
    std::vector<Tier>* tiers, absl::FunctionRef<absl::Status()> keep_going) {
  absl::StatusOr<MatchResult> r =
      WalkAndSplit(tokens, clock_ + 1, pages, tiers, keep_going);
  if (r.ok()) ++clock_;
  return r;
}

size_t RadixIndex::PeekMatchTokens(absl::Span<const Token> tokens) const {
  const size_t total_pages = tokens.size() / page_size_;
  const RadixNode* node = root_.get();
  size_t pos = 0;
  while (pos < total_pages) {
    size_t m = 0;
    const ChildRef* c = FindAndMatchChild(node, tokens.data(), pos, total_pages,
                                          page_size_, &m);
    if (c == nullptr) break;
    pos += m;
    if (m < c->num_pages) break;
    node = c->node;
  }
  return pos * page_size_;
}

absl::Status RadixIndex::ReservePages(absl::Span<const PageHandle> pages,
                                      size_t present) {
  auto& map = impl_->page_node;
  auto rollback = [&](size_t upto) {
    for (size_t j = present; j < upto; ++j) map.erase(pages[j]);
  };
  for (size_t j = present; j < pages.size(); ++j) {
    auto [it, inserted] = map.try_emplace(pages[j], Impl::PageLoc{});
    if (!inserted) {
      const bool dup = it->second.node == nullptr;
      rollback(j);
      return absl::InvalidArgumentError(absl::StrFormat(
          "Insert: pages[%d] (handle %d) %s", j, pages[j],
          dup ? "appears more than once in pages"
              : "is already held by the index for another prefix"));
    }
  }
  // A handle of the already-present part stays the caller's; it must not
  // also be handed to the index. Only handles within the new pages' range
  // are looked up: an append passes a long present part (a namespace's
  // skipped pages are all 0) that this scan must not make slower than the
  // walk's compare.
  if (present == 0 || present == pages.size()) return absl::OkStatus();
  const auto [lo, hi] =
      std::minmax_element(pages.begin() + present, pages.end());
  for (size_t j = 0; j < present; ++j) {
    if (pages[j] < *lo || pages[j] > *hi) continue;
    auto it = map.find(pages[j]);
    if (it != map.end() && it->second.node == nullptr) {
      rollback(pages.size());
      return absl::InvalidArgumentError(absl::StrFormat(
          "Insert: pages[%d] (handle %d) is already cached (the caller keeps "
          "it) and also given for a new page",
          j, pages[j]));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<RadixIndex::InsertResult> RadixIndex::Insert(
    absl::Span<const Token> tokens, absl::Span<const PageHandle> pages,
    Tier tier) {
  if (tokens.size() % page_size_ != 0 ||
      tokens.size() / page_size_ != pages.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Insert: tokens.size() (%d) must equal pages.size() (%d) * "
        "page_size (%d)",
        tokens.size(), pages.size(), page_size_));
  }
  if (pages.size() > UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Insert: pages.size() (%d) exceeds %d", pages.size(), UINT32_MAX));
  }
  const size_t present = PeekMatchTokens(tokens) / page_size_;
  if (absl::Status s = ReservePages(pages, present); !s.ok()) return s;

  MatchResult walk =
      *WalkAndSplit(tokens, clock_ + 1, nullptr, nullptr, NeverStop);
  ++clock_;
  KVH_CHECK(walk.matched_tokens == present * page_size_,
            "RadixIndex::Insert: the walk matched %u tokens, its peek %u pages",
            walk.matched_tokens, present);
  InsertResult result{walk.matched_tokens, walk.node};
  if (present == pages.size()) return result;

  auto* leaf = new RadixNode;
  leaf->key.assign(tokens.begin() + present * page_size_, tokens.end());
  leaf->value.assign(pages.begin() + present, pages.end());
  leaf->tier.assign(leaf->value.size(), tier);
  tier_pages_[static_cast<int>(tier)] += leaf->value.size();
  leaf->timestamp = clock_;
  RadixNode* parent = walk.node;
  if (parent->heap_pos != kNotInHeap) impl_->Remove(parent);
  AddChild(parent, leaf, impl_->page_bytes);
  for (size_t j = 0; j < leaf->value.size(); ++j) {
    impl_->page_node[leaf->value[j]] = {leaf, static_cast<uint32_t>(j)};
  }
  impl_->Push(leaf);
  evictable_pages_ += leaf->num_pages();
  ++node_count_;
  result.node = leaf;
  return result;
}

void RadixIndex::Lock(RadixNode* node) {
  KVH_CHECK(node != nullptr, "RadixIndex::Lock(nullptr)");
  for (RadixNode* n = node; n != root_.get(); n = n->parent) {
    if (n->ref_count++ == 0) {
      evictable_pages_ -= n->num_pages();
      protected_pages_ += n->num_pages();
      if (n->heap_pos != kNotInHeap) impl_->Remove(n);
    }
  }
  ++root_->ref_count;
}

void RadixIndex::Unlock(RadixNode* node) {
  KVH_CHECK(node != nullptr, "RadixIndex::Unlock(nullptr)");
  // ref_count(ancestor) >= ref_count(node), so checking node suffices.
  KVH_CHECK(node->ref_count > 0,
            "RadixIndex::Unlock of a node that is not locked");
  for (RadixNode* n = node; n != root_.get(); n = n->parent) {
    if (--n->ref_count == 0) {
      protected_pages_ -= n->num_pages();
      evictable_pages_ += n->num_pages();
      if (n->is_leaf()) impl_->Push(n);
    }
  }
  --root_->ref_count;
}

// Called after `child` left `parent`: a childless unlocked parent becomes an
// evictable leaf.
void RadixIndex::OnChildRemoved(RadixNode* parent) {
  if (parent != root_.get() && parent->is_leaf() && parent->ref_count == 0 &&
      parent->heap_pos == kNotInHeap) {
    impl_->Push(parent);
  }
}

// Drops the handles of pages [from, num_pages) of `node` from page_node and
// appends them to `out`, tail first.
void RadixIndex::ReleasePages(const RadixNode* node, size_t from,
                              std::vector<PageHandle>* out) {
  for (size_t i = node->num_pages(); i > from; --i) {
    const PageHandle h = node->value[i - 1];
    impl_->page_node.erase(h);
    --tier_pages_[static_cast<int>(node->tier[i - 1])];
    if (out != nullptr) out->push_back(h);
  }
}

// Removes pages [keep, num_pages) of unlocked `node`, which stays (keep > 0).
void RadixIndex::TrimTail(RadixNode* node, size_t keep,
                          std::vector<PageHandle>* out) {
  ReleasePages(node, keep, out);
  evictable_pages_ -= node->num_pages() - keep;
  node->value.resize(keep);
  node->tier.resize(keep);
  node->key.resize(keep * page_size_);
  MaybeShrink(&node->value);
  MaybeShrink(&node->tier);
  MaybeShrink(&node->key);
  node->parent->children[node->pos_in_parent] = RefOf(node);
}

// Detaches and frees an unlocked node with no children.
void RadixIndex::DeleteLeaf(RadixNode* node, std::vector<PageHandle>* out) {
  RadixNode* parent = node->parent;
  if (node->heap_pos != kNotInHeap) impl_->Remove(node);
  RemoveChild(parent, node);
  evictable_pages_ -= node->num_pages();
  ReleasePages(node, 0, out);
  delete node;
  --node_count_;
  OnChildRemoved(parent);
}

size_t RadixIndex::Evict(size_t num_pages, std::vector<PageHandle>* evicted) {
  size_t done = 0;
  while (done < num_pages && !impl_->heap.empty()) {
    RadixNode* leaf = impl_->Oldest();
    const size_t have = leaf->num_pages();
    const size_t take = std::min(have, num_pages - done);
    if (take == have) {
      DeleteLeaf(leaf, evicted);
    } else {
      // Stays in the heap with its timestamp: its remaining pages are
      // exactly as old as the ones trimmed.
      TrimTail(leaf, have - take, evicted);
    }
    done += take;
  }
  return done;
}

size_t RadixIndex::EvictIf(size_t num_pages,
                           absl::FunctionRef<bool(PageHandle, Tier)> evictable,
                           std::vector<PageHandle>* evicted) {
  size_t done = 0;
  // Leaves whose tail page may not go: out of the heap while this runs (so
  // the next LRU leaf comes up), back in at the end. They stay leaves, since
  // only heap leaves and their parents change below.
  std::vector<RadixNode*> kept;
  while (done < num_pages && !impl_->heap.empty()) {
    RadixNode* leaf = impl_->Oldest();
    const size_t have = leaf->num_pages();
    size_t keep = have;
    while (keep > 0 && have - keep < num_pages - done &&
           evictable(leaf->value[keep - 1], leaf->tier[keep - 1])) {
      --keep;
    }
    const size_t take = have - keep;
    if (take == 0) {
      impl_->Remove(leaf);
      kept.push_back(leaf);
      continue;
    }
    if (keep == 0) {
      DeleteLeaf(leaf, evicted);
    } else {
      // Stays in the heap: either enough is evicted, or its new tail page
      // fails the predicate and the next round sets it aside.
      TrimTail(leaf, keep, evicted);
    }
    done += take;
  }
  for (RadixNode* leaf : kept) impl_->Push(leaf);
  return done;
}

size_t RadixIndex::EvictAll(std::vector<PageHandle>* evicted) {
  // Every unlocked page lies in an unlocked subtree, whose leaves Evict
  // reaches one after another, so this empties the evictable set.
  return Evict(evictable_pages_, evicted);
}

absl::Status RadixIndex::Erase(absl::Span<const PageHandle> pages,
                               std::vector<PageHandle>* removed) {
  // ref_count(node) == 0 implies its whole subtree is unlocked, so checking
  // each named page's node covers every page that would go.
  for (size_t i = 0; i < pages.size(); ++i) {
    auto it = impl_->page_node.find(pages[i]);
    if (it != impl_->page_node.end() && it->second.node->ref_count > 0) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "Erase: pages[%d] (handle %d) is locked (ref_count %d); nothing "
          "was erased",
          i, pages[i], it->second.node->ref_count));
    }
  }
  for (PageHandle h : pages) {
    auto it = impl_->page_node.find(h);
    if (it == impl_->page_node.end()) continue;  // unknown or already gone
    RadixNode* node = it->second.node;
    const size_t idx = it->second.index();
    DeleteDescendants(node, removed);
    if (idx == 0) {
      DeleteLeaf(node, removed);
    } else {
      TrimTail(node, idx, removed);
      if (node->heap_pos == kNotInHeap) impl_->Push(node);
    }
  }
  return absl::OkStatus();
}

// Frees every descendant of an unlocked `node` (node stays, childless).
void RadixIndex::DeleteDescendants(RadixNode* node,
                                   std::vector<PageHandle>* out) {
  std::vector<RadixNode*> stack;
  PushChildren(node, &stack);
  node->children.clear();
  node->children.shrink_to_fit();
  node->child_index.reset();
  while (!stack.empty()) {
    RadixNode* n = stack.back();
    stack.pop_back();
    PushChildren(n, &stack);
    if (n->heap_pos != kNotInHeap) impl_->Remove(n);
    evictable_pages_ -= n->num_pages();
    ReleasePages(n, 0, out);
    delete n;
    --node_count_;
  }
}

// ---------------------------------------------------------------------------
// Introspection.

size_t RadixIndex::MemoryBytes() const {
  // O(nodes): meant for stats and benchmarks, not a per-request path.
  size_t bytes = sizeof(Impl) + kMallocOverhead;
  const auto& map = impl_->page_node;
  if (map.capacity() > 0) {
    bytes += map.capacity() *
                 (sizeof(std::pair<const PageHandle, Impl::PageLoc>) + 1) +
             kMallocOverhead;
  }
  bytes += impl_->heap.capacity() * sizeof(impl_->heap[0]) + kMallocOverhead;
  bytes += impl_->path.capacity() * sizeof(impl_->path[0]) + kMallocOverhead;
  std::vector<const RadixNode*> stack = {root_.get()};
  while (!stack.empty()) {
    const RadixNode* n = stack.back();
    stack.pop_back();
    PushChildren(n, &stack);
    bytes += sizeof(RadixNode) + kMallocOverhead;
    bytes += n->key.capacity() * sizeof(Token) +
             n->value.capacity() * sizeof(PageHandle) +
             n->tier.capacity() * sizeof(Tier) + 3 * kMallocOverhead;
    if (n->children.capacity() > kInlineChildren) {
      bytes += n->children.capacity() * sizeof(ChildRef) + kMallocOverhead;
    }
    if (n->child_index != nullptr) {
      bytes += sizeof(RadixNode::ChildIndex) +
               n->child_index->capacity() * (sizeof(RadixNode*) + 1) +
               2 * kMallocOverhead;
    }
  }
  return bytes;
}

}  // namespace kvharbor
