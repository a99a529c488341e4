"""Issue 32 items 2 and 3 through the Python client against a real kvharbord
(docs/engines_api.md "Page-hash namespaces", "Topology"):

- KeyKind.PAGE_HASHES: pages 1..200 inserted in two batches with no prefix
  (SGLang's backup batches of 128) all match; a list whose earlier pages
  another call stored matches without them; a match stops at the first
  missing key; evicting a middle page shortens the match.
- create_namespace(topology=kvharbor.Topology(...)): the daemon fills it in;
  a second process claiming the namespace with another pipeline stage,
  tensor-parallel rank, model or dtype gets AlreadyExistsError naming the
  field; bad ranges are InvalidArgumentError naming the field."""

import hashlib
import random
import unittest

import kvharbor
from daemon import Daemon

GEOM = kvharbor.Geometry(num_layers=2, num_kv_heads=2, head_dim=16,
                         page_size=4, dtype=kvharbor.DType.FP16)
PB = GEOM.page_bytes
NS_BYTES = 1 << 20  # 1024 pages


def pages(n, seed):
    rng = random.Random(seed)
    return bytes(rng.randrange(256) for _ in range(n * PB))


def chain(n, salt=b""):
    """n chained page hashes as SGLang makes them: 64 hex characters, each
    hashing the previous hash and the page's (stand-in) tokens."""
    keys, prev = [], salt
    for i in range(n):
        prev = hashlib.sha256(prev + i.to_bytes(4, "little")).hexdigest().encode()
        keys.append(prev.decode())
    return keys


class PageHashTest(unittest.TestCase):
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

    def make_ns(self, name, **kwargs):
        r = self.client.create_namespace(name, GEOM, capacity_bytes=NS_BYTES,
                                         **kwargs)
        self.addCleanup(self.client.delete_namespace, name, True)
        return r

    def matched(self, ns, keys):
        return self.client.match(ns, keys=keys).num_pages

    def test_batches_without_a_prefix(self):
        r = self.make_ns("sgl", key_kind=kvharbor.KeyKind.PAGE_HASHES)
        self.assertEqual(r.info.key_kind, kvharbor.KeyKind.PAGE_HASHES)
        keys = chain(200)
        data = pages(200, 1)
        # Pages 1..128, then 129..200 with no prefix: both stored.
        res = self.client.insert("sgl", data[:128 * PB], keys=keys[:128])
        self.assertEqual(res.pages_stored, 128)
        res = self.client.insert("sgl", data[128 * PB:], keys=keys[128:])
        self.assertEqual(res.pages_stored, 72)
        self.assertEqual(self.matched("sgl", keys), 200)
        # A prefetch that passes only a node's own pages (SGLang's row (b)):
        # the pages another call stored match without their ancestors.
        with self.client.match("sgl", keys=keys[150:170], lock=True) as lease:
            self.assertEqual(lease.num_pages, 20)
            self.assertEqual(lease.matched_tokens, 20 * GEOM.page_size)
            self.assertEqual(bytes(lease.fetch()), data[150 * PB:170 * PB])
        # The match stops at the first missing key.
        self.assertEqual(self.matched("sgl", keys[:10] + ["gone"] + keys[10:]),
                         10)
        self.assertEqual(self.matched("sgl", keys[195:] + chain(3, b"x")), 5)
        # Evicting a middle page shortens the match from the start, and
        # only that one.
        handle = self.client.match("sgl", keys=keys[99:100]).handles
        self.assertEqual(self.client.evict_pages("sgl", handle).pages_evicted, 1)
        self.assertEqual(self.matched("sgl", keys), 99)
        self.assertEqual(self.matched("sgl", keys[100:]), 100)
        # Storing the whole list again stores only that page.
        res = self.client.insert("sgl", data, keys=keys)
        self.assertEqual(res.pages_stored, 1)
        self.assertEqual(res.already_present_tokens, 199 * GEOM.page_size)
        self.assertEqual(self.matched("sgl", keys), 200)
        self.assertEqual(self.client.stats("sgl").namespaces[0].cached_pages,
                         200)

    def test_skip_pages(self):
        self.make_ns("skip", key_kind=kvharbor.KeyKind.PAGE_HASHES)
        keys = chain(6)
        data = pages(6, 2)
        self.client.insert("skip", data[:2 * PB], keys=keys[:2])
        # Every page given, the first two skipped: only the new ones travel.
        res = self.client.insert("skip", data, keys=keys, skip_pages=2)
        self.assertEqual(res.pages_stored, 4)
        self.assertEqual(bytes(self.client.match("skip", keys=keys,
                                                 lock=True).fetch()), data)

    def test_bad_input(self):
        self.make_ns("bad", key_kind=kvharbor.KeyKind.PAGE_HASHES)
        with self.assertRaises(kvharbor.InvalidArgumentError) as cm:
            self.client.match("bad", [1, 2, 3, 4])
        self.assertIn("token_ids", str(cm.exception))
        with self.assertRaises(kvharbor.InvalidArgumentError) as cm:
            self.client.match("bad", keys=["a", ""])
        self.assertIn("keys[1]", str(cm.exception))
        with self.assertRaises(kvharbor.AlreadyExistsError) as cm:
            self.client.create_namespace("bad", GEOM, capacity_bytes=NS_BYTES,
                                         if_not_exists=True,
                                         key_kind=kvharbor.KeyKind.PAGE_KEYS)
        self.assertIn("spec.key_kind", str(cm.exception))


class TopologyTest(unittest.TestCase):
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

    def create(self, name, geometry=GEOM, **topology):
        r = self.client.create_namespace(
            name, geometry, capacity_bytes=NS_BYTES, if_not_exists=True,
            topology=kvharbor.Topology(**topology))
        if r.created:
            self.addCleanup(self.client.delete_namespace, name, True)
        return r

    def test_stage_rank_model_dtype(self):
        stage0 = dict(model="meta-llama/Llama-3.1-8B", layer_begin=0,
                      total_layers=4, kv_head_begin=2, total_kv_heads=4)
        r = self.create("pp", **stage0)
        self.assertTrue(r.created)
        self.assertEqual(r.info.topology, kvharbor.Topology(
            model="meta-llama/Llama-3.1-8B", layer_begin=0, layer_end=2,
            total_layers=4, kv_head_begin=2, kv_head_end=4, total_kv_heads=4))
        self.assertEqual(self.client.describe_namespace("pp").topology,
                         r.info.topology)
        # The same claim is the same namespace.
        self.assertFalse(self.create("pp", **stage0).created)
        # Pipeline stage 1, TP rank 0, another model, another dtype.
        for field, change in (
                ("spec.topology.layer_begin", dict(layer_begin=2)),
                ("spec.topology.kv_head_begin", dict(kv_head_begin=0)),
                ("spec.topology.model", dict(model="Qwen/Qwen3-8B"))):
            with self.subTest(field=field):
                with self.assertRaises(kvharbor.AlreadyExistsError) as cm:
                    self.create("pp", **{**stage0, **change})
                self.assertIn(field, str(cm.exception))
        fp32 = kvharbor.Geometry(num_layers=2, num_kv_heads=2, head_dim=16,
                                 page_size=4, dtype=kvharbor.DType.FP32)
        with self.assertRaises(kvharbor.AlreadyExistsError) as cm:
            self.create("pp", geometry=fp32, **stage0)
        self.assertIn("spec.geometry.dtype", str(cm.exception))
        # Each stage in a namespace of its own.
        self.assertTrue(self.create("pp-1", **{**stage0, "layer_begin": 2})
                        .created)

    def test_bad_ranges(self):
        for field, topology in (
                ("topology.layer_end", dict(layer_begin=0, layer_end=3)),
                ("topology.kv_head_end", dict(kv_head_begin=1, kv_head_end=2)),
                ("topology.total_layers", dict(layer_begin=3, total_layers=4))):
            with self.subTest(field=field):
                with self.assertRaises(kvharbor.InvalidArgumentError) as cm:
                    self.create("bad", **topology)
                self.assertIn(field, str(cm.exception))
        with self.assertRaises(kvharbor.InvalidArgumentError) as cm:
            self.create("bad", layer_begin=-1)
        self.assertIn("topology.layer_begin", str(cm.exception))
        with self.assertRaises(kvharbor.InvalidArgumentError) as cm:
            self.client.create_namespace("bad", GEOM, topology={"model": "m"})
        self.assertIn("topology", str(cm.exception))

    def test_unset_is_the_whole_model(self):
        r = self.client.create_namespace("whole", GEOM, capacity_bytes=NS_BYTES)
        self.addCleanup(self.client.delete_namespace, "whole", True)
        self.assertEqual(r.info.topology, kvharbor.Topology(
            layer_end=2, total_layers=2, kv_head_end=2, total_kv_heads=2))


if __name__ == "__main__":
    unittest.main()
