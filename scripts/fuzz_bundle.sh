#!/usr/bin/env bash
# Packs the libFuzzer targets for a campaign on another machine (the 16-core
# GPU machine, which has no package registry): one tar,
# .fuzzpack/fuzz.tar.xz, holding .fuzz/ with
#   bin/      the *_fuzz binaries of build-fuzz/ (debug info stripped: the
#             symbol table stays, so sanitizer reports still name functions
#             when a symbolizer is there; build-fuzz/ keeps the full ones)
#   lib/      the shared libraries they load (../shared/tools/gpu-bundle:
#             everything but glibc, libstdc++ and libgcc_s)
#   corpus/   fuzz/corpus/<target>/
#   fuzz_campaign.sh, fuzz_rates.txt, BUILD_INFO (commit, sums of the
#             unstripped binaries, to symbolize reports offline here)
# There, from the repository root:
#   tar -xJf .fuzzpack/fuzz.tar.xz && bash .fuzz/fuzz_campaign.sh 540 15 $OUT/fuzz
# build-fuzz/ must be configured (scripts/run_fuzz.sh does it); the targets
# are rebuilt here when out of date.
#   usage: scripts/fuzz_bundle.sh [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD_DIR=${FUZZ_BUILD_DIR:-build-fuzz}
PACK=$ROOT/.fuzzpack
BUNDLER=${GPU_BUNDLE:-$ROOT/../shared/tools/gpu-bundle}
[ -x "$BUNDLER" ] || { echo "gpu-bundle not found at $BUNDLER (GPU_BUNDLE=...)" >&2; exit 2; }

targets=()
if [ $# -gt 0 ]; then
  for name in "$@"; do targets+=("${name%_fuzz}_fuzz"); done
else
  for src in fuzz/*_fuzz.cc; do targets+=("$(basename "$src" .cc)"); done
fi
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  echo "$BUILD_DIR is not configured: run scripts/run_fuzz.sh first" >&2
  exit 2
fi
cmake --build "$BUILD_DIR" -j"${FUZZ_BUILD_JOBS:-2}" --target "${targets[@]}"

stage=$(mktemp -d "${TMPDIR:-/tmp}/fuzz_bundle.XXXXXX")
trap 'rm -rf "$stage"' EXIT
dest=$stage/.fuzz
bins=()
for t in "${targets[@]}"; do bins+=("$BUILD_DIR/fuzz/$t"); done
"$BUNDLER" "$dest" "${bins[@]}"
strip --strip-debug "$dest"/bin/* "$dest"/lib/*
mkdir -p "$dest/corpus"
for t in "${targets[@]}"; do
  cp -r "fuzz/corpus/${t%_fuzz}" "$dest/corpus/"
done
cp scripts/fuzz_campaign.sh fuzz/fuzz_rates.txt "$dest/"
{
  echo "commit $(git rev-parse HEAD)$(git diff --quiet HEAD -- fuzz core server scripts || echo ' (dirty)')"
  echo "built $(date -u +%FT%TZ) on $(hostname) in $ROOT/$BUILD_DIR"
  echo "sha256 of the unstripped binaries there (symbolize reports with them):"
  (cd "$BUILD_DIR/fuzz" && sha256sum "${targets[@]}")
} > "$dest/BUILD_INFO"

mkdir -p "$PACK"
rm -f "$PACK/fuzz.tar.xz"
tar -C "$stage" -cf - .fuzz | xz -T2 -6 > "$PACK/fuzz.tar.xz"
size=$(du -m "$PACK/fuzz.tar.xz" | cut -f1)
echo "fuzz_bundle: $PACK/fuzz.tar.xz, ${size} MiB ($(du -sm "$dest" | cut -f1) MiB unpacked)"
if [ "$size" -ge 64 ]; then
  echo "fuzz_bundle: over 64 MiB, too large to carry" >&2
  exit 1
fi
