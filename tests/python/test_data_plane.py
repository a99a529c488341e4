"""kvharbor.Client on the bulk data plane (docs/data_plane.md) against a
real kvharbord with data_plane.listen: byte-exact fetches with the plane
(auto, on, several connection counts) and without it (off), a daemon without
the plane, and bad options raising with the field named."""

import random
import tempfile
import unittest

import kvharbor
from daemon import Daemon

GEOM = kvharbor.Geometry(num_layers=2, num_kv_heads=2, head_dim=16,
                         page_size=4, dtype=kvharbor.DType.FP16)
PB = GEOM.page_bytes


class DataPlaneTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.work = tempfile.TemporaryDirectory()
        cls.daemon = Daemon(config={"data_plane": {"listen": "127.0.0.1:0"}},
                            workdir=cls.work.name)
        cls.plain = Daemon()

    @classmethod
    def tearDownClass(cls):
        for d in (cls.daemon, cls.plain):
            rc = d.stop()
            if rc != 0:
                raise AssertionError(f"kvharbord exited {rc}")
        cls.work.cleanup()

    def store(self, client, name, pages):
        client.create_namespace(name, GEOM, capacity_bytes=1 << 20)
        self.addCleanup(client.delete_namespace, name, True)
        rng = random.Random(pages)
        toks = [rng.randrange(1, 32000) for _ in range(pages * GEOM.page_size)]
        data = bytes(rng.randrange(256) for _ in range(pages * PB))
        client.insert(name, toks, data)
        return toks, data

    def test_fetch_with_and_without_the_plane(self):
        admin = kvharbor.Client(self.daemon.address, timeout=10)
        self.addCleanup(admin.close)
        toks, data = self.store(admin, "plane", 23)
        for opts in ({}, {"data_plane": "on"}, {"data_plane": "off"},
                     {"data_plane_connections": 1},
                     {"data_plane": "on", "data_plane_connections": 16}):
            with self.subTest(**opts):
                c = kvharbor.Client(self.daemon.address, timeout=10,
                                    host_fetch="off", **opts)
                try:
                    with c.match("plane", toks, lock=True) as lease:
                        self.assertEqual(bytes(lease.fetch()), data)
                finally:
                    c.close()

    def test_daemon_without_the_plane_streams(self):
        c = kvharbor.Client(self.plain.address, timeout=10, data_plane="on")
        self.addCleanup(c.close)
        toks, data = self.store(c, "noplane", 5)
        with c.match("noplane", toks, lock=True) as lease:
            self.assertEqual(bytes(lease.fetch()), data)

    def test_bad_options(self):
        for kwargs, field in (({"data_plane": "fast"}, "data_plane"),
                              ({"data_plane_connections": 0},
                               "data_plane_connections"),
                              ({"data_plane_connections": 17},
                               "data_plane_connections"),
                              ({"data_plane_connections": True},
                               "data_plane_connections")):
            with self.subTest(**kwargs):
                with self.assertRaises(kvharbor.InvalidArgumentError) as cm:
                    kvharbor.Client(self.daemon.address, **kwargs)
                self.assertIn(field, str(cm.exception))


if __name__ == "__main__":
    unittest.main()
