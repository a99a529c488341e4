// The unary RPCs through the raw generated stub: namespaces, Match, leases,
// Evict, Stats and DumpTree, with every bad input rejected by code and field
// and leaving the namespace as it was.
#include <string>
#include <thread>
#include <vector>

#include "server/rpc/service.h"
#include "tests/server/server_test_util.h"

namespace kvharbor {
namespace testing {
namespace {

using C = grpc::StatusCode;

v1::NamespaceSpec Spec(const std::string& name) {
  v1::NamespaceSpec spec;
  spec.set_name(name);
  *spec.mutable_geometry() = TestGeometryProto();
  spec.set_capacity_bytes(8 * kPageBytes);
  return spec;
}

grpc::Status Create(TestServer& s, const v1::NamespaceSpec& spec,
                    bool if_not_exists = false,
                    v1::CreateNamespaceResponse* out = nullptr) {
  grpc::ClientContext ctx;
  v1::CreateNamespaceRequest req;
  *req.mutable_spec() = spec;
  req.set_if_not_exists(if_not_exists);
  v1::CreateNamespaceResponse local;
  return s.stub->CreateNamespace(&ctx, req, out ? out : &local);
}

std::vector<std::string> Names(TestServer& s) {
  grpc::ClientContext ctx;
  v1::ListNamespacesResponse resp;
  REQUIRE(
      s.stub->ListNamespaces(&ctx, v1::ListNamespacesRequest(), &resp).ok());
  std::vector<std::string> names;
  for (const auto& info : resp.namespaces())
    names.push_back(info.spec().name());
  return names;
}

TEST_CASE("CreateNamespace, Describe, List, Delete", "[server][namespace]") {
  TestServer s;
  v1::CreateNamespaceResponse created;
  REQUIRE(Create(s, Spec("alpha"), false, &created).ok());
  CHECK(created.created());
  CHECK(created.info().spec().name() == "alpha");
  CHECK(created.info().spec().codec() == "identity");
  CHECK(created.info().spec().capacity_bytes() == 8 * kPageBytes);
  CHECK(created.info().spec().geometry().dtype() == v1::DTYPE_BF16);
  CHECK(created.info().spec().geometry().layout() ==
        v1::PAGE_LAYOUT_KV_LAYER_TOKEN_HEAD_DIM);
  CHECK(created.info().stats().capacity_pages() == 8);
  CHECK(created.info().stats().page_bytes() == kPageBytes);

  // if_not_exists with the same spec is fine; without it, ALREADY_EXISTS.
  v1::CreateNamespaceResponse again;
  REQUIRE(Create(s, Spec("alpha"), true, &again).ok());
  CHECK_FALSE(again.created());
  CheckError(Create(s, Spec("alpha")), C::ALREADY_EXISTS, "spec.name");

  grpc::ClientContext dctx;
  v1::DescribeNamespaceRequest dreq;
  dreq.set_namespace_("alpha");
  v1::NamespaceInfo info;
  REQUIRE(s.stub->DescribeNamespace(&dctx, dreq, &info).ok());
  CHECK(info.spec().geometry().head_dim() == 64);
  CHECK(info.stats().name() == "alpha");

  CHECK(Names(s) == std::vector<std::string>{"alpha", "test"});

  grpc::ClientContext xctx;
  v1::DeleteNamespaceRequest del;
  del.set_namespace_("alpha");
  v1::DeleteNamespaceResponse dr;
  REQUIRE(s.stub->DeleteNamespace(&xctx, del, &dr).ok());
  CHECK(Names(s) == std::vector<std::string>{"test"});
}

TEST_CASE("CreateNamespace rejects bad specs", "[server][namespace]") {
  TestServer s;
  const uint64_t reserved = s.daemon->store().Counters().pool_reserved_bytes;
  v1::NamespaceSpec spec = Spec("fresh");
  v1::Geometry* g = spec.mutable_geometry();
  grpc::StatusCode code = C::INVALID_ARGUMENT;
  std::string field;

  SECTION("no spec") {
    grpc::ClientContext ctx;
    v1::CreateNamespaceResponse resp;
    CheckError(
        s.stub->CreateNamespace(&ctx, v1::CreateNamespaceRequest(), &resp),
        C::INVALID_ARGUMENT, "spec");
    field = "";
  }
  SECTION("empty name") {
    spec.set_name("");
    field = "spec.name";
  }
  SECTION("name with a bad character") {
    spec.set_name("a/b");
    field = "spec.name";
  }
  SECTION("name too long") {
    spec.set_name(std::string(129, 'a'));
    field = "spec.name";
  }
  SECTION("no geometry") {
    spec.clear_geometry();
    field = "spec.geometry";
  }
  SECTION("DTYPE_UNSPECIFIED") {
    g->set_dtype(v1::DTYPE_UNSPECIFIED);
    field = "spec.geometry.dtype";
  }
  SECTION("unknown dtype value") {
    g->set_dtype(static_cast<v1::DType>(42));
    field = "spec.geometry.dtype";
  }
  SECTION("unknown layout value") {
    g->set_layout(static_cast<v1::PageLayout>(9));
    field = "spec.geometry.layout";
  }
  SECTION("num_layers 0") {
    g->set_num_layers(0);
    field = "spec.geometry.num_layers";
  }
  SECTION("num_kv_heads too large") {
    g->set_num_kv_heads(kMaxKvHeads + 1);
    field = "spec.geometry.num_kv_heads";
  }
  SECTION("head_dim too large") {
    g->set_head_dim(kMaxHeadDim + 1);
    field = "spec.geometry.head_dim";
  }
  SECTION("page_size 0") {
    g->set_page_size(0);
    field = "spec.geometry.page_size";
  }
  SECTION("a page over the size limit") {
    g->set_num_layers(1024);
    g->set_num_kv_heads(64);
    g->set_head_dim(128);
    g->set_page_size(64);
    field = "spec.geometry";
  }
  SECTION("negative rope_theta") {
    g->set_rope_theta(-1);
    field = "spec.geometry.rope_theta";
  }
  SECTION("capacity below one page") {
    spec.set_capacity_bytes(kPageBytes - 1);
    field = "spec.capacity_bytes";
  }
  SECTION("capacity over the budget") {
    // A cap larger than the whole budget could never be reached.
    spec.set_capacity_bytes(uint64_t{1} << 40);
    field = "spec.capacity_bytes";
  }
  SECTION("host tier over the budget") {
    spec.set_host_compressed_bytes(UINT64_MAX);
    field = "spec.host_compressed_bytes";
  }
  SECTION("unknown codec") {
    spec.set_codec("zip");
    field = "spec.codec";
  }
  if (!field.empty()) CheckError(Create(s, spec), code, field);
  CHECK(Names(s) == std::vector<std::string>{"test"});
  CHECK(s.daemon->store().Counters().pool_reserved_bytes == reserved);
  // Still serving.
  REQUIRE(Create(s, Spec("after")).ok());
}

TEST_CASE("Describe and Delete reject unknown or malformed names",
          "[server][namespace]") {
  TestServer s;
  for (const char* name : {"nope", "", "bad name"}) {
    const C want =
        std::string(name) == "nope" ? C::NOT_FOUND : C::INVALID_ARGUMENT;
    grpc::ClientContext c1;
    v1::DescribeNamespaceRequest d;
    d.set_namespace_(name);
    v1::NamespaceInfo info;
    CheckError(s.stub->DescribeNamespace(&c1, d, &info), want, "namespace");
    grpc::ClientContext c2;
    v1::DeleteNamespaceRequest x;
    x.set_namespace_(name);
    v1::DeleteNamespaceResponse xr;
    CheckError(s.stub->DeleteNamespace(&c2, x, &xr), want, "namespace");
  }
  CHECK(Names(s) == std::vector<std::string>{"test"});
}

TEST_CASE("DeleteNamespace refuses a leased namespace unless forced",
          "[server][namespace]") {
  TestServer s;
  const std::vector<int32_t> tokens = Tokens(kPageSize, 1);
  REQUIRE(
      InsertPages(s.stub.get(), tokens, RandomBytes(kPageBytes, 1), 4096).ok());
  v1::MatchResponse m = MatchOk(s.stub.get(), tokens, true);
  REQUIRE(m.lease_id() != 0);
  const uint64_t reserved = s.daemon->store().Counters().pool_reserved_bytes;

  grpc::ClientContext c1;
  v1::DeleteNamespaceRequest del;
  del.set_namespace_(kNs);
  v1::DeleteNamespaceResponse dr;
  CheckError(s.stub->DeleteNamespace(&c1, del, &dr), C::FAILED_PRECONDITION,
             "namespace");
  CHECK(Names(s) == std::vector<std::string>{"test"});
  grpc::ClientContext c2;
  del.set_force(true);
  REQUIRE(s.stub->DeleteNamespace(&c2, del, &dr).ok());
  CHECK(Names(s).empty());
  // Capacities are caps: nothing was reserved, nothing comes back; the
  // pages' memory goes back to the budget once the namespace is gone.
  CHECK(reserved == 0);
  CHECK(s.daemon->store().Counters().pool_reserved_bytes == 0);
  CHECK(Eventually(
      [&] { return s.daemon->store().Counters().memory_used_bytes == 0; }));
}

grpc::Status MatchRaw(TestServer& s, const std::string& ns,
                      const std::vector<int32_t>& tokens) {
  grpc::ClientContext ctx;
  v1::MatchRequest req;
  req.set_namespace_(ns);
  for (int32_t t : tokens) req.add_token_ids(t);
  v1::MatchResponse resp;
  return s.stub->Match(&ctx, req, &resp);
}

TEST_CASE("Match finds the longest cached prefix and counts hits",
          "[server][match]") {
  TestServer s;
  const std::vector<int32_t> tokens = Tokens(3 * kPageSize, 1);
  REQUIRE(
      InsertPages(s.stub.get(), tokens, RandomBytes(3 * kPageBytes, 1), 4096)
          .ok());
  std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + 2 * kPageSize);
  prompt.push_back(999999);  // diverges inside the third page
  for (int i = 0; i < 6; ++i) prompt.push_back(i);
  v1::MatchResponse m = MatchOk(s.stub.get(), prompt);
  CHECK(m.matched_tokens() == 2 * kPageSize);
  CHECK(m.page_handles_size() == 2);
  CHECK(m.lease_id() == 0);
  CHECK(m.lease_expires_unix_ms() == 0);
  const NamespaceStats c = s.ns()->Counters();
  CHECK(c.hit_tokens == 2 * kPageSize);
  CHECK(c.miss_tokens == prompt.size() - 2 * kPageSize);
  // A miss takes no lease even with lock.
  v1::MatchResponse none =
      MatchOk(s.stub.get(), Tokens(kPageSize, 77777), true);
  CHECK(none.matched_tokens() == 0);
  CHECK(none.lease_id() == 0);
}

TEST_CASE("Match rejects bad requests", "[server][match]") {
  DaemonOptions o = TestOptions();
  o.store.max_tokens_per_request = 64;
  TestServer s(o);
  REQUIRE(InsertPages(s.stub.get(), Tokens(kPageSize, 1),
                      RandomBytes(kPageBytes, 1), 4096)
              .ok());
  const Snapshot before = Snap(*s.ns());
  CheckError(MatchRaw(s, "nope", Tokens(4, 1)), C::NOT_FOUND, "namespace");
  CheckError(MatchRaw(s, "", Tokens(4, 1)), C::INVALID_ARGUMENT, "namespace");
  CheckError(MatchRaw(s, kNs, {}), C::INVALID_ARGUMENT, "token_ids");
  CheckError(MatchRaw(s, kNs, Tokens(65, 1)), C::INVALID_ARGUMENT, "token_ids");
  CheckError(MatchRaw(s, kNs, {1, 2, -3, 4}), C::INVALID_ARGUMENT,
             "token_ids[2]");
  CHECK(Snap(*s.ns()) == before);
  CHECK(MatchOk(s.stub.get(), Tokens(kPageSize, 1)).matched_tokens() ==
        kPageSize);
}

grpc::Status EvictAll(TestServer& s, v1::EvictResponse* out) {
  grpc::ClientContext ctx;
  v1::EvictRequest req;
  req.set_namespace_(kNs);
  req.set_all(true);
  return s.stub->Evict(&ctx, req, out);
}

grpc::Status Release(TestServer& s, uint64_t lease) {
  grpc::ClientContext ctx;
  v1::ReleaseRequest req;
  req.set_lease_id(lease);
  v1::ReleaseResponse resp;
  return s.stub->Release(&ctx, req, &resp);
}

grpc::Status Extend(TestServer& s, uint64_t lease, uint32_t ttl_ms,
                    v1::ExtendLeaseResponse* out = nullptr) {
  grpc::ClientContext ctx;
  v1::ExtendLeaseRequest req;
  req.set_lease_id(lease);
  req.set_lease_ttl_ms(ttl_ms);
  v1::ExtendLeaseResponse local;
  return s.stub->ExtendLease(&ctx, req, out ? out : &local);
}

TEST_CASE("A lease protects its pages from Evict(all)", "[server][lease]") {
  TestServer s;
  const std::vector<int32_t> leased = Tokens(2 * kPageSize, 1);
  const std::vector<int32_t> other = Tokens(3 * kPageSize, 5000);
  REQUIRE(
      InsertPages(s.stub.get(), leased, RandomBytes(2 * kPageBytes, 1), 4096)
          .ok());
  REQUIRE(InsertPages(s.stub.get(), other, RandomBytes(3 * kPageBytes, 2), 4096)
              .ok());
  v1::MatchResponse m = MatchOk(s.stub.get(), leased, true);
  REQUIRE(m.lease_id() != 0);
  CHECK(s.ns()->Counters().protected_pages == 2);

  v1::EvictResponse er;
  REQUIRE(EvictAll(s, &er).ok());
  CHECK(er.pages_evicted() == 3);
  CHECK(er.bytes_freed() == 3 * kPageBytes);
  CHECK(MatchOk(s.stub.get(), leased).matched_tokens() == leased.size());
  CHECK(MatchOk(s.stub.get(), other).matched_tokens() == 0);
  // Evicting a leased page by handle is refused.
  {
    grpc::ClientContext ctx;
    v1::EvictRequest req;
    req.set_namespace_(kNs);
    req.mutable_pages()->add_page_handles(m.page_handles(1));
    v1::EvictResponse resp;
    CheckError(s.stub->Evict(&ctx, req, &resp), C::FAILED_PRECONDITION,
               "pages.page_handles");
  }
  REQUIRE(Release(s, m.lease_id()).ok());
  CheckError(Release(s, m.lease_id()), C::NOT_FOUND, "lease_id");
  REQUIRE(EvictAll(s, &er).ok());
  CHECK(er.pages_evicted() == 2);
  CHECK(s.ns()->Counters().free_pages == kCapacityPages);
  CheckSettled(*s.ns());
}

TEST_CASE("A lease runs out after its TTL unless extended", "[server][lease]") {
  TestServer s;  // reaps every 20 ms
  const std::vector<int32_t> tokens = Tokens(kPageSize, 1);
  REQUIRE(
      InsertPages(s.stub.get(), tokens, RandomBytes(kPageBytes, 1), 4096).ok());
  v1::MatchResponse shortl = MatchOk(s.stub.get(), tokens, true, 150);
  v1::MatchResponse longl = MatchOk(s.stub.get(), tokens, true, 150);
  const int64_t now_ms = absl::ToUnixMillis(absl::Now());
  CHECK(shortl.lease_expires_unix_ms() > now_ms);
  CHECK(shortl.lease_expires_unix_ms() <= now_ms + 200);
  v1::ExtendLeaseResponse ext;
  REQUIRE(Extend(s, longl.lease_id(), 60000, &ext).ok());
  CHECK(ext.lease_expires_unix_ms() >= now_ms + 59000);
  CHECK(s.ns()->Counters().active_leases == 2);

  REQUIRE(Eventually([&] { return s.ns()->Counters().active_leases == 1; }));
  CheckError(Release(s, shortl.lease_id()), C::NOT_FOUND, "lease_id");
  CheckError(Extend(s, shortl.lease_id(), 1000), C::NOT_FOUND, "lease_id");
  v1::EvictResponse er;
  REQUIRE(EvictAll(s, &er).ok());
  CHECK(er.pages_evicted() == 0);  // the extended lease still protects it
  REQUIRE(Release(s, longl.lease_id()).ok());
  REQUIRE(EvictAll(s, &er).ok());
  CHECK(er.pages_evicted() == 1);
}

TEST_CASE("Lease TTLs are capped at the daemon's maximum", "[server][lease]") {
  DaemonOptions o = TestOptions();
  o.store.default_lease_ttl = absl::Seconds(1);
  o.store.max_lease_ttl = absl::Seconds(2);
  TestServer s(o);
  const std::vector<int32_t> tokens = Tokens(kPageSize, 1);
  REQUIRE(
      InsertPages(s.stub.get(), tokens, RandomBytes(kPageBytes, 1), 4096).ok());
  v1::MatchResponse m = MatchOk(s.stub.get(), tokens, true, 3600 * 1000);
  CHECK(m.lease_expires_unix_ms() <= absl::ToUnixMillis(absl::Now()) + 2000);
}

TEST_CASE("Release and ExtendLease reject bad lease ids", "[server][lease]") {
  TestServer s;
  CheckError(Release(s, 0), C::INVALID_ARGUMENT, "lease_id");
  CheckError(Release(s, 424242), C::NOT_FOUND, "lease_id");
  CheckError(Extend(s, 0, 10), C::INVALID_ARGUMENT, "lease_id");
  CheckError(Extend(s, 424242, 10), C::NOT_FOUND, "lease_id");
}

TEST_CASE("Evict by pages and by bytes", "[server][evict]") {
  TestServer s;
  const std::vector<int32_t> tokens = Tokens(4 * kPageSize, 1);
  REQUIRE(
      InsertPages(s.stub.get(), tokens, RandomBytes(4 * kPageBytes, 1), 4096)
          .ok());
  v1::MatchResponse m = MatchOk(s.stub.get(), tokens);
  {
    // Page 2 and every page that extends it.
    grpc::ClientContext ctx;
    v1::EvictRequest req;
    req.set_namespace_(kNs);
    req.mutable_pages()->add_page_handles(m.page_handles(2));
    v1::EvictResponse resp;
    REQUIRE(s.stub->Evict(&ctx, req, &resp).ok());
    CHECK(resp.pages_evicted() == 2);
    CHECK(MatchOk(s.stub.get(), tokens).matched_tokens() == 2 * kPageSize);
  }
  {
    grpc::ClientContext ctx;
    v1::EvictRequest req;
    req.set_namespace_(kNs);
    req.set_bytes(1);  // rounds up to a page
    v1::EvictResponse resp;
    REQUIRE(s.stub->Evict(&ctx, req, &resp).ok());
    CHECK(resp.pages_evicted() == 1);
    CHECK(resp.bytes_freed() == kPageBytes);
  }
  CHECK(s.ns()->Counters().cached_pages == 1);
  CHECK(s.ns()->Counters().evicted_pages == 3);
}

TEST_CASE("Evict rejects bad requests", "[server][evict]") {
  TestServer s;
  const std::vector<int32_t> tokens = Tokens(2 * kPageSize, 1);
  REQUIRE(
      InsertPages(s.stub.get(), tokens, RandomBytes(2 * kPageBytes, 1), 4096)
          .ok());
  v1::MatchResponse m = MatchOk(s.stub.get(), tokens);
  const Snapshot before = Snap(*s.ns());
  auto evict = [&](const v1::EvictRequest& req) {
    grpc::ClientContext ctx;
    v1::EvictResponse resp;
    return s.stub->Evict(&ctx, req, &resp);
  };
  v1::EvictRequest req;
  req.set_namespace_(kNs);
  CheckError(evict(req), C::INVALID_ARGUMENT, "target");
  req.set_bytes(0);
  CheckError(evict(req), C::INVALID_ARGUMENT, "bytes");
  req.set_all(false);
  CheckError(evict(req), C::INVALID_ARGUMENT, "all");
  req.mutable_pages();
  CheckError(evict(req), C::INVALID_ARGUMENT, "pages.page_handles");
  req.mutable_pages()->add_page_handles(m.page_handles(0));
  req.mutable_pages()->add_page_handles(m.page_handles(1) ^
                                        (uint64_t{7} << 32));
  CheckError(evict(req), C::NOT_FOUND, "pages.page_handles[1]");
  req.set_all(true);
  req.set_namespace_("nope");
  CheckError(evict(req), C::NOT_FOUND, "namespace");
  CHECK(Snap(*s.ns()) == before);
  CHECK(MatchOk(s.stub.get(), tokens).matched_tokens() == tokens.size());
}

TEST_CASE("Stats reports namespaces and global counters", "[server][stats]") {
  TestServer s;
  REQUIRE(Create(s, Spec("other")).ok());
  const std::vector<int32_t> tokens = Tokens(2 * kPageSize, 1);
  const std::string bytes = RandomBytes(2 * kPageBytes, 1);
  REQUIRE(InsertPages(s.stub.get(), tokens, bytes, 4096).ok());
  MatchOk(s.stub.get(), tokens, true);

  grpc::ClientContext ctx;
  v1::StatsResponse all;
  REQUIRE(s.stub->Stats(&ctx, v1::StatsRequest(), &all).ok());
  REQUIRE(all.namespaces_size() == 2);
  CHECK(all.namespaces(0).name() == "other");
  const v1::NamespaceStats& t = all.namespaces(1);
  CHECK(t.name() == kNs);
  CHECK(t.capacity_pages() == kCapacityPages);
  CHECK(t.free_pages() == kCapacityPages - 2);
  CHECK(t.cached_pages() == 2);
  CHECK(t.protected_pages() == 2);
  CHECK(t.evictable_pages() == 0);
  CHECK(t.inserted_pages() == 2);
  CHECK(t.bytes_in() == bytes.size());
  CHECK(t.hit_tokens() == tokens.size());
  CHECK(t.active_leases() == 1);
  CHECK(t.page_bytes() == kPageBytes);
  CHECK(t.index_nodes() >= 1);
  const v1::GlobalStats& g = all.global();
  CHECK(g.pool_budget_bytes() == 64 << 20);
  CHECK(g.pool_reserved_bytes() == 0);  // capacities are caps
  CHECK(g.memory_used_bytes() >= 2 * kPageBytes);
  CHECK(g.memory_used_bytes() ==
        t.memory_bytes() + all.namespaces(0).memory_bytes());
  CHECK(g.namespaces() == 2);
  CHECK(g.cached_pages() == 2);
  CHECK(g.active_leases() == 1);
  CHECK(g.bytes_in() == bytes.size());
  CHECK(g.uptime_seconds() >= 0);

  grpc::ClientContext c1;
  v1::StatsRequest one;
  one.set_namespace_("other");
  v1::StatsResponse r1;
  REQUIRE(s.stub->Stats(&c1, one, &r1).ok());
  REQUIRE(r1.namespaces_size() == 1);
  CHECK(r1.namespaces(0).name() == "other");
  CHECK(r1.global().namespaces() == 2);

  grpc::ClientContext c2;
  one.set_namespace_("nope");
  CheckError(s.stub->Stats(&c2, one, &r1), C::NOT_FOUND, "namespace");
  grpc::ClientContext c3;
  one.set_namespace_("bad name");
  CheckError(s.stub->Stats(&c3, one, &r1), C::INVALID_ARGUMENT, "namespace");
}

TEST_CASE("DumpTree shows the tree and validates max_nodes", "[server][dump]") {
  TestServer s;
  REQUIRE(InsertPages(s.stub.get(), Tokens(2 * kPageSize, 1),
                      RandomBytes(2 * kPageBytes, 1), 4096)
              .ok());
  std::vector<int32_t> branch = Tokens(kPageSize, 1);
  for (int32_t t : Tokens(kPageSize, 7000)) branch.push_back(t);
  REQUIRE(
      InsertPages(s.stub.get(), branch, RandomBytes(2 * kPageBytes, 2), 4096)
          .ok());
  grpc::ClientContext ctx;
  v1::DumpTreeRequest req;
  req.set_namespace_(kNs);
  v1::DumpTreeResponse resp;
  REQUIRE(s.stub->DumpTree(&ctx, req, &resp).ok());
  CHECK(resp.nodes() == s.ns()->Counters().index_nodes);
  CHECK(resp.nodes() >= 3);
  CHECK(resp.text() == s.ns()->DumpTree(1000));

  grpc::ClientContext c1;
  req.set_max_nodes(kMaxDumpNodes + 1);
  CheckError(s.stub->DumpTree(&c1, req, &resp), C::INVALID_ARGUMENT,
             "max_nodes");
  grpc::ClientContext c2;
  req.set_max_nodes(1);
  req.set_namespace_("nope");
  CheckError(s.stub->DumpTree(&c2, req, &resp), C::NOT_FOUND, "namespace");
}

}  // namespace
}  // namespace testing
}  // namespace kvharbor
