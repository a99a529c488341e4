// Command-line parsing for the kvharbor CLI: positionals and --flags
// (--name=value, --name value, or --name for a boolean), and the parsers for
// the values the commands take (numbers, token and handle lists).
//
// Internal to the CLI. Value types; thread-compatible. Errors are
// INVALID_ARGUMENT and name the flag ("--layers: ...").
#ifndef KVHARBOR_CLI_CLI_ARGS_H_
#define KVHARBOR_CLI_CLI_ARGS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvharbor {
namespace cli {

struct FlagSpec {
  const char* name;  // without the leading "--"
  bool takes_value;
};

class Args {
 public:
  // `args` excludes the program name. A lone "--" ends the flags.
  static absl::StatusOr<Args> Parse(const std::vector<std::string>& args,
                                    const std::vector<FlagSpec>& flags);

  const std::vector<std::string>& positionals() const { return positionals_; }
  bool Has(absl::string_view name) const;
  // Flags given, in order of name; for checking them against a command.
  std::vector<std::string> FlagNames() const;

  std::optional<std::string> Get(absl::string_view name) const;
  absl::StatusOr<std::string> Required(absl::string_view name) const;
  // A boolean flag: absent = false, "--x" or "--x=true" = true.
  absl::StatusOr<bool> Bool(absl::string_view name) const;
  absl::StatusOr<uint64_t> Uint(absl::string_view name, uint64_t fallback,
                                uint64_t max = UINT64_MAX) const;
  absl::StatusOr<uint64_t> RequiredUint(absl::string_view name,
                                        uint64_t max = UINT64_MAX) const;

 private:
  std::vector<std::string> positionals_;
  std::map<std::string, std::string, std::less<>> values_;
};

// Decimal or 0x-hex unsigned number no larger than `max`; `field` names it.
absl::StatusOr<uint64_t> ParseUint(absl::string_view text,
                                   absl::string_view field,
                                   uint64_t max = UINT64_MAX);
// Token ids separated by commas and/or whitespace; each in [0, 2^31).
absl::StatusOr<std::vector<int32_t>> ParseTokens(absl::string_view text,
                                                 absl::string_view field);
// Page handles (decimal or 0x-hex) separated by commas and/or whitespace.
absl::StatusOr<std::vector<uint64_t>> ParseHandles(absl::string_view text,
                                                   absl::string_view field);

absl::StatusOr<std::string> ReadFile(const std::string& path,
                                     absl::string_view field);
absl::Status WriteFile(const std::string& path, absl::string_view field,
                       const std::vector<std::vector<uint8_t>>& pages);

}  // namespace cli
}  // namespace kvharbor

#endif  // KVHARBOR_CLI_CLI_ARGS_H_
