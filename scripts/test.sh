#!/usr/bin/env bash
# Sets up what is missing and runs the whole test suite (no GPU needed):
#   1. the Release build's CTest suite (unit, integration, reflection, health,
#      CLI, find_package consumer),
#   2. the same unit and integration tests under AddressSanitizer+UBSan
#      (KVHARBOR_TEST_SANITIZERS=0 skips; the tests' own code at -O0,
#      KVHARBOR_TEST_OPT, the code under test optimized as in stage 1),
#   3. each libFuzzer target for a short while (KVHARBOR_FUZZ_SECONDS, default 20; 0 skips),
#   4. scripts/lint.sh: yamllint, shellcheck, and the Dockerfile's build steps and
#      deploy/ configs checked outside Docker (KVHARBOR_TEST_LINT=0 skips),
#   5. the core concurrency stress test (tests/stress/core_stress.cc) under
#      ThreadSanitizer with no report allowed (KVHARBOR_TEST_TSAN=0 skips):
#      scripts/build_tsan_deps.sh builds Debian's abseil source with
#      -fsanitize=thread into build-tsan/deps (once; kept between runs), and
#      build-tsan/ builds only kvharbor's core and that test against it, so
#      TSan sees absl::Mutex. No suppression for kvharbor code (one inside
#      abseil's Mutex: tests/stress/core_stress_tsan.supp). The gRPC-level
#      stress test (tests/stress/stress_test.cc) runs in stages 1 and 2
#      only: Debian's gRPC and protobuf are not TSan-instrumented and link
#      the uninstrumented abseil, so under TSan it reports races that are
#      not there.
#   6. clang's thread-safety analysis: core/, server/, client/ and cluster/
#      (libraries, kvharbord and the kvharbor CLI), and the host C++ of
#      cuda/, client/cuda/ and capi/ (kvharbor_cuda_host_check: compiled
#      against the CUDA headers of /usr/local/cuda/include, not linked; the
#      .cu kernels hold no locks) compiled with clang++-14 -Wthread-safety
#      -Werror (KVHARBOR_THREAD_SAFETY), configured in build-thread-safety/
#      and run with -fsyntax-only by scripts/check_thread_safety.py, so every
#      ABSL_GUARDED_BY and lock annotation is checked without code generation
#      (KVHARBOR_TEST_THREAD_SAFETY=0 skips).
# Each stage prints its time ("stage ... s"): CI stops the run at 90 minutes.
# Builds go through ccache when it is installed (scripts/install_deps.sh
# installs it), with CCACHE_BASEDIR at the clone, so a second run on the same
# machine, in another clone, reuses the first's objects.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=$(nproc)
# Free disk first: a full disk otherwise shows only as a failed link late in
# the run (debug sections are compressed, KVHARBOR_COMPRESS_DEBUG, to need
# less).
echo "kvharbor: $(df -Ph . | awk 'NR==2 {print $4}') free here; a clean run's build directories take about 4.2 GiB (a fresh clone, 2026-11)"
RUN_START=$SECONDS
STAGE=""
STAGE_START=$SECONDS
stage_end() {
  if [ -n "$STAGE" ]; then
    echo "kvharbor: stage '$STAGE': $((SECONDS - STAGE_START)) s (run so far $((SECONDS - RUN_START)) s)"
  fi
  STAGE=""
}
stage() {
  stage_end
  STAGE=$1
  STAGE_START=$SECONDS
  echo "== $1 =="
}
LAUNCHER=()
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1
  export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache \
    CMAKE_CUDA_COMPILER_LAUNCHER=ccache
  LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
# Line tables only (-g1): enough for every stack trace a failing test or a
# sanitizer prints, and a third less compile time than full debug info on
# this code (gRPC, protobuf and Catch2 templates); the test binaries also
# use precompiled headers (tests/CMakeLists.txt, KVHARBOR_TEST_PCH).
LINES=(-DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG"
       -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG")
stage "Release build"
BUILD_DIR=build bash scripts/build.sh "${LINES[@]}"
stage "CTest"
(cd build && ctest --output-on-failure -j"$JOBS" --timeout 600)

if [ "${KVHARBOR_TEST_SANITIZERS:-1}" != 0 ]; then
  stage "AddressSanitizer + UndefinedBehaviorSanitizer"
  BUILD_DIR=build-asan bash scripts/build.sh -DKVHARBOR_SANITIZE=address \
    -DKVHARBOR_BUILD_BENCH=OFF -DKVHARBOR_CUDA=OFF -DKVHARBOR_TEST_OPT=-O0 \
    "${LINES[@]}"
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --output-on-failure -j"$JOBS" --timeout 900 -E 'consumer')
fi

if [ "${KVHARBOR_FUZZ_SECONDS:-20}" != 0 ] && [ -x scripts/run_fuzz.sh ]; then
  stage "libFuzzer (${KVHARBOR_FUZZ_SECONDS:-20} s per target)"
  bash scripts/run_fuzz.sh "${KVHARBOR_FUZZ_SECONDS:-20}"
fi
if [ "${KVHARBOR_TEST_LINT:-1}" != 0 ]; then
  stage "lint and deploy checks"
  BUILD_DIR=build bash scripts/lint.sh
fi
if [ "${KVHARBOR_TEST_TSAN:-1}" != 0 ]; then
  stage "ThreadSanitizer: core concurrency stress test"
  bash scripts/build_tsan_deps.sh build-tsan/deps
  GEN=()
  command -v ninja >/dev/null && GEN=(-G Ninja)
  cmake -S . -B build-tsan "${GEN[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DKVHARBOR_SANITIZE=thread -DKVHARBOR_TSAN_DEPS="$PWD/build-tsan/deps" \
    -DKVHARBOR_CUDA=OFF -DKVHARBOR_BUILD_BENCH=OFF >/dev/null
  cmake --build build-tsan -j"$JOBS" --target kvharbor_core_stress
  # OpenBLAS's own (uninstrumented) threads stay off should a codec reach it.
  # The one suppression is inside abseil's Mutex (a known TSan false positive,
  # explained in the file); none may name kvharbor code.
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/tests/stress/core_stress_tsan.supp" \
    OPENBLAS_NUM_THREADS=1 \
    KVHARBOR_CORE_STRESS_SECONDS="${KVHARBOR_TSAN_SECONDS:-30}" \
    build-tsan/tests/kvharbor_core_stress
fi
if [ "${KVHARBOR_TEST_THREAD_SAFETY:-1}" != 0 ]; then
  stage "clang -Wthread-safety: core, server, client, cluster, tools, cuda host code"
  GEN=()
  command -v ninja >/dev/null && GEN=(-G Ninja)
  cmake -S . -B build-thread-safety "${GEN[@]}" "${LAUNCHER[@]}" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang-14 \
    -DCMAKE_CXX_COMPILER=clang++-14 -DKVHARBOR_THREAD_SAFETY=ON \
    -DKVHARBOR_CUDA=OFF -DKVHARBOR_BUILD_TESTS=OFF -DKVHARBOR_BUILD_BENCH=OFF \
    -DKVHARBOR_BUILD_CAPI=OFF -DKVHARBOR_CUDA_HOST_CHECK=ON \
    -DKVHARBOR_CUDA_INCLUDE_DIR=/usr/local/cuda/include >/dev/null
  BUILD_DIR=build-thread-safety python3 scripts/check_thread_safety.py
fi
stage_end
echo "kvharbor: build directories: $(du -shc build* 2>/dev/null | tail -1 | cut -f1)"
echo "kvharbor: all test stages passed"
