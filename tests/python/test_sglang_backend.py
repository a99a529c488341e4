"""kvharbor.integrations.sglang against a real kvharbord, driven by the calls
SGLang's HiCacheController makes (managers/cache_controller.py at commit
001067fffe33): the backend built as the "dynamic" factory builds it, then
register_mem_pool_host; a backup writes a node's pages batch by batch
(batch_set_v1 with host_indices, prefix_keys growing); a prefetch asks
batch_exists per batch of up to 128 page hashes, stops at the first short
batch, then batch_get_v1 into fresh host slots; the generic batch_set /
batch_get of flat host pages; every host layout of MHATokenToKVPoolHost
(layer_first, page_first, page_first_direct, page_head) with real torch
tensors; tensor-parallel ranks in their own namespaces; the daemon
restarted under it; bad input naming the field.

The calls through the daemon use a page-key namespace and appends
(docs/engines_api.md). Needs torch (python3-torch)."""

import hashlib
import time
import types
import unittest

import stand_in
from daemon import Daemon

try:
    import torch
except ImportError:
    torch = None

import kvharbor

if torch is not None:
    from kvharbor.integrations import sglang as kvh_sglang
    from kvharbor.integrations._paged import PagedKv

LAYERS, HEADS, DIM, PAGE = 3, 4, 8, 4
LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")


def page_hashes(tokens, last_hash=None):
    """SGLang's chained page hashes: SHA-256 hex of each page's token ids
    after the previous page's hash (mem_cache/utils.get_hash_str)."""
    out = []
    for i in range(0, len(tokens) - len(tokens) % PAGE, PAGE):
        h = hashlib.sha256()
        if last_hash:
            h.update(bytes.fromhex(last_hash))
        for t in tokens[i:i + PAGE]:
            h.update(t.to_bytes(4, "little", signed=False))
        last_hash = h.hexdigest()
        out.append(last_hash)
    return out


class HostPool:
    """MHATokenToKVPoolHost's attributes the backend reads: kv_buffer in one
    of the layouts, page_size, layout, and its flat pages."""

    def __init__(self, layout, pages, heads=HEADS, dtype=None, salt=0,
                 device_dtype=None):
        """``salt``: added to every value (another pipeline stage's layers
        hold other KV); ``device_dtype``: the device pool's dtype when it
        differs (fp8 pools store uint8: pool_host's dtype is the device
        pool's store_dtype)."""
        self.salt = salt
        if device_dtype is not None:
            self.device_pool = types.SimpleNamespace(dtype=device_dtype)
        self.layout, self.page_size = layout, PAGE
        self.layer_num, self.head_num, self.head_dim = LAYERS, heads, DIM
        self.dtype = dtype or torch.float32
        slots = pages * PAGE
        dims = {"layer_first": (2, LAYERS, slots, heads, DIM),
                "page_first": (2, slots, LAYERS, heads, DIM),
                "page_first_direct": (2, pages, LAYERS, PAGE, heads, DIM),
                "page_head": (2, pages, heads, PAGE, LAYERS, DIM)}[layout]
        self.kv_buffer = torch.zeros(dims, dtype=self.dtype)
        self.free = list(range(pages))

    def alloc(self, n):
        pages = [self.free.pop(0) for _ in range(n)]
        return torch.tensor([p * PAGE + t for p in pages for t in range(PAGE)])

    def get_data_page(self, index, flat=True):
        if self.layout == "layer_first":
            page = self.kv_buffer[:, :, index:index + PAGE]
        elif self.layout == "page_first":
            page = self.kv_buffer[:, index:index + PAGE]
        else:
            page = self.kv_buffer[:, index // PAGE:index // PAGE + 1]
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self):
        return torch.zeros((2, LAYERS, PAGE, self.head_num, DIM),
                           dtype=self.dtype).flatten()

    def token_kv(self, slot):
        """K and V of host slot ``slot``: [2, layers, heads, dim]."""
        p, t = divmod(slot, PAGE)
        b = self.kv_buffer
        if self.layout == "layer_first":
            return b[:, :, slot]
        if self.layout == "page_first":
            return b[:, slot]
        if self.layout == "page_first_direct":
            return b[:, p, :, t]
        return b[:, p, :, t].permute(0, 2, 1, 3)

    def fill(self, host_indices, tokens):
        """Writes a prefix-dependent K/V for each token into its slot."""
        acc = 0
        mod = 251 if self.dtype == torch.uint8 else 997
        for slot, tok in zip(host_indices.tolist(), tokens):
            acc = (acc * 31 + tok + 1) % 65521
            self.token_kv(slot).copy_(torch.full((2, LAYERS, self.head_num, DIM),
                                                 float((acc + self.salt) % mod)))


def storage_config(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1,
                   **kvharbor_options):
    """HiCacheStorageConfig as HiCacheController._generate_storage_config
    makes it (attention-DP and CP fields at their defaults)."""
    return types.SimpleNamespace(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=pp_rank, pp_size=pp_size,
        attn_cp_rank=0, attn_cp_size=1, dp_rank=0, dp_size=1,
        tp_lcm_size=None, should_split_heads=False,
        enable_storage_metrics=False, is_mla_model=False,
        is_page_first_layout=False, model_name="m",
        extra_config={"backend_name": "kvharbor",
                      "module_path": "kvharbor.integrations.sglang",
                      "class_name": "KvHarborHiCacheStorage", "interface_v1": 1,
                      "kvharbor": kvharbor_options})


@unittest.skipIf(torch is None, "needs torch (python3-torch)")
class HostLayoutTest(unittest.TestCase):
    """SGLang's host layouts as per-layer views: the pages gathered out of
    them, their flat pages, and the engine layout fetches write into."""

    def test_layouts_round_trip(self):
        for layout in LAYOUTS:
            with self.subTest(layout=layout):
                pool = HostPool(layout, 6)
                idx = pool.alloc(3)
                pool.fill(idx, list(range(3 * PAGE)))
                paged = PagedKv.from_sglang_host(pool.kv_buffer, layout, PAGE)
                self.assertEqual((paged.num_layers, paged.num_blocks,
                                  paged.block_size, paged.num_kv_heads,
                                  paged.head_dim), (LAYERS, 6, PAGE, HEADS, DIM))
                blocks = [i // PAGE for i in idx.tolist()[::PAGE]]
                pages = paged.gather(blocks)
                # Page i, token t, layer l is host slot idx[i*PAGE+t]'s K/V.
                for i in range(3):
                    for t in range(PAGE):
                        want = pool.token_kv(idx[i * PAGE + t].item())
                        self.assertTrue(torch.equal(pages[i][:, :, t], want))
                # The flat page of get_data_page, in kvharbor's order.
                core = kvh_sglang.HiCacheCore.__new__(kvh_sglang.HiCacheCore)
                core.host_pool, core.paged = pool, paged
                flat = pool.get_data_page(idx[PAGE].item())
                self.assertTrue(torch.equal(core._flat_view(flat), pages[1]))
                # The engine layout fetches write through: its addresses are
                # the host pool's own elements.
                lay = paged.layout()
                es = pool.kv_buffer.element_size()
                for l in range(LAYERS):
                    for slot in idx.tolist()[::3]:
                        b, t = divmod(slot, PAGE)
                        for h in range(HEADS):
                            for kv, bases in ((0, lay.k), (1, lay.v)):
                                addr = bases[l] + es * (b * lay.block_stride +
                                                        t * lay.token_stride +
                                                        h * lay.head_stride)
                                self.assertEqual(
                                    addr, pool.token_kv(slot)[kv, l, h].data_ptr())

    def test_bad_host_pools(self):
        cases = [
            (lambda: PagedKv.from_sglang_host(torch.zeros(3, 2, 8, 2, 4),
                                              "layer_first", PAGE), "kv_buffer"),
            (lambda: PagedKv.from_sglang_host(torch.zeros(2, 2, 8, 2, 4),
                                              "page_last", PAGE), "kv_buffer"),
            (lambda: PagedKv.from_sglang_host(torch.zeros(2, 2, 10, 2, 4),
                                              "layer_first", PAGE), "kv_buffer"),
            (lambda: kvh_sglang.HiCacheCore(types.SimpleNamespace(
                tp_rank=0, tp_size=1, is_mla_model=True, extra_config={})),
             "is_mla_model"),
            (lambda: kvh_sglang.HiCacheCore(storage_config(adress="x")),
             "extra_config.kvharbor.adress"),
        ]
        for fn, field in cases:
            with self.subTest(field=field):
                with self.assertRaises(kvharbor.InvalidArgumentError) as cm:
                    fn()
                self.assertIn(field, cm.exception.message)


@unittest.skipIf(torch is None, "needs torch (python3-torch)")
class SglangBackendTest(unittest.TestCase):
    def setUp(self):
        self.daemon = Daemon()
        self.addCleanup(lambda: self.daemon.stop())

    def backend(self, layout, pool, tp_rank=0, tp_size=1, ns="sg", pp_rank=0,
                pp_size=1, address=None):
        core = kvh_sglang.HiCacheCore(storage_config(
            tp_rank, tp_size, pp_rank, pp_size,
            address=address or self.daemon.address, namespace=ns,
            capacity_bytes=1 << 20, retry_after=0.2), {})
        core.register_mem_pool_host(pool)
        self.addCleanup(core.close)
        return core

    def backup(self, core, pool, tokens, host_indices, prefix=None, batch=128):
        """cache_controller._page_backup: batch by batch, prefix keys grow."""
        hashes = page_hashes(tokens)
        prefix = list(prefix or [])
        done = 0
        for i in range(0, len(hashes), batch):
            keys = hashes[i:i + batch]
            idx = host_indices[i * PAGE:(i + len(keys)) * PAGE]
            info = types.SimpleNamespace(prefix_keys=list(prefix), extra_info=None)
            if not all(core.batch_set_v1(keys, idx, info)):
                break
            prefix += keys
            done += len(keys)
        return done

    def prefetch(self, core, pool, tokens, batch=128):
        """_storage_hit_query then _page_transfer (zero copy)."""
        hashes = page_hashes(tokens)
        hits, prefix = [], []
        for i in range(0, len(hashes), batch):
            keys = hashes[i:i + batch]
            n = core.batch_exists(keys, types.SimpleNamespace(
                prefix_keys=list(prefix), extra_info=None))
            hits += keys[:n]
            if n < len(keys):
                break
            prefix += keys
        idx = pool.alloc(len(hits))
        got, prefix = 0, []
        for i in range(0, len(hits), batch):
            keys = hits[i:i + batch]
            ok = core.batch_get_v1(keys, idx[i * PAGE:(i + len(keys)) * PAGE],
                                   types.SimpleNamespace(prefix_keys=list(prefix),
                                                         extra_info=None))
            n = ok.index(False) if False in ok else len(ok)
            got += n
            if n < len(keys):
                break
            prefix += keys
        return got, idx

    def test_backup_then_prefetch_every_layout(self):
        tokens = list(range(1000, 1000 + 10 * PAGE + 2))
        for layout in LAYOUTS:
            with self.subTest(layout=layout):
                a = HostPool(layout, 32)
                core_a = self.backend(layout, a, ns=f"sg_{layout}")
                idx = a.alloc(10)
                a.fill(idx, tokens)
                # A first node of 6 pages, then its child of 4 (prefix keys).
                self.assertEqual(self.backup(core_a, a, tokens[:6 * PAGE],
                                             idx[:6 * PAGE], batch=4), 6)
                self.assertEqual(self.child_backup(core_a, a, tokens, idx), 4)
                b = HostPool(layout, 32)
                core_b = self.backend(layout, b, ns=f"sg_{layout}")
                got, bidx = self.prefetch(core_b, b, tokens, batch=3)
                self.assertEqual(got, 10)
                for s_a, s_b in zip(idx.tolist(), bidx.tolist()):
                    self.assertTrue(torch.equal(a.token_kv(s_a), b.token_kv(s_b)))
                # The generic interface: flat pages, anchored at the root.
                keys = page_hashes(tokens)[:3]
                flats = core_b.batch_get(keys, [b.get_dummy_flat_data_page()
                                                for _ in keys])
                for i, flat in enumerate(flats):
                    self.assertTrue(torch.equal(
                        core_b._flat_view(flat),
                        core_b._flat_view(a.get_data_page(idx[i * PAGE].item()))))
                self.assertTrue(core_b.exists(keys[0]))

    def child_backup(self, core, pool, tokens, idx):
        hashes = page_hashes(tokens)
        info = types.SimpleNamespace(prefix_keys=hashes[:6], extra_info=None)
        ok = core.batch_set_v1(hashes[6:10], idx[6 * PAGE:10 * PAGE], info)
        return sum(ok)

    def test_consecutive_hits_and_missing_prefix(self):
        pool = HostPool("page_first", 16)
        core = self.backend("page_first", pool)
        tokens = list(range(5 * PAGE))
        idx = pool.alloc(5)
        pool.fill(idx, tokens)
        hashes = page_hashes(tokens)
        self.assertEqual(self.backup(core, pool, tokens[:3 * PAGE],
                                     idx[:3 * PAGE]), 3)
        self.assertEqual(core.batch_exists(hashes), 3)
        self.assertEqual(core.batch_exists(hashes[3:], types.SimpleNamespace(
            prefix_keys=hashes[:3], extra_info=None)), 0)
        # Page hashes name their pages: a child batch is stored whatever
        # prefix_keys say (here a parent kvharbor never held), and found.
        info = types.SimpleNamespace(prefix_keys=["ab" * 32] * 2, extra_info=None)
        self.assertEqual(core.batch_set_v1(hashes[3:5], idx[3 * PAGE:], info),
                         [True, True])
        self.assertEqual(core.batch_exists(hashes), 5)
        self.assertEqual(core.batch_exists(hashes[3:]), 2)
        self.assertTrue(core.clear())
        self.assertEqual(core.batch_exists(hashes), 0)

    def test_controller_batches_and_ancestor_only_prefetch(self):
        """Issue 32 rows (a) and (b), as SGLang's cache controller calls:
        (a) a node's backup in batches of 128 whose prefix_keys grow only
        when already non-empty (a node under the root passes [] for every
        batch), then its child; (b) a prefetch whose prefix_keys hold only
        the ancestors' hashes of the last host node, not that node's own."""
        pool = HostPool("page_first", 260)
        core = self.backend("page_first", pool)
        n_parent, n_child = 200, 8
        tokens = list(range(7, 7 + (n_parent + n_child) * PAGE))
        idx = pool.alloc(n_parent + n_child)
        pool.fill(idx, tokens)
        hashes = page_hashes(tokens)
        prefix = []  # a node under the root
        for i in range(0, n_parent, 128):
            keys = hashes[i:min(i + 128, n_parent)]
            info = types.SimpleNamespace(prefix_keys=list(prefix), extra_info=None)
            self.assertTrue(all(core.batch_set_v1(
                keys, idx[i * PAGE:(i + len(keys)) * PAGE], info)))
            if prefix:  # the controller's rule: grows only when non-empty
                prefix += keys
        child = hashes[n_parent:]
        info = types.SimpleNamespace(prefix_keys=hashes[:n_parent], extra_info=None)
        self.assertEqual(core.batch_set_v1(child, idx[n_parent * PAGE:], info),
                         [True] * n_child)
        # Every page is found, batch by batch with proper prefixes ...
        self.assertEqual(self.prefetch(core, HostPool("page_first", 260), tokens)[0],
                         n_parent + n_child)
        # ... and by a follow-up turn whose prefetch passes the child's own
        # pages with only the parent's ancestors (none) as prefix_keys.
        only_ancestors = types.SimpleNamespace(prefix_keys=[], extra_info=None)
        self.assertEqual(core.batch_exists(child, only_ancestors), n_child)
        b = HostPool("page_first", 16)
        got = core.batch_get_v1(child, b.alloc(n_child), only_ancestors)
        self.assertEqual(got, [True] * n_child)

    def test_tensor_parallel_and_restart(self):
        tokens = list(range(4 * PAGE))
        pools = [HostPool("layer_first", 8, heads=HEADS // 2) for _ in range(2)]
        cores = [self.backend("layer_first", p, r, 2) for r, p in enumerate(pools)]
        for p, c in zip(pools, cores):
            idx = p.alloc(4)
            p.fill(idx, tokens)
            self.assertEqual(self.backup(c, p, tokens, idx), 4)
        names = sorted(n.name for n in kvharbor.Client(
            self.daemon.address).list_namespaces())
        self.assertEqual(names, ["sg.tp0of2", "sg.tp1of2"])
        address = self.daemon.address
        self.daemon.stop()
        hashes = page_hashes(tokens)
        self.assertEqual(cores[0].batch_exists(hashes), 0)  # a miss, no raise
        self.assertEqual(cores[0].batch_get_v1(hashes, pools[0].alloc(4)),
                         [False] * 4)
        self.daemon = Daemon(f"--listen={address}")
        time.sleep(0.3)
        cores[0].store.client.wait_connected(5)
        self.assertEqual(cores[0].batch_exists(hashes), 0)  # recreated, empty
        self.assertGreaterEqual(cores[0].store.stats()["namespace_recreated"], 1)


    def test_pipeline_stages_never_share_pages(self):
        """--pp-size 2: each stage's host pool holds its own layers (both
        start at their layer 0, same geometry). Stage 1 never finds stage
        0's pages; each stage prefetches its own bytes."""
        tokens = list(range(2000, 2000 + 6 * PAGE))
        hashes = page_hashes(tokens)
        pools = [HostPool("page_first", 16, salt=100 * s) for s in range(2)]
        cores = [self.backend("page_first", p, pp_rank=s, pp_size=2)
                 for s, p in enumerate(pools)]
        idx = [p.alloc(6) for p in pools]
        pools[0].fill(idx[0], tokens)
        self.assertEqual(self.backup(cores[0], pools[0], tokens, idx[0]), 6)
        self.assertEqual(cores[1].batch_exists(hashes), 0)
        self.assertEqual(cores[1].batch_get_v1(hashes, pools[1].alloc(6)),
                         [False] * 6)
        pools[1].fill(idx[1], tokens)
        self.assertEqual(self.backup(cores[1], pools[1], tokens, idx[1]), 6)
        names = sorted(n.name for n in kvharbor.Client(
            self.daemon.address).list_namespaces())
        self.assertEqual(names, ["sg.pp0of2", "sg.pp1of2"])
        for s in range(2):
            fresh = HostPool("page_first", 16)
            core = self.backend("page_first", fresh, pp_rank=s, pp_size=2)
            got, fidx = self.prefetch(core, fresh, tokens)
            self.assertEqual(got, 6)
            for a, b in zip(idx[s].tolist(), fidx.tolist()):
                self.assertTrue(torch.equal(pools[s].token_kv(a),
                                            fresh.token_kv(b)))

    def test_starts_without_the_daemon(self):
        """kvharbord unreachable when SGLang attaches the backend:
        register_mem_pool_host does not raise, lookups miss and backups
        fail; once the daemon is up the namespace is created and backups
        and prefetches work."""
        address = self.daemon.address
        self.daemon.stop()
        pool = HostPool("layer_first", 16)
        core = self.backend("layer_first", pool, address=address)
        self.assertFalse(core.store.namespace_ready)
        tokens = list(range(3 * PAGE))
        hashes = page_hashes(tokens)
        idx = pool.alloc(3)
        pool.fill(idx, tokens)
        self.assertEqual(core.batch_exists(hashes), 0)
        self.assertEqual(core.batch_set_v1(hashes, idx), [False] * 3)
        self.daemon = Daemon(f"--listen={address}")
        up = time.monotonic()
        while time.monotonic() < up + 15:
            if all(core.batch_set_v1(hashes, idx)):
                break
            time.sleep(0.1)
        connect_seconds = time.monotonic() - up
        self.assertTrue(core.store.namespace_ready)
        self.assertEqual(core.batch_exists(hashes), 3)
        self.assertLess(connect_seconds, 5, f"first connect took "
                        f"{connect_seconds:.1f} s")

    def test_fp8_host_pool(self):
        """An fp8 (E4M3) device pool: the host pool holds uint8; its pages
        are stored as FP8_E4M3 and come back byte for byte. E5M2 is
        refused, naming the device pool's dtype."""
        e4m3, e5m2 = _TorchDtypeName("float8_e4m3fn"), _TorchDtypeName(
            "float8_e5m2")
        tokens = list(range(4 * PAGE))
        a = HostPool("page_first", 16, dtype=torch.uint8, device_dtype=e4m3)
        core_a = self.backend("page_first", a, ns="f8")
        idx = a.alloc(4)
        a.fill(idx, tokens)
        self.assertEqual(self.backup(core_a, a, tokens, idx), 4)
        info = kvharbor.Client(self.daemon.address).describe_namespace("f8")
        self.assertEqual(info.geometry.dtype, kvharbor.DType.FP8_E4M3)
        b = HostPool("page_first", 16, dtype=torch.uint8, device_dtype=e4m3)
        core_b = self.backend("page_first", b, ns="f8")
        got, bidx = self.prefetch(core_b, b, tokens)
        self.assertEqual(got, 4)
        for s_a, s_b in zip(idx.tolist(), bidx.tolist()):
            self.assertTrue(torch.equal(a.token_kv(s_a), b.token_kv(s_b)))
        bad = HostPool("page_first", 16, dtype=torch.uint8, device_dtype=e5m2)
        with self.assertRaises(kvharbor.InvalidArgumentError) as cm:
            self.backend("page_first", bad, ns="f8e5")
        self.assertIn("mem_pool_host.device_pool.dtype", cm.exception.message)


class _TorchDtypeName:
    """A torch dtype this torch may lack (float8_*: torch >= 2.1), as the
    backend sees it: by name."""

    def __init__(self, name):
        self.name = name

    def __str__(self):
        return f"torch.{self.name}"


@unittest.skipIf(torch is None, "needs torch (python3-torch)")
class LazySglangClassTest(unittest.TestCase):
    def test_subclass_of_hicache_storage(self):
        mod = types.ModuleType("sglang.srt.mem_cache.hicache_storage")

        class HiCacheStorage:
            def register_mem_pool_host(self, mem_pool_host):
                self.mem_pool_host = mem_pool_host

        mod.HiCacheStorage = HiCacheStorage
        stand_in.install(self, {mod.__name__: mod},
                         forget=[(kvh_sglang, "KvHarborHiCacheStorage")])
        cls = getattr(kvh_sglang, "KvHarborHiCacheStorage")
        self.assertTrue(issubclass(cls, HiCacheStorage))
        backend = cls(storage_config(namespace="lazy"), {})
        self.assertEqual(backend._core.namespace, "lazy")


if __name__ == "__main__":
    unittest.main()
