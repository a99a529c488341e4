// Transport security of kvharbord's gRPC port: the `security:` options
// (TLS, mutual TLS, bearer tokens), their validation, and the
// grpc::ServerCredentials built from them.
//
// Which credentials the port gets (docs/operations.md "Security"):
//   TLS configured           -> grpc::SslServerCredentials (+ token processor)
//   tokens, no TLS, loopback -> LocalServerCredentials(LOCAL_TCP) + processor:
//                               gRPC runs an AuthMetadataProcessor only on
//                               secure credentials (InsecureServerCredentials
//                               aborts in SetAuthMetadataProcessor), and
//                               LOCAL_TCP is a secure type that accepts
//                               plaintext connections from loopback peers only
//   tokens, no TLS, elsewhere-> refused: tokens would cross the network in
//                               clear text
//   nothing                  -> InsecureServerCredentials (the easy local
//                               default; a loud warning off loopback)
//
// Value types and stateless functions; thread-safe.
#ifndef KVHARBOR_SERVER_SECURITY_SECURITY_H_
#define KVHARBOR_SERVER_SECURITY_SECURITY_H_

#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/store/store.h"

namespace kvharbor {

class TokenStore;

struct SecurityOptions {
  // PEM files; TLS is on when cert_file is set (key_file is then required).
  std::string tls_cert_file;
  std::string tls_key_file;
  // CA bundle that signs client certificates; with require_client_cert,
  // clients without a certificate it verifies are refused (mutual TLS).
  std::string tls_client_ca_file;
  bool tls_require_client_cert = false;
  // YAML tokens file (server/security/auth.h); "" = no authentication.
  std::string tokens_file;

  bool tls() const { return !tls_cert_file.empty(); }
  bool auth() const { return !tokens_file.empty(); }
};

// "127.0.0.1", "127.x.y.z", "localhost", "[::1]", "::1".
bool IsLoopbackHost(absl::string_view host);

// Checks the files (readable PEM, key matches certificate, tokens file
// parses), the combinations, and that config namespaces carry a tenant when
// tokens are on. Messages read "<prefix>: security.tls.key_file: ...".
absl::Status ValidateSecurityOptions(const SecurityOptions& security,
                                     absl::string_view listen_host,
                                     const std::vector<NamespaceSpec>& specs,
                                     absl::string_view prefix);

// The port's credentials (table above); `tokens` is null without auth.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> BuildServerCredentials(
    const SecurityOptions& security, absl::string_view listen_host,
    std::shared_ptr<const TokenStore> tokens);

// Logs a several-line warning when the port is reachable off this machine
// with neither TLS nor tokens. Returns whether it warned.
bool WarnIfExposed(const SecurityOptions& security,
                   absl::string_view listen_host);

}  // namespace kvharbor

#endif  // KVHARBOR_SERVER_SECURITY_SECURITY_H_
