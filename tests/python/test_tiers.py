"""Codecs and page tiers through the Python client against a real kvharbord:
a KVTC namespace calibrated by kvharbor-calibrate (by path and inline),
pages demoted to host_compressed and disk, RAW and COMPRESSED fetches
checked against the codec's bounds, per-page tiers, per-tier stats,
GetCalibration, and bad tier arguments raising with the field named.

CTest sets KVHARBOR_CALIBRATE (tools/kvharbor-calibrate) besides KVHARBORD
and KVHARBOR_LIB. The KV rows are low-rank (what PCA-based KVTC is built
for), drawn from the same generator for the calibration samples and for
the pages."""

import ctypes
import json
import math
import os
import random
import struct
import subprocess
import tempfile
import time
import unittest

import kvharbor
from daemon import Daemon
from kvharbor import FetchFormat, Tier

L, H, D, P = 2, 2, 8, 16  # layers, kv heads, head_dim, tokens per page
GEOM = kvharbor.Geometry(num_layers=L, num_kv_heads=H, head_dim=D, page_size=P,
                         dtype=kvharbor.DType.FP32)
PB = GEOM.page_bytes  # 2*2*16*2*8*4 = 4096
FEATURES = L * H * D  # one KVTC row per token: [layer][kv_head][head_dim]
RANK = 4
NS_BYTES = 64 * PB
HOST_BYTES = 1 << 20
# Every stored byte counted (each buffer's envelope, headers and FP8 sinks
# take about 300 bytes): 4 KiB pages leave 22 bytes per K or V row at 4x.
RATIO = 4
MAX_REL_ERROR = 0.1  # RMS error / RMS value of decoded pages (measured: 0.03)


class LowRankRows:
    """K and V rows (FEATURES floats each): RANK latent factors + noise."""

    def __init__(self, seed):
        rng = random.Random(seed)
        self.bases = [[[rng.gauss(0, 0.4) for _ in range(FEATURES)]
                       for _ in range(RANK)] for _ in range(2)]

    def row(self, rng, kv):
        z = [rng.gauss(0, 1) for _ in range(RANK)]
        basis = self.bases[kv]
        return [sum(z[j] * basis[j][f] for j in range(RANK)) + rng.gauss(0, 0.02)
                for f in range(FEATURES)]

    def samples_file(self, path, sequences=16, seq_len=64, seed=1):
        """A KV sample file (docs/kv_samples.md), standard library only."""
        rng = random.Random(seed)
        k, v = [], []
        for _ in range(sequences * seq_len):
            k.extend(self.row(rng, 0))
            v.extend(self.row(rng, 1))
        tokens = sequences * seq_len
        positions = [t % seq_len for t in range(tokens)]
        blobs = [("k", "F32", [tokens, L, H, D], struct.pack(f"<{len(k)}f", *k)),
                 ("v", "F32", [tokens, L, H, D], struct.pack(f"<{len(v)}f", *v)),
                 ("positions", "I64", [tokens],
                  struct.pack(f"<{tokens}q", *positions))]
        header = {"__metadata__": {
            "format": "kvharbor.kv_samples", "format_version": "1",
            "num_layers": str(L), "num_kv_heads": str(H), "head_dim": str(D),
            "rope_style": "none"}}
        offset = 0
        for name, dtype, shape, blob in blobs:
            header[name] = {"dtype": dtype, "shape": shape,
                            "data_offsets": [offset, offset + len(blob)]}
            offset += len(blob)
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            for *_, blob in blobs:
                f.write(blob)

    def pages(self, count, seed):
        """`count` fp32 pages in the default layout [K|V][layer][token][head][dim]."""
        rng = random.Random(seed)
        out = []
        for _ in range(count):
            rows = [(self.row(rng, 0), self.row(rng, 1)) for _ in range(P)]
            page = [rows[t][kv][(layer * H + h) * D + d]
                    for kv in range(2) for layer in range(L) for t in range(P)
                    for h in range(H) for d in range(D)]
            out.append(struct.pack(f"<{len(page)}f", *page))
        return b"".join(out)


def floats(data):
    return struct.unpack(f"<{len(data) // 4}f", data)


def rel_error(got, want):
    """RMS error over RMS value, of whole buffers of fp32."""
    g, w = floats(got), floats(want)
    err = sum((a - b) ** 2 for a, b in zip(g, w))
    ref = sum(b * b for b in w)
    return math.sqrt(err / ref)


def tokens(n, seed):
    rng = random.Random(seed)
    return [rng.randrange(1, 32000) for _ in range(n)]


class CalibratedDaemonTest(unittest.TestCase):
    """A kvharbord and KVTC calibrations of LowRankRows made by
    kvharbor-calibrate: cls.cal_files[ratio] (path), cls.cal_bytes (RATIO's
    bytes), cls.cal_path. Subclasses set RATIOS and may override
    daemon_args()."""

    RATIOS = (RATIO,)

    @classmethod
    def daemon_args(cls):
        return ()

    @classmethod
    def setUpClass(cls):
        tool = os.environ.get("KVHARBOR_CALIBRATE")
        if not tool or not os.path.isfile(tool):
            raise RuntimeError("set KVHARBOR_CALIBRATE to the built kvharbor-calibrate")
        cls.tmp = tempfile.TemporaryDirectory(prefix="kvh_py_tiers_")
        cls.rows = LowRankRows(seed=11)
        samples = os.path.join(cls.tmp.name, "samples.safetensors")
        cls.rows.samples_file(samples)
        prefix = os.path.join(cls.tmp.name, "cal")
        r = subprocess.run([tool, "--samples", samples, "--out", prefix,
                            "--ratios", ",".join(map(str, cls.RATIOS)),
                            "--raw-dtype", "fp32",
                            "--page-size", str(P), "--quiet"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
        if r.returncode != 0:
            raise RuntimeError(f"kvharbor-calibrate failed:\n{r.stdout}")
        cls.cal_files = {ratio: f"{prefix}.{ratio}x.kvtc" for ratio in cls.RATIOS}
        cls.cal_path = cls.cal_files[RATIO]
        with open(cls.cal_path, "rb") as f:
            cls.cal_bytes = f.read()
        cls.daemon = Daemon(*cls.daemon_args())
        cls.client = kvharbor.Client(cls.daemon.address, timeout=10)
        cls.client.wait_connected(10)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        rc = cls.daemon.stop()
        cls.tmp.cleanup()
        if rc != 0:
            raise AssertionError(f"kvharbord exited {rc}")

    def make_ns(self, name, **kwargs):
        r = self.client.create_namespace(name, GEOM, capacity_bytes=NS_BYTES,
                                         **kwargs)
        self.addCleanup(self.client.delete_namespace, name, True)
        return r


class TiersTest(CalibratedDaemonTest):
    def disk_dir(self, name):
        return os.path.join(self.tmp.name, "disk_" + name)

    def check_tier_stats(self, ns, tier, pages):
        st = self.client.stats(ns).namespace(ns)
        self.assertEqual([t.tier for t in st.tiers],
                         [Tier.RAW, Tier.HOST_COMPRESSED, Tier.DISK])
        for t in st.tiers:
            self.assertEqual(t.pages, pages if t.tier == tier else 0, t)
        stored = st.tier(tier).bytes
        if tier == Tier.RAW:
            self.assertEqual(stored, pages * PB)
        else:
            self.assertGreater(stored, 0)
        self.assertEqual((st.disk_write_errors, st.corrupt_dropped), (0, 0))
        return st

    def test_kvtc_tiers(self):
        disk = self.disk_dir("kvtc_path")
        by_path = self.make_ns("kvtc_path", codec="kvtc",
                               calibration_path=self.cal_path,
                               host_compressed_bytes=HOST_BYTES, disk_dir=disk,
                               disk_bytes=NS_BYTES)
        info = by_path.info
        self.assertTrue(by_path.created)
        self.assertEqual(info.codec, "kvtc")
        self.assertNotEqual(info.calibration_fingerprint, 0)
        self.assertEqual((info.host_compressed_bytes, info.disk_dir, info.disk_bytes),
                         (HOST_BYTES, disk, NS_BYTES))
        self.assertEqual(self.client.describe_namespace("kvtc_path"), info)
        cal = self.client.get_calibration("kvtc_path")
        self.assertEqual(cal.codec, "kvtc")
        self.assertEqual(cal.fingerprint, info.calibration_fingerprint)
        self.assertEqual(cal.bytes, self.cal_bytes)  # kvtc: the file itself
        # The same calibration inline (any buffer), from get_calibration.
        inline = self.make_ns("kvtc_inline", codec="kvtc",
                              calibration=memoryview(cal.bytes),
                              host_compressed_bytes=HOST_BYTES)
        self.assertEqual(inline.info.calibration_fingerprint, cal.fingerprint)
        self.assertEqual(inline.info.disk_dir, "")
        self.assertEqual(self.client.get_calibration("kvtc_inline"), cal)

        toks = tokens(4 * P, 21)
        data = self.rows.pages(4, seed=22)
        for ns, tiers in (("kvtc_path", (Tier.RAW, Tier.HOST_COMPRESSED, Tier.DISK)),
                          ("kvtc_inline", (Tier.RAW, Tier.HOST_COMPRESSED))):
            ins = self.client.insert(ns, toks, data)
            self.assertEqual(ins.pages_stored, 4)
            for tier in tiers:
                with self.subTest(ns=ns, tier=tier.name):
                    if tier != Tier.RAW:
                        self.assertEqual(self.client.demote(ns, tier), 4)
                    st = self.check_tier_stats(ns, tier, 4)
                    if tier != Tier.RAW:
                        self.assertLess(st.tier(tier).bytes, 4 * PB)  # compressed
                        self.assertGreaterEqual(st.demoted_pages, 4)
                    # Per codec: kvtc holds every cold page, at its ratio.
                    kv = st.codec("kvtc")
                    cold = 0 if tier == Tier.RAW else 4
                    self.assertEqual((kv.pages, kv.bytes),
                                     (cold, st.tier(tier).bytes if cold else 0))
                    if cold:
                        self.assertAlmostEqual(kv.stored_ratio(PB),
                                               4 * PB / kv.bytes)
                    # What the uploaded calibration expected.
                    c = st.calibration
                    self.assertEqual((c.codec, c.target_ratio), ("kvtc", RATIO))
                    self.assertGreaterEqual(c.expected_ratio, 0.97 * RATIO)
                    self.assertTrue(0 < c.keys_rel_error < 1, c)
                    self.assertTrue(0 < c.values_rel_error < 1, c)
                    self.check_kvtc_fetches(ns, toks, data, tier)
            if ns == "kvtc_path":
                self.assertGreaterEqual(len(os.listdir(disk)), 4)  # one file a page

    def check_kvtc_fetches(self, ns, toks, data, tier):
        with self.client.match(ns, toks, lock=True) as lease:
            self.assertEqual(lease.page_tiers, (tier,) * 4)
            raw, comp = bytearray(4 * PB), bytearray(4 * PB)
            r = lease.fetch_into(raw)  # RAW is the default
            self.assertEqual((r.num_pages, r.bytes_written), (4, 4 * PB))
            r = lease.fetch_into(comp, format=FetchFormat.COMPRESSED)
            self.assertEqual((r.num_pages, r.bytes_written), (4, 4 * PB))
            # A window of the lease, compressed, into per-page buffers.
            window = [bytearray(PB), bytearray(PB)]
            lease.fetch_into(window, start_page=1, page_count=2,
                             format=FetchFormat.COMPRESSED)
            self.assertEqual(b"".join(window), comp[PB:3 * PB])
        self.assertNotEqual(comp, data)  # lossy: not the identity codec
        self.assertLess(rel_error(comp, data), MAX_REL_ERROR)
        if tier == Tier.RAW:
            # Raw pages are sent as stored, or encoded on the fly.
            self.assertEqual(raw, data)
        else:
            # Cold pages: the SDK decodes the buffers exactly as the daemon.
            self.assertEqual(comp, raw)
        # Without a lease (by handle) the format is honoured as well.
        plain = self.client.match(ns, toks)
        self.assertEqual(plain.page_tiers, (tier,) * 4)
        self.assertEqual(plain.fetch(format=FetchFormat.COMPRESSED), comp)

    def test_online_calibration(self):
        oc = kvharbor.OnlineCalibration(min_tokens=2 * P, target_ratio=2)
        r = self.make_ns("online", codec="kvtc", host_compressed_bytes=HOST_BYTES,
                         online_calibration=oc)
        self.assertEqual(r.info.online_calibration.target_ratio, 2.0)
        self.assertEqual(r.info.online_calibration.min_tokens, 2 * P)
        # Ratios below 1, out of reach for 1 KiB pages, or not numbers.
        for bad in (0.5, 64, "2"):
            with self.subTest(target_ratio=bad):
                with self.assertRaises(kvharbor.InvalidArgumentError) as e:
                    self.client.create_namespace(
                        "online_bad", GEOM, capacity_bytes=NS_BYTES,
                        codec="kvtc", host_compressed_bytes=HOST_BYTES,
                        online_calibration=kvharbor.OnlineCalibration(
                            target_ratio=bad))
                self.assertIn("online_calibration.target_ratio", str(e.exception))
        self.client.insert("online", tokens(2 * P, 31), self.rows.pages(2, seed=32))
        for _ in range(300):
            st = self.client.stats("online").namespace("online")
            if st.calibration.state == 3:
                break
            time.sleep(0.1)
        self.assertEqual((st.calibration.state, st.calibration.codec), (3, "kvtc"))
        self.assertEqual(st.calibration.target_ratio, 2)
        self.assertGreaterEqual(st.calibration.expected_ratio, 0.97 * 2)
        self.assertEqual(self.client.demote("online", Tier.HOST_COMPRESSED), 2)
        st = self.client.stats("online").namespace("online")
        self.assertEqual(st.codec("kvtc").pages, 2)
        self.assertGreater(st.codec("kvtc").stored_ratio(PB), 1)

    def test_identity_tiers_exact(self):
        self.make_ns("id_tiers", host_compressed_bytes=HOST_BYTES,
                     disk_dir=self.disk_dir("id_tiers"))
        cal = self.client.get_calibration("id_tiers")
        self.assertEqual((cal.bytes, cal.fingerprint), (b"", 0))
        self.assertIn(cal.codec, ("", "identity"))
        toks = tokens(3 * P, 31)
        data = os.urandom(3 * PB)
        self.client.insert("id_tiers", toks, data)
        for tier in (Tier.HOST_COMPRESSED, Tier.DISK):
            with self.subTest(tier=tier.name):
                self.assertEqual(self.client.demote("id_tiers", tier), 3)
                self.check_tier_stats("id_tiers", tier, 3)
                with self.client.match("id_tiers", toks, lock=True) as lease:
                    self.assertEqual(lease.page_tiers, (tier,) * 3)
                    for fmt in FetchFormat:
                        self.assertEqual(lease.fetch(format=fmt), data, fmt)
        # Nothing left to move.
        self.assertEqual(self.client.demote("id_tiers", Tier.DISK), 0)

    def test_bad_tier_arguments_name_the_field(self):
        c = self.client
        self.make_ns("tiers_bad", host_compressed_bytes=HOST_BYTES)
        c.insert("tiers_bad", tokens(P, 41), os.urandom(PB))
        other = kvharbor.Geometry(num_layers=L + 1, num_kv_heads=H, head_dim=D,
                                  page_size=P, dtype=kvharbor.DType.FP32)

        def create(**kwargs):
            return lambda: c.create_namespace("tiers_new", GEOM, NS_BYTES, **kwargs)

        cases = [
            (create(codec="zip"), "codec"),
            (create(codec="kvtc"), "calibration_path"),
            (create(codec="kvtc", calibration=b"not a calibration"), "calibration"),
            (create(codec="kvtc", calibration_path="/nonexistent/x.kvtc"),
             "calibration_path"),
            (create(calibration_path=self.cal_path), "calibration_path"),
            (create(disk_dir=self.disk_dir("no_host")), "disk_dir"),
            (create(disk_bytes=1 << 20), "disk_bytes"),
            (lambda: c.create_namespace("tiers_new", other, NS_BYTES, codec="kvtc",
                                        calibration_path=self.cal_path),
             "calibration_path"),  # calibrated for another geometry
            (create(host_compressed_bytes=-1), "host_compressed_bytes"),
            (create(disk_bytes=2**64), "disk_bytes"),
            (create(codec=5), "codec"),
            (create(calibration="text"), "calibration"),
            (create(calibration=12345), "calibration"),
            (create(disk_dir="a\0b"), "disk_dir"),
            (lambda: c.demote("tiers_bad", Tier.RAW), "tier"),
            (lambda: c.demote("tiers_bad", 7), "tier"),
            (lambda: c.demote("tiers_bad", "disk"), "tier"),
            (lambda: c.demote("", Tier.DISK), "namespace"),
            (lambda: c.get_calibration(""), "namespace"),
            (lambda: c.match("tiers_bad", tokens(P, 41)).fetch(format=9), "format"),
            (lambda: c.fetch_into("tiers_bad", bytearray(PB), handles=[1],
                                  format=-1), "format"),
        ]
        for fn, field in cases:
            with self.subTest(field=field):
                with self.assertRaises(kvharbor.InvalidArgumentError) as cm:
                    fn()
                self.assertEqual(cm.exception.code, kvharbor.StatusCode.INVALID_ARGUMENT)
                self.assertIn(field, cm.exception.message)
        self.assertNotIn("tiers_new", [n.name for n in c.list_namespaces()])
        with self.assertRaises(kvharbor.NotFoundError):
            c.demote("no_such_ns", Tier.DISK)
        with self.assertRaises(kvharbor.NotFoundError):
            c.get_calibration("no_such_ns")
        # The page stayed where it was: no argument above moved anything.
        self.check_tier_stats("tiers_bad", Tier.RAW, 1)

    def test_c_abi_guards(self):
        """What the Python layer never sends, the C ABI still refuses."""
        lib = kvharbor._native.library()
        self.assertGreaterEqual(lib.kvh_abi_version(), 2)
        handle = self.client._h()
        spec = kvharbor._native._NamespaceSpec()
        spec.struct_size = 8  # an unknown (older) layout
        spec.name = b"abi_ns"
        rc = lib.kvh_namespace_create_spec(handle, ctypes.byref(spec), 0, 0,
                                           None, None)
        self.assertEqual(rc, kvharbor.StatusCode.INVALID_ARGUMENT)
        self.assertIn(b"spec.struct_size", lib.kvh_last_error_message())
        # Between the ABI 2 layout and the ABI 5 one (online fields).
        spec.struct_size = ctypes.sizeof(kvharbor._native._NamespaceSpecV2) + 8
        rc = lib.kvh_namespace_create_spec(handle, ctypes.byref(spec), 0, 0,
                                           None, None)
        self.assertEqual(rc, kvharbor.StatusCode.INVALID_ARGUMENT)
        self.assertIn(b"spec.struct_size", lib.kvh_last_error_message())
        spec.struct_size = ctypes.sizeof(spec)
        spec.calibration_len = 16  # with a null pointer
        rc = lib.kvh_namespace_create_spec(handle, ctypes.byref(spec), 0, 0,
                                           None, None)
        self.assertEqual(rc, kvharbor.StatusCode.INVALID_ARGUMENT)
        self.assertIn(b"spec.calibration", lib.kvh_last_error_message())
        rc = lib.kvh_demote(handle, b"abi_ns", 3, None, 0)
        self.assertEqual(rc, kvharbor.StatusCode.INVALID_ARGUMENT)
        self.assertIn(b"tier", lib.kvh_last_error_message())
        rc = lib.kvh_get_calibration(handle, b"abi_ns", 0, None)
        self.assertEqual(rc, kvharbor.StatusCode.INVALID_ARGUMENT)
        self.assertIn(b"out", lib.kvh_last_error_message())
        lib.kvh_calibration_free(None)  # ignored
        empty = kvharbor._native._Calibration()
        lib.kvh_calibration_free(ctypes.byref(empty))  # zeroed: ignored


if __name__ == "__main__":
    unittest.main()
