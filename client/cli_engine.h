// The kvharbor CLI's match and insert commands, for both key kinds
// (--tokens / --keys) and with append (--skip_pages), and the --layers
// option of fetch (docs/engines_api.md).
//
// Internal to the CLI (see cli_commands.h); stateless handlers.
#ifndef KVHARBOR_CLIENT_CLI_ENGINE_H_
#define KVHARBOR_CLIENT_CLI_ENGINE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/cli_args.h"
#include "client/cli_commands.h"
#include "client/types.h"

namespace kvharbor {
namespace cli {

absl::Status MatchCommand(const Context& ctx, const Args& args,
                          const std::vector<std::string>& pos);
absl::Status InsertCommand(const Context& ctx, const Args& args,
                           const std::vector<std::string>& pos);
// --layers B:E of fetch into `source` (absent: every layer).
absl::Status LayersFrom(const Args& args, client::FetchSource* source);
// --key_kind tokens|page_keys of ns create.
absl::StatusOr<client::KeyKind> KeyKindFrom(const Args& args);

}  // namespace cli
}  // namespace kvharbor

#endif  // KVHARBOR_CLIENT_CLI_ENGINE_H_
