// The etcd side of membership against a real etcd on loopback: the JSON
// gateway calls, the registrar's lease (keepalive, re-registration after the
// lease is lost, revoke on stop), the watching member source, and the
// kvharbord config section.
#include <catch2/catch.hpp>
#include <optional>

#include "cluster/etcd_client.h"
#include "cluster/member_source.h"
#include "cluster/registrar.h"
#include "server/daemon/config.h"
#include "server/daemon/daemon.h"
#include "tests/cluster/cluster_test_util.h"

namespace kvharbor {
namespace testing {
namespace {

bool HasMember(const cluster::MemberSource& s, const std::string& address) {
  for (const cluster::Member& m : s.Members()) {
    if (m.address == address) return true;
  }
  return false;
}

TEST_CASE("etcd gateway: put, range, lease keepalive and expiry") {
  if (SkipWithoutEtcd()) return;
  TempDir dir;
  EtcdServer etcd(dir.path);
  REQUIRE(etcd.WaitReady());
  cluster::EtcdClient c(etcd.options());
  auto lease = c.GrantLease(absl::Seconds(2));
  REQUIRE(lease.ok());
  REQUIRE(c.Put("/t/a", "value-a", *lease).ok());
  REQUIRE(c.Put("/t/b", std::string("bin\0ary", 7), 0).ok());
  REQUIRE(c.Put("/u/c", "other prefix", 0).ok());
  auto range = c.RangePrefix("/t/");
  REQUIRE(range.ok());
  REQUIRE(range->kvs.size() == 2);
  CHECK(range->kvs[0].key == "/t/a");
  CHECK(range->kvs[0].value == "value-a");
  CHECK(range->kvs[0].lease == *lease);
  CHECK(range->kvs[1].value == std::string("bin\0ary", 7));
  CHECK(range->revision > 0);
  auto ttl = c.KeepAlive(*lease);
  REQUIRE(ttl.ok());
  CHECK(*ttl >= absl::Seconds(1));
  REQUIRE(c.RevokeLease(*lease).ok());
  CHECK(absl::IsNotFound(c.KeepAlive(*lease).status()));
  range = c.RangePrefix("/t/");
  REQUIRE(range.ok());
  REQUIRE(range->kvs.size() == 1);  // the leased key went with the lease
  CHECK(range->kvs[0].key == "/t/b");
}

TEST_CASE("etcd endpoints: bad ones are named, dead ones fail in time") {
  cluster::EtcdOptions o;
  CHECK(absl::IsInvalidArgument(cluster::ValidateEtcdOptions(o, "x")));
  o.endpoints = {"https://127.0.0.1:2379"};
  absl::Status s = cluster::ValidateEtcdOptions(o, "cluster.etcd_endpoints");
  CHECK(absl::IsInvalidArgument(s));
  CHECK(s.message().find("cluster.etcd_endpoints") != absl::string_view::npos);
  o.endpoints = {"127.0.0.1:notaport"};
  CHECK(absl::IsInvalidArgument(cluster::ValidateEtcdOptions(o, "x")));
  o.endpoints = {"127.0.0.1:" + std::to_string(FreePort())};
  o.request_timeout = absl::Milliseconds(500);
  cluster::EtcdClient dead(o);
  const absl::Time start = absl::Now();
  CHECK(absl::IsUnavailable(dead.RangePrefix("/").status()));
  CHECK(absl::Now() - start < absl::Seconds(2));
}

TEST_CASE("registrar: keeps its key alive, re-registers, revokes on stop") {
  if (SkipWithoutEtcd()) return;
  TempDir dir;
  EtcdServer etcd(dir.path);
  REQUIRE(etcd.WaitReady());
  cluster::RegistrarOptions o;
  o.etcd = etcd.options();
  o.key_prefix = "/kvh/";
  o.lease_ttl = absl::Seconds(1);
  o.advertise = "10.1.2.3:50051";
  auto r = cluster::MemberRegistrar::Start(o);
  REQUIRE(r.ok());
  auto source = cluster::EtcdMemberSource::Create(etcd.options(), "/kvh/");
  REQUIRE(source.ok());
  CHECK(HasMember(**source, "10.1.2.3:50051"));
  // Three TTLs later the key is still there: the keepalive works.
  absl::SleepFor(absl::Seconds(3));
  CHECK(HasMember(**source, "10.1.2.3:50051"));
  // Someone revokes our lease (as its expiry during an etcd outage would):
  // the key goes, the registrar notices and registers again. The gap can
  // be shorter than any polling interval (CI once missed it), so the test
  // asks for its traces instead: the watch saw changes, a second
  // registration under a new lease, and the member listed again.
  cluster::EtcdClient c(etcd.options());
  const int64_t first_lease = (*r)->lease();
  const uint64_t generation = (*source)->generation();
  REQUIRE(c.RevokeLease(first_lease).ok());
  CHECK(WaitFor(
      [&] {
        return (*r)->registrations() == 2 &&
               (*source)->generation() > generation &&
               HasMember(**source, "10.1.2.3:50051");
      },
      absl::Seconds(5)));
  CHECK((*r)->lease() != first_lease);
  CHECK((*r)->registrations() == 2);
  // Stop revokes: the member is gone at once, not after the TTL.
  (*r)->Stop();
  CHECK(WaitFor([&] { return !HasMember(**source, "10.1.2.3:50051"); },
                absl::Milliseconds(500)));
}

TEST_CASE("etcd member source survives an etcd restart") {
  if (SkipWithoutEtcd()) return;
  TempDir dir;
  auto etcd = std::make_unique<EtcdServer>(dir.path);
  REQUIRE(etcd->WaitReady());
  const cluster::EtcdOptions options = etcd->options();
  cluster::EtcdClient c(options);
  REQUIRE(c.Put("/m/a", R"({"address":"h1:1"})", 0).ok());
  auto source = cluster::EtcdMemberSource::Create(options, "/m/");
  REQUIRE(source.ok());
  REQUIRE((*source)->Members().size() == 1);
  CHECK((*source)->Members()[0].address == "h1:1");
  // A key without the registrar's JSON names its member by its suffix.
  REQUIRE(c.Put("/m/h2:2", "", 0).ok());
  CHECK(WaitFor([&] { return HasMember(**source, "h2:2"); }, absl::Seconds(2)));
  // etcd goes down (the view stays) and comes back on the same data and
  // port: the source re-reads and watches again.
  etcd->process().Kill();
  absl::SleepFor(absl::Milliseconds(300));
  CHECK((*source)->Members().size() == 2);
  const int client_port = etcd->client_port();
  const int peer_port = etcd->peer_port();
  etcd.reset();
  etcd = std::make_unique<EtcdServer>(dir.path, client_port, peer_port);
  REQUIRE(etcd->WaitReady());
  REQUIRE(c.Put("/m/h3:3", "", 0).ok());
  CHECK(
      WaitFor([&] { return HasMember(**source, "h3:3"); }, absl::Seconds(10)));
  CHECK((*source)->resyncs() >= 1);
  CHECK((*source)->Members().size() == 3);
}

TEST_CASE("config: the cluster section, with errors naming the key") {
  TempDir dir;
  DaemonOptions o;
  REQUIRE(LoadConfigFile(dir.Write("ok.yaml",
                                   "cluster:\n"
                                   "  etcd_endpoints: [http://10.0.0.1:2379, "
                                   "10.0.0.2:2379]\n"
                                   "  key_prefix: /prod/kvh/\n"
                                   "  lease_ttl_s: 5\n"
                                   "  advertise: kvharbor-0.kvharbor:50051\n"),
                         &o)
              .ok());
  REQUIRE(o.cluster.has_value());
  CHECK(o.cluster->etcd.endpoints.size() == 2);
  CHECK(o.cluster->key_prefix == "/prod/kvh/");
  CHECK(o.cluster->lease_ttl == absl::Seconds(5));
  CHECK(o.cluster->advertise == "kvharbor-0.kvharbor:50051");
  struct Bad {
    const char* yaml;
    const char* field;
  };
  for (const Bad& b : {
           Bad{"cluster:\n  key_prefix: /x/\n", "cluster.etcd_endpoints"},
           Bad{"cluster:\n  etcd_endpoints: [https://a:1]\n",
               "cluster.etcd_endpoints"},
           Bad{"cluster:\n  etcd_endpoints: [a:1]\n  lease_ttl_s: 0\n",
               "cluster.lease_ttl_s"},
           Bad{"cluster:\n  etcd_endpoints: [a:1]\n  lease_ttl_s: ten\n",
               "cluster.lease_ttl_s"},
           Bad{"cluster:\n  etcd_endpoints: [a:1]\n  advertise: nohost\n",
               "cluster.advertise"},
           Bad{"cluster:\n  etcd_endpoints: [a:1]\n  typo: 1\n",
               "cluster.typo"},
       }) {
    DaemonOptions d;
    absl::Status s = LoadConfigFile(dir.Write("bad.yaml", b.yaml), &d);
    INFO(b.yaml << " -> " << s);
    CHECK(absl::IsInvalidArgument(s));
    CHECK(s.message().find(b.field) != absl::string_view::npos);
  }
}

TEST_CASE("kvharbord fails to start when etcd does not answer") {
  TempDir dir;
  DaemonOptions o;
  o.listen = "127.0.0.1:0";
  o.store.pool_budget_bytes = 64 << 20;
  cluster::RegistrarOptions c;
  c.etcd.endpoints = {"127.0.0.1:" + std::to_string(FreePort())};
  c.etcd.request_timeout = absl::Milliseconds(300);
  o.cluster = c;
  auto d = Daemon::Start(o);
  CHECK(absl::IsUnavailable(d.status()));
}

}  // namespace
}  // namespace testing
}  // namespace kvharbor
