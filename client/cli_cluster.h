// `kvharbor cluster status`: the members of a kvharbor cluster (from etcd, a
// static list or a DNS name) with each daemon's pages, bytes and load.
//
// Internal to the CLI; stateless, writes to the Context's stream.
#ifndef KVHARBOR_CLIENT_CLI_CLUSTER_H_
#define KVHARBOR_CLIENT_CLI_CLUSTER_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/cli_args.h"
#include "client/cli_commands.h"

namespace kvharbor {
namespace cli {

// Flags: exactly one of --etcd=URL[,URL] (with --etcd_prefix, default
// /kvharbor/members/), --members=HOST:PORT[,...] or --dns=NAME:PORT.
// UNAVAILABLE (after printing the table) when a member did not answer.
absl::Status ClusterStatus(const Context& ctx, const Args& args,
                           const std::vector<std::string>& pos);

}  // namespace cli
}  // namespace kvharbor

#endif  // KVHARBOR_CLIENT_CLI_CLUSTER_H_
