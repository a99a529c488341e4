#!/usr/bin/env bash
# Checks that includes point one way (docs/layout.md):
#   types/ <- core/base <- core/memory, core/index <- core/codec,
#   core/transform <- core/calibration <- core/store
# (a folder includes only itself and the folders to its left; memory and
# index not each other, codec and transform not each other), that types/
# and core/ include no gRPC, protobuf, CUDA, server/ or client/ header, and
# that the CPU-only SDK (client/, capi/) includes nothing of client/cuda/ or
# cuda/ -- except that capi/ may include client/cuda/ inside an
# `#if KVHARBOR_CAPI_CUDA` block (the C ABI's CUDA build). Prints every
# offending include; exit status 1 if there is one.
set -euo pipefail
cd "$(dirname "$0")/.."

rank() {  # folder under core/ (or "types") -> its layer
  case $1 in
    types) echo 0 ;;
    base) echo 1 ;;
    memory | index) echo 2 ;;
    codec | transform) echo 3 ;;
    calibration) echo 4 ;;
    store) echo 5 ;;
    *) echo 99 ;;
  esac
}

bad=0
report() {
  echo "check_layers: $1: $2"
  bad=1
}

while IFS= read -r f; do
  case $f in
    types/*) from=types ;;
    core/*) from=$(echo "$f" | cut -d/ -f2) ;;
  esac
  from_rank=$(rank "$from")
  [ "$from_rank" != 99 ] || report "$f" "not in a known core/ folder"
  while IFS= read -r inc; do
    case $inc in
      grpc* | google/protobuf* | cuda* | cublas* | cusolver* | server/* | client/* | proto/* | kvharbor/v1/*)
        report "$f" "includes $inc (core/ and types/ stay free of it)" ;;
      types/*) ;;
      core/*)
        to=$(echo "$inc" | cut -d/ -f2)
        to_rank=$(rank "$to")
        if [ "$to" != "$from" ] && [ "$to_rank" -ge "$from_rank" ]; then
          report "$f" "includes $inc (core/$from may include only folders below it)"
        fi ;;
    esac
  done < <(sed -n 's/^#include [<"]\([^">]*\)[">].*/\1/p' "$f")
done < <(git ls-files 'core/*.h' 'core/*.cc' 'types/*.h' 'types/*.cc')

# Includes of a file, each marked "cuda" when inside an
# `#if KVHARBOR_CAPI_CUDA` block, else "cpu".
includes_by_build() {
  awk '/^#if KVHARBOR_CAPI_CUDA/ { cuda = 1 }
       /^#endif/ { cuda = 0 }
       /^#include [<"]/ {
         inc = $2; gsub(/[<>"]/, "", inc)
         print (cuda ? "cuda " : "cpu ") inc
       }' "$1"
}

while IFS= read -r f; do
  while read -r build inc; do
    case $inc in
      client/cuda/*)
        case $f in
          capi/*) [ "$build" = cuda ] ||
            report "$f" "includes $inc outside #if KVHARBOR_CAPI_CUDA" ;;
          *) report "$f" "includes $inc (the SDK stays CPU-only)" ;;
        esac ;;
      cuda/* | cuda_runtime* | cublas*)
        report "$f" "includes $inc (the SDK and C ABI stay CPU-only)" ;;
    esac
  done < <(includes_by_build "$f")
done < <(git ls-files --cached --others --exclude-standard 'client/*.h' 'client/*.cc' 'capi/*.h' 'capi/*.cc' | grep -v '^client/cuda/')

if [ "$bad" = 0 ]; then echo "check_layers: includes point one way"; fi
exit "$bad"
