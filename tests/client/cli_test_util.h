// Test helper: runs the built `kvharbor` CLI binary against a daemon address
// in a scratch directory and captures its exit code, stdout and stderr.
//
// Cli owns its scratch directory (removed by the destructor); not
// thread-safe (one command at a time writes the same stdout/stderr files).
#ifndef KVHARBOR_TESTS_CLIENT_CLI_TEST_UTIL_H_
#define KVHARBOR_TESTS_CLIENT_CLI_TEST_UTIL_H_

#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kvharbor {
namespace testing {

// tests/CMakeLists.txt defines KVHARBOR_CLI_PATH; without it, CTest's
// KVHARBOR_BUILD_DIR says where the build tree is.
inline std::string CliPath() {
#ifdef KVHARBOR_CLI_PATH
  return KVHARBOR_CLI_PATH;
#else
  const char* build = std::getenv("KVHARBOR_BUILD_DIR");
  return absl::StrCat(build != nullptr ? build : ".", "/client/kvharbor");
#endif
}

struct CliResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

inline std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The value after `key` on its line of a key/value block.
inline std::string Field(const std::string& text, const std::string& key) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::ConsumePrefix(&line, key) && !line.empty() && line[0] == ' ') {
      return std::string(absl::StripLeadingAsciiWhitespace(line));
    }
  }
  return "";
}

class Cli {
 public:
  explicit Cli(std::string address) : address_(std::move(address)) {
    char tmpl[] = "/tmp/kvharbor_cli_test_XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    dir_ = tmpl;
  }
  ~Cli() { std::system(absl::StrCat("rm -rf '", dir_, "'").c_str()); }

  const std::string& dir() const { return dir_; }
  std::string Path(const std::string& name) const {
    return absl::StrCat(dir_, "/", name);
  }

  CliResult Run(const std::string& args, bool with_addr = true) const {
    const std::string out = Path("stdout"), err = Path("stderr");
    const std::string cmd =
        absl::StrCat("'", CliPath(), "'",
                     with_addr ? absl::StrCat(" --addr=", address_) : "", " ",
                     args, " >'", out, "' 2>'", err, "'");
    const int status = std::system(cmd.c_str());
    CliResult r;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = ReadAll(out);
    r.err = ReadAll(err);
    UNSCOPED_INFO("$ kvharbor " << args << "\n" << r.out << r.err);
    return r;
  }

 private:
  std::string address_;
  std::string dir_;
};

}  // namespace testing
}  // namespace kvharbor

#endif  // KVHARBOR_TESTS_CLIENT_CLI_TEST_UTIL_H_
