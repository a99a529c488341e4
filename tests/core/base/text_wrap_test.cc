#include "core/base/text_wrap.h"

#include <catch2/catch.hpp>

namespace kvharbor {
namespace {

TEST_CASE("WrapText fills lines up to the width, indented", "[core][base]") {
  CHECK(WrapText("", 2) == "");
  CHECK(WrapText("  ", 2) == "");
  CHECK(WrapText("one two", 4) == "    one two\n");
  // 2 + "aaa bbb" = 9 columns fit in 9; "ccc" goes to the next line.
  CHECK(WrapText("aaa bbb ccc", 2, 9) == "  aaa bbb\n  ccc\n");
  CHECK(WrapText("aaa  bbb", 0, 7) == "aaa bbb\n");  // runs of spaces: one
  // A word wider than the width stands alone on its line.
  CHECK(WrapText("a verylongword b", 1, 6) == " a\n verylongword\n b\n");
}

}  // namespace
}  // namespace kvharbor
