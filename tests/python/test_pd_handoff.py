"""bench/pd_handoff_bench.py in its CPU mode (--cpu): a prefill process
stores stories260K's K/V (or a tiny random Llama's when stories260K is not
found) in a kvharbord, and a second process, whose client is told the
daemon is on another host (host_fetch off, device_ipc off), loads it with
fetch_to_layout and decodes, for an identity and a KVTC namespace. Checks,
from the bench's JSON: the decode process's first token equals the first
token of the decode without the cache, its K/V are the stored bytes and its
tokens those of the same loop on them (raw), no same-host path served it,
the KVTC pages were stored compressed and served from host_compressed,
every timing is there; and the target table's statuses.

Needs torch (Debian's python3-torch; skipped without it, "torch is not
installed"), KVHARBORD, KVHARBOR_CALIBRATE and KVHARBOR_LIB (CTest sets
them).
"""

import json
import os
import subprocess
import sys
import tempfile
import types
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
BENCH = os.path.join(REPO, "bench")

try:
    import torch  # noqa: F401
except ImportError:
    torch = None


@unittest.skipIf(torch is None, "torch is not installed (apt-get install python3-torch)")
class PdHandoffCpuTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        out = os.path.join(cls.tmp.name, "pd.json")
        cmd = [sys.executable, os.path.join(BENCH, "pd_handoff_bench.py"), "--cpu",
               "--json", out, "--work", os.path.join(cls.tmp.name, "work")]
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=110)
        cls.output, cls.rc = r.stdout, r.returncode
        cls.report = None
        if os.path.exists(out):
            with open(out) as f:
                cls.report = json.load(f)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def rows(self, variant):
        return [r for r in self.report["rows"] if r["variant"] == variant]

    def timed(self, row):
        return [r for r in row["runs"] if not r["warmup"]]

    def test_exit_status_and_rows(self):
        self.assertEqual(self.rc, 0, self.output[-4000:])
        self.assertIsNotNone(self.report, self.output[-4000:])
        self.assertEqual(self.report["failures"], [])
        self.assertEqual([(r["variant"], r["tokens"]) for r in self.report["rows"]],
                         [("raw", 32), ("kvtc", 32), ("raw", 96), ("kvtc", 96)])
        for row in self.report["rows"]:
            with self.subTest(variant=row["variant"], tokens=row["tokens"]):
                self.assertGreaterEqual(row["timed_runs"], 1)
                for key in ("prefill_s", "insert_s", "load_s", "first_forward_s",
                            "handoff_s", "prefill_over_handoff"):
                    self.assertGreater(row[key], 0.0, key)
                # The handoff contains the insert and the load.
                self.assertGreater(row["handoff_s"], row["load_s"])
                self.assertTrue(row["insert_path"])
                self.assertTrue(row["fetch_path"])
                self.assertGreater(row["fetch_bytes"], 0)

    def test_raw_decode_is_exact(self):
        self.assertIsNotNone(self.report, self.output[-4000:])
        for row in self.rows("raw"):
            self.assertTrue(row["kv_exact"])
            for run in row["runs"]:
                with self.subTest(tokens=row["tokens"]):
                    self.assertNotIn("error", run)
                    # The decode without the cache (the prefill's own) and
                    # the decode from kvharbor agree on the first token.
                    self.assertEqual(run["decode_tokens"][0], run["no_cache_tokens"][0])
                    self.assertEqual(run["decode_tokens"], run["stored_bytes_tokens"])
                    self.assertEqual(len(run["decode_tokens"]), 8)
                    self.assertEqual(run["fetch_bytes"], row["kv_bytes"])

    def test_decode_is_remote(self):
        self.assertIsNotNone(self.report, self.output[-4000:])
        self.assertEqual(self.report["decode_client"]["host_fetch"], "off")
        self.assertFalse(self.report["decode_client"]["device_ipc"])
        for row in self.report["rows"]:
            for run in row["runs"]:
                self.assertEqual(run["decode_shm_pages"], 0)
                for path in run["fetch_path"].split("+"):
                    self.assertNotIn(path, ("host_shm", "device_ipc", "compressed_local"))

    def test_kvtc_pages_are_compressed(self):
        self.assertIsNotNone(self.report, self.output[-4000:])
        for row in self.rows("kvtc"):
            with self.subTest(tokens=row["tokens"]):
                self.assertEqual(row["tiers"], ["host_compressed"])
                self.assertLess(row["compressed_bytes"], row["kv_bytes"])
                self.assertGreater(row["demote_s"], 0.0)
                for run in self.timed(row):
                    self.assertEqual(run["demoted_pages"], row["tokens"] // 16)

    def test_targets_not_measured_below_32k(self):
        self.assertIsNotNone(self.report, self.output[-4000:])
        self.assertEqual({t["variant"]: t["status"] for t in self.report["targets"]},
                         {"raw": "not measured", "kvtc": "not measured"})
        self.assertIn("Target 8 at 32768 tokens", self.output)


class PdReportTest(unittest.TestCase):
    """The target statuses of pd_report.build (pure, no torch)."""

    def test_statuses(self):
        sys.path.insert(0, BENCH)
        try:
            import pd_report
        finally:
            sys.path.remove(BENCH)
        args = types.SimpleNamespace(
            variants=["raw", "kvtc"], device="cuda", model_name="x, RANDOM bf16 weights",
            decode_tokens=16, connections=4, data_plane="auto", prefill_remote=False,
            raw_pool="host", repeats=3,
            long_repeats=2, kvtc_ratio="16", kvtc_components=1024, calib_tokens=4096)
        rows = [{"variant": "raw", "tokens": 32768, "prefill_over_handoff": 2.5},
                {"variant": "kvtc", "tokens": 32768, "prefill_over_handoff": 9.9},
                {"variant": "kvtc", "tokens": 16384, "prefill_over_handoff": 50.0}]
        rep = pd_report.build(rows, args, [])
        self.assertEqual({t["variant"]: t["status"] for t in rep["targets"]},
                         {"raw": "MET", "kvtc": "NOT MET"})
        self.assertTrue(rep["random_weights"])


if __name__ == "__main__":
    unittest.main()
