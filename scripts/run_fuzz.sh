#!/usr/bin/env bash
# Builds the libFuzzer targets (clang-14, ASan + UBSan) in build-fuzz/ and runs
# each fuzz/<name>_fuzz.cc for SECONDS seconds over its checked-in corpus
# fuzz/corpus/<name>/ (read-only: new inputs go to build-fuzz/corpus/<name>/).
# Exits non-zero when a target crashes; the reproducer is in
# build-fuzz/artifacts/<name>/.
#   usage: scripts/run_fuzz.sh SECONDS
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=${1:?usage: scripts/run_fuzz.sh SECONDS}
BUILD_DIR=${FUZZ_BUILD_DIR:-build-fuzz}
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  CC=clang-14 CXX=clang++-14 cmake -S . -B "$BUILD_DIR" "${GEN[@]}" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVHARBOR_CUDA=OFF \
    -DKVHARBOR_BUILD_FUZZ=ON -DKVHARBOR_BUILD_TESTS=OFF -DKVHARBOR_BUILD_BENCH=OFF
fi
targets=()
for src in fuzz/*_fuzz.cc; do
  targets+=("$(basename "$src" .cc)")
done
cmake --build "$BUILD_DIR" -j"$(nproc)" --target "${targets[@]}"

status=0
for target in "${targets[@]}"; do
  name=${target%_fuzz}
  work="$BUILD_DIR/corpus/$name"
  artifacts="$BUILD_DIR/artifacts/$name/"
  mkdir -p "$work" "$artifacts" "fuzz/corpus/$name"
  echo "== $target: ${SECONDS_PER_TARGET}s =="
  if ! "$BUILD_DIR/fuzz/$target" -max_total_time="$SECONDS_PER_TARGET" \
      -print_final_stats=1 -artifact_prefix="$artifacts" -timeout=25 \
      -rss_limit_mb=2048 "$work" "fuzz/corpus/$name"; then
    echo "FAILED: $target (reproducer in $artifacts)" >&2
    status=1
  fi
done
exit $status
