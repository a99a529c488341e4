#include "server/security/security.h"

#include <grpc/grpc_security_constants.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "server/security/auth.h"
#include "spdlog/spdlog.h"

namespace kvharbor {

namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};

absl::Status Invalid(absl::string_view prefix, absl::string_view field,
                     absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(prefix, ": ", field, ": ", what));
}

// Certificates and keys are a few KiB; a bigger file, a FIFO or a device
// (/dev/zero) is a mistake that must not hang or exhaust the daemon.
constexpr off_t kMaxPemBytes = 1 << 20;

absl::StatusOr<std::string> ReadPem(const std::string& path,
                                    absl::string_view prefix,
                                    absl::string_view field) {
  struct stat st;
  if (stat(path.c_str(), &st) == 0 &&
      (!S_ISREG(st.st_mode) || st.st_size > kMaxPemBytes)) {
    return Invalid(
        prefix, field,
        absl::StrCat("'", path, "' is not a regular file of at most ",
                     kMaxPemBytes, " bytes"));
  }
  std::ifstream in(path);
  if (!in) {
    return Invalid(
        prefix, field,
        absl::StrCat("cannot read '", path, "': ", std::strerror(errno)));
  }
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::unique_ptr<BIO, BioFree> MemBio(const std::string& pem) {
  return std::unique_ptr<BIO, BioFree>(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// Never prompts on the terminal for the passphrase of an encrypted key.
int NoPassphrase(char*, int, int, void*) { return -1; }

absl::StatusOr<std::unique_ptr<X509, X509Free>> ParseCert(
    const std::string& path, absl::string_view prefix,
    absl::string_view field) {
  KVH_ASSIGN_OR_RETURN(std::string pem, ReadPem(path, prefix, field));
  auto bio = MemBio(pem);
  std::unique_ptr<X509, X509Free> cert(
      PEM_read_bio_X509(bio.get(), nullptr, NoPassphrase, nullptr));
  ERR_clear_error();
  if (cert == nullptr) {
    return Invalid(prefix, field,
                   absl::StrCat("'", path, "' holds no PEM certificate"));
  }
  return cert;
}

// The TLS files: each readable PEM, the key that of the certificate.
absl::Status ValidateTls(const SecurityOptions& s, absl::string_view prefix) {
  if (!s.tls()) {
    for (const auto& [value, field] :
         {std::pair<const std::string&, const char*>{s.tls_key_file,
                                                     "security.tls.key_file"},
          {s.tls_client_ca_file, "security.tls.client_ca_file"}}) {
      if (!value.empty()) {
        return Invalid(prefix, field,
                       "set without security.tls.cert_file (TLS is off)");
      }
    }
    if (s.tls_require_client_cert) {
      return Invalid(prefix, "security.tls.require_client_cert",
                     "true without security.tls.cert_file (TLS is off)");
    }
    return absl::OkStatus();
  }
  if (s.tls_key_file.empty()) {
    return Invalid(prefix, "security.tls.key_file",
                   "required with security.tls.cert_file");
  }
  KVH_ASSIGN_OR_RETURN(
      auto cert, ParseCert(s.tls_cert_file, prefix, "security.tls.cert_file"));
  KVH_ASSIGN_OR_RETURN(std::string key_pem, ReadPem(s.tls_key_file, prefix,
                                                    "security.tls.key_file"));
  auto bio = MemBio(key_pem);
  std::unique_ptr<EVP_PKEY, PkeyFree> key(
      PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassphrase, nullptr));
  ERR_clear_error();
  if (key == nullptr) {
    return Invalid(prefix, "security.tls.key_file",
                   absl::StrCat("'", s.tls_key_file,
                                "' holds no unencrypted PEM private key"));
  }
  const int match = X509_check_private_key(cert.get(), key.get());
  ERR_clear_error();
  if (match != 1) {
    return Invalid(prefix, "security.tls.key_file",
                   absl::StrCat("'", s.tls_key_file,
                                "' is not the key of security.tls.cert_file '",
                                s.tls_cert_file, "'"));
  }
  if (s.tls_require_client_cert && s.tls_client_ca_file.empty()) {
    return Invalid(prefix, "security.tls.require_client_cert",
                   "needs security.tls.client_ca_file (the CA that signs "
                   "client certificates)");
  }
  if (!s.tls_client_ca_file.empty()) {
    KVH_RETURN_IF_ERROR(
        ParseCert(s.tls_client_ca_file, prefix, "security.tls.client_ca_file")
            .status());
  }
  return absl::OkStatus();
}

}  // namespace

bool IsLoopbackHost(absl::string_view host) {
  return host == "localhost" || host == "[::1]" || host == "::1" ||
         absl::StartsWith(host, "127.");
}

absl::Status ValidateSecurityOptions(const SecurityOptions& s,
                                     absl::string_view listen_host,
                                     const std::vector<NamespaceSpec>& specs,
                                     absl::string_view prefix) {
  KVH_RETURN_IF_ERROR(ValidateTls(s, prefix));
  if (!s.auth()) return absl::OkStatus();
  if (!s.tls() && !IsLoopbackHost(listen_host)) {
    return Invalid(
        prefix, "security.tokens_file",
        absl::StrCat("bearer tokens need TLS (security.tls.cert_file) when "
                     "listen is not a loopback address ('",
                     listen_host,
                     "'): they would cross the network in clear "
                     "text"));
  }
  KVH_RETURN_IF_ERROR(
      TokenStore::Load(s.tokens_file,
                       absl::StrCat(prefix, ": security.tokens_file"))
          .status());
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].tenant.empty()) {
      return Invalid(prefix, absl::StrCat("namespaces[", i, "].tenant"),
                     "required when security.tokens_file is set (no token "
                     "could reach a namespace without a tenant)");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> BuildServerCredentials(
    const SecurityOptions& s, absl::string_view listen_host,
    std::shared_ptr<const TokenStore> tokens) {
  std::shared_ptr<grpc::ServerCredentials> creds;
  if (s.tls()) {
    grpc::SslServerCredentialsOptions ssl(
        s.tls_client_ca_file.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
        : s.tls_require_client_cert
            ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
            : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
    grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
    KVH_ASSIGN_OR_RETURN(pair.private_key, ReadPem(s.tls_key_file, "options",
                                                   "security.tls.key_file"));
    KVH_ASSIGN_OR_RETURN(pair.cert_chain, ReadPem(s.tls_cert_file, "options",
                                                  "security.tls.cert_file"));
    ssl.pem_key_cert_pairs.push_back(std::move(pair));
    if (!s.tls_client_ca_file.empty()) {
      KVH_ASSIGN_OR_RETURN(ssl.pem_root_certs,
                           ReadPem(s.tls_client_ca_file, "options",
                                   "security.tls.client_ca_file"));
    }
    creds = grpc::SslServerCredentials(ssl);
  } else if (tokens != nullptr) {
    if (!IsLoopbackHost(listen_host)) {
      return absl::InvalidArgumentError(
          "security.tokens_file: bearer tokens need TLS off loopback");
    }
    creds = grpc::experimental::LocalServerCredentials(LOCAL_TCP);
  } else {
    return grpc::InsecureServerCredentials();
  }
  if (tokens != nullptr) {
    creds->SetAuthMetadataProcessor(
        std::make_shared<BearerTokenProcessor>(std::move(tokens)));
  }
  return creds;
}

bool WarnIfExposed(const SecurityOptions& s, absl::string_view listen_host) {
  if (s.tls() || s.auth() || IsLoopbackHost(listen_host)) return false;
  spdlog::warn(
      "**************************************************************");
  spdlog::warn("* kvharbord listens on '{}' WITHOUT TLS AND WITHOUT AUTH.",
               std::string(listen_host));
  spdlog::warn("* Anyone who can reach this port can read, overwrite, evict");
  spdlog::warn("* and delete every namespace, and sniff all KV-cache data.");
  spdlog::warn("* Set security.tls.* and security.tokens_file (or --tls_cert,");
  spdlog::warn("* --tls_key, --tokens_file), or listen on 127.0.0.1.");
  spdlog::warn("* See docs/operations.md, section Security.");
  spdlog::warn(
      "**************************************************************");
  return true;
}

}  // namespace kvharbor
