#include "cluster/etcd_client.h"

#include <httplib.h>

#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace kvharbor {
namespace cluster {

namespace {

using Json = nlohmann::json;

struct Endpoint {
  std::string host;
  int port = 0;
};

absl::StatusOr<Endpoint> ParseEndpoint(absl::string_view text) {
  absl::string_view rest = text;
  if (absl::StartsWith(rest, "https://")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", text, "': https is not supported (etcd's plain HTTP gateway)"));
  }
  absl::ConsumePrefix(&rest, "http://");
  absl::ConsumeSuffix(&rest, "/");
  const size_t colon = rest.rfind(':');
  Endpoint e;
  if (colon == absl::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(rest.substr(colon + 1), &e.port) || e.port <= 0 ||
      e.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "' is not [http://]HOST:PORT"));
  }
  e.host = std::string(rest.substr(0, colon));
  return e;
}

std::unique_ptr<httplib::Client> MakeHttp(const Endpoint& e,
                                          absl::Duration timeout) {
  auto cli = std::make_unique<httplib::Client>(e.host, e.port);
  const auto us = absl::ToChronoMicroseconds(timeout);
  cli->set_connection_timeout(us);
  cli->set_read_timeout(us);
  cli->set_write_timeout(us);
  return cli;
}

// The gateway writes int64 fields as JSON strings; accept numbers too.
int64_t Int64Field(const Json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  int64_t v = 0;
  if (it->is_string() && absl::SimpleAtoi(it->get<std::string>(), &v)) {
    return v;
  }
  return 0;
}

std::string B64(absl::string_view s) { return absl::Base64Escape(s); }

std::string Unb64(const Json& j, const char* name) {
  auto it = j.find(name);
  std::string out;
  if (it != j.end() && it->is_string()) {
    absl::Base64Unescape(it->get<std::string>(), &out);
  }
  return out;
}

EtcdKeyValue ParseKv(const Json& j) {
  EtcdKeyValue kv;
  kv.key = Unb64(j, "key");
  kv.value = Unb64(j, "value");
  kv.lease = Int64Field(j, "lease");
  kv.mod_revision = Int64Field(j, "mod_revision");
  return kv;
}

absl::StatusOr<Json> ParseBody(absl::string_view path,
                               const std::string& body) {
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::UnavailableError(
        absl::StrCat("etcd ", path, ": answer is not a JSON object"));
  }
  return j;
}

}  // namespace

absl::Status ValidateEtcdOptions(const EtcdOptions& options,
                                 absl::string_view field) {
  if (options.endpoints.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": at least one etcd endpoint is required"));
  }
  for (const std::string& e : options.endpoints) {
    absl::StatusOr<Endpoint> parsed = ParseEndpoint(e);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": ", parsed.status().message()));
    }
  }
  if (options.request_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": request timeout must be > 0"));
  }
  return absl::OkStatus();
}

std::string PrefixRangeEnd(absl::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    unsigned char& last = reinterpret_cast<unsigned char&>(end.back());
    if (last < 0xff) {
      ++last;
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // empty prefix: every key
}

EtcdClient::EtcdClient(EtcdOptions options) : options_(std::move(options)) {}

absl::StatusOr<std::string> EtcdClient::Call(absl::string_view path,
                                             const std::string& body) {
  absl::Status last = absl::UnavailableError("etcd: no endpoint configured");
  for (const std::string& text : options_.endpoints) {
    absl::StatusOr<Endpoint> e = ParseEndpoint(text);
    if (!e.ok()) return e.status();
    auto cli = MakeHttp(*e, options_.request_timeout);
    httplib::Result r = cli->Post(std::string(path), body, "application/json");
    if (!r) {
      last = absl::UnavailableError(absl::StrCat(
          "etcd ", text, path, ": ", httplib::to_string(r.error())));
      continue;
    }
    if (r->status != 200) {
      return absl::FailedPreconditionError(absl::StrCat(
          "etcd ", text, path, ": HTTP ", r->status, ": ", r->body));
    }
    return r->body;
  }
  return last;
}

absl::StatusOr<int64_t> EtcdClient::GrantLease(absl::Duration ttl) {
  const int64_t seconds = std::max<int64_t>(1, absl::ToInt64Seconds(ttl));
  Json req = {{"TTL", std::to_string(seconds)}};
  absl::StatusOr<std::string> body = Call("/v3/lease/grant", req.dump());
  if (!body.ok()) return body.status();
  absl::StatusOr<Json> j = ParseBody("/v3/lease/grant", *body);
  if (!j.ok()) return j.status();
  const int64_t id = Int64Field(*j, "ID");
  if (id == 0) {
    return absl::UnavailableError(
        absl::StrCat("etcd /v3/lease/grant: no lease ID in ", *body));
  }
  return id;
}

absl::StatusOr<absl::Duration> EtcdClient::KeepAlive(int64_t lease) {
  Json req = {{"ID", std::to_string(lease)}};
  absl::StatusOr<std::string> body = Call("/v3/lease/keepalive", req.dump());
  if (!body.ok()) return body.status();
  // A streaming endpoint: one {"result": ...} line per renewal.
  const std::string first = body->substr(0, body->find('\n'));
  absl::StatusOr<Json> j = ParseBody("/v3/lease/keepalive", first);
  if (!j.ok()) return j.status();
  auto result = j->find("result");
  if (result == j->end() || !result->is_object()) {
    return absl::UnavailableError(
        absl::StrCat("etcd /v3/lease/keepalive: ", first));
  }
  // etcd answers TTL 0 (omitted) for a lease it no longer has.
  const int64_t ttl = Int64Field(*result, "TTL");
  if (ttl <= 0) {
    return absl::NotFoundError(absl::StrCat("etcd lease ", lease, " expired"));
  }
  return absl::Seconds(ttl);
}

absl::Status EtcdClient::RevokeLease(int64_t lease) {
  Json req = {{"ID", std::to_string(lease)}};
  return Call("/v3/lease/revoke", req.dump()).status();
}

absl::Status EtcdClient::Put(absl::string_view key, absl::string_view value,
                             int64_t lease) {
  Json req = {{"key", B64(key)}, {"value", B64(value)}};
  if (lease != 0) req["lease"] = std::to_string(lease);
  return Call("/v3/kv/put", req.dump()).status();
}

absl::Status EtcdClient::Delete(absl::string_view key) {
  Json req = {{"key", B64(key)}};
  return Call("/v3/kv/deleterange", req.dump()).status();
}

absl::StatusOr<EtcdRange> EtcdClient::RangePrefix(absl::string_view prefix) {
  Json req = {{"key", B64(prefix)}, {"range_end", B64(PrefixRangeEnd(prefix))}};
  absl::StatusOr<std::string> body = Call("/v3/kv/range", req.dump());
  if (!body.ok()) return body.status();
  absl::StatusOr<Json> j = ParseBody("/v3/kv/range", *body);
  if (!j.ok()) return j.status();
  EtcdRange range;
  auto header = j->find("header");
  if (header != j->end()) range.revision = Int64Field(*header, "revision");
  auto kvs = j->find("kvs");
  if (kvs != j->end() && kvs->is_array()) {
    for (const Json& kv : *kvs) range.kvs.push_back(ParseKv(kv));
  }
  return range;
}

// ---- EtcdWatch ----

EtcdWatch::EtcdWatch(EtcdOptions options, std::string prefix,
                     int64_t start_revision, EventsFn on_events,
                     BrokenFn on_broken)
    : options_(std::move(options)),
      prefix_(std::move(prefix)),
      start_revision_(start_revision),
      on_events_(std::move(on_events)),
      on_broken_(std::move(on_broken)) {}

std::unique_ptr<EtcdWatch> EtcdWatch::Start(EtcdOptions options,
                                            std::string prefix,
                                            int64_t start_revision,
                                            EventsFn on_events,
                                            BrokenFn on_broken) {
  std::unique_ptr<EtcdWatch> w(
      new EtcdWatch(std::move(options), std::move(prefix), start_revision,
                    std::move(on_events), std::move(on_broken)));
  w->thread_ = std::thread([p = w.get()] { p->Run(); });
  return w;
}

EtcdWatch::~EtcdWatch() { Stop(); }

void EtcdWatch::Stop() {
  stopping_ = true;
  {
    absl::MutexLock lock(&mu_);
    if (http_ != nullptr) static_cast<httplib::Client*>(http_)->stop();
  }
  if (thread_.joinable()) thread_.join();
}

bool EtcdWatch::WaitCreated(absl::Duration timeout) {
  return created_.WaitForNotificationWithTimeout(timeout);
}

bool EtcdWatch::ConsumeLines() {
  size_t nl;
  while ((nl = buffer_.find('\n')) != std::string::npos) {
    const std::string line = buffer_.substr(0, nl);
    buffer_.erase(0, nl + 1);
    if (line.find_first_not_of(" \r\t") == std::string::npos) continue;
    Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return false;
    auto result = j.find("result");
    if (result == j.end() || !result->is_object()) return false;  // error
    if (result->value("canceled", false)) return false;
    if (result->value("created", false)) created_.Notify();
    auto events = result->find("events");
    if (events == result->end() || !events->is_array()) continue;
    std::vector<EtcdEvent> batch;
    for (const Json& e : *events) {
      EtcdEvent ev;
      // PUT is the enum's zero value, which the gateway omits.
      ev.deleted = e.value("type", std::string("PUT")) == "DELETE";
      auto kv = e.find("kv");
      if (kv != e.end() && kv->is_object()) ev.kv = ParseKv(*kv);
      batch.push_back(std::move(ev));
    }
    if (!batch.empty()) on_events_(batch);
  }
  return true;
}

void EtcdWatch::Run() {
  absl::Status why = absl::UnavailableError("etcd watch: no endpoint answered");
  for (const std::string& text : options_.endpoints) {
    if (stopping_) return;
    absl::StatusOr<Endpoint> e = ParseEndpoint(text);
    if (!e.ok()) continue;
    auto cli = MakeHttp(*e, options_.request_timeout);
    // The stream stays quiet while nothing changes: no read timeout.
    cli->set_read_timeout(std::chrono::hours(24 * 365));
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      http_ = cli.get();
    }
    Json create = {{"key", B64(prefix_)},
                   {"range_end", B64(PrefixRangeEnd(prefix_))},
                   {"start_revision", std::to_string(start_revision_)}};
    httplib::Request req;
    req.method = "POST";
    req.path = "/v3/watch";
    req.body = Json{{"create_request", create}}.dump();
    req.set_header("Content-Type", "application/json");
    bool clean = true;
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      buffer_.append(data, n);
      clean = ConsumeLines();
      return clean && !stopping_;
    };
    httplib::Response res;
    httplib::Error err = httplib::Error::Success;
    cli->send(req, res, err);
    {
      absl::MutexLock lock(&mu_);
      http_ = nullptr;
    }
    if (stopping_) return;
    why = absl::UnavailableError(absl::StrCat(
        "etcd watch on ", text, " ended: ",
        clean ? httplib::to_string(err) : std::string("bad or error message")));
    // A watch that was created and then broke must resynchronise (events
    // may have been missed), so it is not silently retried elsewhere.
    if (created_.HasBeenNotified()) break;
  }
  if (!stopping_) on_broken_(why);
}

}  // namespace cluster
}  // namespace kvharbor
