// Bearer tokens, roles and tenant isolation through the SDK: for every RPC,
// tenant A's token cannot touch tenant B's namespace (it reads exactly like
// a missing one) nor see it in ListNamespaces or Stats; roles are enforced;
// the tokens file reloads without a restart; tokens never reach the log.
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "kvharbor/client.h"
#include "server/daemon/daemon.h"
#include "spdlog/spdlog.h"
#include "tests/server/log_capture.h"
#include "tests/server/server_test_util.h"
#include "tests/temp_dir.h"

namespace kvharbor {
namespace testing {
namespace {

constexpr char kARead[] = "a-read-token-0000000001";
constexpr char kAWrite[] = "a-write-token-000000002";
constexpr char kAAdmin[] = "a-admin-token-000000003";
constexpr char kBWrite[] = "b-write-token-000000004";
constexpr char kCRead[] = "c-read-token-0000000005";

std::string TokensYaml(const std::vector<std::vector<std::string>>& entries) {
  std::string out = "tokens:\n";
  for (const auto& e : entries) {
    absl::StrAppend(&out, "  - token: ", e[0], "\n    tenant: ", e[1],
                    "\n    role: ", e[2], "\n");
  }
  return out;
}

const std::vector<std::vector<std::string>> kTokens = {
    {kARead, "tenant-a", "read"},
    {kAWrite, "tenant-a", "write"},
    {kAAdmin, "tenant-a", "admin"},
    {kBWrite, "tenant-b", "write"}};

NamespaceSpec OwnedSpec(const std::string& name, const std::string& tenant) {
  NamespaceSpec spec;
  spec.name = name;
  spec.geometry = TestGeometry();
  spec.capacity_bytes = kCapacityPages * kPageBytes;
  spec.host_compressed_bytes = kCapacityPages * kPageBytes;
  spec.tenant = tenant;
  return spec;
}

client::NamespaceSpec ClientSpec(const std::string& name) {
  client::NamespaceSpec spec;
  spec.name = name;
  spec.geometry.num_layers = 2;
  spec.geometry.num_kv_heads = 2;
  spec.geometry.head_dim = 64;
  spec.geometry.page_size = kPageSize;
  spec.geometry.dtype = client::DType::kBF16;
  spec.capacity_bytes = 8 * kPageBytes;
  return spec;
}

struct TenantDaemon {
  TenantDaemon() {
    spdlog::set_level(spdlog::level::warn);
    tokens_path = dir.Write("tokens.yaml", TokensYaml(kTokens));
    DaemonOptions o;
    o.listen = "127.0.0.1:0";
    o.store.pool_budget_bytes = 64 << 20;
    o.lease_reap_interval = absl::Milliseconds(20);
    o.drain_timeout = absl::Seconds(2);
    o.security.tokens_file = tokens_path;
    o.namespaces = {OwnedSpec("a-ns", "tenant-a"),
                    OwnedSpec("b-ns", "tenant-b")};
    absl::StatusOr<std::unique_ptr<Daemon>> d = Daemon::Start(o);
    INFO(d.status().ToString());
    REQUIRE(d.ok());
    daemon = *std::move(d);
  }

  std::unique_ptr<Client> As(const std::string& token) const {
    ClientOptions options;
    options.address = daemon->address();
    options.token = token;
    options.default_timeout = absl::Seconds(10);
    absl::StatusOr<std::unique_ptr<Client>> c = Client::Create(options);
    REQUIRE(c.ok());
    return *std::move(c);
  }

  TempDir dir;
  std::string tokens_path;
  std::unique_ptr<Daemon> daemon;
};

std::vector<uint8_t> PageData(size_t pages, uint8_t fill) {
  return std::vector<uint8_t>(pages * kPageBytes, fill);
}

std::vector<client::Token> Prompt(size_t n, int32_t first) {
  std::vector<client::Token> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = first + static_cast<int32_t>(i);
  return t;
}

// `call` on another tenant's namespace fails exactly like on a missing one:
// NOT_FOUND, and the same message up to the name.
template <typename Call>
void ExpectLooksMissing(const std::string& what, Call call) {
  INFO(what);
  const absl::Status hidden = call("b-ns");
  const absl::Status missing = call("x-ns");
  CHECK(hidden.code() == absl::StatusCode::kNotFound);
  CHECK(missing.code() == absl::StatusCode::kNotFound);
  CHECK(std::string(hidden.message()) ==
        absl::StrReplaceAll(missing.message(), {{"x-ns", "b-ns"}}));
}

template <typename T>
absl::Status StatusOf(const absl::StatusOr<T>& s) {
  return s.status();
}

TEST_CASE("A tenant's token cannot reach another tenant's namespace in any RPC",
          "[server][security]") {
  TenantDaemon t;
  std::unique_ptr<Client> b = t.As(kBWrite);
  const std::vector<client::Token> prompt = Prompt(2 * kPageSize, 100);
  REQUIRE(b->Insert("b-ns", prompt, PageData(2, 0xb), kPageBytes).ok());
  absl::StatusOr<client::Lease> b_lease = b->Match("b-ns", prompt, true);
  REQUIRE(b_lease.ok());
  REQUIRE(b_lease->locked());
  REQUIRE(b_lease->pages.size() == 2);
  const std::vector<client::PageHandle> b_pages = b_lease->pages;

  std::unique_ptr<Client> a = t.As(kAAdmin);  // A's strongest token
  ExpectLooksMissing("DescribeNamespace", [&](const std::string& ns) {
    return StatusOf(a->DescribeNamespace(ns));
  });
  ExpectLooksMissing("Match", [&](const std::string& ns) {
    return StatusOf(a->Match(ns, prompt, true));
  });
  ExpectLooksMissing("Insert", [&](const std::string& ns) {
    return StatusOf(
        a->Insert(ns, Prompt(kPageSize, 500), PageData(1, 0xa), kPageBytes));
  });
  ExpectLooksMissing("Fetch by pages", [&](const std::string& ns) {
    return StatusOf(a->Fetch(ns, client::FetchSource::FromPages(b_pages)));
  });
  ExpectLooksMissing("Fetch by lease", [&](const std::string& ns) {
    return StatusOf(a->Fetch(ns, client::FetchSource::FromLease(b_lease->id)));
  });
  ExpectLooksMissing("Evict pages", [&](const std::string& ns) {
    return StatusOf(a->EvictPages(ns, b_pages));
  });
  ExpectLooksMissing("Evict all", [&](const std::string& ns) {
    return StatusOf(a->EvictAll(ns));
  });
  ExpectLooksMissing("Stats of one namespace", [&](const std::string& ns) {
    return StatusOf(a->Stats(ns));
  });
  ExpectLooksMissing("DumpTree", [&](const std::string& ns) {
    return StatusOf(a->DumpTree(ns));
  });
  ExpectLooksMissing("GetCalibration", [&](const std::string& ns) {
    return StatusOf(a->GetCalibration(ns));
  });
  ExpectLooksMissing("Demote", [&](const std::string& ns) {
    return StatusOf(a->Demote(ns, client::Tier::kHostCompressed));
  });
  ExpectLooksMissing("GetDeviceHandles", [&](const std::string& ns) {
    return StatusOf(a->GetDeviceHandles(ns, b_lease->id));
  });
  ExpectLooksMissing("GetHostHandles", [&](const std::string& ns) {
    return StatusOf(a->GetHostHandles(ns, b_lease->id));
  });
  ExpectLooksMissing("DeleteNamespace", [&](const std::string& ns) {
    return a->DeleteNamespace(ns, /*force=*/true);
  });

  SECTION("leases: B's lease id reads like an expired one") {
    const uint64_t unused_id = b_lease->id + 1000000;
    for (bool release : {false, true}) {
      INFO((release ? "Release" : "ExtendLease"));
      auto call = [&](uint64_t id) {
        return release ? a->Release(id)
                       : StatusOf(a->ExtendLease(id, absl::Seconds(5)));
      };
      const absl::Status hidden = call(b_lease->id);
      const absl::Status missing = call(unused_id);
      CHECK(hidden.code() == absl::StatusCode::kNotFound);
      CHECK(std::string(hidden.message()) ==
            absl::StrReplaceAll(
                missing.message(),
                {{absl::StrCat(unused_id), absl::StrCat(b_lease->id)}}));
    }
    // Nor through a namespace of A's own.
    CHECK(a->Fetch("a-ns", client::FetchSource::FromLease(b_lease->id))
              .status()
              .code() == absl::StatusCode::kNotFound);
    // GetDeviceHandles answers B's lease id exactly as an unused one (here
    // FAILED_PRECONDITION: this daemon has no device tier).
    const absl::Status b_handles =
        a->GetDeviceHandles("a-ns", b_lease->id).status();
    const absl::Status unused_handles =
        a->GetDeviceHandles("a-ns", unused_id).status();
    CHECK(b_handles.code() == unused_handles.code());
    CHECK(b_handles.message() == unused_handles.message());
  }

  SECTION("CreateNamespace does not hand out or describe B's namespace") {
    for (bool if_not_exists : {false, true}) {
      client::NamespaceSpec spec = ClientSpec("b-ns");
      spec.capacity_bytes = 0;
      absl::StatusOr<client::CreateNamespaceResult> r =
          a->CreateNamespace(spec, if_not_exists);
      CHECK(r.status().code() == absl::StatusCode::kAlreadyExists);
      CHECK_FALSE(absl::StrContains(r.status().message(), "geometry"));
    }
  }

  SECTION("ListNamespaces and Stats show only A's namespaces") {
    absl::StatusOr<std::vector<client::NamespaceInfo>> list =
        a->ListNamespaces();
    REQUIRE(list.ok());
    REQUIRE(list->size() == 1);
    CHECK(list->at(0).spec.name == "a-ns");
    for (const char* token : {kARead, kAAdmin}) {
      absl::StatusOr<client::Stats> stats = t.As(token)->Stats();
      REQUIRE(stats.ok());
      REQUIRE(stats->namespaces.size() == 1);
      CHECK(stats->namespaces[0].name == "a-ns");
      // Store-wide totals are the daemon admin's only; A's admin and
      // reader alike get A's own (hostile_test.cc covers daemon_admin).
      CHECK(stats->global.namespaces == 1u);
      CHECK(stats->global.cached_pages == 0u);
    }
  }

  // Whatever A tried, B's namespace, pages and lease are untouched.
  absl::StatusOr<client::Stats> b_stats = b->Stats("b-ns");
  REQUIRE(b_stats.ok());
  CHECK(b_stats->namespaces.at(0).cached_pages == 2);
  CHECK(b_stats->namespaces.at(0).active_leases == 1);
  CHECK(b->ExtendLease(b_lease->id, absl::Seconds(5)).ok());
  absl::StatusOr<std::vector<std::vector<uint8_t>>> pages =
      b->Fetch("b-ns", client::FetchSource::FromLease(b_lease->id));
  REQUIRE(pages.ok());
  REQUIRE(pages->size() == 2);
  CHECK(pages->at(1) == std::vector<uint8_t>(kPageBytes, 0xb));
  CHECK(b->Release(b_lease->id).ok());
}

TEST_CASE("Roles: read < write < admin, each RPC checked",
          "[server][security]") {
  TenantDaemon t;
  std::unique_ptr<Client> reader = t.As(kARead);
  std::unique_ptr<Client> writer = t.As(kAWrite);
  std::unique_ptr<Client> admin = t.As(kAAdmin);
  const std::vector<client::Token> prompt = Prompt(kPageSize, 7);
  auto denied = [](const absl::Status& s) {
    INFO(s.ToString());
    return s.code() == absl::StatusCode::kPermissionDenied &&
           absl::StrContains(s.message(), "needs role");
  };

  CHECK(denied(
      reader->Insert("a-ns", prompt, PageData(1, 1), kPageBytes).status()));
  CHECK(denied(reader->EvictAll("a-ns").status()));
  CHECK(denied(reader->Demote("a-ns", client::Tier::kHostCompressed).status()));
  CHECK(denied(reader->CreateNamespace(ClientSpec("r-ns")).status()));
  CHECK(denied(reader->DeleteNamespace("a-ns")));
  CHECK(denied(writer->CreateNamespace(ClientSpec("w-ns")).status()));
  CHECK(denied(writer->DeleteNamespace("a-ns")));

  REQUIRE(writer->Insert("a-ns", prompt, PageData(1, 1), kPageBytes).ok());
  absl::StatusOr<client::Lease> lease = reader->Match("a-ns", prompt, true);
  REQUIRE(lease.ok());
  CHECK(lease->matched_tokens == kPageSize);
  CHECK(reader->ExtendLease(lease->id, absl::Seconds(5)).ok());
  CHECK(reader->Fetch("a-ns", client::FetchSource::FromLease(lease->id)).ok());
  // Fetch's role suffices for device handles: not denied, only refused
  // because this daemon has no device tier.
  CHECK(reader->GetDeviceHandles("a-ns", lease->id).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(reader->Release(lease->id).ok());
  CHECK(reader->DescribeNamespace("a-ns").ok());
  CHECK(reader->DumpTree("a-ns").ok());
  CHECK(reader->GetCalibration("a-ns").ok());
  CHECK(writer->Demote("a-ns", client::Tier::kHostCompressed).ok());
  CHECK(writer->EvictAll("a-ns").ok());

  // Paths on the daemon's machine are not a tenant's to choose.
  client::NamespaceSpec with_dir = ClientSpec("a-dir");
  with_dir.host_compressed_bytes = 8 * kPageBytes;
  with_dir.disk_dir = "/tmp/kvharbor-tenant-escape";
  const absl::Status dir_status = admin->CreateNamespace(with_dir).status();
  CHECK(dir_status.code() == absl::StatusCode::kPermissionDenied);
  CHECK_THAT(std::string(dir_status.message()),
             Catch::StartsWith("spec.disk_dir: "));

  // The admin's namespace belongs to its tenant: B does not see it.
  REQUIRE(admin->CreateNamespace(ClientSpec("a-new")).ok());
  CHECK(t.As(kBWrite)->DescribeNamespace("a-new").status().code() ==
        absl::StatusCode::kNotFound);
  CHECK(admin->DeleteNamespace("a-new").ok());
}

TEST_CASE("Calls without a valid token are UNAUTHENTICATED; health is open",
          "[server][security]") {
  TenantDaemon t;
  for (const char* token : {"", "not-a-known-token-123456"}) {
    INFO("token '" << token << "'");
    const absl::Status s = t.As(token)->ListNamespaces().status();
    CHECK(s.code() == absl::StatusCode::kUnauthenticated);
    CHECK(absl::StrContains(s.message(), "authorization"));
  }
  // Kubernetes probes send no token.
  auto channel = grpc::CreateChannel(t.daemon->address(),
                                     grpc::InsecureChannelCredentials());
  auto health = grpc::health::v1::Health::NewStub(channel);
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  grpc::ClientContext ctx;
  REQUIRE(health->Check(&ctx, req, &resp).ok());
  CHECK(resp.status() == grpc::health::v1::HealthCheckResponse::SERVING);
  // A wrong token is refused on every service (the metadata processor).
  grpc::ClientContext bad;
  bad.AddMetadata("authorization", "Bearer wrong-token-0000000000");
  CHECK(health->Check(&bad, req, &resp).error_code() ==
        grpc::StatusCode::UNAUTHENTICATED);
}

TEST_CASE("The tokens file reloads without a restart; a bad one is refused",
          "[server][security]") {
  TenantDaemon t;
  std::unique_ptr<Client> old_reader = t.As(kARead);
  std::unique_ptr<Client> newcomer = t.As(kCRead);
  REQUIRE(old_reader->ListNamespaces().ok());
  REQUIRE(newcomer->ListNamespaces().status().code() ==
          absl::StatusCode::kUnauthenticated);

  SECTION("explicit reload (SIGHUP in kvharbord)") {
    t.dir.Write("tokens.yaml", TokensYaml({{kAWrite, "tenant-a", "write"},
                                           {kCRead, "tenant-c", "read"}}));
    REQUIRE(t.daemon->ReloadTokens().ok());
  }
  SECTION("the daemon notices the file changed") {
    // Written elsewhere and renamed over, as a Kubernetes Secret update does.
    const std::string fresh =
        t.dir.Write("tokens.new", TokensYaml({{kAWrite, "tenant-a", "write"},
                                              {kCRead, "tenant-c", "read"}}));
    REQUIRE(std::rename(fresh.c_str(), t.tokens_path.c_str()) == 0);
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (!newcomer->ListNamespaces().ok() && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  CHECK(old_reader->ListNamespaces().status().code() ==
        absl::StatusCode::kUnauthenticated);
  absl::StatusOr<std::vector<client::NamespaceInfo>> c_list =
      newcomer->ListNamespaces();
  REQUIRE(c_list.ok());
  CHECK(c_list->empty());  // tenant-c owns nothing

  // A broken file keeps the tokens in force and says what is wrong.
  t.dir.Write("tokens.yaml", "tokens:\n  - token: " + std::string(kCRead) +
                                 "\n    tenant: tenant-c\n    role: boss\n");
  const absl::Status bad = t.daemon->ReloadTokens();
  CHECK(bad.code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(bad.message(), "tokens[0].role: unknown value"));
  CHECK(newcomer->ListNamespaces().ok());
}

TEST_CASE("Tokens never reach the log", "[server][security]") {
  std::string log;
  {
    LogCapture capture(spdlog::level::trace);
    {
      TenantDaemon t;
      spdlog::set_level(spdlog::level::trace);  // TenantDaemon lowered it
      std::unique_ptr<Client> a = t.As(kAAdmin);
      CHECK(a->CreateNamespace(ClientSpec("a-logged")).ok());
      CHECK(a->Insert("a-ns", Prompt(kPageSize, 1), PageData(1, 3), kPageBytes)
                .ok());
      CHECK_FALSE(t.As(kARead)->EvictAll("a-ns").ok());
      CHECK_FALSE(t.As("unknown-token-abcdef-123456")->ListNamespaces().ok());
      CHECK(t.daemon->ReloadTokens().ok());
      t.dir.Write("tokens.yaml",
                  "tokens:\n  - token: " + std::string(kARead) +
                      "\n    tenant: tenant a\n    role: read\n");
      CHECK_FALSE(t.daemon->ReloadTokens().ok());
    }
    log = capture.text();
  }
  INFO(log);
  CHECK(absl::StrContains(log, "reload"));  // the capture did capture
  for (const char* token :
       {kARead, kAWrite, kAAdmin, kBWrite, "unknown-token-abcdef-123456"}) {
    CHECK_FALSE(absl::StrContains(log, token));
  }
}

}  // namespace
}  // namespace testing
}  // namespace kvharbor
