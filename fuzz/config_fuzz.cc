// libFuzzer target: kvharbord's YAML config loader (LoadConfigFile, server/
// config.cc, through yaml-cpp) on arbitrary text. LoadConfigFile takes only a
// path, so each input is written to a memfd and loaded through
// /proc/self/fd (no disk is touched).
//
// Whatever the text, the loader must return a status, never crash or throw;
// a refusal must be an error that starts with "config" (its message names
// the key), and what loads must pass ValidateDaemonOptions. Loading the same
// text again gives the same outcome.
//
// The seeds in fuzz/corpus/config/ are the deploy/ configs without their
// comments and small configs that set each section.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/strings/match.h"
#include "fuzz/fuzz_util.h"
#include "server/daemon.h"
#include "spdlog/spdlog.h"

namespace kvharbor {
namespace {

absl::Status LoadText(const uint8_t* data, size_t size, DaemonOptions* o) {
  const int fd = memfd_create("config_fuzz", 0);
  FUZZ_CHECK(fd >= 0);
  size_t done = 0;
  while (done < size) {
    const ssize_t w = write(fd, data + done, size - done);
    FUZZ_CHECK(w > 0);
    done += static_cast<size_t>(w);
  }
  absl::Status s = LoadConfigFile("/proc/self/fd/" + std::to_string(fd), o);
  close(fd);
  return s;
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
