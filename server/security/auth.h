// Bearer-token authentication for kvharbord: the tokens file, its reloads,
// and the gRPC AuthMetadataProcessor that checks tokens on secure ports.
//
// The tokens file (YAML, docs/operations.md "Security") maps each token to a
// tenant and a role (read < write < admin). TokenStore keeps only SHA-256
// digests of the tokens, compares a presented token against every entry in
// constant time (CRYPTO_memcmp, no early exit) and never logs or returns a
// token: errors name the entry (tokens[3].token), not its value. Reload()
// swaps in a new table atomically; a file that does not load keeps the old
// table and returns the error.
//
// Why the service authorizes every call itself rather than trusting
// properties the processor might add: gRPC hands the processor the
// connection's AuthContext, shared by every call on that connection, so a
// per-call identity stored there would leak into the next call made with
// another token. The processor therefore only rejects bad tokens early (on
// every service of the port), and KvHarborService resolves the caller from
// the call's own metadata through the same TokenStore.
//
// Thread-safe: the table is immutable and shared; mu_ guards the pointer to
// it and the file's last-seen stamp.
#ifndef KVHARBOR_SERVER_SECURITY_AUTH_H_
#define KVHARBOR_SERVER_SECURITY_AUTH_H_

#include <grpcpp/security/auth_metadata_processor.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace kvharbor {

// Ordered: each role may do everything the ones before it may.
enum class Role : int { kRead = 1, kWrite = 2, kAdmin = 3 };
absl::string_view RoleName(Role role);

// Who makes a call. Without authentication every caller is unrestricted
// (all namespaces, admin role), which keeps a plain local daemon easy.
struct Caller {
  std::string tenant;
  Role role = Role::kAdmin;
  bool unrestricted = true;
  // The daemon's own admin (a tokens-file entry with daemon_admin: true, or
  // any caller without tokens): sees the store-wide totals of every tenant
  // (Stats' global) and may scrape a token-protected /metrics. It still
  // sees only its own tenant's namespaces.
  bool daemon_admin = true;

  static Caller Unrestricted() { return Caller(); }
  // Whether the caller may see a namespace owned by `owner`.
  bool Sees(absl::string_view owner) const {
    return unrestricted || owner == tenant;
  }
};

// The "authorization" metadata key and the scheme it must carry.
inline constexpr char kAuthorizationKey[] = "authorization";
inline constexpr char kBearerPrefix[] = "Bearer ";
// Shortest token accepted in a tokens file: shorter ones are guessable.
inline constexpr size_t kMinTokenLength = 16;

struct TokenEntry {
  std::array<uint8_t, 32> sha256;  // digest of the token
  std::string tenant;
  Role role;
  bool daemon_admin = false;  // Caller::daemon_admin; needs role admin
};

// Parses a tokens file's text; errors read "<source>: tokens[2].role: ...".
absl::StatusOr<std::vector<TokenEntry>> ParseTokensFile(
    const std::string& text, absl::string_view source);

class TokenStore {
 public:
  // Loads `path`; errors start with `field` (e.g. "config:
  // security.tokens_file") and name the entry at fault.
  static absl::StatusOr<std::unique_ptr<TokenStore>> Load(
      const std::string& path, absl::string_view field);

  // Reads the file again. On error the current tokens stay in force.
  absl::Status Reload();
  // Reload() when the file's mtime, size or inode changed since the last
  // load (a Kubernetes Secret update swaps a symlink: new inode). Returns
  // whether a reload was attempted, and its outcome in `*status`.
  bool ReloadIfChanged(absl::Status* status);

  // Resolves an "authorization" metadata value ("Bearer <token>").
  // UNAUTHENTICATED when it is malformed or matches no token.
  absl::StatusOr<Caller> Authenticate(absl::string_view authorization) const;

  size_t size() const;
  const std::string& path() const { return path_; }

 private:
  struct Stamp {
    int64_t mtime_ns = 0;
    int64_t size = -1;
    uint64_t inode = 0;
    bool regular = false;
    bool operator==(const Stamp& o) const {
      return mtime_ns == o.mtime_ns && size == o.size && inode == o.inode;
    }
  };
  TokenStore(std::string path, std::string field)
      : path_(std::move(path)), field_(std::move(field)) {}
  static bool StatFile(const std::string& path, Stamp* stamp);
  // Reads and parses the file, and its stamp from before the read.
  absl::StatusOr<std::vector<TokenEntry>> Read(Stamp* stamp) const;

  const std::string path_;
  const std::string field_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const std::vector<TokenEntry>> table_ ABSL_GUARDED_BY(mu_);
  Stamp stamp_ ABSL_GUARDED_BY(mu_);
};

// Rejects calls whose "authorization" metadata is present but invalid
// (UNAUTHENTICATED). Calls without one pass: the health and reflection
// services need no token, and KvHarborService refuses them itself.
class BearerTokenProcessor final : public grpc::AuthMetadataProcessor {
 public:
  explicit BearerTokenProcessor(std::shared_ptr<const TokenStore> tokens)
      : tokens_(std::move(tokens)) {}
  bool IsBlocking() const override { return false; }  // no I/O: a lookup
  grpc::Status Process(const InputMetadata& auth_metadata,
                       grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* response_metadata) override;

 private:
  const std::shared_ptr<const TokenStore> tokens_;
};

}  // namespace kvharbor

#endif  // KVHARBOR_SERVER_SECURITY_AUTH_H_
