// Three kvharbord processes and one etcd on loopback used as one cache
// through ClusterClient: shared-prefix requests spread over all three with
// every hit served by the prefix's owner; one daemon SIGKILLed mid-workload
// (no client error, hits on the survivors unchanged, data byte-exact, no call
// past its deadline); restart and rejoin. Then a hung (SIGSTOPped) member
// with a static member list: calls end within their deadlines.
#include "kvharbor/cluster_client.h"

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cluster/member_source.h"
#include "cluster/rendezvous.h"
#include "tests/cluster/cluster_test_util.h"

namespace kvharbor {
namespace testing {
namespace {

constexpr char kNs[] = "llm";
constexpr uint32_t kPageTokens = 16;
constexpr int kConversations = 48;
constexpr int kPromptPages = 3;  // the shared prefix of a conversation
constexpr int kTurnPages = 1;    // each request adds one page to it

client::NamespaceSpec Spec() {
  client::NamespaceSpec s;
  s.name = kNs;
  s.geometry.num_layers = 2;
  s.geometry.num_kv_heads = 2;
  s.geometry.head_dim = 16;
  s.geometry.page_size = kPageTokens;
  s.geometry.dtype = client::DType::kFP32;
  s.capacity_bytes = 32 << 20;
  return s;
}

// Conversation c's tokens: `pages` pages, the first ones shared by all its
// requests.
std::vector<int32_t> ConvTokens(int c, int pages) {
  std::vector<int32_t> t(static_cast<size_t>(pages) * kPageTokens);
  for (size_t i = 0; i < t.size(); ++i) {
    t[i] = static_cast<int32_t>((c * 7919 + i * 31) % 50000);
  }
  return t;
}

// Deterministic page bytes of conversation c (page i the same in every
// request that contains it, as a real KV cache would be).
std::vector<uint8_t> ConvPages(int c, int pages, uint64_t page_bytes) {
  std::vector<uint8_t> out(static_cast<size_t>(pages) * page_bytes);
  for (int p = 0; p < pages; ++p) {
    std::mt19937_64 rng(static_cast<uint64_t>(c) * 1000 + p);
    for (uint64_t i = 0; i < page_bytes; ++i) {
      out[p * page_bytes + i] = static_cast<uint8_t>(rng());
    }
  }
  return out;
}

std::string ExpectedOwner(const std::vector<std::string>& addresses, int c) {
  std::vector<std::string> sorted = addresses;
  std::sort(sorted.begin(), sorted.end());
  std::vector<uint64_t> h;
  for (const std::string& a : sorted) h.push_back(cluster::MemberHash(a));
  const std::vector<int32_t> t = ConvTokens(c, 1);
  return sorted[cluster::RankMembers(cluster::RouteKey(kNs, t), h, 1)[0]];
}

struct Workload {
  std::atomic<uint64_t> errors{0};
  std::atomic<uint64_t> wrong_bytes{0};
  std::atomic<uint64_t> late{0};  // calls that ended past their deadline
  std::atomic<uint64_t> lookups{0};
};

// One request of conversation c: Lookup the prompt plus a new turn, Insert
// the whole sequence; checks what came back against the generator.
void Request(ClusterClient& cc, int c, uint64_t page_bytes, Workload* w) {
  const int pages = kPromptPages + kTurnPages;
  const std::vector<int32_t> tokens = ConvTokens(c, pages);
  const std::vector<uint8_t> expect = ConvPages(c, pages, page_bytes);
  const absl::Duration budget = absl::Seconds(2);
  const absl::Time deadline = absl::Now() + budget;
  auto hit = cc.Lookup(kNs, tokens, CallOptions::Deadline(deadline));
  if (absl::Now() > deadline + absl::Milliseconds(50)) ++w->late;
  ++w->lookups;
  if (!hit.ok()) {
    ++w->errors;
    return;
  }
  if (!std::equal(hit->pages.begin(), hit->pages.end(), expect.begin())) {
    ++w->wrong_bytes;
  }
  auto ins =
      cc.Insert(kNs, tokens, expect, page_bytes, CallOptions::Timeout(budget));
  if (!ins.ok()) ++w->errors;
}

// Matched tokens of conversation c's prompt as each daemon answers alone.
std::map<std::string, uint64_t> DirectMatches(
    std::vector<std::unique_ptr<Client>>& clients,
    const std::vector<std::string>& addresses, int c) {
  std::map<std::string, uint64_t> out;
  const std::vector<int32_t> t = ConvTokens(c, kPromptPages);
  for (size_t i = 0; i < clients.size(); ++i) {
    if (clients[i] == nullptr) continue;
    auto m = clients[i]->Match(kNs, t);
    out[addresses[i]] = m.ok() ? m->matched_tokens : ~uint64_t{0};
  }
  return out;
}

TEST_CASE("three daemons with etcd: spread, kill, rejoin") {
  if (SkipWithoutEtcd()) return;
  TempDir dir;
  EtcdServer etcd(dir.path);
  REQUIRE(etcd.WaitReady());
  const std::string prefix = "/kvharbor-test/members/";
  std::vector<std::unique_ptr<DaemonProcess>> daemons;
  std::vector<std::string> addresses;
  for (int i = 0; i < 3; ++i) {
    daemons.push_back(std::make_unique<DaemonProcess>(dir, FreePort(),
                                                      etcd.endpoint(), prefix));
    addresses.push_back(daemons.back()->address());
  }
  std::vector<std::unique_ptr<Client>> direct;
  for (auto& d : daemons) {
    direct.push_back(d->Connect());
    INFO(d->Log() << " alive " << d->process().Alive() << " status "
                  << d->process().exit_status());
    REQUIRE(direct.back() != nullptr);
  }
  auto source = cluster::EtcdMemberSource::Create(etcd.options(), prefix);
  REQUIRE(source.ok());
  std::shared_ptr<cluster::MemberSource> members(std::move(*source));
  REQUIRE(WaitFor([&] { return members->Members().size() == 3; },
                  absl::Seconds(5)));
  ClusterClientOptions o;
  o.members = members;
  o.member_timeout = absl::Milliseconds(500);
  o.retry_down_after = absl::Milliseconds(200);
  auto cc = ClusterClient::Create(o);
  REQUIRE(cc.ok());
  REQUIRE((*cc)->CreateNamespace(Spec()).ok());
  const uint64_t page_bytes = Spec().geometry.PageBytes();

  // ---- Spread: the prompts, then requests that continue them. ----
  std::map<std::string, int> owned;
  for (int c = 0; c < kConversations; ++c) {
    const auto tokens = ConvTokens(c, kPromptPages);
    auto ins = (*cc)->Insert(
        kNs, tokens, ConvPages(c, kPromptPages, page_bytes), page_bytes);
    REQUIRE(ins.ok());
    REQUIRE_FALSE(ins->dropped);
    CHECK(ins->member == ExpectedOwner(addresses, c));
    ++owned[ins->member];
  }
  REQUIRE(owned.size() == 3);  // every daemon owns some prefixes
  Workload before;
  for (int c = 0; c < kConversations; ++c) {
    Request(**cc, c, page_bytes, &before);
    // The owner alone has the prompt; the others have nothing of it.
    const std::string owner = ExpectedOwner(addresses, c);
    for (const auto& [address, matched] : DirectMatches(direct, addresses, c)) {
      INFO("conversation " << c << " on " << address << " (owner " << owner
                           << ")");
      CHECK(matched == (address == owner ? kPromptPages * kPageTokens : 0));
    }
  }
  CHECK(before.errors == 0);
  CHECK(before.wrong_bytes == 0);
  for (int c = 0; c < kConversations; ++c) {
    auto hit = (*cc)->Lookup(kNs, ConvTokens(c, kPromptPages + kTurnPages));
    REQUIRE(hit.ok());
    CHECK(hit->matched_tokens == (kPromptPages + kTurnPages) * kPageTokens);
    CHECK(hit->member == ExpectedOwner(addresses, c));
  }

  // ---- Kill daemon 1 while four threads run requests. ----
  const std::string victim = addresses[1];
  Workload during;
  std::atomic<bool> stop{false};
  std::vector<std::thread> workers;
  for (int t = 0; t < 4; ++t) {
    workers.emplace_back([&, t] {
      for (int i = 0; !stop; ++i) {
        Request(**cc, (i * 4 + t) % kConversations, page_bytes, &during);
      }
    });
  }
  absl::SleepFor(absl::Milliseconds(300));
  daemons[1]->process().Signal(SIGKILL);
  absl::SleepFor(absl::Milliseconds(700));
  stop = true;
  for (std::thread& w : workers) w.join();
  CHECK(during.lookups > 20);
  CHECK(during.errors == 0);
  CHECK(during.wrong_bytes == 0);
  CHECK(during.late == 0);
  direct[1].reset();

  // Survivors' conversations still hit in full, byte-exact; the victim's
  // are misses; Inserts to it were dropped, not errors.
  auto check_after_kill = [&](bool victim_listed) {
    for (int c = 0; c < kConversations; ++c) {
      const std::string owner = ExpectedOwner(addresses, c);
      const int pages = kPromptPages + kTurnPages;
      auto hit = (*cc)->Lookup(kNs, ConvTokens(c, pages));
      REQUIRE(hit.ok());
      INFO("conversation " << c << " owner " << owner);
      if (owner == victim) {
        CHECK(hit->matched_tokens == 0);
      } else {
        CHECK(hit->matched_tokens == pages * kPageTokens);
        CHECK(hit->member == owner);
        CHECK(hit->pages == ConvPages(c, pages, page_bytes));
      }
    }
  };
  check_after_kill(true);
  bool victim_counted = false;
  for (const ClusterMemberStatus& m : (*cc)->MemberStatus(false)) {
    if (m.address != victim) continue;
    victim_counted = true;
    CHECK(m.failures >= 1);
    CHECK(m.down_misses + m.dropped_inserts >= 1);
  }
  CHECK(victim_counted);
  // The lease expires (ttl 2 s): the victim leaves the view, and its
  // prefixes now belong to the survivors, who do not have them (misses) --
  // the survivors' own prefixes keep their owner and their hits.
  REQUIRE(WaitFor([&] { return members->Members().size() == 2; },
                  absl::Seconds(6)));
  for (int c = 0; c < kConversations; ++c) {
    if (ExpectedOwner(addresses, c) == victim) continue;
    auto hit = (*cc)->Lookup(kNs, ConvTokens(c, kPromptPages));
    REQUIRE(hit.ok());
    CHECK(hit->matched_tokens == kPromptPages * kPageTokens);
  }

  // ---- Restart on the same address: it registers again and rejoins. ----
  daemons[1]->Start();
  direct[1] = daemons[1]->Connect();
  INFO(daemons[1]->Log());
  INFO("alive " << daemons[1]->process().Alive() << " status "
                << daemons[1]->process().exit_status());
  REQUIRE(direct[1] != nullptr);
  REQUIRE(WaitFor([&] { return members->Members().size() == 3; },
                  absl::Seconds(5)));
  Workload after;
  for (int c = 0; c < kConversations; ++c) Request(**cc, c, page_bytes, &after);
  CHECK(after.errors == 0);
  CHECK(after.wrong_bytes == 0);
  // The ClusterClient re-created the namespace there, and the victim's
  // conversations are back on it.
  for (int c = 0; c < kConversations; ++c) {
    const std::string owner = ExpectedOwner(addresses, c);
    auto hit = (*cc)->Lookup(kNs, ConvTokens(c, kPromptPages + kTurnPages));
    REQUIRE(hit.ok());
    CHECK(hit->member == owner);
    CHECK(hit->matched_tokens == (kPromptPages + kTurnPages) * kPageTokens);
  }
  auto stats = direct[1]->Stats(kNs);
  REQUIRE(stats.ok());
  REQUIRE(stats->namespaces.size() == 1);
  CHECK(stats->namespaces[0].cached_pages ==
        static_cast<uint64_t>(owned[victim] * (kPromptPages + kTurnPages)));
}

TEST_CASE("a hung member costs no call more than its deadline (static list)") {
  TempDir dir;
  std::vector<std::unique_ptr<DaemonProcess>> daemons;
  std::vector<std::string> addresses;
  for (int i = 0; i < 2; ++i) {
    daemons.push_back(std::make_unique<DaemonProcess>(dir, FreePort(), "", ""));
    addresses.push_back(daemons.back()->address());
    REQUIRE(daemons.back()->Connect() != nullptr);
  }
  auto source = cluster::StaticMemberSource::Create(addresses);
  REQUIRE(source.ok());
  ClusterClientOptions o;
  o.members = std::move(*source);
  o.member_timeout = absl::Milliseconds(300);
  o.retry_down_after = absl::Milliseconds(500);
  auto cc = ClusterClient::Create(o);
  REQUIRE(cc.ok());
  REQUIRE((*cc)->CreateNamespace(Spec()).ok());
  const uint64_t page_bytes = Spec().geometry.PageBytes();
  int hung_conv = -1;
  for (int c = 0; c < 16; ++c) {
    auto ins =
        (*cc)->Insert(kNs, ConvTokens(c, kPromptPages),
                      ConvPages(c, kPromptPages, page_bytes), page_bytes);
    REQUIRE(ins.ok());
    if (ins->member == addresses[0]) hung_conv = c;
  }
  REQUIRE(hung_conv >= 0);
  const auto tokens = ConvTokens(hung_conv, kPromptPages);
  REQUIRE((*cc)->Lookup(kNs, tokens)->matched_tokens ==
          kPromptPages * kPageTokens);

  REQUIRE(daemons[0]->process().Stop());
  // The member timeout (300 ms) ends the first call; the member is then
  // down and the next calls are immediate misses.
  absl::Time start = absl::Now();
  auto hit = (*cc)->Lookup(kNs, tokens, CallOptions::Timeout(absl::Seconds(5)));
  REQUIRE(hit.ok());
  CHECK(hit->matched_tokens == 0);
  CHECK(absl::Now() - start < absl::Milliseconds(600));
  start = absl::Now();
  hit = (*cc)->Lookup(kNs, tokens, CallOptions::Timeout(absl::Seconds(5)));
  REQUIRE(hit.ok());
  CHECK(hit->matched_tokens == 0);
  CHECK(absl::Now() - start < absl::Milliseconds(50));
  // Once the member is due for a retry, a caller deadline shorter than the
  // member timeout wins.
  absl::SleepFor(absl::Milliseconds(600));
  start = absl::Now();
  hit =
      (*cc)->Lookup(kNs, tokens, CallOptions::Timeout(absl::Milliseconds(100)));
  REQUIRE(hit.ok());
  CHECK(hit->matched_tokens == 0);
  CHECK(absl::Now() - start < absl::Milliseconds(300));
  auto ins = (*cc)->Insert(
      kNs, tokens, ConvPages(hung_conv, kPromptPages, page_bytes), page_bytes);
  REQUIRE(ins.ok());
  CHECK(ins->dropped);

  // It wakes up: after retry_down_after it answers again with its pages.
  daemons[0]->process().Signal(SIGCONT);
  CHECK(WaitFor(
      [&] {
        auto h = (*cc)->Lookup(kNs, tokens);
        return h.ok() && h->matched_tokens == kPromptPages * kPageTokens &&
               h->pages == ConvPages(hung_conv, kPromptPages, page_bytes);
      },
      absl::Seconds(3)));
}

TEST_CASE("cluster client: bad input is an error naming the field") {
  ClusterClientOptions o;
  auto cc = ClusterClient::Create(o);
  CHECK(absl::IsInvalidArgument(cc.status()));
  CHECK(cc.status().message().find("members") != absl::string_view::npos);
  auto s = cluster::StaticMemberSource::Create({"nohostport"});
  CHECK(absl::IsInvalidArgument(s.status()));
  s = cluster::StaticMemberSource::Create({});
  CHECK(absl::IsInvalidArgument(s.status()));
  s = cluster::StaticMemberSource::Create({"127.0.0.1:1"});
  REQUIRE(s.ok());
  o.members = std::move(*s);
  o.member_timeout = absl::ZeroDuration();
  CHECK(absl::IsInvalidArgument(ClusterClient::Create(o).status()));
  // With every member dead, requests are misses and inserts are dropped.
  o.member_timeout = absl::Milliseconds(200);
  cc = ClusterClient::Create(o);
  REQUIRE(cc.ok());
  const auto tokens = ConvTokens(1, 2);
  auto hit = (*cc)->Lookup(kNs, tokens);
  REQUIRE(hit.ok());
  CHECK(hit->matched_tokens == 0);
  std::vector<uint8_t> pages(2 * Spec().geometry.PageBytes());
  auto ins = (*cc)->Insert(kNs, tokens, pages, Spec().geometry.PageBytes());
  REQUIRE(ins.ok());
  CHECK(ins->dropped);
}

}  // namespace
}  // namespace testing
}  // namespace kvharbor
