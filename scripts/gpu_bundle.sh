#!/usr/bin/env bash
# Builds the GPU binaries here (no GPU needed; build dir build-cuda) and
# bundles them, stripped, with the libraries they need into .gpu/ (ignored by
# git) for the GPU machine, together with scripts/gpu_checks.sh, the one
# script run there:  bash .gpu/bin/gpu_checks.sh (packed into .gpupack/gpu.tar.xz
# to fit the device tool's transfer limit)
# Extra arguments are more files to bundle (e.g. another test binary); a
# bundled kvharbor_*_tests or kvharbor_bench_* binary is run by gpu_checks.sh.
# The daemon with its GPU tier plugin, the C ABI library (both moved to
# .gpu/lib) and kvharbor-calibrate are always bundled, with stories260K from
# $SHARED/stories260K (default ../shared) in .gpu/share/stories260K, for
# the Python programs gpu_checks.sh runs from the checkout
# (bench/hit_correctness.py, bench/ttft_bench.py, bench/pd_handoff_bench.py);
# kvharbor_hit_path_tests,
# kvharbor_gpu_daemon_tests and the hit-path, IPC-insert and layer-wise load
# benchmarks start
# the bundled kvharbord as their daemons. From a git worktree set
# SHARED=/work/shared (../shared is not the shared folder there).
# Environment: BUILD_DIR (default build-cuda) picks the build directory,
# JOBS (default 2) the build parallelism, BUNDLE_BENCH=0 leaves the KVTC GPU
# benchmark out (tests only, a shorter device run).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-cuda}
JOBS=${JOBS:-2}
BUNDLE_BENCH=${BUNDLE_BENCH:-1}
SHARED=${SHARED:-../shared}
TARGETS=(kvharbor_cuda_tests kvharbor_gpu_tier_tests kvharbor_device_ipc_tests
         kvharbor_ipc_peer kvharbor_hit_path_tests kvharbor_gpu_daemon_tests
         kvharbord kvharbor_gpu_tier kvharbor_c kvharbor-calibrate)
files=("$BUILD_DIR/tests/kvharbor_cuda_tests"
       "$BUILD_DIR/tests/kvharbor_gpu_tier_tests"
       "$BUILD_DIR/tests/kvharbor_device_ipc_tests"
       "$BUILD_DIR/tests/kvharbor_ipc_peer"
       "$BUILD_DIR/tests/kvharbor_hit_path_tests"
       "$BUILD_DIR/tests/kvharbor_gpu_daemon_tests"
       "$BUILD_DIR/server/kvharbord"
       "$BUILD_DIR/server/libkvharbor_gpu_tier.so"
       "$BUILD_DIR/capi/libkvharbor_c.so"
       "$BUILD_DIR/tools/kvharbor-calibrate")
if [ "$BUNDLE_BENCH" != 0 ]; then
  TARGETS+=(kvharbor_bench_kvtc_gpu_bench kvharbor_bench_gpu_tier_bench
            kvharbor_bench_hit_path_bench kvharbor_bench_gpu_ipc_insert_bench
            kvharbor_bench_layerwise_load_bench
            kvharbor_bench_rpc_fetch_pack_bench kvharbor_bench_tcp_link_bench
            kvharbor_bench_ucx_link_bench)
  files+=("$BUILD_DIR/bench/kvharbor_bench_kvtc_gpu_bench"
          "$BUILD_DIR/bench/kvharbor_bench_gpu_tier_bench"
          "$BUILD_DIR/bench/kvharbor_bench_hit_path_bench"
          "$BUILD_DIR/bench/kvharbor_bench_gpu_ipc_insert_bench"
          "$BUILD_DIR/bench/kvharbor_bench_layerwise_load_bench"
          "$BUILD_DIR/bench/kvharbor_bench_rpc_fetch_pack_bench"
          "$BUILD_DIR/bench/kvharbor_bench_tcp_link_bench"
          "$BUILD_DIR/bench/kvharbor_bench_ucx_link_bench")
fi
files+=("$@")
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DKVHARBOR_CUDA=ON -DKVHARBOR_GPU_TIER=ON -DKVHARBOR_BUILD_BENCH=ON
fi
cmake --build "$BUILD_DIR" -j"$JOBS" --target "${TARGETS[@]}"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
for f in "${files[@]}"; do
  cp -L "$f" "$stage/"
  if file -L "$f" | grep -q ELF; then strip -s "$stage/$(basename "$f")"; fi
done
cp scripts/gpu_checks.sh "$stage/"
rm -rf .gpu
bash "$SHARED/tools/gpu-bundle" .gpu "$stage"/*
chmod +x .gpu/bin/*
mv .gpu/bin/libkvharbor_c.so .gpu/lib/
# kvharbord loads its GPU tier plugin from ../lib (server/daemon/device_setup.h).
mv .gpu/bin/libkvharbor_gpu_tier.so .gpu/lib/
mkdir -p .gpu/share/stories260K
cp "$SHARED"/stories260K/{stories260K.bin,tok512.bin,validation_100.txt} .gpu/share/stories260K/
for lib in .gpu/lib/*; do
  # shellcheck disable=SC2015  # best effort: a library strip refuses stays as it is
  [ -f "$lib" ] && strip --strip-unneeded "$lib" 2>/dev/null || true
done
# The device tool carries at most 64 MiB and libopenblas alone is 36 MiB:
# carry .gpupack (the xz tarball, about a fifth of the size) and unpack it
# there with `tar -xJf .gpupack/gpu.tar.xz`.
mkdir -p .gpupack
tar -cJf .gpupack/gpu.tar.xz .gpu
echo "gpu_bundle: $(du -sh .gpu | cut -f1) in .gpu/, $(du -sh .gpupack/gpu.tar.xz | cut -f1) packed" \
  "(carry .gpupack; there: tar -xJf .gpupack/gpu.tar.xz && bash .gpu/bin/gpu_checks.sh)"
