#include "cli/cli_args.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kvharbor {
namespace cli {

namespace {

const FlagSpec* FindFlag(const std::vector<FlagSpec>& flags,
                         absl::string_view name) {
  for (const FlagSpec& f : flags) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

std::vector<absl::string_view> SplitList(absl::string_view text) {
  return absl::StrSplit(text, absl::ByAnyChar(", \t\r\n"), absl::SkipEmpty());
}

}  // namespace

absl::StatusOr<Args> Args::Parse(const std::vector<std::string>& args,
                                 const std::vector<FlagSpec>& flags) {
  Args out;
  bool flags_done = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (flags_done || !absl::StartsWith(a, "--") || a == "-") {
      out.positionals_.push_back(a);
      continue;
    }
    if (a == "--") {
      flags_done = true;
      continue;
    }
    absl::string_view body = absl::string_view(a).substr(2);
    const size_t eq = body.find('=');
    absl::string_view name = body.substr(0, eq);
    const FlagSpec* spec = FindFlag(flags, name);
    if (spec == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, ": unknown flag (see kvharbor --help)"));
    }
    std::string value;
    if (eq != absl::string_view::npos) {
      value = std::string(body.substr(eq + 1));
    } else if (spec->takes_value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, ": needs a value"));
      }
      value = args[++i];
    } else {
      value = "true";
    }
    if (out.values_.count(name) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, ": given more than once"));
    }
    out.values_.emplace(std::string(name), std::move(value));
  }
  return out;
}

bool Args::Has(absl::string_view name) const {
  return values_.find(name) != values_.end();
}

std::vector<std::string> Args::FlagNames() const {
  std::vector<std::string> names;
  for (const auto& [name, value] : values_) names.push_back(name);
  return names;
}

std::optional<std::string> Args::Get(absl::string_view name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

absl::StatusOr<std::string> Args::Required(absl::string_view name) const {
  auto it = values_.find(name);
  if (it == values_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, ": required"));
  }
  return it->second;
}

absl::StatusOr<bool> Args::Bool(absl::string_view name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return false;
  bool b = false;
  if (!absl::SimpleAtob(it->second, &b)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, ": '", it->second, "' is not true or false"));
  }
  return b;
}

absl::StatusOr<uint64_t> Args::Uint(absl::string_view name, uint64_t fallback,
                                    uint64_t max) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  return ParseUint(it->second, absl::StrCat("--", name), max);
}

absl::StatusOr<uint64_t> Args::RequiredUint(absl::string_view name,
                                            uint64_t max) const {
  auto it = values_.find(name);
  if (it == values_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, ": required"));
  }
  return ParseUint(it->second, absl::StrCat("--", name), max);
}

absl::StatusOr<uint64_t> ParseUint(absl::string_view text,
                                   absl::string_view field, uint64_t max) {
  absl::string_view t = absl::StripAsciiWhitespace(text);
  uint64_t v = 0;
  bool ok = false;
  if (absl::StartsWithIgnoreCase(t, "0x")) {
    ok = t.size() > 2 && absl::SimpleHexAtoi(t.substr(2), &v) &&
         t.substr(2).find_first_of("+-") == absl::string_view::npos;
  } else {
    ok = !t.empty() && t[0] != '-' && t[0] != '+' && absl::SimpleAtoi(t, &v);
  }
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", text, "' is not an unsigned number"));
  }
  if (v > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", v, " exceeds the maximum ", max));
  }
  return v;
}

namespace {

// A comma-separated list of unsigned numbers up to `max`, each named
// field[i] in errors; `none` says what an empty list lacks.
template <typename T>
absl::StatusOr<std::vector<T>> ParseUintList(absl::string_view text,
                                             absl::string_view field,
                                             uint64_t max,
                                             absl::string_view none) {
  std::vector<T> values;
  for (absl::string_view piece : SplitList(text)) {
    absl::StatusOr<uint64_t> v =
        ParseUint(piece, absl::StrCat(field, "[", values.size(), "]"), max);
    if (!v.ok()) return v.status();
    values.push_back(static_cast<T>(*v));
  }
  if (values.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": no ", none));
  }
  return values;
}

}  // namespace

absl::StatusOr<std::vector<int32_t>> ParseTokens(absl::string_view text,
                                                 absl::string_view field) {
  return ParseUintList<int32_t>(text, field, uint64_t{INT32_MAX}, "token ids");
}

absl::StatusOr<std::vector<uint64_t>> ParseHandles(absl::string_view text,
                                                   absl::string_view field) {
  return ParseUintList<uint64_t>(text, field, UINT64_MAX, "page handles");
}

absl::StatusOr<std::string> ReadFile(const std::string& path,
                                     absl::string_view field) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(field, ": cannot open '", path,
                                            "': ", std::strerror(errno)));
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) {
    return absl::DataLossError(
        absl::StrCat(field, ": error reading '", path, "'"));
  }
  return std::move(ss).str();
}

absl::Status WriteFile(const std::string& path, absl::string_view field,
                       const std::vector<std::vector<uint8_t>>& pages) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) {
    return absl::PermissionDeniedError(absl::StrCat(
        field, ": cannot create '", path, "': ", std::strerror(errno)));
  }
  for (const std::vector<uint8_t>& page : pages) {
    out.write(reinterpret_cast<const char*>(page.data()),
              static_cast<std::streamsize>(page.size()));
  }
  out.close();
  if (!out) {
    return absl::DataLossError(
        absl::StrCat(field, ": error writing '", path, "'"));
  }
  return absl::OkStatus();
}

}  // namespace cli
}  // namespace kvharbor
