#!/usr/bin/env bash
# Builds Debian's own abseil source (the version of the installed libabsl-dev)
# with -fsanitize=thread and installs it into a prefix, for the ThreadSanitizer
# stage of scripts/test.sh.
#
# Why: Debian's libabsl is not TSan-instrumented, so TSan cannot see
# absl::Mutex's locking and reports races in our code that are not there.
# Linking kvharbor's core against an instrumented abseil removes those false
# reports without any suppression for our code.
#
# Usage: scripts/build_tsan_deps.sh [PREFIX]   (default build-tsan/deps)
# Idempotent: does nothing when PREFIX already holds this abseil version.
# Touches nothing system-wide: the deb-src list, apt's package lists and its
# download cache live in a scratch directory next to PREFIX.
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX=$(realpath -m "${1:-build-tsan/deps}")
WORK="$PREFIX.work"
JOBS=${KVHARBOR_TSAN_DEPS_JOBS:-$(nproc)}

die() {
  echo "build_tsan_deps: ERROR: $*" >&2
  exit 1
}

VERSION=$(dpkg-query -W -f='${Version}' libabsl-dev 2>/dev/null) ||
  die "libabsl-dev is not installed (run scripts/install_deps.sh)"
STAMP="$PREFIX/.kvharbor-abseil-tsan-$VERSION"
if [ -f "$STAMP" ]; then
  echo "build_tsan_deps: instrumented abseil $VERSION already in $PREFIX"
  exit 0
fi
command -v dpkg-source >/dev/null || die "dpkg-source missing (package dpkg-dev)"

rm -rf "$WORK" "$PREFIX"
mkdir -p "$WORK/lists/partial" "$WORK/archives/partial" "$WORK/src"

# Same mirrors as the system's apt configuration, as deb-src lines.
MIRROR=http://deb.debian.org/debian
SECURITY=http://deb.debian.org/debian-security
# shellcheck source=/dev/null
CODENAME=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
cat >"$WORK/sources.list" <<EOF
deb-src $MIRROR $CODENAME main
deb-src $MIRROR $CODENAME-updates main
deb-src $SECURITY $CODENAME-security main
EOF
APT_OPTS=(
  -o "Dir::Etc::SourceList=$WORK/sources.list"
  -o Dir::Etc::SourceParts=/dev/null
  -o "Dir::State::Lists=$WORK/lists"
  -o "Dir::Cache=$WORK/cache"
  -o "Dir::Cache::archives=$WORK/archives"
  -o Debug::NoLocking=1
)
echo "build_tsan_deps: fetching Debian's abseil source $VERSION"
apt-get "${APT_OPTS[@]}" -qq update ||
  die "apt-get update of the private deb-src list failed (no network or mirror $MIRROR unreachable)"
(cd "$WORK/src" && apt-get "${APT_OPTS[@]}" -qq source --download-only "abseil=$VERSION") ||
  die "cannot fetch source package abseil=$VERSION from $MIRROR (deb-src)"
(cd "$WORK/src" && dpkg-source -x ./*.dsc abseil >/dev/null) ||
  die "cannot unpack abseil $VERSION (dpkg-source -x)"

GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
LAUNCHER=()
command -v ccache >/dev/null && LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
FLAGS="-fsanitize=thread -fno-omit-frame-pointer"
echo "build_tsan_deps: building abseil with $FLAGS (-j$JOBS)"
cmake -S "$WORK/src/abseil" -B "$WORK/build" "${GEN[@]}" "${LAUNCHER[@]}" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_STANDARD=17 \
  -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DBUILD_SHARED_LIBS=OFF \
  -DBUILD_TESTING=OFF -DABSL_PROPAGATE_CXX_STD=ON \
  -DCMAKE_CXX_FLAGS="$FLAGS" \
  -DCMAKE_INSTALL_PREFIX="$PREFIX" >/dev/null ||
  die "configuring abseil failed"
cmake --build "$WORK/build" -j"$JOBS" >/dev/null || die "building abseil failed"
cmake --install "$WORK/build" >/dev/null || die "installing abseil failed"

# (grep -c, not -q: with pipefail, -q's early exit fails nm with SIGPIPE.)
TSAN_SYMBOLS=$(nm "$PREFIX"/lib*/libabsl_synchronization.a 2>/dev/null | grep -c __tsan_ || true)
[ "$TSAN_SYMBOLS" -gt 0 ] ||
  die "libabsl_synchronization.a in $PREFIX has no TSan instrumentation"
rm -rf "$WORK"
touch "$STAMP"
echo "build_tsan_deps: instrumented abseil $VERSION installed in $PREFIX"
