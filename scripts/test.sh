#!/usr/bin/env bash
# Sets up what is missing and runs the whole test suite (no GPU needed):
#   1. the Release build's CTest suite (unit, integration, reflection, health,
#      CLI, find_package consumer),
#   2. the same unit and integration tests under AddressSanitizer+UBSan
#      (KVHARBOR_TEST_SANITIZERS=0 skips),
#   3. each libFuzzer target for a short while (KVHARBOR_FUZZ_SECONDS, default 20; 0 skips).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=$(nproc)
BUILD_DIR=build bash scripts/build.sh
(cd build && ctest --output-on-failure -j"$JOBS" --timeout 600)

if [ "${KVHARBOR_TEST_SANITIZERS:-1}" != 0 ]; then
  echo "== AddressSanitizer + UndefinedBehaviorSanitizer =="
  BUILD_DIR=build-asan bash scripts/build.sh -DKVHARBOR_SANITIZE=address \
    -DKVHARBOR_BUILD_BENCH=OFF -DKVHARBOR_CUDA=OFF
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --output-on-failure -j"$JOBS" --timeout 900 -E 'consumer')
fi

if [ "${KVHARBOR_FUZZ_SECONDS:-20}" != 0 ] && [ -x scripts/run_fuzz.sh ]; then
  echo "== libFuzzer (${KVHARBOR_FUZZ_SECONDS:-20} s per target) =="
  bash scripts/run_fuzz.sh "${KVHARBOR_FUZZ_SECONDS:-20}"
fi
echo "kvharbor: all test stages passed"
