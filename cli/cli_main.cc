// kvharbor: command-line client of the kvharbor daemon (see --help, and
// kvharbor COMMAND --help).
//
// Exit codes: 0 success, 1 the daemon (or the connection) returned an error,
// 2 bad usage. Errors print as "error: CODE: message" on stderr.
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/cli_args.h"
#include "cli/cli_commands.h"
#include "cli/cli_help.h"
#include "kvharbor/client.h"

namespace kvharbor {
namespace cli {
namespace {

constexpr int kExitError = 1;
constexpr int kExitUsage = 2;
// Flags every command takes (connection and security).
constexpr absl::string_view kGlobalFlags[] = {
    "addr",     "timeout_ms", "no_verify",       "tls",  "tls_ca",
    "tls_cert", "tls_key",    "tls_server_name", "token"};

// The security flags, and KVHARBOR_TOKEN when --token is not given.
absl::Status SecurityOptions(const Args& args, ClientOptions* options) {
  absl::StatusOr<bool> tls = args.Bool("tls");
  if (!tls.ok()) return tls.status();
  options->tls = *tls;
  options->tls_ca_file = args.Get("tls_ca").value_or("");
  options->tls_cert_file = args.Get("tls_cert").value_or("");
  options->tls_key_file = args.Get("tls_key").value_or("");
  options->tls_server_name = args.Get("tls_server_name").value_or("");
  if (std::optional<std::string> token = args.Get("token")) {
    options->token = *token;
  } else if (const char* env = std::getenv("KVHARBOR_TOKEN")) {
    options->token = env;
  }
  return absl::OkStatus();
}

int Fail(const absl::Status& s, int code) {
  std::cerr << "error: " << absl::StatusCodeToString(s.code()) << ": "
            << s.message() << "\n";
  return code;
}

int Usage(const std::string& message) {
  return Fail(absl::InvalidArgumentError(message), kExitUsage);
}

// The command whose words begin the positionals (longest match).
const Command* FindCommand(const std::vector<std::string>& pos) {
  const Command* best = nullptr;
  for (const Command& c : Commands()) {
    if (c.words.size() > pos.size()) continue;
    if (!std::equal(c.words.begin(), c.words.end(), pos.begin())) continue;
    if (best == nullptr || c.words.size() > best->words.size()) best = &c;
  }
  return best;
}

// Help for the words given: a command's own, a group's ("ns"), or the
// global help; an unknown command is a usage error.
int Help(const std::vector<std::string>& words) {
  if (words.empty()) {
    PrintHelp(std::cout);
    return 0;
  }
  if (const Command* cmd = FindCommand(words)) {
    PrintCommandHelp(*cmd, std::cout);
    return 0;
  }
  if (PrintGroupHelp(words, std::cout)) return 0;
  return Usage(absl::StrCat("unknown command '", absl::StrJoin(words, " "),
                            "' (see kvharbor --help)"));
}

int Run(int argc, char** argv) {
  std::vector<std::string> raw(argv + 1, argv + argc);
  absl::StatusOr<Args> args = Args::Parse(raw, AllFlags());
  if (!args.ok()) return Fail(args.status(), kExitUsage);
  std::vector<std::string> pos = args->positionals();
  // --help or -h anywhere, or "help" first: the help of the command (or
  // command group) the other words name, else the global help.
  bool help = args->Has("help");
  if (!pos.empty() && pos[0] == "help") {
    help = true;
    pos.erase(pos.begin());
  }
  if (const auto h = std::find(pos.begin(), pos.end(), "-h"); h != pos.end()) {
    help = true;
    pos.erase(h);
  }
  if (help) return Help(pos);
  if (pos.empty()) {
    PrintHelp(std::cerr);
    return kExitUsage;
  }
  const Command* cmd = FindCommand(pos);
  if (cmd == nullptr) {
    return Usage(absl::StrCat("unknown command '", absl::StrJoin(pos, " "),
                              "' (see kvharbor --help)"));
  }
  const std::string name = absl::StrJoin(cmd->words, " ");
  const std::string usage =
      absl::StrCat("usage: kvharbor ", name, " ", cmd->usage);
  for (const std::string& flag : args->FlagNames()) {
    const bool global =
        std::find(std::begin(kGlobalFlags), std::end(kGlobalFlags), flag) !=
        std::end(kGlobalFlags);
    if (!global && std::find(cmd->flags.begin(), cmd->flags.end(), flag) ==
                       cmd->flags.end()) {
      return Usage(
          absl::StrCat("--", flag, ": not a flag of '", name, "'; ", usage));
    }
  }
  std::vector<std::string> rest(pos.begin() + cmd->words.size(), pos.end());
  if (rest.size() < cmd->min_args || rest.size() > cmd->max_args) {
    return Usage(absl::StrCat("'", name, "' takes ", cmd->min_args,
                              cmd->min_args == cmd->max_args
                                  ? ""
                                  : absl::StrCat(" to ", cmd->max_args),
                              " argument(s), got ", rest.size(), "; ", usage));
  }

  ClientOptions options;
  options.address = args->Get("addr").value_or(options.address);
  absl::StatusOr<uint64_t> timeout_ms = args->Uint("timeout_ms", 30000);
  if (!timeout_ms.ok()) return Fail(timeout_ms.status(), kExitUsage);
  if (*timeout_ms == 0) return Usage("--timeout_ms: must be positive");
  options.default_timeout = absl::Milliseconds(*timeout_ms);
  absl::StatusOr<bool> no_verify = args->Bool("no_verify");
  if (!no_verify.ok()) return Fail(no_verify.status(), kExitUsage);
  options.verify_checksums = !*no_verify;
  absl::Status security = SecurityOptions(*args, &options);
  if (!security.ok()) return Fail(security, kExitUsage);
  absl::StatusOr<std::unique_ptr<Client>> client =
      Client::Create(std::move(options));
  if (!client.ok()) return Fail(client.status(), kExitUsage);

  Context ctx;
  ctx.client = client->get();
  ctx.out = &std::cout;
  ctx.err = &std::cerr;
  absl::Status s = cmd->run(ctx, *args, rest);
  if (!s.ok()) return Fail(s, kExitError);
  return 0;
}

}  // namespace
}  // namespace cli
}  // namespace kvharbor

int main(int argc, char** argv) { return kvharbor::cli::Run(argc, argv); }
