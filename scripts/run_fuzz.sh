#!/usr/bin/env bash
# Builds the libFuzzer targets (clang-14, ASan + UBSan; line tables only, -g1,
# enough for a crash's stack) in build-fuzz/ and runs
# each fuzz/<name>_fuzz.cc for SECONDS seconds over its checked-in corpus
# fuzz/corpus/<name>/ (read-only: new inputs go to build-fuzz/corpus/<name>/).
# With JOBS > 1 each target runs as JOBS parallel libFuzzer jobs (-jobs,
# -workers: JOBS processes, each for SECONDS seconds, sharing the work
# corpus), e.g. on a many-core machine for the long campaign. Prints the
# total executions per target (sum of stat::number_of_executed_units over
# its jobs) and a summary table at the end.
# Exits non-zero when a target crashes (or leaks, times out, runs out of
# memory); the reproducer is in build-fuzz/artifacts/<name>/, the job logs in
# build-fuzz/logs/<name>/.
#   usage: scripts/run_fuzz.sh SECONDS [JOBS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SECONDS_PER_TARGET=${1:?usage: scripts/run_fuzz.sh SECONDS [JOBS] [TARGET...]}
JOBS=${2:-1}
shift $(($# < 2 ? $# : 2))
BUILD_DIR=${FUZZ_BUILD_DIR:-build-fuzz}
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  CC=clang-14 CXX=clang++-14 cmake -S . -B "$BUILD_DIR" "${GEN[@]}" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVHARBOR_CUDA=OFF \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
    -DKVHARBOR_BUILD_FUZZ=ON -DKVHARBOR_BUILD_TESTS=OFF -DKVHARBOR_BUILD_BENCH=OFF
fi
targets=()
if [ $# -gt 0 ]; then
  for name in "$@"; do targets+=("${name%_fuzz}_fuzz"); done
else
  for src in fuzz/*_fuzz.cc; do
    targets+=("$(basename "$src" .cc)")
  done
fi
cmake --build "$BUILD_DIR" -j"$(nproc)" --target "${targets[@]}"

status=0
summary=()
for target in "${targets[@]}"; do
  name=${target%_fuzz}
  work="$ROOT/$BUILD_DIR/corpus/$name"
  artifacts="$ROOT/$BUILD_DIR/artifacts/$name/"
  logs="$ROOT/$BUILD_DIR/logs/$name"
  rm -rf "$logs"
  mkdir -p "$work" "$artifacts" "$logs" "fuzz/corpus/$name"
  before=$(find "$artifacts" -type f | wc -l)
  echo "== $target: ${SECONDS_PER_TARGET}s x $JOBS job(s) =="
  args=(-max_total_time="$SECONDS_PER_TARGET" -print_final_stats=1
        -artifact_prefix="$artifacts" -timeout=25 -rss_limit_mb=2048
        "$work" "$ROOT/fuzz/corpus/$name")
  rc=0
  if [ "$JOBS" -le 1 ]; then
    "$ROOT/$BUILD_DIR/fuzz/$target" "${args[@]}" > "$logs/fuzz-0.log" 2>&1 || rc=$?
  else
    # -jobs writes fuzz-<i>.log into the working directory.
    (cd "$logs" && "$ROOT/$BUILD_DIR/fuzz/$target" -jobs="$JOBS" \
      -workers="$JOBS" "${args[@]}" > parent.log 2>&1) || rc=$?
  fi
  tail -n 3 "$logs"/fuzz-*.log | grep -v '^$' || true
  execs=$(cat "$logs"/fuzz-*.log | awk '/stat::number_of_executed_units/ {s += $2}
    END {print s + 0}')
  after=$(find "$artifacts" -type f | wc -l)
  if [ "$rc" != 0 ] || [ "$after" != "$before" ] ||
      grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:' \
        "$logs"/*.log; then
    echo "FAILED: $target (reproducer in $artifacts, logs in $logs)" >&2
    status=1
    summary+=("$(printf '%-20s %12s executions  FAILED' "$target" "$execs")")
  else
    summary+=("$(printf '%-20s %12s executions  ok' "$target" "$execs")")
  fi
  echo "== $target: $execs executions in total"
done
echo "== fuzz summary (${SECONDS_PER_TARGET}s x $JOBS job(s) per target) =="
printf '%s\n' "${summary[@]}"
exit $status
