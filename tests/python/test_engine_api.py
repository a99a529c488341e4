"""The engine API of the Python client against a real kvharbord
(docs/engines_api.md): page-key namespaces (str, bytes and long keys),
appends with skip_pages and prefix leases (the retry with every page, the
error without), layer-range fetches, layer-by-layer uploads (begin_insert,
send_layer, pieces, from a host layout, commit, abort), and the bad input of
each with the field named."""

import hashlib
import random
import time
import unittest

import kvharbor
from daemon import Daemon

try:
    import torch
except ImportError:  # torch is optional for the package and these tests
    torch = None

GEOM = kvharbor.Geometry(num_layers=2, num_kv_heads=2, head_dim=16,
                         page_size=4, dtype=kvharbor.DType.FP16)
PB = GEOM.page_bytes  # 2*2*4*2*16*2 = 1024
KVB = PB // (2 * GEOM.num_layers)  # K (or V) of one layer of one page
NS_BYTES = 1 << 20


def pages(n, seed):
    rng = random.Random(seed)
    return bytes(rng.randrange(256) for _ in range(n * PB))


def layer_of(data, page_from, layer):
    """Layer `layer` of pages [page_from, ...) of `data` (layout
    KV_LAYER_TOKEN_HEAD_DIM): for each page, K then V of the layer."""
    out = b""
    for p in range(page_from, len(data) // PB):
        page = data[p * PB:(p + 1) * PB]
        for kv in range(2):
            off = (kv * GEOM.num_layers + layer) * KVB
            out += page[off:off + KVB]
    return out


class EngineApiTest(unittest.TestCase):
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

    def make_ns(self, name, key_kind=kvharbor.KeyKind.TOKENS):
        r = self.client.create_namespace(name, GEOM, capacity_bytes=NS_BYTES,
                                         key_kind=key_kind)
        self.addCleanup(self.client.delete_namespace, name, True)
        return r

    def stats(self, ns):
        return self.client.stats(ns).namespaces[0]

    def test_page_keys(self):
        r = self.make_ns("keys", kvharbor.KeyKind.PAGE_KEYS)
        self.assertEqual(r.info.key_kind, kvharbor.KeyKind.PAGE_KEYS)
        # SGLang's hex page hashes (64 characters) are hashed to 32 bytes.
        keys = [hashlib.sha256(bytes([i])).hexdigest() for i in range(3)]
        data = pages(3, 1)
        res = self.client.insert("keys", data, keys=keys)
        self.assertEqual(res.pages_stored, 3)
        with self.client.match("keys", keys=keys[:2] + ["other"],
                               lock=True) as lease:
            self.assertEqual(lease.num_pages, 2)
            self.assertEqual(lease.matched_tokens, 2 * GEOM.page_size)
            self.assertEqual(bytes(lease.fetch()), data[:2 * PB])
        # bytes keys and str keys of the same bytes are the same key.
        res = self.client.insert("keys", [data[:PB]], keys=[b"k\x00"])
        self.assertEqual(res.pages_stored, 1)
        self.assertEqual(self.client.match("keys", keys=["k\x00"]).num_pages, 1)
        # Bad input names the field; nothing is stored.
        with self.assertRaises(kvharbor.InvalidArgumentError) as cm:
            self.client.match("keys", keys=["a", ""])
        self.assertIn("keys[1]", str(cm.exception))
        with self.assertRaises(kvharbor.InvalidArgumentError) as cm:
            self.client.match("keys", [1, 2, 3, 4])
        self.assertIn("token_ids", str(cm.exception))
        with self.assertRaises(kvharbor.InvalidArgumentError) as cm:
            self.client.match("keys", keys=[7])
        self.assertIn("keys[0]", str(cm.exception))
        self.make_ns("toks")
        with self.assertRaises(kvharbor.InvalidArgumentError) as cm:
            self.client.match("toks", keys=["a"])
        self.assertIn("page_keys", str(cm.exception))
        self.assertEqual(self.stats("keys").cached_pages, 4)

    def test_append(self):
        self.make_ns("chat")
        toks = list(range(100, 124))  # 6 pages
        data = pages(6, 2)
        self.client.insert("chat", toks[:16], data[:4 * PB])
        before = self.stats("chat").bytes_in
        # Every page given: only the 2 new ones are sent.
        res = self.client.insert("chat", toks, data, skip_pages=4)
        self.assertEqual(res.pages_stored, 2)
        self.assertEqual(self.stats("chat").bytes_in - before, 2 * PB)
        # The prefix gone: retried with every page, or an error naming
        # header.skip_pages with only the new pages given.
        self.client.evict_all("chat")
        with self.assertRaises(kvharbor.FailedPreconditionError) as cm:
            self.client.insert("chat", toks, data[4 * PB:], skip_pages=4)
        self.assertIn("header.skip_pages", str(cm.exception))
        self.assertEqual(self.stats("chat").cached_pages, 0)
        res = self.client.insert("chat", toks, data, skip_pages=4)
        self.assertEqual(res.pages_stored, 6)
        # After a prefix lease, per-page buffers of the new pages only.
        self.client.evict_all("chat")
        self.client.insert("chat", toks[:8], data[:2 * PB])
        with self.client.match("chat", toks[:8], lock=True) as lease:
            res = self.client.insert(
                "chat", toks, [data[i * PB:(i + 1) * PB] for i in range(2, 6)],
                prefix_lease=lease)
            self.assertEqual(res.pages_stored, 4)
        with self.client.match("chat", toks, lock=True) as lease:
            self.assertEqual(bytes(lease.fetch()), data)
        with self.assertRaises(kvharbor.InvalidArgumentError) as cm:
            self.client.insert("chat", toks, data, skip_pages=-1)
        self.assertIn("skip_pages", str(cm.exception))
        # A prefix lease that is not a prefix of the sequence: refused
        # naming the field, nothing stored.
        other, fresh = list(range(500, 508)), list(range(700, 724))
        self.client.insert("chat", other, data[:2 * PB])
        with self.client.match("chat", other, lock=True) as lease:
            with self.assertRaises(kvharbor.KvHarborError) as cm:
                self.client.insert("chat", fresh, data[2 * PB:],
                                   prefix_lease=lease)
            self.assertIn("header.prefix_lease_id", str(cm.exception))
        self.assertEqual(self.client.match("chat", fresh).num_pages, 0)

    def test_layer_range(self):
        self.make_ns("layers")
        toks = list(range(7, 19))
        data = pages(3, 3)
        self.client.insert("layers", toks, data)
        with self.client.match("layers", toks, lock=True) as lease:
            dst = bytearray(3 * 2 * KVB)
            r = lease.fetch_into(dst, layer_begin=1, layer_end=2)
            self.assertEqual(r.page_bytes, 2 * KVB)
            self.assertEqual(bytes(dst), layer_of(data, 0, 1))
            per_page = [bytearray(2 * KVB) for _ in range(3)]
            lease.fetch_into(per_page, layer_begin=0, layer_end=1)
            self.assertEqual(b"".join(per_page), layer_of(data, 0, 0))
            with self.assertRaises(kvharbor.InvalidArgumentError) as cm:
                lease.fetch_into(dst, layer_begin=1, layer_end=3)
            self.assertIn("layer_end", str(cm.exception))
            with self.assertRaises(kvharbor.InvalidArgumentError) as cm:
                lease.fetch_into(dst, layer_begin=0, layer_end=1,
                                 format=kvharbor.FetchFormat.COMPRESSED)
            self.assertIn("layer_begin", str(cm.exception))

    def test_begin_insert(self):
        self.make_ns("up")
        toks = list(range(50, 66))  # 4 pages
        data = pages(4, 4)
        self.client.insert("up", toks[:4], data[:PB])
        with self.client.begin_insert("up", toks, skip_pages=1) as up:
            self.assertEqual((up.num_layers, up.sent_pages),
                             (GEOM.num_layers, 3))
            self.assertEqual(up.layer_bytes, 3 * 2 * KVB)
            with self.assertRaises(kvharbor.InvalidArgumentError) as cm:
                up.send_layer(1, layer_of(data, 1, 1))
            self.assertIn("layer", str(cm.exception))
            with self.assertRaises(kvharbor.InvalidArgumentError) as cm:
                up.send_layer(0, layer_of(data, 1, 0)[:-KVB])
            self.assertIn("layer_pages", str(cm.exception))
            up.send_layer(0, layer_of(data, 1, 0))
            self.assertEqual(up.next_layer, 1)
            with self.assertRaises(kvharbor.InvalidArgumentError):
                up.commit()  # a layer missing
            last = layer_of(data, 1, 1)
            up.send_layer(1, [last[i:i + KVB]
                              for i in range(0, len(last), KVB)])
            res = up.commit()
        self.assertEqual(res.pages_stored, 3)
        with self.client.match("up", toks, lock=True) as lease:
            self.assertEqual(bytes(lease.fetch()), data)

    def test_begin_insert_refused_or_aborted(self):
        self.make_ns("ab")
        toks = list(range(900, 916))
        free = self.stats("ab").free_pages
        with self.assertRaises(kvharbor.FailedPreconditionError) as cm:
            self.client.begin_insert("ab", toks, skip_pages=2)
        self.assertIn("header.skip_pages", str(cm.exception))
        up = self.client.begin_insert("ab", toks)
        # Slots are reserved as bytes arrive: the header holds one page's.
        self.assertEqual(self.stats("ab").free_pages, free - 1)
        up.send_layer(0, layer_of(pages(4, 5), 0, 0))
        up.abort()
        up.close()
        with self.assertRaises(RuntimeError):
            with self.client.begin_insert("ab", toks) as up2:
                up2.send_layer(0, layer_of(pages(4, 5), 0, 0))
                raise RuntimeError("the engine failed mid-prefill")
        for _ in range(200):
            if self.stats("ab").uploads_in_flight == 0:
                break
            time.sleep(0.01)
        s = self.stats("ab")
        self.assertEqual((s.uploads_in_flight, s.cached_pages, s.free_pages),
                         (0, 0, free))
        with self.assertRaises(kvharbor.InvalidArgumentError) as cm:
            self.client.begin_insert("ab", toks, layer_major=False)
        self.assertIn("layer_major", str(cm.exception))

    @unittest.skipIf(torch is None, "needs torch")
    def test_send_layer_from_layout(self):
        self.make_ns("lay")
        toks = list(range(300, 312))  # 3 pages
        # vLLM's host cache per layer: [2, blocks, page_size, H, D].
        gen = torch.Generator().manual_seed(6)
        cache = [torch.randn(2, 8, 4, 2, 16, generator=gen).half()
                 for _ in range(2)]
        layout = kvharbor.PagedKvLayout.from_vllm(cache)
        blocks = [5, 1, 6]
        with self.client.begin_insert("lay", toks) as up:
            for layer in range(2):
                up.send_layer_from_layout(layer, layout, blocks)
            up.commit()
        with self.client.match("lay", toks, lock=True) as lease:
            got = torch.frombuffer(bytearray(lease.fetch()),
                                   dtype=torch.float16).reshape(
                3, 2, 2, 4, 2, 16)  # [page][kv][layer][token][head][dim]
        for i, b in enumerate(blocks):
            for layer in range(2):
                for kv in range(2):
                    self.assertTrue(torch.equal(got[i, kv, layer],
                                                cache[layer][kv, b]))
        # A host layout of layer 1 only fetches that layer (a layer-range
        # fetch: half the page bytes) into its blocks.
        other = [torch.zeros(2, 8, 4, 2, 16, dtype=torch.float16)]
        one = kvharbor.PagedKvLayout.from_vllm(other, layer_begin=1)
        with self.client.match("lay", toks, lock=True) as lease:
            r = lease.fetch_to_layout(one, [0, 2, 4])
        self.assertEqual((r.path, r.pages, r.bytes_moved), ("cpu", 3, 3 * PB // 2))
        self.assertEqual(r.h2d_bytes, 0)  # no compressed path's H2D
        for i, b in enumerate([0, 2, 4]):
            self.assertTrue(torch.equal(other[0][:, b], cache[1][:, blocks[i]]))


if __name__ == "__main__":
    unittest.main()
