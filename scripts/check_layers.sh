#!/usr/bin/env bash
# Checks that includes point one way (docs/layout.md):
#   types/ <- core/base <- core/memory, core/index <- core/codec,
#   core/transform <- core/calibration <- core/store
# (a folder includes only itself and the folders to its left; memory and
# index not each other, codec and transform not each other), that types/
# and core/ include no gRPC, protobuf, CUDA, server/ or client/ header, and
# that the CPU-only SDK (client/, capi/) includes nothing of client/cuda/ or
# cuda/. Prints every offending include; exit status 1 if there is one.
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

while IFS= read -r f; do
  while IFS= read -r inc; do
    case $inc in
      client/cuda/* | cuda/* | cuda_runtime* | cublas*)
        report "$f" "includes $inc (the SDK and C ABI stay CPU-only)" ;;
    esac
  done < <(sed -n 's/^#include [<"]\([^">]*\)[">].*/\1/p' "$f")
done < <(git ls-files 'client/*.h' 'client/*.cc' 'capi/*.h' 'capi/*.cc' | grep -v '^client/cuda/')

if [ "$bad" = 0 ]; then echo "check_layers: includes point one way"; fi
exit "$bad"
