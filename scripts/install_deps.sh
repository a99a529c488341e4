#!/usr/bin/env bash
# Installs kvharbor's build and test dependencies from Debian 12 packages.
# Idempotent: installs only what is missing. Needs root (or sudo).
set -euo pipefail

PKGS=(
  build-essential cmake ninja-build pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler grpc-proto
  libabsl-dev libspdlog-dev catch2 libxxhash-dev libzstd-dev
  libopenblas-dev liblapack-dev libyaml-cpp-dev nlohmann-json3-dev libhiredis-dev
  redis-server python3 python3-grpcio python3-numpy python3-torch
  python3-venv python3-pip python3-setuptools
  clang-14 libclang-rt-14-dev
  yamllint shellcheck universal-ctags ccache
  libcpp-httplib-dev prometheus
  libssl-dev openssl
  etcd-server etcd-client
  # UCX: the UCX-over-TCP comparison bench, bench/ucx_link_bench.cc.
  libucx-dev
)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#PKGS[@]} packages present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
echo "install_deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install_deps: done"
