#!/usr/bin/env bash
# The Dockerfile's build steps, outside Docker (no Docker engine runs on the
# development and CI machines). Cheap: no compilation.
#   1. static checks (tests/deploy/deploy_check.py dockerfile-static): stages,
#      COPY sources in the build context, .dockerignore keeping no tracked
#      file out, scripts the RUN lines call, non-root USER, EXPOSE = the
#      ports the image's config listens on, HEALTHCHECK, ENTRYPOINT --config;
#   2. each builder's build RUN line, executed as written in a clean copy of
#      the build context, with /build and /opt/kvharbor moved under a temp
#      dir and a `cmake` shim: configure runs for real (and fails on unused
#      -D variables, i.e. misspelt options), `cmake --build` is skipped and
#      `cmake --install` installs BUILD_DIR (default build/), which CI
#      compiled from the same tree. The CUDA builder's -DKVHARBOR_CUDA=ON
#      becomes OFF where no nvcc is installed;
#   3. the staged tree: programs present, no headers or static libraries,
#      HEALTHCHECK and ENTRYPOINT programs present; the CPU image's apt list
#      provides (with its dependencies) every library the programs load, and
#      names no -dev package; the CUDA image's collected libraries resolve;
#   4. the staged kvharbord starts on the image's config and is SERVING for
#      the staged kvharbor-healthcheck and the CLI; SIGTERM exits 0 and the
#      health check then fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=tests/deploy/lib.sh
source tests/deploy/lib.sh
BUILD_DIR=$(realpath "${BUILD_DIR:-build}")
check() { "$PY" tests/deploy/deploy_check.py "$@"; }

tmp=$(mktemp -d)
trap 'kill_daemon; rm -rf "$tmp"' EXIT

echo "== Dockerfile: static checks"
check dockerfile-static || fail "Dockerfile static checks"

if [ ! -x "$BUILD_DIR/server/kvharbord" ]; then
  echo "SKIP build steps: no $BUILD_DIR/server/kvharbord (run scripts/build.sh first)"
  exit 0
fi

echo "== Dockerfile: clean copy of the build context"
mkdir -p "$tmp/src" "$tmp/shim"
check context-files | tar -cf - -T - | tar -xf - -C "$tmp/src"
cat >"$tmp/shim/cmake" <<'SHIM'
#!/usr/bin/env bash
# cmake as the Dockerfile's RUN line sees it in this test: see the header.
set -euo pipefail
case " $* " in
  *" --build "*)
    echo "cmake shim: skipped 'cmake $*' (using $KVH_PREBUILT)"
    exit 0 ;;
  *" --install "*)
    args=()
    next=0
    for a in "$@"; do
      if [ "$next" = 1 ]; then args+=("$KVH_PREBUILT"); next=0; continue; fi
      [ "$a" = --install ] && next=1
      args+=("$a")
    done
    exec "$KVH_REAL_CMAKE" "${args[@]}" ;;
esac
"$KVH_REAL_CMAKE" "$@" 2>&1 | tee -a "$KVH_CMAKE_LOG"
SHIM
chmod +x "$tmp/shim/cmake"
export KVH_PREBUILT=$BUILD_DIR
KVH_REAL_CMAKE=$(command -v cmake)
export KVH_REAL_CMAKE

for stage in build-cpu build-cuda; do
  root="$tmp/$stage"
  prefix="$root/opt/kvharbor"
  run=$(check build-run "$stage" "$root")
  if [[ $run == *-DKVHARBOR_CUDA=ON* ]] && [ ! -x /usr/local/cuda/bin/nvcc ]; then
    echo "NOTE: no nvcc here: $stage configures with -DKVHARBOR_CUDA=OFF"
    run=${run//-DKVHARBOR_CUDA=ON/-DKVHARBOR_CUDA=OFF}
    run=${run//-DKVHARBOR_GPU_TIER=ON/-DKVHARBOR_GPU_TIER=OFF}
  fi
  echo "== $stage: $run"
  export KVH_CMAKE_LOG="$root.cmake.log"
  : >"$KVH_CMAKE_LOG"
  (cd "$tmp/src" && PATH="$tmp/shim:$PATH" bash -euo pipefail -c "$run") \
    || fail "$stage: the build RUN line failed"
  if grep -A5 'Manually-specified variables were not used' "$KVH_CMAKE_LOG"; then
    fail "$stage: cmake ignored a -D option of the Dockerfile (misspelt?)"
  fi
  grep -q 'Build files have been written' "$KVH_CMAKE_LOG" \
    || fail "$stage: no cmake configure ran"
  for exe in kvharbord kvharbor kvharbor-healthcheck; do
    [ -x "$prefix/bin/$exe" ] || fail "$stage: $prefix/bin/$exe missing"
  done
  [ ! -e "$prefix/include" ] || fail "$stage: headers left in the image"
  [ -z "$(find "$prefix" -name '*.a')" ] || fail "$stage: static libraries left"
  target=${stage#build-}
  hc=$(check healthcheck "$target")
  entry=$(check entrypoint "$target")
  for prog in "${hc%%$'\n'*}" "${entry%%$'\n'*}"; do
    [ -x "$prefix/bin/$prog" ] || fail "$target: runs $prog, not in $prefix/bin"
  done
done

echo "== cpu: runtime packages provide every library"
mapfile -t pkgs < <(check apt-packages cpu)
for p in "${pkgs[@]}"; do
  [[ $p == *-dev ]] && fail "cpu: runtime stage installs development package $p"
  apt-cache show "$p" >/dev/null 2>&1 || fail "cpu: no Debian package '$p'"
done
closure=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
  --no-breaks --no-replaces --no-enhances "${pkgs[@]}" | grep -v '^ ' | sort -u)
prefix="$tmp/build-cpu/opt/kvharbor"
# The CPU stage's own build has no CUDA; BUILD_DIR may (see deploy_check.py).
needed=$(KVH_IGNORE_LIB_PREFIX=/usr/local/cuda \
  check library-packages "$prefix"/bin/* "$prefix"/lib/*.so*) \
  || fail "cpu: $needed"
[ -n "$needed" ] || fail "cpu: found no libraries (ldd failed?)"
for p in $needed; do
  grep -qx "$p" <<<"$closure" || fail "cpu: library package $p not installed by the runtime stage"
done
echo "cpu: $(wc -w <<<"$needed") library packages, all in the runtime stage's dependencies"

echo "== cuda: collected libraries resolve"
prefix="$tmp/build-cuda/opt/kvharbor"
for f in "$prefix"/bin/*; do
  file -L "$f" | grep -q ELF || continue
  LD_LIBRARY_PATH="$prefix/lib" ldd "$f" | grep -q 'not found' && fail "cuda: $f: unresolved library"
  LD_LIBRARY_PATH="$prefix/lib" ldd "$f" | awk '/=>/ && $3 ~ /^\// {print $3}' | while read -r lib; do
    base=$(basename "$lib")
    [[ $lib == "$prefix"/lib/* ]] && continue
    [[ $base =~ ^(libc\.so|libm\.so|libdl\.so|librt\.so|libpthread\.so|libstdc\+\+|libgcc_s|ld-linux|libcuda|libcudart|libcublas|libcusolver|libcusparse|libnvJitLink|libnvidia) ]] \
      || fail "cuda: $f loads $lib from the builder, not from $prefix/lib"
  done
done

echo "== cpu: staged kvharbord on the image's config"
prefix="$tmp/build-cpu/opt/kvharbor"
STATE_DIR="$tmp/state"
mkdir -p "$STATE_DIR"
test_config deploy/container/kvharbord.yaml "$tmp/image.yaml" "$prefix/bin/kvharbord"
# The image listens on 0.0.0.0:50051; here a free loopback port (flags win).
start_daemon "$tmp/image.log" "$prefix/bin/kvharbord" --config="$tmp/image.yaml" \
  --listen=127.0.0.1:0 || fail "kvharbord did not start on the image's config"
KVHARBOR_HEALTH_ADDR=$DAEMON_ADDR "$prefix/bin/kvharbor-healthcheck" \
  || fail "kvharbor-healthcheck: not SERVING"
"$prefix/bin/kvharbor-healthcheck" --addr="$DAEMON_ADDR" --service=kvharbor.v1.KvHarbor \
  || fail "kvharbor-healthcheck --service=kvharbor.v1.KvHarbor: not SERVING"
"$prefix/bin/kvharbor" --addr="$DAEMON_ADDR" stats >/dev/null || fail "kvharbor stats"
addr=$DAEMON_ADDR
stop_daemon
if "$prefix/bin/kvharbor-healthcheck" --addr="$addr" --timeout=2 2>/dev/null; then
  fail "kvharbor-healthcheck passed with the daemon stopped"
fi
echo "dockerfile_steps_test: PASS"
