// Internals of RadixIndex shared by its implementation files
// (radix_index.cc: the tree, matching, insertion and eviction;
// radix_index_tiers.cc: page tiers; radix_index_check.cc: Dump and the
// invariant checks). Not part of the core's interface:
// include it only from those files.
//
// RadixNode is owned by the RadixIndex (see radix_index.h for ownership and
// thread-safety); nothing here is thread-safe on its own.
#ifndef KVHARBOR_CORE_INDEX_RADIX_INDEX_INTERNAL_H_
#define KVHARBOR_CORE_INDEX_RADIX_INDEX_INTERNAL_H_

#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "core/index/radix_index.h"
#include "types/tier.h"

// clang-format off
#include <xxh3.h>  // Defines XXH_INLINE_ALL: the page hash inlines.
// clang-format on

namespace kvharbor {
namespace radix_internal {

inline constexpr uint32_t kNotInHeap = UINT32_MAX;
// Children refs stored inside the node before the vector goes to the heap.
inline constexpr size_t kInlineChildren = 2;
// A child index is built above this many children and dropped at or below
// kChildIndexDrop (hysteresis, so a node at the boundary does not thrash).
inline constexpr size_t kChildIndexMin = 8;
inline constexpr size_t kChildIndexDrop = 4;

}  // namespace radix_internal

class RadixNode {
 public:
  // One child as its parent sees it: `first`, `num_pages` and `key` mirror
  // the child's key[0], num_pages() and key.data() (re-synced wherever a key
  // changes), so a walk finds and compares a child without loading it.
  struct Ref {
    Token first;
    uint32_t num_pages;
    const Token* key;
    RadixNode* node;
  };
  // Heterogeneous key for looking a child up by the query's page.
  struct PageRef {
    const Token* tokens;
  };
  // Hash and equality of a child by its first page (page_bytes long).
  struct FirstPageHash {
    using is_transparent = void;
    size_t page_bytes;
    size_t operator()(PageRef p) const {
      return static_cast<size_t>(XXH3_64bits(p.tokens, page_bytes));
    }
    size_t operator()(const RadixNode* n) const {
      return (*this)(PageRef{n->key.data()});
    }
  };
  struct FirstPageEq {
    using is_transparent = void;
    size_t page_bytes;
    bool Same(const Token* a, const Token* b) const {
      return a == b || std::memcmp(a, b, page_bytes) == 0;
    }
    bool operator()(const RadixNode* a, const RadixNode* b) const {
      return a == b || Same(a->key.data(), b->key.data());
    }
    bool operator()(PageRef a, const RadixNode* b) const {
      return Same(a.tokens, b->key.data());
    }
    bool operator()(const RadixNode* a, PageRef b) const {
      return Same(a->key.data(), b.tokens);
    }
  };
  using ChildIndex =
      absl::flat_hash_set<RadixNode*, FirstPageHash, FirstPageEq>;

  size_t num_pages() const { return value.size(); }
  bool is_leaf() const { return children.empty(); }

  RadixNode* parent = nullptr;
  std::vector<Token> key;         // num_pages() * page_size tokens
  std::vector<PageHandle> value;  // one handle per page
  std::vector<Tier> tier;         // one per page, never hotter down the path
  // Two inline: most internal nodes of a radix tree have two children, and
  // inline refs save a dependent cache miss per level of a walk.
  absl::InlinedVector<Ref, radix_internal::kInlineChildren> children;
  std::unique_ptr<ChildIndex> child_index;  // only above kChildIndexMin
  uint64_t timestamp = 0;
  uint32_t ref_count = 0;
  uint32_t pos_in_parent = 0;  // index in parent->children
  uint32_t heap_pos = radix_internal::kNotInHeap;
  // Page i of this node has position base + i in its page_node entry
  // (Impl::PageLoc): a split gives the prefix pages to a new node with the
  // same base and raises this node's base, so no entry of the pages that
  // stay is rewritten, and a handle finds its page in O(1).
  uint32_t base = 0;
};

namespace radix_internal {

// The child of `node` whose first page equals `page` (page_bytes long), or
// null.
inline const RadixNode::Ref* FindChild(const RadixNode* node, const Token* page,
                                       size_t page_bytes) {
  if (node->child_index != nullptr) {
    auto it = node->child_index->find(RadixNode::PageRef{page});
    if (it == node->child_index->end()) return nullptr;
    return &node->children[(*it)->pos_in_parent];
  }
  for (const RadixNode::Ref& c : node->children) {
    if (c.first == page[0] && std::memcmp(c.key, page, page_bytes) == 0) {
      return &c;
    }
  }
  return nullptr;
}

// Appends the children of `node` to a depth-first `stack`.
template <typename NodePtr>
void PushChildren(const RadixNode* node, std::vector<NodePtr>* stack) {
  for (const RadixNode::Ref& c : node->children) stack->push_back(c.node);
}

}  // namespace radix_internal

struct RadixIndex::Impl {
  explicit Impl(size_t page_bytes) : page_bytes(page_bytes) {}

  // Where a held page is: its node, and its index there as pos - node->base
  // (see RadixNode::base). node is null while Insert reserves the handle.
  struct PageLoc {
    RadixNode* node = nullptr;
    uint32_t pos = 0;
    size_t index() const { return pos - node->base; }
  };

  const size_t page_bytes;
  absl::flat_hash_map<PageHandle, PageLoc> page_node;
  // Min-heap by timestamp of evictable leaves; node->heap_pos is the slot.
  // Each slot keeps a copy of its node's timestamp (Push and Fix refresh
  // it), so sifting compares within this array and never loads a node: a
  // leaf touched by Match sinks to the bottom, past 2 * log2(leaves) slots.
  struct HeapSlot {
    uint64_t timestamp;
    RadixNode* node;
  };
  std::vector<HeapSlot> heap;
  // WalkAndSplit's scratch (node, pages matched in it), kept between calls
  // so that a long walk allocates nothing.
  std::vector<std::pair<RadixNode*, size_t>> path;

  RadixNode* Oldest() const { return heap.front().node; }
  void Place(size_t i, HeapSlot slot) {
    heap[i] = slot;
    slot.node->heap_pos = static_cast<uint32_t>(i);
  }
  void SiftUp(size_t i) {
    const HeapSlot n = heap[i];
    while (i > 0) {
      const size_t p = (i - 1) / 2;
      if (heap[p].timestamp <= n.timestamp) break;
      Place(i, heap[p]);
      i = p;
    }
    Place(i, n);
  }
  void SiftDown(size_t i) {
    const HeapSlot n = heap[i];
    const size_t size = heap.size();
    for (;;) {
      size_t c = 2 * i + 1;
      if (c >= size) break;
      if (c + 1 < size && heap[c + 1].timestamp < heap[c].timestamp) ++c;
      if (heap[c].timestamp >= n.timestamp) break;
      Place(i, heap[c]);
      i = c;
    }
    Place(i, n);
  }
  void Push(RadixNode* n) {
    heap.push_back(HeapSlot{n->timestamp, n});
    n->heap_pos = static_cast<uint32_t>(heap.size() - 1);
    SiftUp(heap.size() - 1);
  }
  void Remove(RadixNode* n) {
    const size_t i = n->heap_pos;
    n->heap_pos = radix_internal::kNotInHeap;
    const HeapSlot last = heap.back();
    heap.pop_back();
    if (last.node == n) return;
    Place(i, last);
    SiftUp(i);
    SiftDown(last.node->heap_pos);
  }
  // After n's timestamp changed.
  void Fix(RadixNode* n) {
    heap[n->heap_pos].timestamp = n->timestamp;
    SiftUp(n->heap_pos);
    SiftDown(n->heap_pos);
  }
};

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_INDEX_RADIX_INDEX_INTERNAL_H_
