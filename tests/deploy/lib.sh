# shellcheck shell=bash
# Helpers for tests/deploy/*_test.sh (sourced; not a test itself).
# DAEMON_PID / DAEMON_ADDR describe the one kvharbord a test runs at a time.

DAEMON_PID=""
DAEMON_ADDR=""
PY=/usr/bin/python3  # Debian's, with python3-grpcio and python3-yaml

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# start_daemon LOG COMMAND...: runs COMMAND (a kvharbord) in the background
# and waits until it logs the address it serves on.
start_daemon() {
  local log=$1
  shift
  "$@" >"$log" 2>&1 &
  DAEMON_PID=$!
  for _ in $(seq 200); do
    if grep -q 'serving on ' "$log"; then
      DAEMON_ADDR=$(grep -o 'serving on [^ ]*' "$log" | head -1 | cut -d' ' -f3)
      DAEMON_ADDR=${DAEMON_ADDR%:}
      return 0
    fi
    if ! kill -0 "$DAEMON_PID" 2>/dev/null; then
      wait "$DAEMON_PID" || true
      DAEMON_PID=""
      cat "$log" >&2
      return 1
    fi
    sleep 0.1
  done
  cat "$log" >&2
  return 1
}

# stop_daemon: SIGTERM, and the exit status must be 0 (drained, clean exit).
stop_daemon() {
  local rc=0
  [ -n "$DAEMON_PID" ] || return 0
  kill -TERM "$DAEMON_PID"
  wait "$DAEMON_PID" || rc=$?
  DAEMON_PID=""
  [ "$rc" -eq 0 ] || fail "kvharbord exited $rc after SIGTERM (want 0)"
}

# Kills a daemon left running by a failed check (EXIT trap).
kill_daemon() {
  if [ -n "$DAEMON_PID" ]; then
    kill -KILL "$DAEMON_PID" 2>/dev/null || true
    wait "$DAEMON_PID" 2>/dev/null || true
  fi
}

free_port() {
  "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# test_config SRC DST KVHARBORD: copies a deploy config for a local run:
# state paths under $STATE_DIR, and metrics.listen on a free loopback port
# when KVHARBORD has --metrics_listen, or without the metrics block when it
# does not have it yet (printed; every other key is still checked).
test_config() {
  local src=$1 dst=$2 daemon=$3 metrics="" help
  help=$("$daemon" --help 2>&1 || true)  # a kvharbord older than --help exits 1
  if grep -q -- '--metrics_listen' <<<"$help"; then
    metrics="127.0.0.1:$(free_port)"
  else
    echo "NOTE: $daemon has no --metrics_listen yet: metrics.listen left out of $(basename "$dst")"
  fi
  "$PY" - "$src" "$dst" "$STATE_DIR" "$metrics" <<'PYEOF'
import sys, yaml
src, dst, state, metrics = sys.argv[1:]
text = open(src).read().replace("/var/lib/kvharbor", state)
config = yaml.safe_load(text)
if metrics:
    config["metrics"]["listen"] = metrics
else:
    config.pop("metrics", None)
open(dst, "w").write(yaml.safe_dump(config, sort_keys=False))
PYEOF
}
