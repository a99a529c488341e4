// Helpers shared by the libFuzzer targets in fuzz/: a check that traps (so
// libFuzzer records the input as a crash) and the seed-file writer the
// targets' corpus-generating modes use. Header-only; no state.
#ifndef KVHARBOR_FUZZ_FUZZ_UTIL_H_
#define KVHARBOR_FUZZ_FUZZ_UTIL_H_

#include <cstdio>
#include <cstdlib>
#include <string>

// A property of the decoder that must hold for every input.
#define FUZZ_CHECK(cond)                                 \
  do {                                                   \
    if (!(cond)) {                                       \
      std::fprintf(stderr, "check failed: %s\n", #cond); \
      __builtin_trap();                                  \
    }                                                    \
  } while (0)

namespace kvharbor {

// Writes one corpus seed; exits on failure (corpus generation is a
// developer's command, not a fuzzing run).
inline void WriteSeedOrDie(const std::string& path, const void* data,
                           size_t size) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    std::perror(path.c_str());
    std::exit(1);
  }
  std::fwrite(data, 1, size, f);
  std::fclose(f);
}

}  // namespace kvharbor

#endif  // KVHARBOR_FUZZ_FUZZ_UTIL_H_
