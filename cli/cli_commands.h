// The commands of the kvharbor CLI: a table of (words, usage, flags, handler)
// that cli_main.cc dispatches on, each handler one SDK call or a few.
//
// Internal to the CLI. The table is immutable; handlers write to the
// Context's stream and return the SDK's status.
#ifndef KVHARBOR_CLI_CLI_COMMANDS_H_
#define KVHARBOR_CLI_CLI_COMMANDS_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "cli/cli_args.h"
#include "kvharbor/client.h"

namespace kvharbor {
namespace cli {

struct Context {
  Client* client = nullptr;
  std::ostream* out = nullptr;
  std::ostream* err = nullptr;  // notes that are not the command's result
  CallOptions call;
};

struct Command {
  std::vector<std::string> words;  // e.g. {"ns", "create"}
  std::string usage;               // what follows the words
  std::string summary;
  std::vector<std::string> flags;  // the command's own flags
  size_t min_args = 0;             // positionals after the words
  size_t max_args = 0;
  absl::Status (*run)(const Context& ctx, const Args& args,
                      const std::vector<std::string>& pos) = nullptr;
};

const std::vector<Command>& Commands();
// Every flag any command (or the CLI itself) accepts.
std::vector<FlagSpec> AllFlags();

}  // namespace cli
}  // namespace kvharbor

#endif  // KVHARBOR_CLI_CLI_COMMANDS_H_
