// RadixIndex introspection: Dump (the TreeDump RPC, debugging) and the
// structural invariant checks the tests run after every operation. Kept out
// of radix_index.cc, which holds the tree's operations; see radix_index.h
// for the contract and radix_index.cc for the layout these checks enforce.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "core/base/status_macros.h"
#include "core/index/page_key.h"
#include "core/index/radix_index.h"
#include "core/index/radix_index_internal.h"

namespace kvharbor {

using radix_internal::FindChild;
using radix_internal::kChildIndexDrop;
using radix_internal::kChildIndexMin;
using radix_internal::kNotInHeap;
using radix_internal::PushChildren;
using ChildRef = RadixNode::Ref;

namespace {

// The first pages of `n`'s key: token ids, or page keys in hex.
void AppendKey(const RadixNode* n, uint32_t page_size, bool page_keys,
               std::string* out) {
  constexpr size_t kShowTokens = 8;
  constexpr size_t kShowKeys = 2;
  if (page_keys && page_size == kPageKeyWords) {
    const size_t pages = n->key.size() / kPageKeyWords;
    for (size_t p = 0; p < std::min(pages, kShowKeys); ++p) {
      absl::StrAppend(out, p > 0 ? " | " : "",
                      absl::BytesToHexString(
                          DecodePageKey(n->key.data() + p * kPageKeyWords)));
    }
    if (pages > kShowKeys) absl::StrAppend(out, " ...");
    return;
  }
  for (size_t i = 0; i < std::min(n->key.size(), kShowTokens); ++i) {
    if (i > 0) {
      absl::StrAppend(out, page_size > 1 && i % page_size == 0 ? " | " : " ");
    }
    absl::StrAppend(out, n->key[i]);
  }
  if (n->key.size() > kShowTokens) absl::StrAppend(out, " ...");
}

}  // namespace

std::string RadixIndex::Dump(size_t max_nodes, bool page_keys) const {
  constexpr size_t kShowPages = 4;
  std::string out = absl::StrFormat(
      "RadixIndex page_size=%d nodes=%d pages=%d evictable=%d protected=%d "
      "locks=%d\n",
      page_size_, node_count_, total_pages(), evictable_pages_,
      protected_pages_, root_->ref_count);
  std::vector<std::pair<const RadixNode*, size_t>> stack;
  for (auto it = root_->children.rbegin(); it != root_->children.rend(); ++it)
    stack.push_back({it->node, 1});
  size_t shown = 0;
  while (!stack.empty() && shown < max_nodes) {
    auto [n, depth] = stack.back();
    stack.pop_back();
    ++shown;
    absl::StrAppend(&out, std::string(2 * depth, ' '), "[");
    AppendKey(n, page_size_, page_keys, &out);
    absl::StrAppend(&out, "] pages=", n->num_pages(), " (");
    for (size_t i = 0; i < std::min(n->num_pages(), kShowPages); ++i) {
      absl::StrAppend(&out, i > 0 ? " " : "", n->value[i]);
    }
    if (n->num_pages() > kShowPages) absl::StrAppend(&out, " ...");
    absl::StrAppend(&out, ") ref=", n->ref_count, " ts=", n->timestamp, "\n");
    for (auto it = n->children.rbegin(); it != n->children.rend(); ++it)
      stack.push_back({it->node, depth + 1});
  }
  if (shown < node_count_) {
    absl::StrAppend(&out, "... ", node_count_ - shown, " more nodes\n");
  }
  return out;
}

absl::Status RadixIndex::CheckNode(const RadixNode* n) const {
  const bool is_root = n == root_.get();
  const auto bad = [&](absl::string_view what) {
    return absl::InternalError(absl::StrFormat(
        "RadixIndex: %s (node with %d pages, first handle %s, ref=%d, ts=%d)",
        what, n->num_pages(),
        n->value.empty() ? "-" : absl::StrCat(n->value[0]), n->ref_count,
        n->timestamp));
  };
  if (n->key.size() != n->num_pages() * page_size_) {
    return bad("key length != pages * page_size");
  }
  if (n->tier.size() != n->num_pages()) return bad("tier length != pages");
  for (size_t i = 1; i < n->tier.size(); ++i) {
    if (n->tier[i] < n->tier[i - 1]) {
      return bad(absl::StrCat("page ", i, " is in a hotter tier than page ",
                              i - 1, " before it"));
    }
  }
  if (!is_root && n->parent != root_.get() && !n->tier.empty() &&
      n->tier.front() < n->parent->tier.back()) {
    return bad("first page is in a hotter tier than its parent's last page");
  }
  if (!is_root) {
    if (n->num_pages() == 0) return bad("non-root node without pages");
    const RadixNode* p = n->parent;
    if (p == nullptr || n->pos_in_parent >= p->children.size() ||
        p->children[n->pos_in_parent].node != n) {
      return bad("parent/pos_in_parent inconsistent");
    }
    if (p != root_.get() && p->timestamp < n->timestamp) {
      return bad("parent older than child");
    }
    if (n->timestamp > clock_) return bad("timestamp ahead of clock");
  }
  for (size_t i = 0; i < n->value.size(); ++i) {
    auto it = impl_->page_node.find(n->value[i]);
    if (it == impl_->page_node.end() || it->second.node != n ||
        it->second.index() != i) {
      return bad(absl::StrCat("page_node entry of handle ", n->value[i],
                              " (page ", i, ") wrong"));
    }
  }
  uint64_t child_refs = 0;
  absl::flat_hash_set<absl::string_view> first_pages;
  for (const ChildRef& ref : n->children) {
    const RadixNode* c = ref.node;
    child_refs += c->ref_count;
    if (c->parent != n) return bad("child's parent pointer wrong");
    if (c->key.empty()) return bad("child without key");
    if (ref.first != c->key[0] || ref.key != c->key.data() ||
        ref.num_pages != c->num_pages()) {
      return bad("child Ref out of sync with the child's key");
    }
    const absl::string_view page(reinterpret_cast<const char*>(c->key.data()),
                                 impl_->page_bytes);
    if (!first_pages.insert(page).second) {
      return bad("two children share a first page");
    }
    if (n->child_index != nullptr &&
        FindChild(n, c->key.data(), impl_->page_bytes) != &ref) {
      return bad("child index does not find a child by its first page");
    }
  }
  if (child_refs > n->ref_count) return bad("ref_count < sum of children's");
  if (n->child_index != nullptr
          ? (n->child_index->size() != n->children.size() ||
             n->children.size() <= kChildIndexDrop)
          : n->children.size() > kChildIndexMin) {
    return bad("child index present/size wrong");
  }
  const bool evictable_leaf = !is_root && n->is_leaf() && n->ref_count == 0;
  if (evictable_leaf != (n->heap_pos != kNotInHeap)) {
    return bad("heap membership != (leaf && unlocked)");
  }
  if (evictable_leaf && (n->heap_pos >= impl_->heap.size() ||
                         impl_->heap[n->heap_pos].node != n)) {
    return bad("heap_pos does not point at the node");
  }
  return absl::OkStatus();
}

absl::Status RadixIndex::CheckHeap(size_t expected_leaves) const {
  const auto& heap = impl_->heap;
  if (heap.size() != expected_leaves) {
    return absl::InternalError(
        absl::StrFormat("RadixIndex: heap holds %d nodes, %d evictable leaves",
                        heap.size(), expected_leaves));
  }
  for (size_t i = 0; i < heap.size(); ++i) {
    if (heap[i].timestamp != heap[i].node->timestamp) {
      return absl::InternalError(absl::StrFormat(
          "RadixIndex: heap slot %d holds timestamp %d, its node %d", i,
          heap[i].timestamp, heap[i].node->timestamp));
    }
    if (i > 0 && heap[(i - 1) / 2].timestamp > heap[i].timestamp) {
      return absl::InternalError(
          absl::StrFormat("RadixIndex: heap order broken at slot %d", i));
    }
  }
  return absl::OkStatus();
}

absl::Status RadixIndex::CheckInvariants() const {
  const RadixNode* root = root_.get();
  if (root->parent != nullptr || !root->key.empty() ||
      root->heap_pos != kNotInHeap) {
    return absl::InternalError(
        "RadixIndex: root has a parent, key or heap slot");
  }
  size_t nodes = 0, evictable = 0, protected_pages = 0, leaves = 0;
  size_t per_tier[kNumTiers] = {0, 0, 0};
  std::vector<const RadixNode*> stack = {root};
  while (!stack.empty()) {
    const RadixNode* n = stack.back();
    stack.pop_back();
    KVH_RETURN_IF_ERROR(CheckNode(n));
    if (n != root) {
      ++nodes;
      (n->ref_count > 0 ? protected_pages : evictable) += n->num_pages();
      if (n->heap_pos != kNotInHeap) ++leaves;
      for (Tier t : n->tier) ++per_tier[static_cast<int>(t)];
    }
    PushChildren(n, &stack);
  }
  if (nodes != node_count_ || evictable != evictable_pages_ ||
      protected_pages != protected_pages_ ||
      impl_->page_node.size() != evictable + protected_pages) {
    return absl::InternalError(absl::StrFormat(
        "RadixIndex: counts wrong: nodes %d/%d evictable %d/%d protected "
        "%d/%d handles %d (counted/kept)",
        nodes, node_count_, evictable, evictable_pages_, protected_pages,
        protected_pages_, impl_->page_node.size()));
  }
  for (int t = 0; t < kNumTiers; ++t) {
    if (per_tier[t] != tier_pages_[t]) {
      return absl::InternalError(absl::StrFormat(
          "RadixIndex: tier %s holds %d pages, counter says %d",
          TierName(static_cast<Tier>(t)), per_tier[t], tier_pages_[t]));
    }
  }
  return CheckHeap(leaves);
}

}  // namespace kvharbor
