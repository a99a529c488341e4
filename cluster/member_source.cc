#include "cluster/member_source.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kvharbor {
namespace cluster {

namespace {

bool SplitHostPort(absl::string_view text, std::string* host, int* port) {
  const size_t colon = text.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) return false;
  absl::string_view p = text.substr(colon + 1);
  if (p.empty() ||
      p.find_first_not_of("0123456789") != absl::string_view::npos ||
      !absl::SimpleAtoi(p, port) || *port <= 0 || *port > 65535) {
    return false;
  }
  *host = std::string(text.substr(0, colon));
  return true;
}

std::vector<Member> Sorted(std::vector<Member> members) {
  std::sort(
      members.begin(), members.end(),
      [](const Member& a, const Member& b) { return a.address < b.address; });
  members.erase(std::unique(members.begin(), members.end(),
                            [](const Member& a, const Member& b) {
                              return a.address == b.address;
                            }),
                members.end());
  return members;
}

}  // namespace

// ---- Static ----

absl::StatusOr<std::unique_ptr<StaticMemberSource>> StaticMemberSource::Create(
    std::vector<std::string> addresses, absl::string_view field) {
  if (addresses.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": at least one HOST:PORT is required"));
  }
  std::unique_ptr<StaticMemberSource> s(new StaticMemberSource());
  std::vector<Member> members;
  for (std::string& a : addresses) {
    std::string host;
    int port = 0;
    if (!SplitHostPort(a, &host, &port)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": '", a, "' is not HOST:PORT"));
    }
    members.push_back(Member{std::move(a), 0});
  }
  s->members_ = Sorted(std::move(members));
  return s;
}

std::string StaticMemberSource::Describe() const {
  std::vector<std::string> a;
  for (const Member& m : members_) a.push_back(m.address);
  return absl::StrCat("static: ", absl::StrJoin(a, ","));
}

// ---- DNS ----

DnsMemberSource::DnsMemberSource(std::string name, int port,
                                 absl::Duration refresh)
    : name_(std::move(name)), port_(port), refresh_(refresh) {}

absl::StatusOr<std::unique_ptr<DnsMemberSource>> DnsMemberSource::Create(
    const std::string& name_port, absl::Duration refresh) {
  std::string host;
  int port = 0;
  if (!SplitHostPort(name_port, &host, &port)) {
    return absl::InvalidArgumentError(
        absl::StrCat("dns: '", name_port, "' is not NAME:PORT"));
  }
  if (refresh <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("dns: refresh interval must be > 0");
  }
  std::unique_ptr<DnsMemberSource> s(
      new DnsMemberSource(std::move(host), port, refresh));
  absl::Status st = s->Resolve();
  if (!st.ok()) return st;
  s->thread_ = std::thread([p = s.get()] {
    while (!p->stop_.WaitForNotificationWithTimeout(p->refresh_)) {
      p->Resolve().IgnoreError();  // keep the last view on failure
    }
  });
  return s;
}

DnsMemberSource::~DnsMemberSource() {
  stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

absl::Status DnsMemberSource::Resolve() {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(name_.c_str(), nullptr, &hints, &res);
  if (rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("dns: cannot resolve '", name_, "': ", gai_strerror(rc)));
  }
  std::set<std::string> seen;
  std::vector<Member> members;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    char ip[INET6_ADDRSTRLEN] = {0};
    std::string address;
    if (a->ai_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr,
                ip, sizeof(ip));
      address = absl::StrCat(ip, ":", port_);
    } else if (a->ai_family == AF_INET6) {
      inet_ntop(AF_INET6,
                &reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr, ip,
                sizeof(ip));
      address = absl::StrCat("[", ip, "]:", port_);
    } else {
      continue;
    }
    if (seen.insert(address).second) members.push_back(Member{address, 0});
  }
  freeaddrinfo(res);
  if (members.empty()) {
    return absl::UnavailableError(
        absl::StrCat("dns: '", name_, "' has no addresses"));
  }
  members = Sorted(std::move(members));
  absl::MutexLock lock(&mu_);
  if (members != members_) {
    members_ = std::move(members);
    ++generation_;
  }
  return absl::OkStatus();
}

std::vector<Member> DnsMemberSource::Members() const {
  absl::MutexLock lock(&mu_);
  return members_;
}

std::string DnsMemberSource::Describe() const {
  return absl::StrCat("dns: ", name_, ":", port_, " (every ",
                      absl::FormatDuration(refresh_), ")");
}

// ---- etcd ----

std::string MemberAddressFromEtcd(absl::string_view prefix,
                                  const EtcdKeyValue& kv) {
  nlohmann::json j =
      nlohmann::json::parse(kv.value, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("address") && j["address"].is_string()) {
    return j["address"].get<std::string>();
  }
  return kv.key.substr(std::min(prefix.size(), kv.key.size()));
}

EtcdMemberSource::EtcdMemberSource(EtcdOptions etcd, std::string key_prefix)
    : etcd_(std::move(etcd)), prefix_(std::move(key_prefix)) {}

absl::StatusOr<std::unique_ptr<EtcdMemberSource>> EtcdMemberSource::Create(
    EtcdOptions etcd, std::string key_prefix) {
  absl::Status s = ValidateEtcdOptions(etcd, "etcd");
  if (!s.ok()) return s;
  if (key_prefix.empty()) {
    return absl::InvalidArgumentError("etcd: key prefix must not be empty");
  }
  std::unique_ptr<EtcdMemberSource> src(
      new EtcdMemberSource(std::move(etcd), std::move(key_prefix)));
  s = src->Resync();
  if (!s.ok()) return s;
  src->resync_thread_ = std::thread([p = src.get()] { p->ResyncLoop(); });
  return src;
}

EtcdMemberSource::~EtcdMemberSource() {
  {
    absl::MutexLock lock(&broken_mu_);
    stopping_ = true;
  }
  if (resync_thread_.joinable()) resync_thread_.join();
  if (watch_ != nullptr) watch_->Stop();
}

absl::Status EtcdMemberSource::Resync() {
  if (watch_ != nullptr) {
    watch_->Stop();
    watch_.reset();
  }
  EtcdClient client(etcd_);
  absl::StatusOr<EtcdRange> range = client.RangePrefix(prefix_);
  if (!range.ok()) return range.status();
  std::map<std::string, Member> view;
  for (const EtcdKeyValue& kv : range->kvs) {
    view[kv.key] = Member{MemberAddressFromEtcd(prefix_, kv), kv.mod_revision};
  }
  {
    absl::MutexLock lock(&mu_);
    if (view.size() != by_key_.size() ||
        !std::equal(view.begin(), view.end(), by_key_.begin(),
                    [](const auto& a, const auto& b) {
                      return a.first == b.first && a.second == b.second;
                    })) {
      by_key_ = std::move(view);
      ++generation_;
    }
  }
  watch_ = EtcdWatch::Start(
      etcd_, prefix_, range->revision + 1,
      [this](const std::vector<EtcdEvent>& events) { Apply(events); },
      [this](const absl::Status&) {
        absl::MutexLock lock(&broken_mu_);
        broken_ = true;
      });
  return absl::OkStatus();
}

void EtcdMemberSource::Apply(const std::vector<EtcdEvent>& events) {
  absl::MutexLock lock(&mu_);
  for (const EtcdEvent& e : events) {
    if (e.deleted) {
      by_key_.erase(e.kv.key);
    } else {
      by_key_[e.kv.key] =
          Member{MemberAddressFromEtcd(prefix_, e.kv), e.kv.mod_revision};
    }
  }
  ++generation_;
}

void EtcdMemberSource::ResyncLoop() {
  absl::Duration backoff = absl::Milliseconds(100);
  while (true) {
    {
      absl::MutexLock lock(&broken_mu_);
      auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(broken_mu_) {
        return broken_ || stopping_;
      };
      broken_mu_.Await(absl::Condition(&wake));
      if (stopping_) return;
      // Cleared before the new watch starts so that its own break counts.
      broken_ = false;
    }
    if (Resync().ok()) {
      ++resyncs_;
      backoff = absl::Milliseconds(100);
      continue;
    }
    absl::MutexLock lock(&broken_mu_);
    broken_ = true;
    auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(broken_mu_) {
      return stopping_;
    };
    broken_mu_.AwaitWithTimeout(absl::Condition(&stop), backoff);
    backoff = std::min(backoff * 2, absl::Seconds(5));
  }
}

std::vector<Member> EtcdMemberSource::Members() const {
  std::vector<Member> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [key, m] : by_key_) out.push_back(m);
  return Sorted(std::move(out));
}

std::string EtcdMemberSource::Describe() const {
  return absl::StrCat("etcd: ", absl::StrJoin(etcd_.endpoints, ","), " ",
                      prefix_);
}

}  // namespace cluster
}  // namespace kvharbor
