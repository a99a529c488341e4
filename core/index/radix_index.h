// RadixIndex: a radix tree over token ids whose values are page handles.
//
// This is the prefix index of one namespace, after mini-sglang's
// RadixCacheManager (seed 004) but at page granularity: every node's key is a
// whole number of pages (a multiple of page_size tokens) and its value holds
// one PageHandle per page. Match walks the tree and splits a node when the
// match ends inside it; Insert deduplicates against what is present; Lock and
// Unlock keep reference counts along the path to the root; Evict removes the
// least recently used unlocked pages, trimming LRU leaves from their tail so
// that it frees exactly what was asked for.
//
// The index never sees page bytes: a PageHandle is an opaque 64-bit value that
// the owner (the namespace's slot table) interprets. Pages handed to Insert
// that the index keeps become the index's until Evict/Erase returns them;
// pages it does not keep (duplicates) stay the caller's.
//
// Not thread-safe: the owning Namespace serialises all calls with its mutex.
// A RadixNode* returned by Match/Insert stays valid while it is locked; an
// unlocked node may be freed by the next Evict/Erase and must not be kept.
#ifndef KVHARBOR_CORE_INDEX_RADIX_INDEX_H_
#define KVHARBOR_CORE_INDEX_RADIX_INDEX_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "types/tier.h"

namespace kvharbor {

using Token = int32_t;
using PageHandle = uint64_t;

class RadixNode;  // Defined in radix_index.cc.

class RadixIndex {
 public:
  // `page_size` tokens per page; must be >= 1.
  explicit RadixIndex(uint32_t page_size);
  ~RadixIndex();
  RadixIndex(const RadixIndex&) = delete;
  RadixIndex& operator=(const RadixIndex&) = delete;

  uint32_t page_size() const { return page_size_; }

  struct MatchResult {
    // Tokens matched, a multiple of page_size (only whole pages match).
    size_t matched_tokens = 0;
    // The deepest node of the match (the root when nothing matched); pass it
    // to Lock to protect exactly the matched pages.
    RadixNode* node = nullptr;
  };

  // Longest cached prefix of `tokens` (a trailing partial page is ignored).
  // Appends the matched pages, in order, to `*pages` (which may be null) and
  // refreshes the LRU time of every node on the path. Splits a node when the
  // match ends inside it, so the returned node covers exactly the match.
  MatchResult Match(absl::Span<const Token> tokens,
                    std::vector<PageHandle>* pages);
  // The same, also appending each matched page's tier to `*tiers` (may be
  // null), and stopping early: about every 256K tokens compared it calls
  // `keep_going` (the server passes its call's deadline and cancellation),
  // and when that returns an error the walk stops, having changed and
  // appended nothing, and Match returns the error. O(matched pages + nodes
  // passed) plus, when the match ends inside a node, that node's split.
  absl::StatusOr<MatchResult> Match(
      absl::Span<const Token> tokens, std::vector<PageHandle>* pages,
      std::vector<Tier>* tiers, absl::FunctionRef<absl::Status()> keep_going);

  // Like Match but changes nothing (no split, no LRU update): the number of
  // tokens of `tokens` already present. Used to size an upload before it
  // starts.
  size_t PeekMatchTokens(absl::Span<const Token> tokens) const;

  struct InsertResult {
    // Tokens of the input already present before the call (multiple of
    // page_size). pages[0 .. already_present_tokens / page_size) were NOT
    // taken by the index: the caller still owns them (frees or reuses them).
    size_t already_present_tokens = 0;
    // The node ending the inserted path (covers all of `tokens`).
    RadixNode* node = nullptr;
  };

  // Inserts `tokens` with `pages` as values. Requires tokens.size() ==
  // pages.size() * page_size (InvalidArgument otherwise, and nothing
  // changes). The new suffix becomes evictable (unlocked) and starts in
  // `tier` (warm restart inserts disk pages directly).
  absl::StatusOr<InsertResult> Insert(absl::Span<const Token> tokens,
                                      absl::Span<const PageHandle> pages,
                                      Tier tier = Tier::kRaw);

  // Reference counts along the path from `node` to the root. A locked page is
  // never evicted. Unlock of a node that is not locked is a broken invariant.
  void Lock(RadixNode* node);
  void Unlock(RadixNode* node);

  // Evicts up to `num_pages` pages, least recently used first, from unlocked
  // leaves (a leaf is trimmed from its tail; a parent left childless and
  // unlocked becomes a leaf and may be evicted in turn). Appends the evicted
  // handles to `*evicted`; returns how many were evicted (less than asked
  // only when nothing more is evictable).
  size_t Evict(size_t num_pages, std::vector<PageHandle>* evicted);

  // Like Evict, but takes only pages for which `evictable(handle, tier)`
  // holds: an LRU leaf is trimmed from its tail while its tail page passes,
  // and a leaf whose tail page fails is kept (with its LRU position). A
  // tiered namespace evicts with it only raw pages whose slot it can reuse
  // at once, leaving cold pages to their tier's budget. O(leaves skipped *
  // log leaves) on top of Evict's cost.
  size_t EvictIf(size_t num_pages,
                 absl::FunctionRef<bool(PageHandle, Tier)> evictable,
                 std::vector<PageHandle>* evicted);

  // Removes the given pages and every page that extends them (their
  // descendants: a prefix without page i cannot keep pages after i).
  // Unknown handles are ignored. Fails with FailedPrecondition, changing
  // nothing, when any page to remove is locked. Appends removed handles.
  absl::Status Erase(absl::Span<const PageHandle> pages,
                     std::vector<PageHandle>* removed);

  // Removes everything unlocked and returns it (used when a namespace is
  // deleted); locked pages stay.
  size_t EvictAll(std::vector<PageHandle>* evicted);

  // ---- Tiers (types/tier.h). The index records each page's tier and keeps
  // the path invariant; it never sees the bytes of any tier.

  // The calls below that take a handle find its page in O(1).
  // NotFound for a handle the index does not hold.
  absl::StatusOr<Tier> TierOf(PageHandle h) const;
  // Whether the page's node is locked (lease, upload). False when unknown.
  bool IsLocked(PageHandle h) const;
  // Moves a held page to tier `t`. Changes nothing and fails with
  // FailedPrecondition when the page is locked (unless `allow_locked`: an
  // upload promoting the prefix it locked itself) or when the move would
  // break the path invariant (predecessor colder than t, or a successor
  // hotter than t); NotFound for an unknown handle.
  absl::Status SetTier(PageHandle h, Tier t, bool allow_locked = false);
  // Gives the held page `old_h` the handle `new_h` (same tokens and tier).
  absl::Status ReplaceHandle(PageHandle old_h, PageHandle new_h);

  struct TierCandidate {
    PageHandle handle = 0;
    uint64_t first_position = 0;  // position of the page's first token
  };
  // Up to `n` unlocked pages in tier `from` that may go colder now (every
  // page extending them already is), least recently used first and
  // tail-first within a node, so committing them in order keeps the path
  // invariant. Walks every node: O(nodes) per call, meant for batches.
  size_t TierCandidates(Tier from, size_t n,
                        std::vector<TierCandidate>* out) const;
  // The token ids from the root through the end of held page `h`.
  absl::Status PrefixTokens(PageHandle h, std::vector<Token>* out) const;
  size_t tier_pages(Tier t) const { return tier_pages_[static_cast<int>(t)]; }

  // Page counts. evictable + protected == total at all times.
  size_t evictable_pages() const { return evictable_pages_; }
  size_t protected_pages() const { return protected_pages_; }
  size_t total_pages() const { return evictable_pages_ + protected_pages_; }
  size_t node_count() const { return node_count_; }

  // Heap bytes used by the index itself (nodes, keys, values, maps).
  size_t MemoryBytes() const;

  // Human-readable tree (one line per node, indented), at most `max_nodes`
  // nodes, for debugging and the TreeDump RPC. With `page_keys` (an index of
  // a page-key namespace, core/index/page_key.h) each node shows its first
  // page keys in hex instead of token ids.
  std::string Dump(size_t max_nodes, bool page_keys = false) const;

  // Walks the whole tree and checks every structural invariant (sizes, ref
  // counts, key/value lengths, child keys). For tests.
  absl::Status CheckInvariants() const;

 private:
  const uint32_t page_size_;
  std::unique_ptr<RadixNode> root_;
  uint64_t clock_ = 0;
  size_t evictable_pages_ = 0;
  size_t protected_pages_ = 0;
  size_t node_count_ = 0;
  size_t tier_pages_[kNumTiers] = {0, 0, 0};
  // Further private state (e.g. page->node map) is added by the .cc's needs.
  struct Impl;
  std::unique_ptr<Impl> impl_;

  // Helpers, all in radix_index.cc.
  absl::StatusOr<MatchResult> WalkAndSplit(
      absl::Span<const Token> tokens, uint64_t now,
      std::vector<PageHandle>* pages, std::vector<Tier>* tiers,
      absl::FunctionRef<absl::Status()> keep_going);
  RadixNode* SplitNode(RadixNode* node, size_t pages);
  void Touch(RadixNode* node, uint64_t now);
  absl::Status ReservePages(absl::Span<const PageHandle> pages, size_t present);
  void OnChildRemoved(RadixNode* parent);
  void ReleasePages(const RadixNode* node, size_t from,
                    std::vector<PageHandle>* out);
  void TrimTail(RadixNode* node, size_t keep, std::vector<PageHandle>* out);
  void DeleteLeaf(RadixNode* node, std::vector<PageHandle>* out);
  void DeleteDescendants(RadixNode* node, std::vector<PageHandle>* out);
  absl::Status CheckNode(const RadixNode* node) const;
  absl::Status CheckHeap(size_t expected_leaves) const;
};

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_INDEX_RADIX_INDEX_H_
