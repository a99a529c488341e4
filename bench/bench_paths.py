"""Puts the checkout's Python client (python/) and tools/hf on sys.path for
the Python benchmarks in bench/ (imported first, from the script's folder)."""

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _p in (os.path.join(REPO, "python"), os.path.join(REPO, "tools", "hf")):
    if _p not in sys.path:
        sys.path.insert(0, _p)
