#!/usr/bin/env bash
# The one script run on the GPU machine, from the bundle made by
# scripts/gpu_bundle.sh (nothing is built there):  bash .gpu/bin/gpu_checks.sh
# Runs every bundled test binary (kvharbor_*_tests; on a machine with a build
# tree, `ctest -L gpu` runs the same binaries) and benchmark
# (kvharbor_bench_*), then, from the checkout the bundle was unpacked in, the
# Python programs that drive a real HF generation loop through kvharbor:
# bench/hit_correctness.py (stories260K, identity hits must continue exactly),
# bench/ttft_bench.py (TTFT of every hit path against prefill, Llama-3.1-8B
# config, random weights; JSON to $OUT/ttft_bench.json) and
# bench/pd_handoff_bench.py (prefill in one process, load and decode in a
# second one with a remote client, raw and KVTC, at 4K/16K/32K; JSON to
# $OUT/pd_handoff_bench.json), and the Python
# tests of torch buffers, the engine API, CUDA layouts (test_layout) and
# the engine integrations with CUDA caches (engine_integrations). They need $PYTHON
# (default python3) with torch and transformers; without them they count as
# failed. Everything is printed; with $OUT set, the whole output also goes to
# $OUT/gpu_checks.log. GPU_CHECKS_ONLY, a bash regular expression, runs only
# the programs whose names match it (e.g. 'ttft_bench|hit_correctness'), so
# the checks can be split over several device calls; the default runs all.
# Exit status: number of failed programs.
set -uo pipefail
BIN=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH="$BIN/../lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
LOG=/dev/null
if [ -n "${OUT:-}" ]; then mkdir -p "$OUT"; LOG="$OUT/gpu_checks.log"; fi
TEST_TIMEOUT=${TEST_TIMEOUT:-170}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-140}
# hit_path_bench: every hit path at 4K and 32K tokens, the host KVTC rows in
# each GEMM mode, stage_cold and the insert rows.
HIT_BENCH_TIMEOUT=${HIT_BENCH_TIMEOUT:-300}
# layerwise_load_bench: whole loads against 32 one-layer and 8 four-layer
# fetches on three paths at 4K and 32K tokens.
LAYERWISE_BENCH_TIMEOUT=${LAYERWISE_BENCH_TIMEOUT:-240}
HIT_TIMEOUT=${HIT_TIMEOUT:-300}
TTFT_TIMEOUT=${TTFT_TIMEOUT:-420}
# pd_handoff_bench: two model builds, a calibration, then raw and KVTC
# handoffs at 4K, 16K and 32K (its --budget-s stops further repeats at 300 s).
PD_TIMEOUT=${PD_TIMEOUT:-480}
ROOT=$(cd "$BIN/../.." && pwd)
PYTHON=${PYTHON:-python3}

ONLY=${GPU_CHECKS_ONLY:-.}

wanted() {  # name: whether GPU_CHECKS_ONLY selects it
  [[ $1 =~ $ONLY ]] && return 0
  echo "=== $1: skipped (GPU_CHECKS_ONLY=$ONLY)"
  return 1
}

run() {  # name, timeout, command...
  local name=$1 limit=$2
  shift 2
  echo "=== $name: $* (timeout ${limit}s)"
  local t0=$SECONDS
  timeout "$limit" "$@"
  local rc=$?
  echo "=== $name: exit $rc after $((SECONDS - t0)) s"
  return $rc
}

main() {
  echo "=== gpu_checks on $(hostname) at $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm \
    --format=csv 2>&1 || true
  local failed=0 summary=""
  for exe in "$BIN"/kvharbor_*_tests; do
    [ -x "$exe" ] || continue
    wanted "$(basename "$exe")" || continue
    run "$(basename "$exe")" "$TEST_TIMEOUT" "$exe" --durations yes
    local rc=$?
    # 77: the test main found no CUDA device (tests/gpu_catch_main.cc) or a
    # test skipped itself (tests/skip.h); here, on the GPU machine, that is
    # a failed check, named as such.
    local note=""
    [ $rc -eq 77 ] && note=" (skipped: no CUDA device, or a test skipped)"
    summary+="$(basename "$exe"): exit $rc$note"$'\n'
    [ $rc -eq 0 ] || failed=$((failed + 1))
  done
  for exe in "$BIN"/kvharbor_bench_*; do
    [ -x "$exe" ] || continue
    wanted "$(basename "$exe")" || continue
    local limit=$BENCH_TIMEOUT
    [ "$(basename "$exe")" = kvharbor_bench_hit_path_bench ] &&
      limit=$HIT_BENCH_TIMEOUT
    [ "$(basename "$exe")" = kvharbor_bench_layerwise_load_bench ] &&
      limit=$LAYERWISE_BENCH_TIMEOUT
    if [ "$(basename "$exe")" = kvharbor_bench_ucx_link_bench ]; then
      # The bundle carries UCX's core libraries (TCP is built into libuct),
      # not its modules: an empty module dir keeps this UCX from loading
      # another version's modules from the machine (docs/data_plane.md).
      mkdir -p "${OUT:-/tmp}/ucx_modules_none"
      run "$(basename "$exe")" "$limit" env UCX_MODULE_DIR="${OUT:-/tmp}/ucx_modules_none" "$exe"
    else
      run "$(basename "$exe")" "$limit" "$exe"
    fi
    local rc=$?
    summary+="$(basename "$exe"): exit $rc"$'\n'
    [ $rc -eq 0 ] || failed=$((failed + 1))
  done
  local py
  for py in hit_correctness ttft_bench pd_handoff_bench; do
    wanted $py || continue
    local limit=$HIT_TIMEOUT
    [ $py = ttft_bench ] && limit=$TTFT_TIMEOUT
    [ $py = pd_handoff_bench ] && limit=$PD_TIMEOUT
    if ! "$PYTHON" -c "import torch, transformers" 2>/dev/null; then
      echo "=== $py: $PYTHON cannot import torch and transformers"
      summary+="$py: not run (no torch/transformers)"$'\n'
      failed=$((failed + 1))
      continue
    fi
    PYTHONPATH="$ROOT/python" KVHARBOR_LIB="$BIN/../lib/libkvharbor_c.so" \
      KVHARBORD="$BIN/kvharbord" KVHARBOR_CALIBRATE="$BIN/kvharbor-calibrate" \
      STORIES260K_DIR="$BIN/../share/stories260K" \
      KVHARBOR_TCP_LINK_BENCH="$BIN/kvharbor_bench_tcp_link_bench" \
      run "$py" "$limit" "$PYTHON" "$ROOT/bench/$py.py"
    local rc=$?
    summary+="$py: exit $rc"$'\n'
    [ $rc -eq 0 ] || failed=$((failed + 1))
  done
  # CUDA tensors where the Python client takes a buffer, the engine API
  # (test_engine_api, host buffers through the bundle's CUDA-built library),
  # fetches into and inserts from CUDA layouts (test_layout's GpuLayoutTest:
  # insert_from_layout served by device_ipc, fetched back bit-identical,
  # and the pinned fallback; KVHARBOR_GPU_TIER=1: the bundle's kvharbord
  # has the GPU tier) and the engine integrations on CUDA tensors: the
  # replayed vLLM call sequence (tests/python/vllm_sim.py) with the paged
  # caches on the GPU.
  if wanted engine_integrations; then
    if "$PYTHON" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
      (cd "$ROOT/tests/python" && PYTHONPATH="$ROOT/python" \
        KVHARBOR_LIB="$BIN/../lib/libkvharbor_c.so" KVHARBORD="$BIN/kvharbord" \
        KVHARBOR_TEST_DEVICE=cuda KVHARBOR_GPU_TIER=1 \
        run engine_integrations "$TEST_TIMEOUT" "$PYTHON" -m unittest -v \
        test_torch_buffers test_engine_api test_layout test_vllm_connector test_vllm_class \
        test_sglang_backend)
      local rc=$?
    else
      echo "=== engine_integrations: $PYTHON has no CUDA torch"
      local rc=1
    fi
    summary+="engine_integrations: exit $rc"$'\n'
    [ $rc -eq 0 ] || failed=$((failed + 1))
  fi
  echo "=== summary"
  printf '%s' "$summary"
  echo "=== $failed program(s) failed"
  return $failed
}

main 2>&1 | tee "$LOG"
exit "${PIPESTATUS[0]}"
