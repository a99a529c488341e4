"""The HiCache-shaped adapter against a real kvharbord: consecutive hit counts,
batch_get into engine buffers, batch_set from page 0 and incrementally."""

import os
import random
import unittest

import kvharbor
from daemon import Daemon
from kvharbor.hicache import KvHarborHiCacheStorage, page_keys

GEOM = kvharbor.Geometry(num_layers=1, num_kv_heads=2, head_dim=8,
                         page_size=4, dtype=kvharbor.DType.FP32)
PB = GEOM.page_bytes  # 2*1*4*2*8*4 = 512


class HiCacheTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon()
        cls.client = kvharbor.Client(cls.daemon.address, timeout=10)
        cls.client.create_namespace("hicache", GEOM, capacity_bytes=1 << 20)
        cls.store = KvHarborHiCacheStorage(cls.client, "hicache")

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        if cls.daemon.stop() != 0:
            raise AssertionError("kvharbord did not exit cleanly")

    def setUp(self):
        self.client.evict_all("hicache")

    def test_exists_get_set(self):
        rng = random.Random(7)
        prompt = [rng.randrange(1, 1000) for _ in range(22)]  # 5 pages + 2
        keys = self.store.page_keys(prompt)
        self.assertEqual(len(keys), 5)
        pages = [os.urandom(PB) for _ in keys]
        self.assertEqual(self.store.batch_exists(keys), 0)
        self.assertEqual(self.store.batch_get(keys), [None] * 5)
        # The engine backs up the first three pages, then the rest.
        self.assertTrue(self.store.batch_set(keys[:3], pages[:3]))
        self.assertEqual(self.store.batch_exists(keys), 3)
        self.assertEqual(self.store.batch_exists(keys[1:]), 2)
        self.assertEqual(self.store.batch_exists(keys[3:]), 0)
        self.assertTrue(self.store.exists(keys[2]))
        self.assertFalse(self.store.exists(keys[3]))
        self.assertTrue(self.store.batch_set(keys[3:], pages[3:]))
        self.assertEqual(self.store.batch_exists(keys), 5)
        # batch_get into preallocated engine buffers (one per page).
        targets = [bytearray(PB) for _ in keys[1:4]]
        got = self.store.batch_get(keys[1:4], targets)
        self.assertEqual([bytes(t) for t in got], pages[1:4])
        self.assertTrue(all(g is t for g, t in zip(got, targets)))
        self.assertEqual(self.store.get(keys[4]), pages[4])
        # A prompt that diverges after two pages hits two of them.
        other = prompt[:8] + [p + 1 for p in prompt[8:]]
        other_keys = self.store.page_keys(other)
        self.assertEqual(self.store.batch_exists(other_keys), 2)
        got = self.store.batch_get(other_keys)
        self.assertEqual(got[:2], pages[:2])
        self.assertEqual(got[2:], [None] * 3)
        self.assertEqual(self.client.stats("hicache").namespaces[0].active_leases, 0)

    def test_set_without_prefix_fails(self):
        keys = page_keys(list(range(100, 116)), 4)
        self.assertFalse(self.store.batch_set(keys[2:], [os.urandom(PB)] * 2))
        self.assertEqual(self.store.batch_exists(keys), 0)

    def test_bad_keys(self):
        keys = self.store.page_keys(list(range(16)))
        other = self.store.page_keys(list(range(16)))
        for bad, field in [([], "keys"), ([keys[0], keys[2]], "keys[1]"),
                           ([keys[0], other[1]], "keys[1]"),
                           (["key"], "keys[0]"),
                           (page_keys(list(range(16)), 8), "keys[0]")]:
            with self.subTest(field=field):
                with self.assertRaises(kvharbor.InvalidArgumentError) as cm:
                    self.store.batch_exists(bad)
                self.assertIn(field, cm.exception.message)
        with self.assertRaises(kvharbor.InvalidArgumentError) as cm:
            self.store.batch_set(keys[:2], [os.urandom(PB)])
        self.assertIn("values", cm.exception.message)
        with self.assertRaises(kvharbor.InvalidArgumentError) as cm:
            self.store.batch_set(keys[:1], [os.urandom(PB - 4)])
        self.assertIn("pages", cm.exception.message)


if __name__ == "__main__":
    unittest.main()
