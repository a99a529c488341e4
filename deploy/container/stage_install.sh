#!/usr/bin/env bash
# stage_install.sh PREFIX: turns a `cmake --install` tree into what the
# container images ship: the programs and shared libraries, without the SDK's
# headers, static libraries and CMake package files, plus kvharbor-healthcheck
# (the images' HEALTHCHECK). Run from the repository root (the Dockerfile's
# builders do; tests/deploy/dockerfile_steps_test.sh runs it on a temporary
# install of build/).
set -euo pipefail
prefix=${1:?usage: stage_install.sh PREFIX}
for exe in kvharbord kvharbor; do
  if [ ! -x "$prefix/bin/$exe" ]; then
    echo "stage_install: $prefix/bin/$exe missing (did cmake --install run?)" >&2
    exit 1
  fi
done
rm -rf "$prefix/include" "$prefix/lib/cmake"
find "$prefix/lib" -name '*.a' -delete
install -m 0755 deploy/container/kvharbor_healthcheck.py "$prefix/bin/kvharbor-healthcheck"
echo "stage_install: $(find "$prefix" -type f | wc -l) files in $prefix"
