#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cli/cli_format.h"
#include "cli/cli_handlers.h"
#include "cluster/registrar.h"
#include "kvharbor/cluster_client.h"

namespace kvharbor {
namespace cli {

namespace {

std::vector<std::string> CommaList(const std::string& text) {
  return absl::StrSplit(text, ',', absl::SkipWhitespace());
}

absl::StatusOr<std::shared_ptr<cluster::MemberSource>> SourceFrom(
    const Args& args, absl::Duration timeout) {
  const int given =
      int{args.Has("etcd")} + int{args.Has("members")} + int{args.Has("dns")};
  if (given != 1) {
    return absl::InvalidArgumentError(
        "--etcd/--members/--dns: give exactly one of them");
  }
  if (args.Has("etcd_prefix") && !args.Has("etcd")) {
    return absl::InvalidArgumentError("--etcd_prefix: needs --etcd");
  }
  if (auto etcd = args.Get("etcd")) {
    cluster::EtcdOptions o;
    o.endpoints = CommaList(*etcd);
    o.request_timeout = timeout;
    absl::Status s = cluster::ValidateEtcdOptions(o, "--etcd");
    if (!s.ok()) return s;
    auto src = cluster::EtcdMemberSource::Create(
        std::move(o),
        args.Get("etcd_prefix").value_or(cluster::kDefaultKeyPrefix));
    if (!src.ok()) return src.status();
    return std::shared_ptr<cluster::MemberSource>(std::move(*src));
  }
  if (auto members = args.Get("members")) {
    auto src =
        cluster::StaticMemberSource::Create(CommaList(*members), "--members");
    if (!src.ok()) return src.status();
    return std::shared_ptr<cluster::MemberSource>(std::move(*src));
  }
  auto src = cluster::DnsMemberSource::Create(*args.Get("dns"));
  if (!src.ok()) {
    return absl::Status(src.status().code(),
                        absl::StrCat("--", src.status().message()));
  }
  return std::shared_ptr<cluster::MemberSource>(std::move(*src));
}

std::vector<std::string> Row(const ClusterMemberStatus& m) {
  if (!m.stats.ok()) {
    return {m.address, "down", "-", "-", "-", "-", "-", "-", "-"};
  }
  const client::Stats& s = *m.stats;
  uint64_t cached_bytes = 0, uploads = 0;
  for (const client::NamespaceStats& n : s.namespaces) {
    cached_bytes += n.cached_pages * n.page_bytes;
    uploads += n.uploads_in_flight;
  }
  return {m.address,
          "up",
          absl::StrCat(s.global.namespaces),
          absl::StrCat(s.global.cached_pages),
          HumanBytes(cached_bytes),
          absl::StrCat(s.global.hit_tokens, "/", s.global.miss_tokens),
          absl::StrCat(HumanBytes(s.global.bytes_in), "/",
                       HumanBytes(s.global.bytes_out)),
          absl::StrCat(s.global.active_leases, "/", uploads),
          absl::StrCat(s.global.uptime_seconds, "s")};
}

}  // namespace

absl::Status ClusterStatus(const Context& ctx, const Args& args,
                           const std::vector<std::string>& pos) {
  // --timeout_ms bounds each member's answer (and each etcd request).
  const absl::Duration timeout = ctx.client->options().default_timeout;
  absl::StatusOr<std::shared_ptr<cluster::MemberSource>> source =
      SourceFrom(args, timeout);
  if (!source.ok()) return source.status();
  ClusterClientOptions o;
  o.members = *source;
  o.member_timeout = timeout;
  absl::StatusOr<std::unique_ptr<ClusterClient>> cc =
      ClusterClient::Create(std::move(o));
  if (!cc.ok()) return cc.status();
  const std::vector<ClusterMemberStatus> members = (*cc)->MemberStatus();
  *ctx.out << (*cc)->source().Describe() << ": " << members.size()
           << " member(s)\n";
  Table table({"member", "state", "namespaces", "pages", "cached",
               "hit/miss tokens", "bytes in/out", "leases/uploads", "uptime"});
  size_t down = 0;
  for (const ClusterMemberStatus& m : members) {
    table.AddRow(Row(m));
    down += m.stats.ok() ? 0 : 1;
  }
  table.Print(*ctx.out);
  for (const ClusterMemberStatus& m : members) {
    if (!m.stats.ok())
      *ctx.out << m.address << ": " << m.stats.status() << "\n";
  }
  if (down > 0) {
    return absl::UnavailableError(absl::StrCat(down, " of ", members.size(),
                                               " member(s) did not answer"));
  }
  return absl::OkStatus();
}

}  // namespace cli
}  // namespace kvharbor
