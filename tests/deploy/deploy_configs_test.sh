#!/usr/bin/env bash
# The deploy/ files against the daemon they configure:
#   1. cross-file checks (deploy_check.py k8s-static, compose-static): ports,
#      probes, Service/NetworkPolicy ports, the ConfigMap mounted where the
#      image reads its config, disk_dir on the persistent volume, memory
#      limit >= pool + host tiers, grace period > preStop + drain, runAsUser
#      = the image's USER, the GPU patch's nvidia.com/gpu, Prometheus target;
#      `promtool check config` on deploy/prometheus.yml;
#   2. the Kubernetes ConfigMap's kvharbord.yaml passes yamllint and starts
#      BUILD_DIR's kvharbord (which rejects unknown keys): SERVING, its
#      namespaces exist; a page demoted to the disk tier is found there again
#      after a restart (warm restart, as the Deployment's volume relies on);
#   3. docker-compose's kvharbord flags start the daemon on the image config;
#   4. deploy/kvharbord.example.yaml starts the daemon as is (on a fresh
#      machine: no file or directory it names needs to exist), and again with
#      its commented disk tier uncommented and its directory's parent present;
#   5. the systemd unit passes `systemd-analyze verify` and keeps its
#      `systemd-analyze security` exposure at or below 2.0 (--threshold=20) (where systemd's
#      tools are installed).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=tests/deploy/lib.sh
source tests/deploy/lib.sh
BUILD_DIR=$(realpath "${BUILD_DIR:-build}")
check() { "$PY" tests/deploy/deploy_check.py "$@"; }
KVHARBORD=$BUILD_DIR/server/kvharbord
CLI=$BUILD_DIR/client/kvharbor
HEALTH=deploy/container/kvharbor_healthcheck.py

tmp=$(mktemp -d)
trap 'kill_daemon; rm -rf "$tmp"' EXIT
STATE_DIR=$tmp/state
mkdir -p "$STATE_DIR"

echo "== cross-file checks"
check k8s-static || fail "deploy/k8s"
check compose-static || fail "deploy/docker-compose.yaml"

if command -v promtool >/dev/null; then
  promtool check config deploy/prometheus.yml || fail "promtool check config"
else
  echo "SKIP: no promtool (Debian package prometheus)"
fi

echo "== systemd unit"
if command -v systemd-analyze >/dev/null; then
  sed "s|^ExecStart=[^ ]*|ExecStart=$(command -v true)|" deploy/systemd/kvharbord.service \
    >"$tmp/kvharbord.service"
  systemd-analyze verify "$tmp/kvharbord.service" || fail "systemd-analyze verify"
  systemd-analyze security --offline=yes --threshold=20 "$tmp/kvharbord.service" \
    | tail -1 || fail "systemd unit hardening: exposure above 2.0"
else
  echo "SKIP: no systemd-analyze"
fi

if [ ! -x "$KVHARBORD" ] || [ ! -x "$CLI" ]; then
  echo "SKIP daemon checks: no $KVHARBORD (run scripts/build.sh first)"
  exit 0
fi

echo "== Kubernetes ConfigMap config"
check configmap-config >"$tmp/configmap.yaml"
yamllint -s "$tmp/configmap.yaml" || fail "the ConfigMap's kvharbord.yaml fails yamllint"
test_config "$tmp/configmap.yaml" "$tmp/k8s.yaml" "$KVHARBORD"
# The listen address stays 0.0.0.0:50051 in the file; here a free loopback port.
start_daemon "$tmp/k8s.log" "$KVHARBORD" --config="$tmp/k8s.yaml" --listen=127.0.0.1:0 \
  || fail "kvharbord refused the ConfigMap's config"
"$HEALTH" --addr="$DAEMON_ADDR" || fail "not SERVING on the ConfigMap's config"
names=$("$PY" -c 'import sys, yaml
for ns in yaml.safe_load(open(sys.argv[1])).get("namespaces", []): print(ns["name"])' "$tmp/k8s.yaml")
listed=$("$CLI" --addr="$DAEMON_ADDR" ns list)
for n in $names; do
  grep -q "$n" <<<"$listed" || fail "namespace $n from the ConfigMap is missing: $listed"
done
# Warm restart: one page of the first namespace moved to disk survives a restart.
ns=$(head -1 <<<"$names")
page_size=$("$CLI" --addr="$DAEMON_ADDR" ns describe "$ns" | awk '$1 == "page_size" {print $2}')
page_bytes=$("$CLI" --addr="$DAEMON_ADDR" ns describe "$ns" | awk '$1 == "page_bytes" {print $2}')
{ [ -n "$page_size" ] && [ -n "$page_bytes" ]; } || fail "ns describe $ns: no page_size/page_bytes"
tokens=$(seq -s, 1 "$page_size")
head -c "$page_bytes" /dev/urandom >"$tmp/page.bin"
"$CLI" --addr="$DAEMON_ADDR" insert "$ns" --tokens "$tokens" --file "$tmp/page.bin" >/dev/null
"$CLI" --addr="$DAEMON_ADDR" demote "$ns" --tier disk >/dev/null
stop_daemon
start_daemon "$tmp/k8s2.log" "$KVHARBORD" --config="$tmp/k8s.yaml" --listen=127.0.0.1:0 \
  || fail "kvharbord did not restart on the ConfigMap's config"
match=$("$CLI" --addr="$DAEMON_ADDR" match "$ns" --tokens "$tokens")
grep -Eq "^tiers +disk$" <<<"$match" || fail "after a restart the page is not on disk: $match"
stop_daemon

echo "== docker-compose flags on the image config"
mapfile -t flags < <(check compose-flags)
test_config deploy/container/kvharbord.yaml "$tmp/image.yaml" "$KVHARBORD"
start_daemon "$tmp/compose.log" "$KVHARBORD" --config="$tmp/image.yaml" "${flags[@]}" \
  --listen=127.0.0.1:0 || fail "kvharbord refused docker-compose's flags ${flags[*]}"
"$HEALTH" --addr="$DAEMON_ADDR" || fail "not SERVING with docker-compose's flags"
stop_daemon
echo "== the example config, as is"
# Only the ports are moved (flags override the file): the file's own are the
# defaults, which another daemon on this machine may hold.
example=deploy/kvharbord.example.yaml
start_daemon "$tmp/example.log" "$KVHARBORD" --config="$example" \
  --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 \
  || fail "kvharbord refused $example as is"
"$HEALTH" --addr="$DAEMON_ADDR" || fail "not SERVING on $example"
names=$("$PY" -c 'import sys, yaml
for ns in yaml.safe_load(open(sys.argv[1]))["namespaces"]: print(ns["name"])' "$example")
listed=$("$CLI" --addr="$DAEMON_ADDR" ns list)
for n in $names; do
  grep -q "^$n " <<<"$listed" || fail "namespace $n of $example is missing: $listed"
done
stop_daemon

echo "== the example config with its disk tier uncommented"
mkdir -p "$tmp/example-state"
"$PY" - "$example" "$tmp/example-disk.yaml" "$tmp/example-state" <<'PYEOF'
import re, sys
src, dst, state = sys.argv[1:]
text = re.sub(r"^( *)# (disk_dir|disk_bytes):", r"\1\2:", open(src).read(), flags=re.M)
open(dst, "w").write(text.replace("/var/lib/kvharbor", state))
PYEOF
grep -q "^ *disk_dir: $tmp/example-state/" "$tmp/example-disk.yaml" \
  || fail "$example has no commented disk_dir under /var/lib/kvharbor"
start_daemon "$tmp/example-disk.log" "$KVHARBORD" --config="$tmp/example-disk.yaml" \
  --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 \
  || fail "kvharbord refused $example with its disk tier"
ns=$(head -1 <<<"$names")
"$CLI" --addr="$DAEMON_ADDR" ns describe "$ns" | grep -Eq "^disk_dir +$tmp/example-state/" \
  || fail "namespace $ns has no disk tier with the uncommented disk_dir"
stop_daemon
echo "deploy_configs_test: PASS"
