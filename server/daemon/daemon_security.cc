// The Daemon's security members (declared in daemon.h): credentials at
// start, tokens file reloads. Kept apart from daemon.cc so that the
// security setup reads as one piece.
#include <grpcpp/security/server_credentials.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "server/daemon/daemon.h"
#include "server/security/auth.h"
#include "server/security/security.h"
#include "spdlog/spdlog.h"

namespace kvharbor {

namespace {

// HOST of a validated "HOST:PORT".
absl::string_view ListenHost(absl::string_view listen) {
  return listen.substr(0, listen.rfind(':'));
}

// Never logs a token: the store's messages name entries, not values.
void LogReload(const TokenStore& tokens, const absl::Status& s,
               absl::string_view what) {
  if (s.ok()) {
    spdlog::info("security: {} {}: {} bearer token(s) in force", tokens.path(),
                 std::string(what), tokens.size());
  } else {
    spdlog::error(
        "security: tokens file reload failed, the {} token(s) loaded before "
        "stay in force: {}",
        tokens.size(), std::string(s.message()));
  }
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>>
Daemon::SetUpSecurity() {
  const SecurityOptions& s = options_.security;
  const absl::string_view host = ListenHost(options_.listen);
  if (s.auth()) {
    KVH_ASSIGN_OR_RETURN(
        tokens_, TokenStore::Load(s.tokens_file, "security.tokens_file"));
  }
  KVH_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> creds,
                       BuildServerCredentials(s, host, tokens_));
  spdlog::info("security: TLS {}, bearer tokens {}",
               !s.tls() ? std::string("off")
                        : absl::StrCat("on (client certificates ",
                                       s.tls_require_client_cert ? "required"
                                       : s.tls_client_ca_file.empty()
                                           ? "not requested"
                                           : "verified when sent",
                                       ")"),
               tokens_ == nullptr ? std::string("off")
                                  : absl::StrCat("on (", tokens_->size(),
                                                 " from ", s.tokens_file, ")"));
  WarnIfExposed(s, host);
  return creds;
}

absl::Status Daemon::ReloadTokens() {
  if (tokens_ == nullptr) return absl::OkStatus();
  absl::Status s = tokens_->Reload();
  LogReload(*tokens_, s, "reloaded");
  return s;
}

void Daemon::PollTokensFile() {
  absl::Status s;
  if (tokens_ != nullptr && tokens_->ReloadIfChanged(&s)) {
    LogReload(*tokens_, s, "changed on disk; reloaded");
  }
}

}  // namespace kvharbor
