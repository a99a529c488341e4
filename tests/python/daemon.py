"""Runs the built kvharbord for the Python tests.

CTest sets KVHARBORD (the daemon) and KVHARBOR_LIB (libkvharbor_c.so). The
daemon listens on 127.0.0.1:0 and the port is read from its "serving on"
log line, so parallel tests never race for a port.
"""

import os
import re
import subprocess
import threading
import time

_SERVING = re.compile(r"serving on (\d+\.\d+\.\d+\.\d+:\d+)")


class Daemon:
    def __init__(self, *extra_args):
        binary = os.environ.get("KVHARBORD")
        if not binary or not os.path.isfile(binary):
            raise RuntimeError("set KVHARBORD to the built kvharbord")
        self.proc = subprocess.Popen(
            [binary, "--listen=127.0.0.1:0", "--metrics_listen=",
             "--pool_bytes=64MiB", *extra_args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.log = []
        found = threading.Event()
        self.address = None

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
        if not found.wait(20) or self.address is None:
            self.stop()
            raise RuntimeError("kvharbord did not start:\n" + "".join(self.log))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(5)
        return self.proc.returncode


def deadline(seconds):
    return time.monotonic() + seconds
