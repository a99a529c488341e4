// kvharbord's command line (server/daemon/main.cc), run as a process: --help
// prints every flag by topic with its default and exits 0.
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tests/server/subprocess.h"
#include "tests/temp_dir.h"

#ifndef KVHARBORD_PATH
#error "KVHARBORD_PATH (the built kvharbord) must be defined by the build"
#endif

namespace kvharbor {
namespace testing {
namespace {

struct Exit {
  int code = -1;  // -1: killed or still running
  std::string output;
};

Exit RunKvharbord(const std::string& arg, const std::string& output_path) {
  Kvharbord proc(KVHARBORD_PATH, {arg}, output_path);
  REQUIRE(proc.started());
  const int status = proc.WaitExit(std::chrono::seconds(10));
  Exit e;
  if (status != -1 && WIFEXITED(status)) e.code = WEXITSTATUS(status);
  std::ifstream in(output_path);
  std::ostringstream ss;
  ss << in.rdbuf();
  e.output = ss.str();
  return e;
}

// The flags absl's --helpfull lists for server/daemon/main.cc: every flag the
// daemon defines, independent of the grouped help under test.
std::set<std::string> FlagsOfMain(const std::string& helpfull) {
  std::set<std::string> flags;
  bool in_main = false;
  for (absl::string_view line : absl::StrSplit(helpfull, '\n')) {
    if (absl::StartsWith(line, "  Flags from ")) {
      in_main = absl::StrContains(line, "server/daemon/main.cc");
    } else if (in_main && absl::StartsWith(line, "    --")) {
      line.remove_prefix(6);
      flags.insert(std::string(line.substr(0, line.find(' '))));
    }
  }
  return flags;
}

TEST_CASE("kvharbord --help: every flag by topic with its default, exit 0",
          "[server][process]") {
  TempDir dir;
  const Exit full = RunKvharbord("--helpfull", dir.path + "/full.txt");
  const std::set<std::string> flags = FlagsOfMain(full.output);
  INFO(full.output);
  REQUIRE(flags.size() >= 20);
  REQUIRE(flags.count("listen") == 1);

  for (const char* arg : {"--help", "-h"}) {
    INFO(arg);
    const Exit help = RunKvharbord(arg, dir.path + "/help.txt");
    INFO(help.output);
    CHECK(help.code == 0);
    CHECK(absl::StartsWith(help.output, "kvharbord: "));
    CHECK_FALSE(absl::StrContains(help.output, "No flags matched"));
    for (const char* group : {"\nlisten and config:\n", "\nmemory and tiers:\n",
                              "\nsame-host paths:\n", "\nobservability:\n",
                              "\nsecurity:\n", "\nlimits:\n", "\ncluster:\n"}) {
      CHECK(absl::StrContains(help.output, group));
    }
    CHECK_FALSE(absl::StrContains(help.output, "\nother:\n"));
    // Each flag once, as "  --name" or "  --name=VALUE", its help text
    // (up to the next flag or topic) stating the default.
    for (const std::string& flag : flags) {
      INFO(flag);
      size_t at = help.output.find(absl::StrCat("\n  --", flag, "\n"));
      if (at == std::string::npos) {
        at = help.output.find(absl::StrCat("\n  --", flag, "="));
      }
      REQUIRE(at != std::string::npos);
      const size_t end = help.output.find("\n  --", at + 1);
      const std::string block = help.output.substr(at, end - at);
      CHECK(absl::StrContains(block, "Default"));
    }
  }
}

}  // namespace
}  // namespace testing
}  // namespace kvharbor
