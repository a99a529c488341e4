#!/usr/bin/env bash
# Long fuzz campaign: every libFuzzer target at once, for SECONDS seconds of
# wall time on JOBS processes in total, then one table of executions and
# crashes per target. Exits non-zero when any process crashed, leaked, timed
# out, ran out of memory or printed a sanitizer report.
#   usage: scripts/fuzz_campaign.sh SECONDS JOBS [OUT]
#
# Sharing the JOBS x SECONDS process-seconds: the goal is the same number of
# executions for every target, up to FUZZ_GOAL (default 10 million, what
# issue 10 asks for), so a target gets process-seconds in inverse
# proportion to its executions per second per process (its "rate"): at
# least a quarter of an equal share, at most half of all, and no more than
# reaching the goal takes while a slower target is short of it. Rates come from $FUZZ_RATES, else fuzz_rates.txt beside the corpora
# (measured here; each campaign writes the rates it saw into OUT/rates.txt,
# which a later run on the same machine can take as FUZZ_RATES). The shares
# are laid end to end on one timeline and cut into JOBS lanes of SECONDS
# (McNaughton's wrap-around rule): a lane runs its segments one after the
# other, one libFuzzer process each (-max_total_time = the segment), so at
# most JOBS processes run at any time. A target whose share exceeds SECONDS
# runs on several lanes at once; its processes share one work corpus
# (libFuzzer reloads it every 10 s). With JOBS < number of targets, targets
# take turns on the lanes.
#
# Each process reads the target's checked-in corpus (never written) and puts
# new units into a scratch work corpus. OUT receives few files (the device
# tool brings back at most 8): summary.txt (the table), rates.txt,
# logs.tar.xz (every process's log), crashes.tar.xz (reproducers, only when
# there are any) and corpus.tar.xz (the work corpora, when under 15 MiB).
#
# Layouts: run from a bundle made by scripts/fuzz_bundle.sh (bin/, lib/,
# corpus/ beside this script; lib/ goes on LD_LIBRARY_PATH), or from the
# repository after scripts/run_fuzz.sh built build-fuzz/ (FUZZ_BUILD_DIR).
# FUZZ_TARGETS="a b" limits the targets; FUZZ_WORK_DIR keeps the scratch
# folder (default: a temporary one, removed at the end); FUZZ_DETECT_LEAKS=0
# turns LeakSanitizer off where it cannot run (it needs ptrace);
# FUZZ_PLAN_ONLY=1 prints the lanes and runs nothing.
set -euo pipefail
shopt -s nullglob
usage="usage: fuzz_campaign.sh SECONDS JOBS [OUT]"
DURATION=${1:?$usage}
JOBS=${2:?$usage}
[[ $DURATION =~ ^[0-9]+$ && $JOBS =~ ^[0-9]+$ && $DURATION -ge 5 &&
  $JOBS -ge 1 ]] || { echo "$usage (SECONDS >= 5, JOBS >= 1)" >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd)

if [ -d "$HERE/bin" ] && [ -d "$HERE/corpus" ]; then
  BIN_DIR=$HERE/bin
  CORPUS_DIR=$HERE/corpus
  RATES_DEFAULT=$HERE/fuzz_rates.txt
  export LD_LIBRARY_PATH="$HERE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  OUT=${3:-$PWD/fuzz-campaign}
else
  ROOT=$(cd "$HERE/.." && pwd)
  BIN_DIR=$ROOT/${FUZZ_BUILD_DIR:-build-fuzz}/fuzz
  CORPUS_DIR=$ROOT/fuzz/corpus
  RATES_DEFAULT=$ROOT/fuzz/fuzz_rates.txt
  OUT=${3:-$ROOT/${FUZZ_BUILD_DIR:-build-fuzz}/campaign}
fi
RATES=${FUZZ_RATES:-$RATES_DEFAULT}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

targets=()
if [ -n "${FUZZ_TARGETS:-}" ]; then
  for t in $FUZZ_TARGETS; do targets+=("${t%_fuzz}"); done
else
  for b in "$BIN_DIR"/*_fuzz; do
    [ -x "$b" ] && targets+=("$(basename "$b" _fuzz)")
  done
fi
[ ${#targets[@]} -gt 0 ] || { echo "no *_fuzz binaries in $BIN_DIR" >&2; exit 2; }
for t in "${targets[@]}"; do
  [ -x "$BIN_DIR/${t}_fuzz" ] || { echo "missing $BIN_DIR/${t}_fuzz" >&2; exit 2; }
  [ -d "$CORPUS_DIR/$t" ] || { echo "missing corpus $CORPUS_DIR/$t" >&2; exit 2; }
done

if [ -n "${FUZZ_WORK_DIR:-}" ]; then
  WORK=$FUZZ_WORK_DIR
  mkdir -p "$WORK"
else
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/fuzz_campaign.XXXXXX")
  trap 'rm -rf "$WORK"' EXIT
fi
mkdir -p "$WORK/logs" "$WORK/artifacts" "$WORK/corpus" "$WORK/rc"

# ---- Shares and lanes (awk: present on every machine this runs on).
# plan lines: lane seconds target (in lane order).
printf '%s\n' "${targets[@]}" > "$WORK/targets"
awk -v P=$((DURATION * JOBS)) -v S="$DURATION" -v J="$JOBS" \
    -v G="${FUZZ_GOAL:-10000000}" '
  function clamp(x, a, b) { return x < a ? a : (x > b ? b : x) }
  FNR == NR { if ($1 !~ /^#/ && NF >= 2 && $2 > 0) rate[$1] = $2; next }
  { t[++n] = $1 }
  END {
    # Unknown targets get the median-free fallback: the slowest known rate.
    slow = 0
    for (k in rate) if (slow == 0 || rate[k] < slow) slow = rate[k]
    if (slow == 0) slow = 1
    for (i = 1; i <= n; i++) r[i] = (t[i] in rate) ? rate[t[i]] : slow
    # At least a quarter of an equal share, and 10 s (startup is ~1 s);
    # at most half of all (one slow target must not starve the others), and
    # no more than reaching G executions needs while others could use it.
    m = P / (4 * n); if (m < 10) m = (S < 10 ? S : 10)
    if (m * n > P) m = P / n
    if (m < 5) m = 5  # then not every target gets time (warned below)
    half = n > 1 ? P / 2 : P
    for (pass = 1; pass <= 2; pass++) {
      for (i = 1; i <= n; i++) {
        cap[i] = half
        if (pass == 1 && G / r[i] < cap[i]) cap[i] = G / r[i]
        if (cap[i] < m) cap[i] = m
      }
      # Water-filling: s_i = clamp(c / r_i, m, cap_i), sum s_i = P (bisect c).
      lo = 0; hi = P * 1e12
      for (it = 0; it < 200; it++) {
        c = (lo + hi) / 2; sum = 0
        for (i = 1; i <= n; i++) sum += clamp(c / r[i], m, cap[i])
        if (sum > P) hi = c; else lo = c
      }
      sum = 0
      for (i = 1; i <= n; i++) sum += clamp(hi / r[i], m, cap[i])
      if (sum >= P - 1) break  # else everyone reaches G: share the rest
    }
    acc = 0
    for (i = 1; i <= n; i++) {
      share[i] = int(clamp(lo / r[i], m, cap[i])); acc += share[i]
    }
    # Integer seconds: the rounding remainder goes to the slowest target.
    worst = 1
    for (i = 2; i <= n; i++) if (r[i] < r[worst]) worst = i
    share[worst] += P - acc
    # McNaughton: lay shares end to end, cut every S seconds into a lane.
    # Pieces under 5 s (a process would mostly start up) are dropped, so a
    # lane may end a few seconds early but never runs past S.
    lane = 0; used = 0
    for (i = 1; i <= n && lane < J; i++) {
      left = share[i]
      while (left > 0 && lane < J) {
        room = S - used
        piece = left < room ? left : room
        if (piece >= 5 || piece == left && left == share[i]) {
          print lane, piece, t[i]
          used += piece
        }
        left -= piece
        if (S - used < 5) { lane++; used = 0 }
      }
    }
  }' <(echo "# rates"; cat "$RATES" 2>/dev/null || true) "$WORK/targets" \
  > "$WORK/plan"

for t in "${targets[@]}"; do
  awk -v t="$t" '$3 == t { f = 1 } END { exit !f }' "$WORK/plan" ||
    echo "WARNING: $t gets no time (SECONDS x JOBS too small for every target)" >&2
done
if [ "${FUZZ_PLAN_ONLY:-0}" = 1 ]; then  # the lanes, and nothing run
  awk '{ print "lane " $1 ": " $3 " " $2 "s" }' "$WORK/plan"
  exit 0
fi
echo "== fuzz campaign: ${#targets[@]} targets, ${DURATION}s x $JOBS processes"
echo "   binaries $BIN_DIR, corpora $CORPUS_DIR (read-only), rates $RATES"
echo "   scratch $WORK, results $OUT"

# One lane: its segments one after the other. A segment's process gets
# -max_total_time; `timeout` only guards against one that never stops.
run_lane() {
  local lane=$1 seg=0 secs target log left
  while read -r l secs target; do
    [ "$l" = "$lane" ] || continue
    # Startups and exits add up along a lane: the lane's last segments
    # give that time back so the lane ends at SECONDS.
    left=$((END - $(date +%s)))
    [ "$left" -lt "$secs" ] && secs=$left
    [ "$secs" -ge 3 ] || break
    log="$WORK/logs/$target.lane$lane.$seg.log"
    mkdir -p "$WORK/corpus/$target" "$WORK/artifacts/$target"
    local rc=0
    ASAN_OPTIONS="detect_leaks=${FUZZ_DETECT_LEAKS:-1}:${ASAN_OPTIONS:-}" \
      timeout -k 10 $((secs + 60)) "$BIN_DIR/${target}_fuzz" \
      -max_total_time="$secs" -print_final_stats=1 -timeout=25 \
      -rss_limit_mb=2048 -artifact_prefix="$WORK/artifacts/$target/" \
      "$WORK/corpus/$target" "$CORPUS_DIR/$target" > "$log" 2>&1 || rc=$?
    echo "$rc $secs" > "$WORK/rc/$target.lane$lane.$seg"
    seg=$((seg + 1))
  done < "$WORK/plan"
}

start=$(date +%s)
END=$((start + DURATION))
pids=()
while read -r lane; do
  run_lane "$lane" &
  pids+=($!)
done < <(cut -d' ' -f1 "$WORK/plan" | sort -un)
for p in "${pids[@]}"; do wait "$p"; done
wall=$(($(date +%s) - start))

# ---- Executions per log: libFuzzer's final stat::number_of_executed_units
# (printed at exit with -print_final_stats=1, and after a crash report);
# when a process died without it, its last status line "#N ..." (a lower
# bound, marked with ~ in the table).
log_execs() {
  awk '/^stat::number_of_executed_units:/ { final = $2 }
       /^#[0-9]+[ \t]/ { n = substr($1, 2) + 0; if (n > last) last = n }
       END { if (final != "") print final, 0; else print last + 0, 1 }' "$1"
}
failure_re='ERROR: (AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer|libFuzzer)|runtime error:|^check failed:|^SUMMARY: |==[0-9]+==ERROR'

status=0
table=$(printf '%-18s %6s %8s %14s %10s %8s\n' target jobs proc_s executions exec/s crashes)
: > "$OUT/rates.txt"
echo "# exec/s per process, measured by fuzz_campaign.sh $DURATION $JOBS on $(hostname) $(date -u +%FT%TZ)" >> "$OUT/rates.txt"
for t in "${targets[@]}"; do
  rcs=("$WORK/rc/$t".lane*)
  secs=$(cat "${rcs[@]}" /dev/null | awk '{ s += $2 } END { print s + 0 }')
  execs=0; approx=""; crashes=0
  for log in "$WORK/logs/$t".lane*.log; do
    [ -f "$log" ] || continue
    read -r n est < <(log_execs "$log")
    execs=$((execs + n))
    [ "$est" = 1 ] && approx="~"
    rcfile="$WORK/rc/$(basename "$log" .log)"
    rc=$(cut -d' ' -f1 "$rcfile" 2>/dev/null || echo missing)
    if [ "$rc" != 0 ] || grep -qE "$failure_re" "$log"; then
      crashes=$((crashes + 1))
      echo "FAILED: $t (exit $rc), log $(basename "$log"):" >&2
      grep -E "$failure_re" "$log" | head -n 5 >&2 || true
    fi
  done
  artifacts=$( (find "$WORK/artifacts/$t" -type f 2>/dev/null || true) | wc -l)
  [ "$artifacts" -gt "$crashes" ] && crashes=$artifacts
  [ "$crashes" -gt 0 ] && status=1
  rate=$(awk -v e="$execs" -v s="$secs" 'BEGIN { printf "%d", s ? e / s : 0 }')
  echo "$t $rate" >> "$OUT/rates.txt"
  jobs=$(awk -v s="$secs" -v d="$DURATION" 'BEGIN { printf "%.2f", s / d }')
  note=""
  if [ "$secs" = 0 ]; then
    note="  NO TIME (lane ran out: startups on an overloaded machine?)"
    echo "WARNING: $t never ran" >&2
  fi
  table+=$'\n'$(printf '%-18s %6s %8s %14s %10s %8s%s' "$t" "$jobs" "$secs" \
    "$approx$execs" "$rate" "$crashes" "$note")
done

{
  echo "== fuzz campaign summary: ${DURATION}s on $JOBS processes, wall ${wall}s, $(date -u +%FT%TZ)"
  echo "   jobs = process-seconds / SECONDS; ~ = lower bound (a process ended without final stats)"
  echo "$table"
  [ $status = 0 ] && echo "== no crash, leak, timeout or sanitizer report" ||
    echo "== FAILED: see the logs and crashes.tar.xz"
} | tee "$OUT/summary.txt"

# ---- Results into OUT as few files.
tar -C "$WORK" -cJf "$OUT/logs.tar.xz" logs rc plan
if [ -n "$(find "$WORK/artifacts" -type f)" ]; then
  tar -C "$WORK" -cJf "$OUT/crashes.tar.xz" artifacts
  echo "== reproducers in $OUT/crashes.tar.xz"
fi
tar -C "$WORK" -cJf "$OUT/corpus.tar.xz" corpus
if [ "$(du -m "$OUT/corpus.tar.xz" | cut -f1)" -ge 15 ]; then
  echo "== work corpus too large to bring back ($(du -h "$OUT/corpus.tar.xz" | cut -f1)); dropped"
  rm -f "$OUT/corpus.tar.xz"
fi
exit $status
