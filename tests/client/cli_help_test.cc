// The built `kvharbor` CLI's help (cli/cli_help.cc): the global help
// lists the commands, and each command's --help prints its own usage and
// describes every option its usage names; no daemon is needed.
#include <catch2/catch.hpp>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "tests/client/cli_test_util.h"

namespace kvharbor {
namespace {

using testing::Cli;
using testing::CliResult;

// The command words of the global help's "commands:" list.
std::vector<std::string> CommandsOf(const std::string& help) {
  std::vector<std::string> commands;
  const size_t at = help.find("\ncommands:\n");
  if (at == std::string::npos) return commands;
  for (absl::string_view line :
       absl::StrSplit(help.substr(at + 11), '\n', absl::SkipEmpty())) {
    if (!absl::StartsWith(line, "  ")) break;
    if (absl::StartsWith(line, "   ")) continue;  // a wrapped summary
    line.remove_prefix(2);
    commands.emplace_back(line.substr(0, line.find("  ")));
  }
  return commands;
}

// The --flags a command's usage names ("--tokens 1,2,3" -> "tokens").
std::set<std::string> FlagsOfUsage(const std::string& help) {
  std::set<std::string> flags;
  const std::string usage = help.substr(0, help.find("\n\n"));
  for (absl::string_view word :
       absl::StrSplit(usage, absl::ByAnyChar(" \n[]()|"), absl::SkipEmpty())) {
    if (absl::ConsumePrefix(&word, "--")) flags.emplace(word);
  }
  return flags;
}

TEST_CASE("kvharbor CLI: each command's --help is its own", "[client][cli]") {
  Cli cli("127.0.0.1:1");  // never called: help needs no daemon
  const CliResult global = cli.Run("--help", false);
  REQUIRE(global.exit_code == 0);
  const std::vector<std::string> commands = CommandsOf(global.out);
  REQUIRE(commands.size() >= 20);
  CHECK(global.out.find("30 s") != std::string::npos);  // the lease TTL

  std::set<std::string> seen;
  for (const std::string& words : commands) {
    INFO(words);
    const CliResult r = cli.Run(absl::StrCat(words, " --help"), false);
    CHECK(r.exit_code == 0);
    CHECK(r.err.empty());
    CHECK(absl::StartsWith(r.out, absl::StrCat("usage: kvharbor ", words)));
    CHECK(seen.insert(r.out).second);  // differs from every other command's
    CHECK(cli.Run(absl::StrCat("help ", words), false).out == r.out);
    CHECK(cli.Run(absl::StrCat(words, " -h"), false).out == r.out);
    // Every flag the usage names is an option with a description.
    for (const std::string& flag : FlagsOfUsage(r.out)) {
      INFO("--" << flag);
      size_t at = r.out.find(absl::StrCat("\n  --", flag, "="));
      if (at == std::string::npos) {
        at = r.out.find(absl::StrCat("\n  --", flag, "\n"));
      }
      REQUIRE(at != std::string::npos);
      const size_t text = r.out.find('\n', at + 1) + 1;
      CHECK(absl::StartsWith(r.out.substr(text), "      "));
      CHECK_FALSE(absl::StartsWith(r.out.substr(text), "      (undocumented)"));
    }
  }

  // A group lists its subcommands; an unknown command is a usage error.
  CliResult r = cli.Run("ns --help", false);
  CHECK(r.exit_code == 0);
  for (const char* sub : {"ns create", "ns list", "ns describe", "ns delete"}) {
    CHECK(r.out.find(sub) != std::string::npos);
  }
  CHECK(r.out.find("\n  match") == std::string::npos);
  r = cli.Run("frobnicate --help", false);
  CHECK(r.exit_code == 2);
  CHECK(absl::StartsWith(r.err, "error: INVALID_ARGUMENT: unknown command"));
}

}  // namespace
}  // namespace kvharbor
