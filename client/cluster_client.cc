#include "kvharbor/cluster_client.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cluster/rendezvous.h"

namespace kvharbor {

struct ClusterClient::MemberState {
  MemberState(std::string a, int64_t e)
      : address(std::move(a)), hash(cluster::MemberHash(address)), epoch(e) {}

  const std::string address;
  const uint64_t hash;
  absl::Mutex mu;
  int64_t epoch ABSL_GUARDED_BY(mu);
  std::shared_ptr<Client> client ABSL_GUARDED_BY(mu);  // null: not connected
  bool down ABSL_GUARDED_BY(mu) = false;
  bool connecting ABSL_GUARDED_BY(mu) = false;
  absl::Time retry_at ABSL_GUARDED_BY(mu) = absl::InfinitePast();
  std::atomic<uint64_t> calls{0};
  std::atomic<uint64_t> failures{0};
  std::atomic<uint64_t> down_misses{0};
  std::atomic<uint64_t> dropped_inserts{0};
};

// An immutable snapshot of the members for routing.
struct ClusterClient::View {
  uint64_t generation = 0;
  std::vector<std::shared_ptr<MemberState>> members;
  std::vector<uint64_t> hashes;
};

namespace {

// A member's failure (it is dead, hung or draining), as opposed to an error
// that is the caller's.
bool IsMemberFailure(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s);
}

}  // namespace

ClusterClient::ClusterClient(ClusterClientOptions options)
    : options_(std::move(options)) {}

ClusterClient::~ClusterClient() = default;

absl::StatusOr<std::unique_ptr<ClusterClient>> ClusterClient::Create(
    ClusterClientOptions options) {
  if (options.members == nullptr) {
    return absl::InvalidArgumentError("members: a member source is required");
  }
  if (options.member_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("member_timeout: must be > 0");
  }
  if (options.retry_down_after < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("retry_down_after: must be >= 0");
  }
  // A dead member must fail fast, not hold the call until its deadline.
  options.client.wait_for_ready = false;
  // A restarted member must be reachable on the next try, not after the
  // backoff that gRPC accumulated while it was dead (and shared between
  // channels to one address).
  options.client.own_connection = true;
  options.client.max_reconnect_backoff =
      std::max(options.retry_down_after, absl::Milliseconds(100));
  // Check the per-member options once, with a placeholder address.
  {
    ClientOptions probe = options.client;
    probe.address = "127.0.0.1:1";
    absl::StatusOr<std::unique_ptr<Client>> c = Client::Create(probe);
    if (!c.ok()) return c.status();
  }
  std::unique_ptr<ClusterClient> cc(new ClusterClient(std::move(options)));
  cc->CurrentView();
  return cc;
}

std::shared_ptr<const ClusterClient::View> ClusterClient::CurrentView() {
  const uint64_t generation = options_.members->generation();
  absl::MutexLock lock(&mu_);
  if (view_ != nullptr && view_->generation == generation) return view_;
  auto view = std::make_shared<View>();
  view->generation = generation;
  for (const cluster::Member& m : options_.members->Members()) {
    std::shared_ptr<MemberState>& s = states_[m.address];
    if (s == nullptr) {
      s = std::make_shared<MemberState>(m.address, m.epoch);
    } else {
      absl::MutexLock ml(&s->mu);
      if (s->epoch != m.epoch) {
        // It registered again (a restart): forget the old connection and
        // any down time; it rejoins with its next call.
        s->epoch = m.epoch;
        s->client.reset();
        s->down = false;
        s->retry_at = absl::InfinitePast();
      }
    }
    view->members.push_back(s);
    view->hashes.push_back(s->hash);
  }
  view_ = view;
  return view_;
}

absl::Time ClusterClient::CallDeadline(const CallOptions& call) const {
  if (call.deadline.has_value()) return *call.deadline;
  return absl::Now() + call.timeout.value_or(options_.client.default_timeout);
}

CallOptions ClusterClient::MemberCall(const CallOptions& call) const {
  return CallOptions::Deadline(
      std::min(CallDeadline(call), absl::Now() + options_.member_timeout));
}

void ClusterClient::MarkDown(MemberState& m, const absl::Status& why) {
  ++m.failures;
  absl::MutexLock lock(&m.mu);
  m.client.reset();
  m.down = true;
  m.retry_at = absl::Now() + options_.retry_down_after;
}

std::shared_ptr<Client> ClusterClient::Connection(MemberState& m,
                                                  absl::Time deadline) {
  {
    absl::MutexLock lock(&m.mu);
    if (m.client != nullptr) return m.client;
    // Down (and not yet due for a retry), or another thread is connecting:
    // a miss now rather than a wait.
    if ((m.down && absl::Now() < m.retry_at) || m.connecting) return nullptr;
    m.connecting = true;
  }
  ClientOptions o = options_.client;
  o.address = m.address;
  absl::StatusOr<std::unique_ptr<Client>> created = Client::Create(o);
  std::shared_ptr<Client> client;
  absl::Status status = created.status();
  if (created.ok()) {
    client = std::move(*created);
    std::vector<client::NamespaceSpec> specs;
    {
      absl::MutexLock lock(&mu_);
      specs = specs_;
    }
    // A (re)joining daemon gets the namespaces this client created before
    // it serves any of their prefixes.
    const CallOptions call = MemberCall(CallOptions::Deadline(deadline));
    for (const client::NamespaceSpec& spec : specs) {
      status =
          client->CreateNamespace(spec, /*if_not_exists=*/true, call).status();
      if (!status.ok()) break;
    }
  }
  if (!status.ok()) {
    {
      absl::MutexLock lock(&m.mu);
      m.connecting = false;
    }
    MarkDown(m, status);
    return nullptr;
  }
  absl::MutexLock lock(&m.mu);
  m.connecting = false;
  m.down = false;
  m.client = client;
  return client;
}

std::shared_ptr<ClusterClient::MemberState> ClusterClient::FindMember(
    absl::string_view address) {
  CurrentView();
  absl::MutexLock lock(&mu_);
  auto it = states_.find(std::string(address));
  return it == states_.end() ? nullptr : it->second;
}

absl::StatusOr<uint32_t> ClusterClient::PageSize(absl::string_view ns,
                                                 const CallOptions& call) {
  {
    absl::MutexLock lock(&mu_);
    auto it = page_sizes_.find(ns);
    if (it != page_sizes_.end()) return it->second;
    for (const client::NamespaceSpec& s : specs_) {
      if (s.name == ns) return s.geometry.page_size;
    }
  }
  // Ask the live members, in the namespace's own rendezvous order.
  std::shared_ptr<const View> view = CurrentView();
  const absl::Time deadline = CallDeadline(call);
  absl::Status last = absl::UnavailableError("no live cluster member");
  for (size_t i : cluster::RankMembers(cluster::RouteKey(ns, {}), view->hashes,
                                       view->hashes.size())) {
    MemberState& m = *view->members[i];
    std::shared_ptr<Client> c = Connection(m, deadline);
    if (c == nullptr) continue;
    absl::StatusOr<client::NamespaceInfo> info =
        c->DescribeNamespace(ns, MemberCall(CallOptions::Deadline(deadline)));
    if (info.ok()) {
      const uint32_t ps = info->spec.geometry.page_size;
      absl::MutexLock lock(&mu_);
      page_sizes_[std::string(ns)] = ps;
      return ps;
    }
    if (!IsMemberFailure(info.status())) return info.status();
    MarkDown(m, info.status());
    last = info.status();
  }
  return last;
}

absl::StatusOr<std::shared_ptr<ClusterClient::MemberState>>
ClusterClient::Route(absl::string_view ns,
                     absl::Span<const client::Token> tokens,
                     const CallOptions& call) {
  std::shared_ptr<const View> view = CurrentView();
  if (view->members.empty()) return nullptr;
  absl::StatusOr<uint32_t> page_size = PageSize(ns, call);
  if (!page_size.ok()) {
    // No member answered: everything is a miss, not an error.
    if (IsMemberFailure(page_size.status())) return nullptr;
    return page_size.status();
  }
  if (*page_size == 0 || tokens.size() < *page_size) return nullptr;
  const uint64_t key = cluster::RouteKey(ns, tokens.subspan(0, *page_size));
  return view->members[cluster::RankMembers(key, view->hashes, 1)[0]];
}

absl::StatusOr<std::string> ClusterClient::Owner(
    absl::string_view ns, absl::Span<const client::Token> tokens,
    const CallOptions& call) {
  absl::StatusOr<std::shared_ptr<MemberState>> m = Route(ns, tokens, call);
  if (!m.ok()) return m.status();
  return *m == nullptr ? std::string() : (*m)->address;
}

absl::Status ClusterClient::CreateNamespace(const client::NamespaceSpec& spec,
                                            const CallOptions& call) {
  {
    absl::MutexLock lock(&mu_);
    auto same = [&](const client::NamespaceSpec& s) {
      return s.name == spec.name;
    };
    specs_.erase(std::remove_if(specs_.begin(), specs_.end(), same),
                 specs_.end());
    specs_.push_back(spec);
    page_sizes_.erase(spec.name);
  }
  std::shared_ptr<const View> view = CurrentView();
  const absl::Time deadline = CallDeadline(call);
  for (const std::shared_ptr<MemberState>& m : view->members) {
    std::shared_ptr<Client> c = Connection(*m, deadline);
    if (c == nullptr) continue;  // down: it gets the namespace on rejoin
    absl::Status s =
        c->CreateNamespace(spec, /*if_not_exists=*/true,
                           MemberCall(CallOptions::Deadline(deadline)))
            .status();
    if (s.ok()) continue;
    if (IsMemberFailure(s)) {
      MarkDown(*m, s);
      continue;
    }
    return absl::Status(s.code(),
                        absl::StrCat("member ", m->address, ": ", s.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> ClusterClient::CallMember(
    MemberState& m, std::atomic<uint64_t>* misses, const CallOptions& call,
    absl::FunctionRef<absl::Status(Client&)> op) {
  std::shared_ptr<Client> c = Connection(m, CallDeadline(call));
  if (c == nullptr) {
    ++*misses;
    return false;
  }
  ++m.calls;
  absl::Status s = op(*c);
  if (s.ok()) return true;
  if (!IsMemberFailure(s)) return s;
  MarkDown(m, s);
  ++*misses;
  return false;
}

absl::StatusOr<ClusterLease> ClusterClient::Match(
    absl::string_view ns, absl::Span<const client::Token> tokens, bool lock,
    absl::Duration ttl, const CallOptions& call) {
  ClusterLease out;
  absl::StatusOr<std::shared_ptr<MemberState>> m = Route(ns, tokens, call);
  if (!m.ok()) return m.status();
  if (*m == nullptr) return out;
  MemberState& member = **m;
  absl::StatusOr<bool> called =
      CallMember(member, &member.down_misses, call, [&](Client& c) {
        absl::StatusOr<client::Lease> lease =
            c.Match(ns, tokens, lock, ttl, MemberCall(call));
        if (lease.ok()) out.lease = std::move(*lease);
        return lease.status();
      });
  if (!called.ok()) return called.status();
  if (*called) out.member = member.address;
  return out;
}

absl::StatusOr<std::vector<std::vector<uint8_t>>> ClusterClient::Fetch(
    absl::string_view ns, const ClusterLease& lease, const CallOptions& call) {
  if (lease.member.empty() || lease.lease.pages.empty()) {
    return std::vector<std::vector<uint8_t>>();
  }
  std::shared_ptr<MemberState> m = FindMember(lease.member);
  std::shared_ptr<Client> c =
      m == nullptr ? nullptr : Connection(*m, CallDeadline(call));
  if (c == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("member ", lease.member, " is down or gone"));
  }
  ++m->calls;
  const client::FetchSource source =
      lease.lease.locked() ? client::FetchSource::FromLease(lease.lease.id)
                           : client::FetchSource::FromPages(lease.lease.pages);
  auto pages = c->Fetch(ns, source, MemberCall(call));
  if (!pages.ok() && IsMemberFailure(pages.status())) {
    MarkDown(*m, pages.status());
  }
  return pages;
}

absl::Status ClusterClient::Release(const ClusterLease& lease,
                                    const CallOptions& call) {
  if (!lease.lease.locked()) return absl::OkStatus();
  std::shared_ptr<MemberState> m = FindMember(lease.member);
  std::shared_ptr<Client> c =
      m == nullptr ? nullptr : Connection(*m, CallDeadline(call));
  // A dead member's leases died with it.
  if (c == nullptr) return absl::OkStatus();
  absl::Status s = c->Release(lease.lease.id, MemberCall(call));
  if (IsMemberFailure(s)) {
    MarkDown(*m, s);
    return absl::OkStatus();
  }
  return s;
}

absl::StatusOr<ClusterLookup> ClusterClient::Lookup(
    absl::string_view ns, absl::Span<const client::Token> tokens,
    const CallOptions& call) {
  const CallOptions whole = CallOptions::Deadline(CallDeadline(call));
  absl::StatusOr<ClusterLease> match =
      Match(ns, tokens, /*lock=*/false, absl::ZeroDuration(), whole);
  if (!match.ok()) return match.status();
  ClusterLookup out;
  if (match->lease.pages.empty()) return out;
  std::shared_ptr<MemberState> m = FindMember(match->member);
  std::shared_ptr<Client> c =
      m == nullptr ? nullptr : Connection(*m, CallDeadline(whole));
  if (c == nullptr) return out;
  ++m->calls;
  const uint64_t page_bytes = match->lease.page_bytes;
  std::vector<uint8_t> pages(page_bytes * match->lease.pages.size());
  absl::StatusOr<client::FetchResult> r =
      c->FetchInto(ns, client::FetchSource::FromPages(match->lease.pages),
                   absl::MakeSpan(pages), MemberCall(whole));
  if (!r.ok()) {
    // Dead since Match, or the pages were evicted in between: recompute.
    if (IsMemberFailure(r.status())) {
      MarkDown(*m, r.status());
      ++m->down_misses;
      return out;
    }
    if (absl::IsNotFound(r.status())) return out;
    return r.status();
  }
  out.matched_tokens = match->lease.matched_tokens;
  out.page_bytes = page_bytes;
  out.pages = std::move(pages);
  out.member = match->member;
  return out;
}

absl::StatusOr<ClusterInsertResult> ClusterClient::Insert(
    absl::string_view ns, absl::Span<const client::Token> tokens,
    absl::Span<const uint8_t> pages, uint64_t page_bytes,
    const CallOptions& call) {
  ClusterInsertResult out;
  absl::StatusOr<std::shared_ptr<MemberState>> m = Route(ns, tokens, call);
  if (!m.ok()) return m.status();
  if (*m == nullptr) {
    if (CurrentView()->members.empty() || tokens.empty()) {
      out.dropped = !tokens.empty();
      return out;
    }
    absl::StatusOr<uint32_t> ps = PageSize(ns, call);
    if (ps.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokens: ", tokens.size(),
                       " tokens are less than one page (", *ps, ")"));
    }
    out.dropped = true;  // no member could say what a page is
    return out;
  }
  MemberState& member = **m;
  out.member = member.address;
  absl::StatusOr<bool> called =
      CallMember(member, &member.dropped_inserts, call, [&](Client& c) {
        absl::StatusOr<client::InsertResult> r =
            c.Insert(ns, tokens, pages, page_bytes, MemberCall(call));
        if (r.ok()) out.result = *r;
        return r.status();
      });
  if (!called.ok()) return called.status();
  out.dropped = !*called;
  return out;
}

std::vector<ClusterMemberStatus> ClusterClient::MemberStatus(bool with_stats) {
  std::shared_ptr<const View> view = CurrentView();
  std::vector<ClusterMemberStatus> out;
  for (const std::shared_ptr<MemberState>& m : view->members) {
    ClusterMemberStatus s;
    s.address = m->address;
    s.calls = m->calls.load();
    s.failures = m->failures.load();
    s.down_misses = m->down_misses.load();
    s.dropped_inserts = m->dropped_inserts.load();
    if (with_stats) {
      const CallOptions call =
          CallOptions::Deadline(absl::Now() + options_.member_timeout);
      std::shared_ptr<Client> c = Connection(*m, *call.deadline);
      s.stats =
          c == nullptr ? absl::UnavailableError("down") : c->Stats("", call);
      if (!s.stats.ok() && IsMemberFailure(s.stats.status())) {
        MarkDown(*m, s.stats.status());
      }
    }
    absl::MutexLock lock(&m->mu);
    s.epoch = m->epoch;
    s.up = !m->down;
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace kvharbor
