#!/usr/bin/env bash
# Checks that includes point one way (docs/layout.md) in every source folder:
# - types/ <- core/base <- core/memory, core/index <- core/codec,
#   core/transform <- core/calibration <- core/store (a folder includes only
#   itself and the folders to its left; memory and index not each other,
#   codec and transform not each other); types/ and core/ include no gRPC,
#   protobuf, CUDA, server/, client/, cli/, capi/, cluster/, tools/ or SDK
#   (include/kvharbor/) header;
# - cuda/ (every subfolder) includes only cuda/, core/, types/ and
#   libraries: never server/, client/, cli/, capi/, the SDK or proto/;
# - server/ in folders: metrics, security, local <- rpc <- daemon (the same
#   rule; metrics, security and local not each other); server/ includes
#   nothing of client/, cli/, capi/, tools/ or the SDK's headers (the daemon
#   and the SDK share only types/, core/, cluster/ and proto/), and CUDA
#   only in the GPU tier plugin (server/daemon/gpu_tier_plugin.cc);
# - the SDK (client/ and its public headers, include/kvharbor/) includes
#   nothing of server/, cli/, capi/ or tools/; include/kvharbor/ includes
#   only itself, types/, cluster/ and libraries (an installed header may not
#   name a private one);
# - cli/ includes the SDK through its public headers (include/kvharbor/),
#   never client/'s private ones, server/, capi/ or tools/;
# - capi/ includes nothing of server/, cli/ or tools/;
# - cluster/ includes only itself and libraries;
# - tools/ includes nothing of server/, client/, cli/, capi/ or the SDK;
# - the CPU-only SDK (client/, include/, cli/, capi/) includes nothing of
#   client/cuda/ or cuda/ -- except that capi/ may include client/cuda/
#   inside an `#if KVHARBOR_CAPI_CUDA` block (the C ABI's CUDA build).
# proto/ has no hand-written sources; tests/, bench/ and fuzz/ may include
# anything. A source in a top-level folder this script does not know is an
# error, so that a new folder gets its rule. Prints every offending include;
# exit status 1 if there is one.
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
      grpc* | google/protobuf* | cuda* | cublas* | cusolver* | server/* | client/* | proto/* | kvharbor/* | cli/* | capi/* | cluster/* | tools/*)
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
done < <(git ls-files --cached --others --exclude-standard 'client/*.h' 'client/*.cc' 'capi/*.h' 'capi/*.cc' 'cli/*.h' 'cli/*.cc' 'include/*.h' | grep -v '^client/cuda/')


server_rank() {  # folder under server/ -> its layer
  case $1 in
    metrics | security | local | data) echo 1 ;;
    rpc) echo 2 ;;
    daemon) echo 3 ;;
    *) echo 99 ;;
  esac
}

# Whether $2, an include of a file in top-level folder $1, is refused.
# Prints the reason when it is.
refused() {
  local from=$1 inc=$2
  case $from:$inc in
    # The SDK's public headers are kvharbor/<name>.h; kvharbor/v1/ is proto.
    server:client/* | server:cli/* | server:capi/* | server:tools/*)
      echo "server/ includes nothing of the SDK, CLI, C ABI or tools" ;;
    client:server/* | client:cli/* | client:capi/* | client:tools/*)
      echo "the SDK includes nothing of server/, cli/, capi/ or tools/" ;;
    include:kvharbor/v1/*) echo "public headers do not expose proto/" ;;
    include:kvharbor/* | include:types/* | include:cluster/*) ;;
    include:core/* | include:cuda/* | include:server/* | include:client/* | include:cli/* | include:capi/* | include:tools/* | include:proto/*)
      echo "public headers include only include/kvharbor/, types/ and cluster/" ;;
    cli:client/* | cli:server/* | cli:capi/* | cli:tools/*)
      echo "cli/ uses the SDK through include/kvharbor/ only" ;;
    capi:server/* | capi:cli/* | capi:tools/*)
      echo "the C ABI includes nothing of server/, cli/ or tools/" ;;
    cluster:cluster/*) ;;
    cluster:types/* | cluster:core/* | cluster:cuda/* | cluster:server/* | cluster:client/* | cluster:cli/* | cluster:capi/* | cluster:tools/* | cluster:proto/* | cluster:kvharbor/*)
      echo "cluster/ includes only itself" ;;
    tools:server/* | tools:client/* | tools:cli/* | tools:capi/*)
      echo "tools/ includes nothing of server/, the SDK, cli/ or capi/" ;;
    tools:kvharbor/[a-z_]*.h) echo "tools/ includes nothing of the SDK" ;;
    cuda:cuda/* | cuda:core/* | cuda:types/*) ;;
    cuda:server/* | cuda:client/* | cuda:cli/* | cuda:capi/* | cuda:proto/* | cuda:kvharbor/* | cuda:tools/* | cuda:cluster/*)
      echo "cuda/ includes only cuda/, core/ and types/" ;;
  esac
  case $from:$inc in
    server:kvharbor/v1/*) ;;
    server:kvharbor/* | cuda:kvharbor/*)
      echo "includes the SDK's public headers" ;;
  esac
}

while IFS= read -r f; do
  top=${f%%/*}
  case $top in
    types | core | proto | tests | bench | fuzz | python) continue ;;
    server | client | include | cli | capi | cluster | tools | cuda) ;;
    *) report "$f" "is in top-level folder $top/, which check_layers.sh has no rule for"
       continue ;;
  esac
  if [ "$top" = server ]; then
    from=$(echo "$f" | cut -d/ -f2)
    from_rank=$(server_rank "$from")
    [ "$from_rank" != 99 ] || report "$f" "not in a known server/ folder"
  fi
  while IFS= read -r inc; do
    why=$(refused "$top" "$inc")
    [ -z "$why" ] || report "$f" "includes $inc ($why)"
    if [ "$top" = server ]; then
      case $inc in
        server/*/*)
          to=$(echo "$inc" | cut -d/ -f2)
          to_rank=$(server_rank "$to")
          if [ "$to" != "$from" ] && [ "$to_rank" -ge "$from_rank" ]; then
            report "$f" "includes $inc (server/$from may include only server folders below it)"
          fi ;;
        server/*) report "$f" "includes $inc (server/ sources are in folders)" ;;
        cuda/* | cuda_runtime* | cublas*)
          # The GPU tier plugin (built only with CUDA) is the one place.
          [ "$f" = server/daemon/gpu_tier_plugin.cc ] ||
            report "$f" "includes $inc (only server/daemon/gpu_tier_plugin.cc includes CUDA)" ;;
      esac
    fi
  done < <(sed -n 's/^#include [<"]\([^">]*\)[">].*/\1/p' "$f")
done < <(git ls-files --cached --others --exclude-standard '*.h' '*.cc' '*.cu' '*.cuh' '*.c' | grep '/')

if [ "$bad" = 0 ]; then echo "check_layers: includes point one way"; fi
exit "$bad"
