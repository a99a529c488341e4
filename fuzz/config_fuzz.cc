// libFuzzer target: kvharbord's YAML config loader (LoadConfigText, the
// body of LoadConfigFile, server/daemon/config.cc, through yaml-cpp) on
// arbitrary text.
//
// Whatever the text, the loader must return a status, never crash or throw;
// a refusal must be an error that starts with "config" (its message names
// the key), and what loads must pass ValidateDaemonOptions. Loading the same
// text again gives the same outcome.
//
// The seeds in fuzz/corpus/config/ are the deploy/ configs without their
// comments and small configs that set each section.
#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/strings/match.h"
#include "fuzz/fuzz_util.h"
#include "server/daemon/config.h"
#include "server/daemon/daemon.h"
#include "spdlog/spdlog.h"

namespace kvharbor {
namespace {

absl::Status LoadText(const uint8_t* data, size_t size, DaemonOptions* o) {
  return LoadConfigText(
      absl::string_view(reinterpret_cast<const char*>(data), size), "fuzz", o);
}

}  // namespace
}  // namespace kvharbor

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  spdlog::set_level(spdlog::level::off);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvharbor;
  DaemonOptions o;
  const absl::Status s = LoadText(data, size, &o);
  if (!s.ok()) {
    if (!absl::StartsWith(s.message(), "config")) {
      std::fprintf(stderr, "unnamed error: %s\n", s.ToString().c_str());
      __builtin_trap();
    }
  } else {
    FUZZ_CHECK(ValidateDaemonOptions(o, "fuzz").ok());
  }
  DaemonOptions again;
  const absl::Status s2 = LoadText(data, size, &again);
  FUZZ_CHECK(s2.code() == s.code() && s2.message() == s.message());
  if (s.ok()) {
    FUZZ_CHECK(again.listen == o.listen);
    FUZZ_CHECK(again.namespaces.size() == o.namespaces.size());
  }
  return 0;
}
