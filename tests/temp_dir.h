// TempDir: a fresh directory under /tmp for one test, removed with
// everything in it when the object goes out of scope. Not thread-safe (one
// test owns it); header-only, shared by the core, server and client tests.
#ifndef KVHARBOR_TESTS_TEMP_DIR_H_
#define KVHARBOR_TESTS_TEMP_DIR_H_

#include <stdlib.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

namespace kvharbor {
namespace testing {

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/kvharbor_test_XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ignored;  // best effort: a test's leftovers are harmless
    std::filesystem::remove_all(path, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  // Writes `text` to the file `name` inside the directory; returns its path.
  std::string Write(const std::string& name, const std::string& text) const {
    const std::string p = path + "/" + name;
    std::ofstream(p) << text;
    return p;
  }

  std::string path;
};

}  // namespace testing
}  // namespace kvharbor

#endif  // KVHARBOR_TESTS_TEMP_DIR_H_
