"""kvharbor.Client against a real kvharbord: namespaces, insert from bytes and
NumPy, match with leases, byte-exact fetch into preallocated buffers, evict,
stats, and bad input raising with the field named."""

import os
import random
import time
import unittest

import kvharbor
from daemon import Daemon

try:
    import numpy as np
except ImportError:  # NumPy is optional for the package and these tests
    np = None

GEOM = kvharbor.Geometry(num_layers=2, num_kv_heads=2, head_dim=16,
                         page_size=4, dtype=kvharbor.DType.FP16)
PB = GEOM.page_bytes  # 2*2*4*2*16*2 = 1024
NS_BYTES = 1 << 20  # the daemon's pool is 64 MiB


def tokens(n, seed):
    rng = random.Random(seed)
    return [rng.randrange(1, 32000) for _ in range(n)]


class ClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon()
        cls.client = kvharbor.Client(cls.daemon.address, timeout=10)
        cls.client.wait_connected(10)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        rc = cls.daemon.stop()
        if rc != 0:
            raise AssertionError(f"kvharbord exited {rc}")

    def make_ns(self, name):
        r = self.client.create_namespace(name, GEOM, capacity_bytes=NS_BYTES)
        self.addCleanup(self.client.delete_namespace, name, True)
        return r

    def test_version(self):
        self.assertEqual(kvharbor.Client.version(), kvharbor.__version__)

    def test_namespaces(self):
        r = self.make_ns("ns_admin")
        self.assertTrue(r.created)
        self.assertEqual(r.info.geometry, GEOM)
        self.assertEqual(r.info.stats.page_bytes, PB)
        again = self.client.create_namespace("ns_admin", GEOM, NS_BYTES,
                                            if_not_exists=True)
        self.assertFalse(again.created)
        with self.assertRaises(kvharbor.AlreadyExistsError) as cm:
            self.client.create_namespace("ns_admin", GEOM, NS_BYTES)
        self.assertEqual(cm.exception.code, kvharbor.StatusCode.ALREADY_EXISTS)
        self.assertIn("ns_admin", [n.name for n in self.client.list_namespaces()])
        self.assertEqual(self.client.describe_namespace("ns_admin").geometry, GEOM)
        self.client.create_namespace("ns_gone", GEOM, NS_BYTES)
        self.client.delete_namespace("ns_gone")
        with self.assertRaises(kvharbor.NotFoundError):
            self.client.describe_namespace("ns_gone")

    def test_insert_match_fetch_bytes(self):
        self.make_ns("ns_bytes")
        toks = tokens(16, 1)
        data = os.urandom(4 * PB)
        ins = self.client.insert("ns_bytes", toks, data)
        self.assertEqual((ins.pages_stored, ins.already_present_tokens), (4, 0))
        # A longer prompt matches the stored whole pages only.
        with self.client.match("ns_bytes", toks + [7, 8, 9], lock=True, ttl=5) as lease:
            self.assertTrue(lease.locked)
            self.assertEqual((lease.matched_tokens, lease.num_pages), (16, 4))
            self.assertGreater(lease.expires_at, time.time())
            self.assertLessEqual(lease.expires_at, time.time() + 6)
            dst = bytearray(4 * PB)
            r = lease.fetch_into(dst)
            self.assertEqual((r.num_pages, r.bytes_written), (4, 4 * PB))
            self.assertEqual(dst, data)
            # A window of the lease into a memoryview slice of a bigger buffer.
            big = bytearray(3 * PB)
            self.client.fetch_into("ns_bytes", memoryview(big)[PB:], lease=lease,
                                   start_page=1, page_count=2)
            self.assertEqual(big[:PB], bytes(PB))
            self.assertEqual(big[PB:], data[PB:3 * PB])
            later = lease.extend(20)
            self.assertGreater(later, time.time() + 15)
            self.assertEqual(self.client.stats("ns_bytes").namespaces[0].active_leases, 1)
        self.assertEqual(self.client.stats("ns_bytes").namespaces[0].active_leases, 0)
        with self.assertRaises(kvharbor.KvHarborError):  # released already
            self.client.release(lease.id)
        # Re-inserting dedups; per-page buffers and by-handle fetch.
        again = self.client.insert("ns_bytes", toks, [data[i * PB:(i + 1) * PB]
                                                      for i in range(4)])
        self.assertEqual((again.pages_stored, again.already_present_tokens), (0, 16))
        plain = self.client.match("ns_bytes", toks[:9])
        self.assertFalse(plain.locked)
        self.assertEqual(plain.num_pages, 2)
        pages = [bytearray(PB), bytearray(PB)]
        self.client.fetch_into("ns_bytes", pages, handles=plain.handles)
        self.assertEqual(b"".join(pages), data[:2 * PB])
        self.assertEqual(plain.fetch(), data[:2 * PB])
        # COMPRESSED: identity codec buffers, decoded by the SDK, byte-exact.
        comp = bytearray(4 * PB)
        r = self.client.fetch_into("ns_bytes", comp, handles=self.client.match(
            "ns_bytes", toks).handles, format=kvharbor.FetchFormat.COMPRESSED)
        self.assertEqual((r.num_pages, r.bytes_written), (4, 4 * PB))
        self.assertEqual(comp, data)

    @unittest.skipIf(np is None, "numpy is not installed")
    def test_numpy_roundtrip(self):
        self.make_ns("ns_numpy")
        toks = np.array(tokens(12, 2), dtype=np.int32)
        rng = np.random.default_rng(3)
        kv = rng.standard_normal((3, PB // 2)).astype(np.float16)
        self.client.insert("ns_numpy", toks, kv)
        readonly = kv.copy()
        readonly.setflags(write=False)
        ins = self.client.insert("ns_numpy", toks, readonly)  # read-only is fine
        self.assertEqual(ins.already_present_tokens, 12)
        lease = self.client.match("ns_numpy", toks, lock=True)
        try:
            out = np.zeros_like(kv)
            self.client.fetch_into("ns_numpy", out, lease=lease)
            self.assertEqual(out.tobytes(), kv.tobytes())
            with self.assertRaises(kvharbor.InvalidArgumentError) as cm:
                self.client.fetch_into("ns_numpy", readonly, lease=lease)
            self.assertIn("dst", cm.exception.message)
            with self.assertRaises(kvharbor.InvalidArgumentError) as cm:
                self.client.fetch_into("ns_numpy", np.zeros((PB, 3), np.uint8).T,
                                       lease=lease)  # not C-contiguous
            self.assertIn("dst", cm.exception.message)
            small = np.zeros(2 * PB, np.uint8)
            with self.assertRaises(kvharbor.InvalidArgumentError) as cm:
                self.client.fetch_into("ns_numpy", small, lease=lease)
            self.assertIn("dst", cm.exception.message)
        finally:
            lease.release()

    def test_evict_and_stats(self):
        self.make_ns("ns_evict")
        a, b = tokens(8, 4), tokens(8, 5)
        self.client.insert("ns_evict", a, os.urandom(2 * PB))
        self.client.insert("ns_evict", b, os.urandom(2 * PB))
        st = self.client.stats("ns_evict").namespace("ns_evict")
        self.assertEqual(st.cached_pages, 4)
        self.assertEqual(st.bytes_in, 4 * PB)
        self.assertGreater(self.client.stats().global_.cached_pages, 3)
        m = self.client.match("ns_evict", a)
        r = self.client.evict_pages("ns_evict", m.handles[1:])
        self.assertEqual((r.pages_evicted, r.bytes_freed), (1, PB))
        self.assertEqual(self.client.match("ns_evict", a).matched_tokens, 4)
        with self.client.match("ns_evict", b, lock=True):
            r = self.client.evict_all("ns_evict")
            self.assertEqual(r.pages_evicted, 1)  # the leased pages stay
            self.assertEqual(self.client.match("ns_evict", b).matched_tokens, 8)
        r = self.client.evict_bytes("ns_evict", 1)
        self.assertGreaterEqual(r.pages_evicted, 1)
        self.assertIn("nodes", repr(self.client.dump_tree("ns_evict")))

    def test_bad_input_names_field(self):
        self.make_ns("ns_bad")
        c = self.client
        cases = [
            (lambda: c.insert("ns_bad", tokens(5, 6), os.urandom(PB)), "token"),
            (lambda: c.insert("ns_bad", tokens(4, 6), os.urandom(PB - 1)), "pages"),
            (lambda: c.insert("ns_bad", [], b""), "tokens"),
            (lambda: c.insert("ns_bad", [2**40], os.urandom(PB)), "tokens"),
            (lambda: c.insert("ns_bad", tokens(4, 6), 12345), "pages"),
            (lambda: c.insert("ns_bad", tokens(8, 6), [b"x" * PB, b"y"]), "pages[1]"),
            (lambda: c.match("", [1, 2]), "namespace"),
            (lambda: c.match("ns_bad", [1, 2, 3, 4], ttl=-1), "ttl"),
            (lambda: c.match("ns_bad", [1, 2, 3, 4], timeout=0), "timeout"),
            (lambda: c.fetch_into("ns_bad", bytearray(PB)), "lease"),
            (lambda: c.fetch_into("ns_bad", b"immutable", handles=[1]), "dst"),
            (lambda: c.evict_bytes("ns_bad", 0), "nbytes"),
            (lambda: c.create_namespace("ns_bad2", kvharbor.Geometry(0, 2, 16, 4)),
             "num_layers"),
        ]
        for fn, field in cases:
            with self.subTest(field=field):
                with self.assertRaises(kvharbor.InvalidArgumentError) as cm:
                    fn()
                self.assertEqual(cm.exception.code, kvharbor.StatusCode.INVALID_ARGUMENT)
                self.assertIn(field, cm.exception.message)
        with self.assertRaises(kvharbor.NotFoundError):
            c.match("no_such_ns", [1, 2, 3, 4])
        with self.assertRaises(kvharbor.NotFoundError):
            c.fetch_into("ns_bad", bytearray(PB), handles=[1],
                         format=kvharbor.FetchFormat.COMPRESSED)

    def test_unreachable_daemon(self):
        with kvharbor.Client("127.0.0.1:1", timeout=0.5) as c:
            with self.assertRaises(kvharbor.KvHarborError) as cm:
                c.stats()
            self.assertIn(cm.exception.code, (kvharbor.StatusCode.UNAVAILABLE,
                                              kvharbor.StatusCode.DEADLINE_EXCEEDED))
        with self.assertRaises(kvharbor.InvalidArgumentError):
            c.stats()  # closed


if __name__ == "__main__":
    unittest.main()
