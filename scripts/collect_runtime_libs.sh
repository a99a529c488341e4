#!/usr/bin/env bash
# collect_runtime_libs.sh PREFIX: copies the non-CUDA, non-libc shared libraries
# that PREFIX/bin/* load into PREFIX/lib, so a runtime image needs no -dev
# packages (used by the CUDA image, whose base has a different package set).
set -euo pipefail
prefix=$1
mkdir -p "$prefix/lib"
skip='^(libcuda|libcudart|libcublas|libcublasLt|libcusolver|libcusparse|libnvJitLink|libnvidia|libc\.so|libm\.so|libdl\.so|librt\.so|libpthread\.so|libstdc\+\+|libgcc_s|ld-linux)'
for f in "$prefix"/bin/*; do
  ldd "$f" | awk '/=>/ && $3 ~ /^\// {print $3}' | while read -r lib; do
    base=$(basename "$lib")
    [[ $base =~ $skip ]] && continue
    cp -Ln "$lib" "$prefix/lib/$base" 2>/dev/null || true
  done
done
