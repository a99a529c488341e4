"""Local kvharbord processes and tool paths for the Python benchmarks
(bench/ttft_bench.py, bench/hit_correctness.py) and tests (tests/python).

find_tool looks for a binary in the order: an explicit path, an environment
variable, the GPU bundle (.gpu/bin, scripts/gpu_bundle.sh), the build tree.
use_library points KVHARBOR_LIB at the bundle's or the build's
libkvharbor_c.so unless it is set already (call it before the first
kvharbor.Client). Kvharbord writes a YAML config (docs/operations.md keys),
starts the daemon on a free loopback port (--listen=127.0.0.1:0; the port is
read from its "serving on" log line, so parallel runs never race for a port)
and stops it with SIGTERM (the daemon also gets SIGTERM when the process
that started it dies).

Standard library only. A Kvharbord is used from one thread; its log reader
runs on its own thread.
"""

import ctypes
import os
import re
import signal
import subprocess
import threading

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SERVING = re.compile(r"serving on (\d+\.\d+\.\d+\.\d+:\d+)")


def find_tool(explicit, env, bundle_name, build_path):
    """The first existing file of: explicit, $env, .gpu/bin/bundle_name,
    build_path (relative to the checkout). Raises naming what was tried."""
    tried = [explicit, os.environ.get(env, ""),
             os.path.join(REPO, ".gpu", "bin", bundle_name),
             os.path.join(REPO, build_path)]
    for p in tried:
        if p and os.path.isfile(p):
            return os.path.abspath(p)
    raise FileNotFoundError(f"{bundle_name}: not found (set {env}); tried "
                            + ", ".join(p for p in tried if p))


def use_library():
    """KVHARBOR_LIB: as set, else the bundle's, else the build's."""
    if os.environ.get("KVHARBOR_LIB"):
        return os.environ["KVHARBOR_LIB"]
    for p in (os.path.join(REPO, ".gpu", "lib", "libkvharbor_c.so"),
              os.path.join(REPO, "build", "capi", "libkvharbor_c.so")):
        if os.path.isfile(p):
            os.environ["KVHARBOR_LIB"] = p
            return p
    return ""  # the package searches itself and says what it tried


def to_yaml(value, indent=0):
    """YAML text of nested dicts/lists of str, int, float and bool."""
    pad = " " * indent
    if isinstance(value, dict):
        lines = []
        for k, v in value.items():
            if isinstance(v, (dict, list)) and v:
                lines.append(f"{pad}{k}:\n{to_yaml(v, indent + 2)}")
            else:
                lines.append(f"{pad}{k}: {_scalar(v)}")
        return "\n".join(lines)
    if isinstance(value, list):
        return "\n".join(f"{pad}- {_scalar(v)}" for v in value)
    return pad + _scalar(value)


def _scalar(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (dict, list)):
        return "{}" if isinstance(v, dict) else "[]"
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _die_with_parent():
    """In the child before exec: SIGTERM when the process that started it
    dies (Linux PR_SET_PDEATHSIG), so a killed benchmark leaves no daemon."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (AttributeError, OSError):
        pass


class Kvharbord:
    def __init__(self, binary, args=(), config=None, workdir=None, name="kvharbord",
                 start_timeout=60):
        """Starts `binary --listen=127.0.0.1:0 --metrics_listen= ARGS`, with
        `config` (a dict) written as workdir/name.yaml and passed as
        --config when given; raises with the daemon's log if it does not
        serve within start_timeout seconds."""
        self.name = name
        cmd = [binary, "--listen=127.0.0.1:0", "--metrics_listen=", *args]
        if config is not None:
            self.config_path = os.path.join(workdir, f"{name}.yaml")
            with open(self.config_path, "w") as f:
                f.write(to_yaml(config) + "\n")
            cmd.append(f"--config={self.config_path}")
        self.log = []
        self.address = None
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, preexec_fn=_die_with_parent)
        found = threading.Event()

        def pump():  # keeps reading so the daemon never blocks on its pipe
            for line in self.proc.stdout:
                self.log.append(line)
                m = _SERVING.search(line)
                if m and self.address is None:
                    self.address = m.group(1)
                    found.set()
            found.set()

        self._reader = threading.Thread(target=pump, daemon=True)
        self._reader.start()
        if not found.wait(start_timeout) or self.address is None:
            self.stop()
            raise RuntimeError(f"kvharbord {name} did not start:\n" + "".join(self.log))

    def log_text(self):
        return "".join(self.log)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(5)
        return self.proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
