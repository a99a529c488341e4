// Help texts of the kvharbor CLI: the global help (flags every command takes
// and the list of commands), one command's help (its usage, what it does and
// each of its options) and a command group's help ("kvharbor ns --help").
//
// Internal to the CLI. Stateless functions over the immutable command table
// (cli_commands.h); they write to the caller's stream.
#ifndef KVHARBOR_CLI_CLI_HELP_H_
#define KVHARBOR_CLI_CLI_HELP_H_

#include <ostream>
#include <string>
#include <vector>

#include "cli/cli_commands.h"

namespace kvharbor {
namespace cli {

void PrintHelp(std::ostream& out);
void PrintCommandHelp(const Command& command, std::ostream& out);
// The commands whose words begin with `words` (e.g. {"ns"}); false (nothing
// printed) when there is none.
bool PrintGroupHelp(const std::vector<std::string>& words, std::ostream& out);

}  // namespace cli
}  // namespace kvharbor

#endif  // KVHARBOR_CLI_CLI_HELP_H_
