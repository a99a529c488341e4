// Output formatting for the kvharbor CLI: aligned tables, key/value blocks
// and human-readable byte counts.
//
// Internal to the CLI. Value types writing to a caller's std::ostream;
// thread-compatible.
#ifndef KVHARBOR_CLI_CLI_FORMAT_H_
#define KVHARBOR_CLI_CLI_FORMAT_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace kvharbor {
namespace cli {

// Columns separated by two spaces; the first column left-aligned, the rest
// right-aligned (they hold numbers).
class Table {
 public:
  explicit Table(std::vector<std::string> header);
  void AddRow(std::vector<std::string> row);
  void Print(std::ostream& out) const;

 private:
  std::vector<std::vector<std::string>> rows_;  // rows_[0] is the header
};

// "key  value" lines with the values aligned.
class KeyValues {
 public:
  void Add(absl::string_view key, std::string value);
  void Print(std::ostream& out, absl::string_view indent = "") const;

 private:
  std::vector<std::pair<std::string, std::string>> items_;
};

// 1536 -> "1.5 KiB"; below 1 KiB "N B".
std::string HumanBytes(uint64_t bytes);
// "N (1.5 KiB)" for N >= 1 KiB, else "N".
std::string BytesWithHuman(uint64_t bytes);
// A lease expiry: "2026-01-02T03:04:05.678Z (in 29.9s)".
std::string FormatExpiry(absl::Time t);

}  // namespace cli
}  // namespace kvharbor

#endif  // KVHARBOR_CLI_CLI_FORMAT_H_
