// TLS and mutual TLS on the gRPC port (certificates made by openssl at test
// time), the security config keys and their validation, the tokens file's
// validation, and the warning for an exposed plaintext port.
#include <catch2/catch.hpp>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "kvharbor/client.h"
#include "server/daemon/config.h"
#include "server/daemon/daemon.h"
#include "server/security/auth.h"
#include "server/security/security.h"
#include "spdlog/spdlog.h"
#include "tests/server/log_capture.h"
#include "tests/server/server_test_util.h"
#include "tests/temp_dir.h"
#include "tests/tls_test_util.h"

namespace kvharbor {
namespace testing {
namespace {

std::unique_ptr<Daemon> StartDaemon(const SecurityOptions& security) {
  DaemonOptions o = TestOptions();
  o.security = security;
  absl::StatusOr<std::unique_ptr<Daemon>> d = Daemon::Start(o);
  INFO(d.status().ToString());
  REQUIRE(d.ok());
  return *std::move(d);
}

// ListNamespaces through a fresh SDK client with `options` (address set).
absl::Status TryList(const Daemon& daemon, ClientOptions options) {
  options.address = daemon.address();
  options.default_timeout = absl::Seconds(5);
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Create(options);
  if (!c.ok()) return c.status();
  return (*c)->ListNamespaces().status();
}

ClientOptions Tls(const TestPki& pki) {
  ClientOptions o;
  o.tls_ca_file = pki.ca();
  return o;
}

// TLS with the PKI's server certificate.
SecurityOptions ServerTls(const TestPki& pki) {
  SecurityOptions s;
  s.tls_cert_file = pki.server_cert();
  s.tls_key_file = pki.server_key();
  return s;
}

TEST_CASE("TLS: a client trusting the CA gets in; plaintext and others don't",
          "[server][security][tls]") {
  TestPki pki;
  std::unique_ptr<Daemon> d = StartDaemon(ServerTls(pki));

  CHECK(TryList(*d, Tls(pki)).ok());
  ClientOptions by_name = Tls(pki);
  by_name.tls_server_name = "kvharbor.test";  // the certificate's DNS SAN
  CHECK(TryList(*d, by_name).ok());

  CHECK(TryList(*d, ClientOptions()).code() == absl::StatusCode::kUnavailable);
  ClientOptions wrong_ca;
  wrong_ca.tls_ca_file = pki.other_ca();
  CHECK(TryList(*d, wrong_ca).code() == absl::StatusCode::kUnavailable);
  ClientOptions wrong_name = Tls(pki);
  wrong_name.tls_server_name = "elsewhere.test";
  CHECK(TryList(*d, wrong_name).code() == absl::StatusCode::kUnavailable);
}

TEST_CASE("Mutual TLS refuses clients without a certificate the CA signed",
          "[server][security][tls]") {
  TestPki pki;
  SecurityOptions s = ServerTls(pki);
  s.tls_client_ca_file = pki.ca();
  s.tls_require_client_cert = true;
  std::unique_ptr<Daemon> d = StartDaemon(s);

  ClientOptions good = Tls(pki);
  good.tls_cert_file = pki.client_cert();
  good.tls_key_file = pki.client_key();
  CHECK(TryList(*d, good).ok());

  CHECK(TryList(*d, Tls(pki)).code() == absl::StatusCode::kUnavailable);
  ClientOptions rogue = Tls(pki);
  rogue.tls_cert_file = pki.rogue_cert();
  rogue.tls_key_file = pki.rogue_key();
  CHECK(TryList(*d, rogue).code() == absl::StatusCode::kUnavailable);
  CHECK(TryList(*d, ClientOptions()).code() == absl::StatusCode::kUnavailable);
}

TEST_CASE("TLS and bearer tokens together", "[server][security][tls]") {
  TestPki pki;
  SecurityOptions s = ServerTls(pki);
  s.tokens_file = pki.dir().Write(
      "tokens.yaml",
      "tokens:\n  - token: tls-token-0123456789\n    tenant: t\n    role: "
      "read\n");
  DaemonOptions o = TestOptions();
  o.namespaces[0].tenant = "t";
  o.security = s;
  o.listen = "0.0.0.0:0";  // allowed: the tokens travel inside TLS
  absl::StatusOr<std::unique_ptr<Daemon>> d = Daemon::Start(o);
  INFO(d.status().ToString());
  REQUIRE(d.ok());
  ClientOptions c = Tls(pki);
  CHECK(TryList(**d, c).code() == absl::StatusCode::kUnauthenticated);
  c.token = "tls-token-0123456789";
  CHECK(TryList(**d, c).ok());
}

// The error of Daemon::Start with `security` (and `listen`).
std::string StartError(const SecurityOptions& security,
                       const std::string& listen = "127.0.0.1:0") {
  DaemonOptions o = TestOptions();
  o.listen = listen;
  o.security = security;
  absl::StatusOr<std::unique_ptr<Daemon>> d = Daemon::Start(o);
  REQUIRE_FALSE(d.ok());
  CHECK(d.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(d.status().message());
}

TEST_CASE("Bad TLS settings are refused naming the field",
          "[server][security][tls]") {
  TestPki pki;
  SecurityOptions s;
  s.tls_cert_file = pki.server_cert();
  s.tls_key_file = pki.client_key();  // another key
  CHECK_THAT(StartError(s),
             Catch::Contains("security.tls.key_file:") &&
                 Catch::Contains("is not the key of security.tls.cert_file"));
  s.tls_key_file = pki.dir().path + "/missing.key";
  CHECK_THAT(StartError(s), Catch::Contains("security.tls.key_file: cannot "
                                            "read"));
  s.tls_key_file = "";
  CHECK_THAT(StartError(s), Catch::Contains("security.tls.key_file: required"));
  s.tls_key_file = pki.server_key();
  s.tls_cert_file = pki.dir().Write("junk.crt", "not a certificate\n");
  CHECK_THAT(StartError(s), Catch::Contains("security.tls.cert_file:") &&
                                Catch::Contains("holds no PEM certificate"));
  s.tls_cert_file = "/dev/zero";  // would never end
  CHECK_THAT(StartError(s),
             Catch::Contains("security.tls.cert_file: '/dev/zero' is not a "
                             "regular file"));
  s.tls_cert_file = pki.server_cert();
  s.tls_require_client_cert = true;
  CHECK_THAT(StartError(s),
             Catch::Contains("security.tls.require_client_cert: needs "
                             "security.tls.client_ca_file"));
  s.tls_client_ca_file = pki.server_key();  // a key, not a certificate
  CHECK_THAT(StartError(s), Catch::Contains("security.tls.client_ca_file:"));

  SecurityOptions no_tls;
  no_tls.tls_client_ca_file = pki.ca();
  CHECK_THAT(StartError(no_tls),
             Catch::Contains("security.tls.client_ca_file: set without "
                             "security.tls.cert_file"));
}

TEST_CASE("Tokens without TLS only on loopback; namespaces need a tenant",
          "[server][security]") {
  TempDir dir;
  SecurityOptions s;
  s.tokens_file = dir.Write(
      "tokens.yaml",
      "tokens:\n  - token: plain-token-0123456789\n    tenant: t\n    role: "
      "admin\n");
  CHECK_THAT(StartError(s, "0.0.0.0:0"),
             Catch::Contains("security.tokens_file: bearer tokens need TLS"));
  // TestOptions' namespace has no tenant: no token could reach it.
  CHECK_THAT(StartError(s), Catch::Contains("namespaces[0].tenant: required"));
}

TEST_CASE("Tokens file errors name the entry and never show the token",
          "[server][security]") {
  struct Case {
    const char* text;
    const char* error;
  };
  const Case cases[] = {
      {"tokens:\n  - token: short\n    tenant: t\n    role: read\n",
       "tokens[0].token: must have at least 16"},
      {"tokens:\n  - token: abcdefghijklmnopq\n    tenant: t\n    role: root\n",
       "tokens[0].role: unknown value 'root'"},
      {"tokens:\n  - token: abcdefghijklmnopq\n    role: read\n",
       "tokens[0].tenant: required"},
      {"tokens:\n  - token: abcdefghijklmnopq\n    tenant: 'a b'\n    role: "
       "read\n",
       "tokens[0].tenant:"},
      {"tokens:\n  - token: abcdefghijklmnopq\n    tenant: t\n    role: "
       "read\n  - token: abcdefghijklmnopq\n    tenant: u\n    role: read\n",
       "tokens[1]: the same token as tokens[0]"},
      {"tokens:\n  - tenant: t\n    role: read\n",
       "tokens[0]: give exactly one of token and sha256"},
      {"tokens:\n  - sha256: 12ab\n    tenant: t\n    role: read\n",
       "tokens[0].sha256: must be 64 hex digits"},
      {"tokens:\n  - token: abcdefghijklmnopq\n    tenant: t\n    role: "
       "read\n    expires: never\n",
       "tokens[0].expires: unknown key"},
      {"users: []\n", "tokens: required"},
      {"tokens: [\n", "(file): not YAML"},
  };
  for (const Case& c : cases) {
    INFO(c.text);
    absl::StatusOr<std::vector<TokenEntry>> parsed =
        ParseTokensFile(c.text, "tokens.yaml");
    REQUIRE_FALSE(parsed.ok());
    CHECK_THAT(std::string(parsed.status().message()),
               Catch::StartsWith("tokens.yaml: ") && Catch::Contains(c.error));
    CHECK_FALSE(
        absl::StrContains(parsed.status().message(), "abcdefghijklmnopq"));
  }
}

TEST_CASE("A sha256 entry authenticates its token; roles and tenants map",
          "[server][security]") {
  TempDir dir;
  // sha256("hashed-token-0123456789")
  const std::string path = dir.Write(
      "tokens.yaml",
      "tokens:\n"
      "  - sha256: "
      "b22fd458dbe2426bebe59cfafe4c46e013df3efd439e4d91cda767ac3052ddd0\n"
      "    tenant: hashed\n    role: write\n"
      "  - token: plain-token-0123456789\n    tenant: plain\n    role: "
      "admin\n");
  absl::StatusOr<std::unique_ptr<TokenStore>> store =
      TokenStore::Load(path, "security.tokens_file");
  REQUIRE(store.ok());
  CHECK((*store)->size() == 2);
  CHECK_THAT(std::string(TokenStore::Load("/dev/zero", "security.tokens_file")
                             .status()
                             .message()),
             Catch::Contains("security.tokens_file: '/dev/zero' is not a "
                             "regular file"));
  absl::StatusOr<Caller> plain =
      (*store)->Authenticate("Bearer plain-token-0123456789");
  REQUIRE(plain.ok());
  CHECK(plain->tenant == "plain");
  CHECK(plain->role == Role::kAdmin);
  CHECK_FALSE(plain->unrestricted);
  absl::StatusOr<Caller> hashed =
      (*store)->Authenticate("Bearer hashed-token-0123456789");
  REQUIRE(hashed.ok());
  CHECK(hashed->tenant == "hashed");
  CHECK(hashed->role == Role::kWrite);
  CHECK((*store)->Authenticate("plain-token-0123456789").status().code() ==
        absl::StatusCode::kUnauthenticated);  // no "Bearer "
  CHECK(
      (*store)->Authenticate("Bearer plain-token-012345678").status().code() ==
      absl::StatusCode::kUnauthenticated);  // a prefix of a token
}

TEST_CASE("The security section of the config file", "[server][security]") {
  TestPki pki;
  const std::string tokens = pki.dir().Write(
      "tokens.yaml",
      "tokens:\n  - token: cfg-token-0123456789\n    tenant: t1\n    role: "
      "read\n");
  const std::string config = pki.dir().Write(
      "kvharbord.yaml",
      absl::StrCat("listen: 0.0.0.0:0\n"
                   "security:\n"
                   "  tokens_file: ",
                   tokens,
                   "\n  tls:\n"
                   "    cert_file: ",
                   pki.server_cert(), "\n    key_file: ", pki.server_key(),
                   "\n    client_ca_file: ", pki.ca(),
                   "\n    require_client_cert: true\n"
                   "namespaces:\n"
                   "  - name: n1\n"
                   "    tenant: t1\n"
                   "    geometry: {num_layers: 1, num_kv_heads: 1, head_dim: "
                   "8, page_size: 4, dtype: fp16}\n"));
  DaemonOptions o;
  absl::Status s = LoadConfigFile(config, &o);
  INFO(s.ToString());
  REQUIRE(s.ok());
  CHECK(o.security.tokens_file == tokens);
  CHECK(o.security.tls_cert_file == pki.server_cert());
  CHECK(o.security.tls_key_file == pki.server_key());
  CHECK(o.security.tls_client_ca_file == pki.ca());
  CHECK(o.security.tls_require_client_cert);
  REQUIRE(o.namespaces.size() == 1);
  CHECK(o.namespaces[0].tenant == "t1");

  const std::string bad = pki.dir().Write(
      "bad.yaml", "security:\n  tls:\n    require_client_cert: maybe\n");
  s = LoadConfigFile(bad, &o);
  CHECK_THAT(std::string(s.message()),
             Catch::Contains("config: security.tls.require_client_cert: "
                             "'maybe' is not true or false"));
  const std::string unknown =
      pki.dir().Write("unknown.yaml", "security:\n  tls_cert: x\n");
  s = LoadConfigFile(unknown, &o);
  CHECK_THAT(std::string(s.message()),
             Catch::Contains("config: security.tls_cert: unknown key"));
}

TEST_CASE("An exposed plaintext port gets a loud warning; loopback does not",
          "[server][security]") {
  std::string log;
  {
    LogCapture capture(spdlog::level::warn);
    CHECK_FALSE(WarnIfExposed(SecurityOptions(), "127.0.0.1"));
    CHECK(capture.text().empty());
    {
      DaemonOptions o = TestOptions();
      o.listen = "0.0.0.0:0";
      absl::StatusOr<std::unique_ptr<Daemon>> d = Daemon::Start(o);
      REQUIRE(d.ok());
    }
    log = capture.text();
  }
  CHECK_THAT(log, Catch::Contains("WITHOUT TLS AND WITHOUT AUTH") &&
                      Catch::Contains("docs/operations.md"));
  SecurityOptions tls;
  tls.tls_cert_file = "x";
  CHECK_FALSE(WarnIfExposed(tls, "0.0.0.0"));
}

}  // namespace
}  // namespace testing
}  // namespace kvharbor
