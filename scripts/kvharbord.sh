#!/usr/bin/env bash
# Sets up what is missing (Debian packages, build) and starts kvharbord on its
# embedded default: 127.0.0.1:50051, host memory, CPU codec. Arguments are
# passed to kvharbord (e.g. --listen=0.0.0.0:50051 --config=deploy/kvharbord.example.yaml).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build} bash scripts/build.sh >&2
exec "${BUILD_DIR:-build}/server/kvharbord" "$@"
