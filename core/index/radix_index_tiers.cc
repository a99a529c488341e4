// RadixIndex: the page tiers (types/tier.h, docs/tiers.md). Each node keeps
// one Tier per page; SetTier checks the path invariant (tiers never get
// hotter down a path) on every change, and TierCandidates picks the least
// recently used pages that may move colder. See radix_index.h for the
// contract and radix_index.cc for the tree itself.
#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/index/radix_index.h"
#include "core/index/radix_index_internal.h"

namespace kvharbor {

namespace {
using ChildRef = RadixNode::Ref;
}  // namespace

absl::StatusOr<Tier> RadixIndex::TierOf(PageHandle h) const {
  auto it = impl_->page_node.find(h);
  if (it == impl_->page_node.end() || it->second.node == nullptr) {
    return absl::NotFoundError(absl::StrCat("handle ", h, " is not indexed"));
  }
  return it->second.node->tier[it->second.index()];
}

bool RadixIndex::IsLocked(PageHandle h) const {
  auto it = impl_->page_node.find(h);
  return it != impl_->page_node.end() && it->second.node != nullptr &&
         it->second.node->ref_count > 0;
}

absl::Status RadixIndex::SetTier(PageHandle h, Tier t, bool allow_locked) {
  auto it = impl_->page_node.find(h);
  if (it == impl_->page_node.end() || it->second.node == nullptr) {
    return absl::NotFoundError(absl::StrCat("handle ", h, " is not indexed"));
  }
  RadixNode* n = it->second.node;
  const size_t i = it->second.index();
  if (n->ref_count > 0 && !allow_locked) {
    return absl::FailedPreconditionError(
        absl::StrCat("handle ", h, " is locked; a leased page is not moved"));
  }
  const Tier* before = i > 0                      ? &n->tier[i - 1]
                       : n->parent != root_.get() ? &n->parent->tier.back()
                                                  : nullptr;
  if (before != nullptr && *before > t) {
    return absl::FailedPreconditionError(absl::StrCat(
        "handle ", h, ": the page before it is colder than ", TierName(t)));
  }
  if (i + 1 < n->num_pages()) {
    if (n->tier[i + 1] < t) {
      return absl::FailedPreconditionError(absl::StrCat(
          "handle ", h, ": the page after it is hotter than ", TierName(t)));
    }
  } else {
    for (const ChildRef& c : n->children) {
      if (c.node->tier.front() < t) {
        return absl::FailedPreconditionError(absl::StrCat(
            "handle ", h, ": a child page is hotter than ", TierName(t)));
      }
    }
  }
  --tier_pages_[static_cast<int>(n->tier[i])];
  ++tier_pages_[static_cast<int>(t)];
  n->tier[i] = t;
  return absl::OkStatus();
}

absl::Status RadixIndex::ReplaceHandle(PageHandle old_h, PageHandle new_h) {
  auto it = impl_->page_node.find(old_h);
  if (it == impl_->page_node.end() || it->second.node == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("handle ", old_h, " is not indexed"));
  }
  if (impl_->page_node.contains(new_h)) {
    return absl::InvalidArgumentError(
        absl::StrCat("handle ", new_h, " is already held"));
  }
  const Impl::PageLoc loc = it->second;
  loc.node->value[loc.index()] = new_h;
  impl_->page_node.erase(it);
  impl_->page_node[new_h] = loc;
  return absl::OkStatus();
}

size_t RadixIndex::TierCandidates(Tier from, size_t n,
                                  std::vector<TierCandidate>* out) const {
  struct Range {
    uint64_t timestamp;
    const RadixNode* node;
    size_t begin, end;     // pages [begin, end) are in `from`
    uint64_t first_token;  // position of the node's first token
  };
  std::vector<Range> ranges;
  std::vector<std::pair<const RadixNode*, uint64_t>> stack;
  for (const ChildRef& c : root_->children) stack.push_back({c.node, 0});
  while (!stack.empty()) {
    auto [node, pos] = stack.back();
    stack.pop_back();
    const uint64_t end_pos = pos + node->key.size();
    for (const ChildRef& c : node->children) stack.push_back({c.node, end_pos});
    if (node->ref_count > 0) continue;
    const auto b = std::lower_bound(node->tier.begin(), node->tier.end(), from);
    const auto e = std::upper_bound(b, node->tier.end(), from);
    if (b == e) continue;
    if (e == node->tier.end()) {
      bool children_colder = true;
      for (const ChildRef& c : node->children) {
        children_colder = children_colder && c.node->tier.front() > from;
      }
      if (!children_colder) continue;
    }
    ranges.push_back(Range{node->timestamp, node,
                           static_cast<size_t>(b - node->tier.begin()),
                           static_cast<size_t>(e - node->tier.begin()), pos});
  }
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.timestamp < b.timestamp;
  });
  size_t taken = 0;
  for (const Range& r : ranges) {
    for (size_t i = r.end; i > r.begin && taken < n; --i, ++taken) {
      out->push_back(TierCandidate{r.node->value[i - 1],
                                   r.first_token + (i - 1) * page_size_});
    }
    if (taken == n) break;
  }
  return taken;
}

absl::Status RadixIndex::PrefixTokens(PageHandle h,
                                      std::vector<Token>* out) const {
  auto it = impl_->page_node.find(h);
  if (it == impl_->page_node.end() || it->second.node == nullptr) {
    return absl::NotFoundError(absl::StrCat("handle ", h, " is not indexed"));
  }
  const RadixNode* n = it->second.node;
  std::vector<const RadixNode*> path;
  for (const RadixNode* p = n->parent; p != root_.get(); p = p->parent) {
    path.push_back(p);
  }
  out->clear();
  for (auto p = path.rbegin(); p != path.rend(); ++p) {
    out->insert(out->end(), (*p)->key.begin(), (*p)->key.end());
  }
  const size_t upto = (it->second.index() + 1) * page_size_;
  out->insert(out->end(), n->key.begin(), n->key.begin() + upto);
  return absl::OkStatus();
}

}  // namespace kvharbor
