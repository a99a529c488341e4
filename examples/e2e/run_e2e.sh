#!/usr/bin/env bash
# End-to-end run with a real model (stories260K, llama2.c): starts kvharbord,
# runs worker A (calibrates KVTC on the model's KV, prefills prompts sharing a
# long prefix, stores their pages, demotes the KVTC namespace) and then worker
# B (another process: matches new prompts, fetches the pages RAW and
# COMPRESSED, continues generation from them and checks against a recompute),
# prints a results table and exits non-zero when any check fails.
#
# usage: examples/e2e/run_e2e.sh [BIN_DIR]
#   BIN_DIR: a build directory (server/kvharbord, tools/kvharbor-calibrate,
#            capi/libkvharbor_c.so; default build/) or a gpu-bundle folder
#            (bin/ holding the three, lib/ the libraries).
# Environment (each optional): KVHARBORD, KVHARBOR_CALIBRATE,
#   KVHARBOR_LIB (override single paths), PYTHON (an interpreter with torch
#   and numpy; default: python3, else /usr/bin/python3), MODEL_DIR (default
#   ../shared/stories260K, else shared/stories260K, else BIN_DIR/tools), WORK (output folder; default a new temp dir),
#   KVTC_RATIO (calibration target vs fp32 rows, default 8), E2E_DEVICE
#   (cpu|cuda; default cuda when available), REPEATS (timing repeats, 5).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BIN=$(cd "${1:-$REPO/build}" && pwd)

find_file() {  # NAME SUBDIR: the first existing candidate
  local c
  for c in "$BIN/$2/$1" "$BIN/bin/$1" "$BIN/$1"; do
    if [ -f "$c" ]; then echo "$c"; return 0; fi
  done
  echo "run_e2e: $1 not found under $BIN ($2/, bin/ or top level)" >&2
  return 1
}
KVHARBORD=${KVHARBORD:-$(find_file kvharbord server)}
KVHARBOR_CALIBRATE=${KVHARBOR_CALIBRATE:-$(find_file kvharbor-calibrate tools)}
export KVHARBOR_LIB=${KVHARBOR_LIB:-$(find_file libkvharbor_c.so capi)}
if [ -d "$BIN/lib" ]; then  # a gpu-bundle: its libraries travel in lib/
  export LD_LIBRARY_PATH="$BIN/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
if [ -z "${MODEL_DIR:-}" ]; then
  for d in "$REPO/../shared/stories260K" "$REPO/shared/stories260K" "$BIN/tools"; do
    if [ -f "$d/stories260K.bin" ]; then MODEL_DIR=$d; break; fi
  done
fi
if [ -z "${MODEL_DIR:-}" ] || [ ! -f "$MODEL_DIR/stories260K.bin" ]; then
  echo "run_e2e: stories260K not found (set MODEL_DIR)" >&2
  exit 2
fi
WORK=${WORK:-$(mktemp -d /tmp/kvharbor-e2e.XXXXXX)}
mkdir -p "$WORK"
KVTC_RATIO=${KVTC_RATIO:-8}
REPEATS=${REPEATS:-5}

if [ -z "${PYTHON:-}" ]; then
  for p in python3 /usr/bin/python3; do
    if "$p" -c 'import torch, numpy' 2>/dev/null; then PYTHON=$p; break; fi
  done
fi
if [ -z "${PYTHON:-}" ]; then
  echo "run_e2e: no python3 with torch and numpy (Debian: apt-get install -y python3-torch)" >&2
  exit 2
fi

"$KVHARBORD" --listen=127.0.0.1:0 --metrics_listen= --pool_bytes=512MiB >"$WORK/kvharbord.log" 2>&1 &
DPID=$!
cleanup() {
  if kill -0 "$DPID" 2>/dev/null; then
    kill -TERM "$DPID"
    wait "$DPID" || true
  fi
}
trap cleanup EXIT
ADDR=
for _ in $(seq 200); do
  ADDR=$(grep -oE 'serving on [0-9.]+:[0-9]+' "$WORK/kvharbord.log" | head -1 | cut -d' ' -f3 || true)
  [ -n "$ADDR" ] && break
  kill -0 "$DPID" 2>/dev/null || break
  sleep 0.1
done
if [ -z "$ADDR" ]; then
  echo "run_e2e: kvharbord did not start:" >&2
  cat "$WORK/kvharbord.log" >&2
  exit 2
fi
echo "run_e2e: kvharbord $KVHARBORD on $ADDR; python $("$PYTHON" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__)'); work $WORK"

cd "$HERE"
common=(--addr "$ADDR" --model-dir "$MODEL_DIR" --work "$WORK")
dev=()
[ -n "${E2E_DEVICE:-}" ] && dev=(--device "$E2E_DEVICE")
"$PYTHON" worker_a.py "${common[@]}" "${dev[@]}" --calibrate "$KVHARBOR_CALIBRATE" \
  --kvtc-ratio "$KVTC_RATIO"
rc=0
"$PYTHON" worker_b.py "${common[@]}" "${dev[@]}" --repeats "$REPEATS" || rc=$?
echo "run_e2e: results in $WORK (worker_a.json, worker_b.json, kvharbord.log)"
exit $rc
