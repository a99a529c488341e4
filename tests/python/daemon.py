"""Runs the built kvharbord for the Python tests.

CTest sets KVHARBORD (the daemon) and KVHARBOR_LIB (libkvharbor_c.so). The
daemon (bench/local_daemon.py) listens on 127.0.0.1:0 with a 64 MiB pool
and the port is read from its "serving on" log line, so parallel tests never
race for a port.
"""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__)))), "bench"))

from local_daemon import Kvharbord  # noqa: E402


class Daemon(Kvharbord):
    def __init__(self, *extra_args, config=None, workdir=None):
        """`config` (a dict, with `workdir` for the file): a config file
        besides the flags (bench/local_daemon.py)."""
        binary = os.environ.get("KVHARBORD")
        if not binary or not os.path.isfile(binary):
            raise RuntimeError("set KVHARBORD to the built kvharbord")
        super().__init__(binary, ["--pool_bytes=64MiB", *extra_args],
                         config=config, workdir=workdir, start_timeout=20)


def deadline(seconds):
    return time.monotonic() + seconds
