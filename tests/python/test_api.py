"""The calls of the C ABI 4 through the Python client against a real
kvharbord: calibration upload, list, pin and lookup by fingerprint; online
calibration in create_namespace (calibrated by the daemon, then pinned);
COMPRESSED fetches undecoded and decoded page by page; the KVCM transform;
same-host host and device handles and the host-fetch counters; the
calibration keys of stats; and bad input naming the field.

CTest sets KVHARBORD, KVHARBOR_LIB and KVHARBOR_CALIBRATE (tools/
kvharbor-calibrate, which makes the KVTC calibration as test_tiers does)."""

import os
import struct
import time
import unittest

import kvharbor
from daemon import deadline
from kvharbor import (CalibrationState, FetchFormat, FetchTransform,
                      KvtcRowKind, OnlineCalibration, RopeStyle, Tier)
from test_tiers import (GEOM, HOST_BYTES, MAX_REL_ERROR, NS_BYTES, P, PB,
                        RATIO, CalibratedDaemonTest, rel_error, tokens)

L, H, D = GEOM.num_layers, GEOM.num_kv_heads, GEOM.head_dim


def kvcm_file(path, factor=2, hidden=4, min_seq_len=1):
    """A text-only fp32 KVCM weights file (core/transform/kvcm_format.h) for
    GEOM: per layer compress_tk and compress_tv, each Linear(factor*D ->
    hidden), Linear(hidden -> hidden), Linear(hidden -> D) with biases."""
    shapes = [(hidden, factor * D), (hidden, hidden), (D, hidden)]
    out = [struct.pack("<IIHHIIIIIIII", 0x4B56434D, 1, 2, 0, L, H, D, 0,
                       factor, min_seq_len, 6, 0)]
    value = 0
    for _ in range(L):
        for _prefix in range(2):
            for rows, cols in shapes:
                out.append(struct.pack("<III", rows, cols, 1))
                w = [((value + i) % 7 - 3) / 16.0 for i in range(rows * cols)]
                value += 1
                out.append(struct.pack(f"<{len(w)}f", *w))
                out.append(struct.pack(f"<{rows}f", *([0.01] * rows)))
    with open(path, "wb") as f:
        f.write(b"".join(out))


class ApiTest(CalibratedDaemonTest):
    RATIOS = (RATIO, 2)  # a second calibration to upload (RATIO is 4)

    @classmethod
    def daemon_args(cls):
        cls.socket = os.path.join(cls.tmp.name, "kvh.sock")
        return (f"--host_ipc_socket={cls.socket}",)

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        with open(cls.cal_files[2], "rb") as f:
            cls.cal4_bytes = f.read()
        cls.kvcm_path = os.path.join(cls.tmp.name, "kvcm.bin")
        kvcm_file(cls.kvcm_path)

    def test_upload_list_pin(self):
        c = self.client
        first = self.make_ns("cal_up", codec="kvtc", calibration=self.cal_bytes,
                             host_compressed_bytes=HOST_BYTES).info
        (only,) = c.list_calibrations("cal_up")
        self.assertEqual((only.codec, only.fingerprint, only.source),
                         ("kvtc", first.calibration_fingerprint, "config"))
        self.assertTrue(only.active)
        self.assertFalse(only.pinned)
        # Cold pages encoded with the config calibration keep it alive.
        toks = tokens(2 * P, 3)
        data = self.rows.pages(2, seed=4)
        c.insert("cal_up", toks, data)
        self.assertEqual(c.demote("cal_up", Tier.HOST_COMPRESSED), 2)
        fp = first.calibration_fingerprint
        c.pin_calibration("cal_up")  # whichever is active
        listed = c.list_calibrations("cal_up")
        self.assertTrue(listed[0].active and listed[0].pinned, listed)
        self.assertTrue(c.stats("cal_up").namespace("cal_up").calibration.pinned)
        # Pinned: another calibration is refused; unpinned it is accepted
        # (pinned at once) and becomes active, the config one stays listed
        # while cold pages use it.
        with self.assertRaises(kvharbor.FailedPreconditionError):
            c.upload_calibration("cal_up", bytearray(self.cal4_bytes))
        c.pin_calibration("cal_up", fp, pinned=False)  # by fingerprint
        self.assertFalse(c.list_calibrations("cal_up")[0].pinned)
        fp4 = c.upload_calibration("cal_up", memoryview(self.cal4_bytes),
                                   pin=True)
        self.assertNotEqual(fp4, fp)
        listed = c.list_calibrations("cal_up")
        self.assertEqual([(i.fingerprint, i.source, i.active, i.pinned, i.pages)
                          for i in listed],
                         [(fp4, "uploaded", True, True, 0),
                          (fp, "config", False, False, 2)])
        with c.match("cal_up", toks, lock=True) as lease:
            self.assertLess(rel_error(lease.fetch(format=FetchFormat.COMPRESSED),
                                      data), MAX_REL_ERROR)
        # Lookup by fingerprint: the bytes the namespace was created with.
        by_fp = c.get_calibration("cal_up", fingerprint=fp)
        self.assertEqual((by_fp.codec, by_fp.bytes, by_fp.fingerprint),
                         ("kvtc", self.cal_bytes, fp))
        with self.assertRaises(kvharbor.NotFoundError) as cm:
            c.get_calibration("cal_up", fingerprint=fp ^ 1)
        self.assertIn("calibration_fingerprint", cm.exception.message)

    def test_online_calibration(self):
        c = self.client
        spec = OnlineCalibration(min_tokens=16 * P, max_sample_tokens=64 * P,
                                 target_ratio=4, row_kind=KvtcRowKind.PER_TOKEN,
                                 rope_style=RopeStyle.NONE, sink_tokens=0)
        info = self.make_ns("cal_online", codec="kvtc", online_calibration=spec,
                            host_compressed_bytes=HOST_BYTES).info
        self.assertEqual(info.online_calibration, spec)
        self.assertEqual(c.describe_namespace("cal_online").online_calibration,
                         spec)
        st = c.stats("cal_online").namespace("cal_online").calibration
        self.assertEqual((st.state, st.codec), (CalibrationState.SAMPLING, "fp8"))
        for seq in range(4):
            c.insert("cal_online", tokens(8 * P, 100 + seq),
                     self.rows.pages(8, seed=200 + seq))
        end = deadline(60)
        while True:
            st = c.stats("cal_online").namespace("cal_online").calibration
            if st.state == CalibrationState.READY or time.monotonic() > end:
                break
            time.sleep(0.1)
        self.assertEqual((st.state, st.codec), (CalibrationState.READY, "kvtc"))
        self.assertGreaterEqual(st.tokens_seen, 16 * P)
        active = c.list_calibrations("cal_online")[0]
        self.assertEqual((active.source, active.fingerprint, active.active),
                         ("online", st.fingerprint, True))
        c.pin_calibration("cal_online")
        self.assertTrue(c.stats("cal_online").namespace("cal_online")
                        .calibration.pinned)
        # The daemon fills in its defaults (0 and None ask for them).
        # (The default target ratio, 16, is out of reach for GEOM's small
        # pages once every stored byte counts: the test asks for 4.)
        plain = self.make_ns("cal_online2", codec="kvtc",
                             online_calibration=OnlineCalibration(
                                 target_ratio=4)).info
        self.assertEqual(plain.online_calibration, OnlineCalibration(
            min_tokens=65536, max_sample_tokens=16384, target_ratio=4,
            sink_tokens=4))
        self.assertIsNone(self.make_ns("cal_offline").info.online_calibration)

    def test_compressed_pages_decoded_by_page(self):
        c = self.client
        self.make_ns("comp", codec="kvtc", calibration=self.cal_bytes,
                     host_compressed_bytes=HOST_BYTES)
        toks = tokens(3 * P, 5)
        data = self.rows.pages(3, seed=6)
        c.insert("comp", toks, data)
        c.demote("comp", Tier.HOST_COMPRESSED)
        with c.match("comp", toks, lock=True) as lease:
            pages = lease.fetch_compressed()
            whole = lease.fetch(format=FetchFormat.COMPRESSED)
            window = c.fetch_compressed("comp", lease=lease, start_page=1,
                                        page_count=1)
        fp = c.get_calibration("comp").fingerprint
        self.assertEqual([p.handle for p in pages], list(lease.handles))
        for p in pages:
            self.assertEqual((p.tier, p.codec, p.calibration_fingerprint),
                             (Tier.HOST_COMPRESSED, "kvtc", fp))
            self.assertLess(len(p.data), PB)  # compressed
        self.assertEqual(window, pages[1:2])
        decoded = b"".join(bytes(c.decode_page("comp", p)) for p in pages)
        self.assertEqual(decoded, whole)  # the SDK's own decode, page by page
        self.assertLess(rel_error(decoded, data), MAX_REL_ERROR)
        into = bytearray(PB)
        self.assertIs(c.decode_page("comp", pages[0], into), into)
        # By handle, without a lease.
        plain = c.match("comp", toks)
        self.assertEqual(plain.fetch_compressed(), pages)
        with self.assertRaises(kvharbor.InvalidArgumentError) as cm:
            c.decode_page("comp", pages[0], bytearray(PB - 1))
        self.assertIn("dst", cm.exception.message)
        with self.assertRaises(kvharbor.InvalidArgumentError) as cm:
            c.decode_page("comp", b"not a page")
        self.assertIn("page", cm.exception.message)

    def test_kvcm_transform(self):
        c = self.client
        info = self.make_ns("kvcm", kvcm_path=self.kvcm_path).info
        self.assertEqual(info.kvcm_path, self.kvcm_path)
        toks = tokens(4 * P, 7)
        c.insert("kvcm", toks, self.rows.pages(4, seed=8))
        dst = bytearray(4 * PB)
        with c.match("kvcm", toks, lock=True) as lease:
            r = lease.fetch_transformed(dst)
        self.assertEqual(r.input_tokens, 4 * P)
        self.assertEqual(r.output_tokens, 4 * P // 2)  # factor 2, no tail
        self.assertEqual(r.nbytes, 2 * L * r.output_tokens * H * D * 4)
        self.assertTrue(any(dst[:r.nbytes]))
        with c.match("kvcm", toks, lock=True) as lease:
            with self.assertRaises(kvharbor.InvalidArgumentError) as cm:
                lease.fetch_transformed(bytearray(16))
            self.assertIn("dst", cm.exception.message)
            with self.assertRaises(kvharbor.InvalidArgumentError) as cm:
                lease.fetch_transformed(dst, transform=FetchTransform.NONE)
            self.assertIn("transform", cm.exception.message)
        # A namespace without weights refuses, naming the transform.
        self.make_ns("no_kvcm")
        c.insert("no_kvcm", toks, bytes(4 * PB))
        with c.match("no_kvcm", toks, lock=True) as lease:
            with self.assertRaises(kvharbor.FailedPreconditionError) as cm:
                lease.fetch_transformed(dst)
            self.assertIn("transform", cm.exception.message)
        with self.assertRaises(kvharbor.InvalidArgumentError) as cm:
            c.create_namespace("kvcm_bad", GEOM, NS_BYTES,
                               kvcm_path=os.path.join(self.tmp.name, "none.bin"))
        self.assertIn("kvcm_path", cm.exception.message)

    def test_host_and_device_handles(self):
        c = self.client
        self.make_ns("handles")
        toks = tokens(2 * P, 9)
        data = os.urandom(2 * PB)
        c.insert("handles", toks, data)
        before = c.host_fetch_stats()
        with c.match("handles", toks, lock=True) as lease:
            h = lease.host_handles()
            self.assertEqual(h.socket_path, self.socket)
            self.assertEqual([p.handle for p in h.pages], list(lease.handles))
            self.assertEqual({p.bytes for p in h.pages}, {PB})
            for p in h.pages:
                self.assertLessEqual(p.offset + p.bytes, h.arena_bytes)
            self.assertNotEqual(h.daemon_id, 0)
            self.assertEqual(lease.fetch(), data)  # served from shared memory
            with self.assertRaises(kvharbor.FailedPreconditionError):
                lease.device_handles()  # no GPU tier in this daemon
        after = c.host_fetch_stats()
        self.assertEqual(after.shm_fetches, before.shm_fetches + 1)
        self.assertEqual(after.shm_pages, before.shm_pages + 2)
        self.assertEqual(after.checksum_mismatches, 0)
        st = c.stats("handles").namespace("handles")
        self.assertGreaterEqual(st.host_ipc_bytes, 2 * PB)
        with self.assertRaises(kvharbor.NotFoundError) as cm:
            c.host_handles("handles", 12345)
        self.assertIn("lease_id", cm.exception.message)

    def test_request_options(self):
        """The request options test_client does not cover: the page layout
        and rope_theta of a geometry, DeleteNamespace.force, DumpTree.
        max_nodes and the global stats of Stats("")."""
        c = self.client
        geom = kvharbor.Geometry(L, H, D, P, kvharbor.DType.FP32,
                                 kvharbor.PageLayout.LAYER_KV_TOKEN_HEAD_DIM,
                                 rope_theta=500000.0)
        info = c.create_namespace("opts", geom, capacity_bytes=NS_BYTES).info
        self.assertEqual(info.geometry, geom)
        self.assertEqual(c.describe_namespace("opts").geometry.rope_theta, 500000.0)
        c.insert("opts", tokens(3 * P, 1), os.urandom(3 * PB))
        c.insert("opts", tokens(2 * P, 2), os.urandom(2 * PB))
        full = c.dump_tree("opts")
        short = c.dump_tree("opts", max_nodes=1)
        self.assertEqual(short.nodes, full.nodes)
        self.assertLess(len(short.text), len(full.text))
        st = c.stats()
        self.assertGreaterEqual(st.global_.namespaces, 1)
        self.assertGreaterEqual(st.global_.cached_pages, 5)
        self.assertIn("opts", [n.name for n in st.namespaces])
        lease = c.match("opts", tokens(3 * P, 1), lock=True)
        self.assertEqual(st.global_.pool_budget_bytes > 0, True)
        with self.assertRaises(kvharbor.FailedPreconditionError):
            c.delete_namespace("opts")  # a lease is active
        c.delete_namespace("opts", force=True)
        with self.assertRaises(kvharbor.NotFoundError):
            lease.extend(5)

    def test_transfer_options(self):
        """FetchRequest.max_chunk_bytes, Insert chunking and page checksums
        as Client options."""
        self.make_ns("chunks")
        toks = tokens(4 * P, 12)
        data = os.urandom(4 * PB)
        for opts in ({"fetch_chunk_bytes": 1024, "insert_chunk_bytes": 100},
                     {"checksums": False}):
            with self.subTest(**opts), kvharbor.Client(self.daemon.address,
                                                       **opts) as c:
                c.evict_all("chunks")
                self.assertEqual(c.insert("chunks", toks, data).pages_stored, 4)
                with c.match("chunks", toks, lock=True) as lease:
                    self.assertEqual(lease.fetch(), data)
        with kvharbor.Client(self.daemon.address, fetch_chunk_bytes=512) as c:
            # By handle: streamed (a lease would be copied from shared memory).
            with self.assertRaises(kvharbor.InvalidArgumentError) as cm:
                c.match("chunks", toks).fetch()
            self.assertIn("max_chunk_bytes", cm.exception.message)
        for opts, field in (({"fetch_chunk_bytes": 1 << 30}, "fetch_chunk_bytes"),
                            ({"insert_chunk_bytes": -1}, "insert_chunk_bytes"),
                            ({"max_reconnect_backoff": -1},
                             "max_reconnect_backoff")):
            with self.subTest(field=field):
                with self.assertRaises(kvharbor.InvalidArgumentError) as cm:
                    kvharbor.Client(self.daemon.address, **opts)
                self.assertIn(field, cm.exception.message)

    def test_bad_input_names_the_field(self):
        c = self.client
        self.make_ns("api_bad", codec="kvtc", calibration=self.cal_bytes)

        def create(**kwargs):
            return lambda: c.create_namespace("api_new", GEOM, NS_BYTES, **kwargs)

        cases = [
            (lambda: c.upload_calibration("api_bad", b"junk"), "calibration"),
            (lambda: c.upload_calibration("api_bad", "text"), "calibration"),
            (lambda: c.upload_calibration("api_bad", b""), "calibration"),
            (lambda: c.upload_calibration("", b"x"), "namespace"),
            (lambda: c.pin_calibration("api_bad", fingerprint=-1), "fingerprint"),
            (lambda: c.get_calibration("api_bad", fingerprint="x"), "fingerprint"),
            (lambda: c.fetch_compressed("api_bad"), "lease"),
            (lambda: c.fetch_compressed("api_bad", lease=1, handles=[1]), "lease"),
            (lambda: c.fetch_transformed("api_bad", bytearray(8), handles=[1],
                                         transform=7), "transform"),
            (lambda: c.host_handles("api_bad", -1), "lease"),
            (create(codec="kvtc", online_calibration=OnlineCalibration(
                target_ratio=0.5)), "online_calibration.target_ratio"),
            (create(codec="kvtc", online_calibration=OnlineCalibration(
                target_ratio=4, rope_style=RopeStyle.HALF_SPLIT)), "online_calibration.rope_style"),
            (create(codec="kvtc", online_calibration=OnlineCalibration(
                target_ratio=4, row_kind=5)), "online_calibration.row_kind"),
            (create(codec="kvtc", online_calibration=OnlineCalibration(
                target_ratio=4, sink_tokens=2**32)), "online_calibration.sink_tokens"),
            (create(codec="kvtc", online_calibration={"min_tokens": 1}),
             "online_calibration"),
            (create(kvcm_path=3), "kvcm_path"),
        ]
        for fn, field in cases:
            with self.subTest(field=field):
                with self.assertRaises(kvharbor.InvalidArgumentError) as cm:
                    fn()
                self.assertIn(field, cm.exception.message)
        self.assertNotIn("api_new", [n.name for n in c.list_namespaces()])
        with self.assertRaises(kvharbor.FailedPreconditionError):
            c.pin_calibration("api_bad", fingerprint=1)  # not the active one


if __name__ == "__main__":
    unittest.main()
