#include "core/base/strict_json.h"

#include <set>
#include <stdexcept>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace kvharbor {
namespace {

using Json = nlohmann::json;

// Thrown from the parser callback to stop at the first structural problem.
struct StructureError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace

std::string QuotedName(absl::string_view name) {
  constexpr size_t kMaxShown = 120;
  std::string shown = absl::CHexEscape(name.substr(0, kMaxShown));
  if (name.size() > kMaxShown) shown += "...";
  return absl::StrCat("'", shown, "'");
}

absl::StatusOr<Json> ParseStrictJson(absl::string_view text, int max_depth,
                                     absl::string_view what) {
  // One set of keys per open object.
  std::vector<std::set<std::string>> open_objects;
  auto callback = [&open_objects, max_depth](
                      int depth, Json::parse_event_t event, Json& parsed) {
    // nlohmann reports a container's start at its parent's depth and its
    // members one deeper, so members of the deepest allowed container are
    // at max_depth.
    if (depth > max_depth) {
      throw StructureError(
          absl::StrCat("nesting deeper than ", max_depth, " levels"));
    }
    switch (event) {
      case Json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case Json::parse_event_t::key: {
        const std::string& key = parsed.get_ref<const std::string&>();
        if (!open_objects.empty() && !open_objects.back().insert(key).second) {
          throw StructureError(absl::StrCat("duplicate key ", QuotedName(key)));
        }
        break;
      }
      default:
        break;
    }
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), callback);
  } catch (const StructureError& e) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": json: ", e.what()));
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": json: not valid JSON: ", e.what()));
  }
}

}  // namespace kvharbor
