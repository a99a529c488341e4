#include "cli/cli_format.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace kvharbor {
namespace cli {

Table::Table(std::vector<std::string> header) {
  rows_.push_back(std::move(header));
}

void Table::AddRow(std::vector<std::string> row) {
  row.resize(rows_[0].size());
  rows_.push_back(std::move(row));
}

void Table::Print(std::ostream& out) const {
  std::vector<size_t> width(rows_[0].size(), 0);
  for (const auto& row : rows_) {
    for (size_t c = 0; c < row.size(); ++c) {
      width[c] = std::max(width[c], row[c].size());
    }
  }
  for (const auto& row : rows_) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      const std::string pad(width[c] - row[c].size(), ' ');
      if (c > 0) line += "  ";
      line += c == 0 ? absl::StrCat(row[c], pad) : absl::StrCat(pad, row[c]);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out << line << "\n";
  }
}

void KeyValues::Add(absl::string_view key, std::string value) {
  items_.emplace_back(std::string(key), std::move(value));
}

void KeyValues::Print(std::ostream& out, absl::string_view indent) const {
  size_t width = 0;
  for (const auto& [key, value] : items_) width = std::max(width, key.size());
  for (const auto& [key, value] : items_) {
    out << indent << key << std::string(width - key.size() + 2, ' ') << value
        << "\n";
  }
}

std::string HumanBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B",   "KiB", "MiB", "GiB",
                                           "TiB", "PiB", "EiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1024.0 && unit < 6) {
    v /= 1024.0;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", v, kUnits[unit]);
}

std::string BytesWithHuman(uint64_t bytes) {
  if (bytes < 1024) return absl::StrCat(bytes);
  return absl::StrCat(bytes, " (", HumanBytes(bytes), ")");
}

std::string FormatExpiry(absl::Time t) {
  return absl::StrCat(
      absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", t, absl::UTCTimeZone()), " (in ",
      absl::FormatDuration(absl::Trunc(t - absl::Now(), absl::Milliseconds(1))),
      ")");
}

}  // namespace cli
}  // namespace kvharbor
