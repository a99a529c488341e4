#include "server/security/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "core/store/store.h"
#include "yaml-cpp/yaml.h"

namespace kvharbor {

namespace {

using Digest = std::array<uint8_t, 32>;

constexpr int64_t kMaxTokensFileBytes = 1 << 20;

Digest Sha256(absl::string_view text) {
  Digest out{};
  unsigned int len = 0;
  // EVP_Digest cannot fail for SHA-256 short of memory exhaustion; a zero
  // digest then matches no entry (entries are digests of real tokens).
  if (EVP_Digest(text.data(), text.size(), out.data(), &len, EVP_sha256(),
                 nullptr) != 1 ||
      len != out.size()) {
    out.fill(0);
  }
  return out;
}

absl::Status Bad(absl::string_view source, absl::string_view field,
                 absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(source, ": ", field, ": ", what));
}

// A token must fit an HTTP/2 header value after "Bearer ": visible ASCII.
bool TokenCharsOk(absl::string_view token) {
  for (char c : token) {
    if (c <= ' ' || c > '~') return false;
  }
  return true;
}

absl::StatusOr<std::string> ScalarAt(const YAML::Node& e, const char* key,
                                     absl::string_view source,
                                     const std::string& path) {
  const YAML::Node v = e[key];
  if (!v) return Bad(source, absl::StrCat(path, ".", key), "required");
  if (!v.IsScalar()) {
    return Bad(source, absl::StrCat(path, ".", key), "must be a single value");
  }
  return v.Scalar();
}

absl::StatusOr<Digest> EntryDigest(const YAML::Node& e,
                                   absl::string_view source,
                                   const std::string& path) {
  const bool has_token = static_cast<bool>(e["token"]);
  if (has_token == static_cast<bool>(e["sha256"])) {
    return Bad(source, path,
               "give exactly one of token and sha256 (the token's SHA-256 "
               "digest in hex)");
  }
  if (has_token) {
    // The value itself never goes into a message.
    KVH_ASSIGN_OR_RETURN(std::string token, ScalarAt(e, "token", source, path));
    if (token.size() < kMinTokenLength || !TokenCharsOk(token)) {
      return Bad(source, absl::StrCat(path, ".token"),
                 absl::StrCat("must have at least ", kMinTokenLength,
                              " visible ASCII characters and no spaces"));
    }
    return Sha256(token);
  }
  KVH_ASSIGN_OR_RETURN(std::string hex, ScalarAt(e, "sha256", source, path));
  Digest d{};
  const std::string bytes = absl::HexStringToBytes(hex);
  if (hex.size() != 64 ||
      hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos ||
      bytes.size() != d.size()) {
    return Bad(source, absl::StrCat(path, ".sha256"),
               "must be 64 hex digits (sha256sum of the token)");
  }
  std::memcpy(d.data(), bytes.data(), d.size());
  return d;
}

absl::StatusOr<Role> ParseRole(absl::string_view text, absl::string_view source,
                               const std::string& field) {
  if (text == "read") return Role::kRead;
  if (text == "write") return Role::kWrite;
  if (text == "admin") return Role::kAdmin;
  return Bad(source, field,
             absl::StrCat("unknown value '", absl::CHexEscape(text),
                          "' (want read, write or admin)"));
}

absl::StatusOr<TokenEntry> ParseEntry(const YAML::Node& e,
                                      absl::string_view source,
                                      const std::string& path) {
  if (!e.IsMap()) return Bad(source, path, "must be a mapping");
  for (const auto& kv : e) {
    const std::string key = kv.first.IsScalar() ? kv.first.Scalar() : "?";
    if (key != "token" && key != "sha256" && key != "tenant" && key != "role" &&
        key != "daemon_admin") {
      return Bad(source, absl::StrCat(path, ".", key),
                 "unknown key (known: token, sha256, tenant, role, "
                 "daemon_admin)");
    }
  }
  TokenEntry entry;
  KVH_ASSIGN_OR_RETURN(entry.sha256, EntryDigest(e, source, path));
  KVH_ASSIGN_OR_RETURN(entry.tenant, ScalarAt(e, "tenant", source, path));
  // Tenants follow the namespace-name rules: they appear in logs and docs
  // next to namespace names.
  absl::Status name_ok =
      ValidateNamespaceName(entry.tenant, absl::StrCat(path, ".tenant"));
  if (!name_ok.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": ", name_ok.message()));
  }
  KVH_ASSIGN_OR_RETURN(std::string role, ScalarAt(e, "role", source, path));
  KVH_ASSIGN_OR_RETURN(entry.role,
                       ParseRole(role, source, absl::StrCat(path, ".role")));
  if (e["daemon_admin"]) {
    const std::string field = absl::StrCat(path, ".daemon_admin");
    KVH_ASSIGN_OR_RETURN(std::string v,
                         ScalarAt(e, "daemon_admin", source, path));
    if (v != "true" && v != "false") {
      return Bad(source, field, "must be true or false");
    }
    entry.daemon_admin = v == "true";
    if (entry.daemon_admin && entry.role != Role::kAdmin) {
      return Bad(source, field, "needs role admin");
    }
  }
  return entry;
}

}  // namespace

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kRead:
      return "read";
    case Role::kWrite:
      return "write";
    case Role::kAdmin:
      return "admin";
  }
  return "?";
}

absl::StatusOr<std::vector<TokenEntry>> ParseTokensFile(
    const std::string& text, absl::string_view source) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    // yaml-cpp's message holds a position, not the offending text.
    return Bad(source, "(file)", absl::StrCat("not YAML: ", e.msg));
  }
  if (!root.IsMap() || !root["tokens"]) {
    return Bad(source, "tokens", "required (a list of token entries)");
  }
  for (const auto& kv : root) {
    const std::string key = kv.first.IsScalar() ? kv.first.Scalar() : "?";
    if (key != "tokens") return Bad(source, key, "unknown key (known: tokens)");
  }
  const YAML::Node list = root["tokens"];
  if (!list.IsSequence() && !list.IsNull()) {
    return Bad(source, "tokens", "must be a list");
  }
  std::vector<TokenEntry> out;
  for (size_t i = 0; list.IsSequence() && i < list.size(); ++i) {
    const std::string path = absl::StrCat("tokens[", i, "]");
    KVH_ASSIGN_OR_RETURN(TokenEntry entry, ParseEntry(list[i], source, path));
    for (size_t j = 0; j < out.size(); ++j) {
      if (out[j].sha256 == entry.sha256) {
        return Bad(source, path,
                   absl::StrCat("the same token as tokens[", j,
                                "] (each token maps to one tenant and role)"));
      }
    }
    out.push_back(std::move(entry));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<TokenStore>> TokenStore::Load(
    const std::string& path, absl::string_view field) {
  std::unique_ptr<TokenStore> store(new TokenStore(path, std::string(field)));
  KVH_RETURN_IF_ERROR(store->Reload());
  return store;
}

bool TokenStore::StatFile(const std::string& path, Stamp* stamp) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return false;
  stamp->mtime_ns =
      int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  stamp->size = st.st_size;
  stamp->inode = st.st_ino;
  stamp->regular = S_ISREG(st.st_mode);
  return true;
}

absl::StatusOr<std::vector<TokenEntry>> TokenStore::Read(Stamp* stamp) const {
  std::ifstream in;
  const bool found = StatFile(path_, stamp);
  // Token files are small; a FIFO or a device must not hang the daemon.
  if (found && (!stamp->regular || stamp->size > kMaxTokensFileBytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        field_, ": '", path_, "' is not a regular file of at most ",
        kMaxTokensFileBytes, " bytes"));
  }
  if (!found || (in.open(path_), !in)) {
    return absl::NotFoundError(absl::StrCat(field_, ": cannot read '", path_,
                                            "': ", std::strerror(errno)));
  }
  std::stringstream text;
  text << in.rdbuf();
  return ParseTokensFile(text.str(), absl::StrCat(field_, ": '", path_, "'"));
}

absl::Status TokenStore::Reload() {
  Stamp stamp;
  absl::StatusOr<std::vector<TokenEntry>> table = Read(&stamp);
  absl::MutexLock lock(&mu_);
  // Remember the stamp even of a bad file, so that polling reports it once
  // rather than on every poll until it is fixed.
  stamp_ = stamp;
  if (!table.ok()) return table.status();
  table_ = std::make_shared<const std::vector<TokenEntry>>(*std::move(table));
  return absl::OkStatus();
}

bool TokenStore::ReloadIfChanged(absl::Status* status) {
  Stamp now;
  StatFile(path_, &now);  // a missing file reads as a change, then fails
  {
    absl::MutexLock lock(&mu_);
    if (now == stamp_) return false;
  }
  *status = Reload();
  return true;
}

absl::StatusOr<Caller> TokenStore::Authenticate(
    absl::string_view authorization) const {
  if (!absl::StartsWith(authorization, kBearerPrefix)) {
    return absl::UnauthenticatedError(
        "authorization: expected 'Bearer <token>'");
  }
  const Digest digest = Sha256(authorization.substr(strlen(kBearerPrefix)));
  std::shared_ptr<const std::vector<TokenEntry>> table;
  {
    absl::MutexLock lock(&mu_);
    table = table_;
  }
  // Every entry is compared, match or not, so the time taken does not tell
  // which entry (or how much of a digest) matched.
  const TokenEntry* found = nullptr;
  for (const TokenEntry& e : *table) {
    const bool match =
        CRYPTO_memcmp(e.sha256.data(), digest.data(), digest.size()) == 0;
    if (match) found = &e;
  }
  if (found == nullptr) {
    return absl::UnauthenticatedError(
        "authorization: unknown or revoked bearer token");
  }
  Caller caller;
  caller.tenant = found->tenant;
  caller.role = found->role;
  caller.unrestricted = false;
  caller.daemon_admin = found->daemon_admin;
  return caller;
}

size_t TokenStore::size() const {
  absl::MutexLock lock(&mu_);
  return table_->size();
}

grpc::Status BearerTokenProcessor::Process(const InputMetadata& auth_metadata,
                                           grpc::AuthContext* /*context*/,
                                           OutputMetadata* /*consumed*/,
                                           OutputMetadata* /*response*/) {
  auto it = auth_metadata.find(kAuthorizationKey);
  if (it == auth_metadata.end()) return grpc::Status::OK;
  const absl::StatusOr<Caller> caller = tokens_->Authenticate(
      absl::string_view(it->second.data(), it->second.size()));
  if (!caller.ok()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        std::string(caller.status().message()));
  }
  return grpc::Status::OK;
}

}  // namespace kvharbor
