"""kvharbor.integrations.vllm against a real kvharbord, driven by the calls
vLLM makes (tests/python/vllm_sim.py replays them around real torch paged
caches in vLLM's layouts): a request's prompt and decoded pages saved, a
second engine loading them layer by layer and computing only the rest,
chunked prefill, tensor parallelism (a namespace per rank), pipeline
stages (a namespace per stage), fp8 caches allocated as uint8, a model
runner whose empty step skips wait_for_save, the daemon down when the
engine starts, the daemon killed and restarted under the engine (misses
and load errors counted, nothing raised, the namespace created again),
saves that never wait for the daemon in the forward, one unleased Match
per lookup, publishable block hashes and KV events, stats per path, and
bad input naming the field. The connector class over vLLM's modules:
test_vllm_class.py. Needs torch (python3-torch); skipped without it."""

import hashlib
import os
import shutil
import tempfile
import threading
import time
import unittest

from daemon import Daemon
from local_daemon import Kvharbord

try:
    import torch
except ImportError:
    torch = None

import kvharbor

if torch is not None:
    from kvharbor.integrations import vllm as kvh_vllm
    from kvharbor.integrations._engine import page_key
    from kvharbor.integrations._paged import PagedKv
    from vllm_sim import BLOCK, DEVICE, Engine, Request, Worker, make_caches

LAYERS, HEADS, DIM, BLOCKS = 3, 4, 8, 64


@unittest.skipIf(torch is None, "needs torch (python3-torch)")
class VllmConnectorTest(unittest.TestCase):
    def setUp(self):
        self.daemon = Daemon()
        self.addCleanup(lambda: self.daemon.stop())

    def config(self, **extra):
        base = {"address": self.daemon.address, "namespace": "m",
                "timeout": 5.0, "retry_after": 0.2, "load_layer_group": 2,
                "capacity_bytes": 1 << 20}
        base.update(extra)
        return kvh_vllm.ConnectorConfig.from_extra(base)

    def engine(self, config, tp=1, layout="flash", dtype=torch.float32,
               pp=1, layers=LAYERS, kv_cache_dtype=None, **engine_options):
        """vLLM with tp ranks in each of pp pipeline stages (stage s owns
        the s-th contiguous share of the layers, as vLLM's get_pp_indices
        splits them)."""
        sched = kvh_vllm.SchedulerSide(config, BLOCK, tp, pp)
        workers = []
        per_stage = -(-layers // pp)
        for stage in range(pp):
            ids = list(range(stage * per_stage,
                             min(layers, (stage + 1) * per_stage)))
            for rank in range(tp):
                side = kvh_vllm.WorkerSide(config, rank, tp, stage, pp,
                                           kv_cache_dtype=kv_cache_dtype)
                caches = make_caches(layout, ids, BLOCKS, HEADS // tp, DIM,
                                     dtype)
                side.register_kv_caches(caches)
                workers.append(Worker(side, caches, layout, HEADS // tp,
                                      rank * HEADS // tp,
                                      ids if pp > 1 else None))
        eng = Engine(sched, workers, layers, DIM, BLOCKS, dtype,
                     **engine_options)
        self.addCleanup(lambda: [sched.close()] + [w.connector.close()
                                                  for w in workers])
        return eng

    def stats(self, eng):
        for w in eng.workers:
            w.connector.store.flush()
        return [w.connector.store.stats() for w in eng.workers]

    def test_prompt_and_decode_reused_by_another_engine(self):
        for layout, dtype in (("flash", torch.float32), ("flashinfer", torch.float16),
                              ("packed", torch.bfloat16)):
            with self.subTest(layout=layout):
                cfg = self.config(namespace=f"m_{layout}")
                prompt = list(range(100, 100 + 37))  # 9 whole pages + 1
                a = self.engine(cfg, layout=layout, dtype=dtype)
                a.add(Request("a", prompt, max_new_tokens=6))
                a.run(chunk=16)  # chunked prefill: 16 + 16 + 5
                self.assertEqual(a.computed_tokens, 37 + 6 - 1)
                # Prompt pages saved by layer, decoded ones at the end.
                ws = self.stats(a)[0]
                self.assertEqual(ws["saved_pages"], (37 + 5) // BLOCK)
                # Appends: each page went over the wire once, not the whole
                # prefix again at every step.
                self.assertEqual(ws["sent_pages"], ws["saved_pages"])
                self.assertEqual((ws["save_errors"], ws["daemon_errors"]), (0, 0))
                # A second engine: the next turn of the conversation.
                b = self.engine(cfg, layout=layout, dtype=dtype)
                req = Request("b", prompt + a.done["a"].output + [7, 8, 9], 1)
                b.add(req)
                b.run(chunk=64)
                loaded = (37 + 5) // BLOCK * BLOCK
                self.assertEqual(b.computed_tokens, len(req.prompt_token_ids)
                                 - loaded)
                wb = self.stats(b)[0]
                self.assertEqual(wb["loaded_pages"], loaded // BLOCK)
                self.assertEqual(wb["load_errors"], 0)
                self.assertEqual(b.load_errors, 0)

    def test_tensor_parallel_ranks_use_their_namespaces(self):
        cfg = self.config(namespace="tp")
        prompt = list(range(1, 30))
        a = self.engine(cfg, tp=2)
        a.add(Request("a", prompt, 0))
        a.run()
        self.stats(a)  # the saves were sent
        names = sorted(n.name for n in kvharbor.Client(
            self.daemon.address).list_namespaces())
        self.assertEqual(names, ["tp.tp0of2", "tp.tp1of2"])
        for rank, name in enumerate(names):
            info = kvharbor.Client(self.daemon.address).describe_namespace(name)
            self.assertEqual(info.geometry.num_kv_heads, HEADS // 2)
            self.assertEqual(info.stats.cached_pages, 28 // BLOCK)
        b = self.engine(cfg, tp=2)
        b.add(Request("b", prompt, 0))
        b.run()
        self.assertEqual(b.computed_tokens, 29 - 28)
        self.assertEqual([s["loaded_pages"] for s in self.stats(b)], [7, 7])

    def test_pipeline_stages_store_their_own_layers(self):
        """Two pipeline stages of two layers each (same geometry): each
        stage's pages go to its own namespace, and a second engine's stages
        load their own layers (the sim checks every loaded byte against its
        layer's KV, so a stage loading the other's pages fails)."""
        cfg = self.config(namespace="pp")
        prompt = list(range(7, 7 + 29))
        a = self.engine(cfg, pp=2, layers=4)
        a.add(Request("a", prompt, 2))
        a.run()
        self.stats(a)  # the saves were sent
        client = kvharbor.Client(self.daemon.address)
        names = sorted(n.name for n in client.list_namespaces())
        self.assertEqual(names, ["pp.pp0of2", "pp.pp1of2"])
        for name in names:
            info = client.describe_namespace(name)
            self.assertEqual(info.geometry.num_layers, 2)
            self.assertEqual(info.stats.cached_pages, (29 + 1) // BLOCK)
        b = self.engine(cfg, pp=2, layers=4)
        b.add(Request("b", prompt + a.done["a"].output + [3], 1))
        b.run()
        self.assertEqual(b.load_errors, 0)
        self.assertEqual([s["loaded_pages"] for s in self.stats(b)], [7, 7])
        # TP x PP: four namespaces, one per (rank, stage).
        c = self.engine(self.config(namespace="tpp"), tp=2, pp=2, layers=4)
        c.add(Request("c", prompt, 0))
        c.run()
        names = sorted(n.name for n in client.list_namespaces()
                       if n.name.startswith("tpp"))
        self.assertEqual(names, ["tpp.tp0of2.pp0of2", "tpp.tp0of2.pp1of2",
                                 "tpp.tp1of2.pp0of2", "tpp.tp1of2.pp1of2"])

    def test_empty_step_without_wait_for_save_frees_blocks(self):
        """A request that finishes alone: its decoded pages are saved in the
        next step, which has no tokens. vLLM versions whose empty step skips
        wait_for_save still call start_load_kv: the save runs there, and
        every block comes back."""
        cfg = self.config(namespace="empty")
        eng = self.engine(cfg, empty_step_skips_wait_for_save=True)
        eng.add(Request("a", list(range(40, 40 + 22)), 6))
        eng.run(max_steps=50)
        self.assertEqual(sorted(eng.free), list(range(BLOCKS)))
        self.assertEqual(eng.held, {})
        ws = self.stats(eng)[0]
        self.assertEqual(ws["saved_pages"], (22 + 5) // BLOCK)
        self.assertEqual(ws["save_errors"], 0)

    def test_engine_starts_without_the_daemon(self):
        """kvharbord down when vLLM starts: register_kv_caches does not
        raise, requests are computed (misses); once the daemon is up the
        namespace is created on the first call and saves and hits work."""
        address = self.daemon.address
        self.daemon.stop()
        cfg = self.config(namespace="late")
        started = time.monotonic()
        a = self.engine(cfg)  # registers: must not raise
        self.assertLess(time.monotonic() - started, 5)
        self.assertFalse(a.workers[0].connector.store.namespace_ready)
        prompt = list(range(60, 60 + 25))
        a.add(Request("a", prompt, 1))
        a.run()
        self.assertEqual(a.computed_tokens, 25)
        self.assertGreater(self.stats(a)[0]["daemon_errors"], 0)
        # Warnings are rate-limited: one per kind of call per LOG_INTERVAL.
        from kvharbor.integrations._engine import EngineStore
        store = EngineStore(address, "quiet", retry_after=0)
        self.addCleanup(store.close)
        with self.assertLogs("kvharbor.integrations", "WARNING") as logs:
            for _ in range(5):
                self.assertIsNone(store.match([1, 2, 3, 4]))
        self.assertEqual(len(logs.records), 1, logs.output)
        self.assertEqual(store.stats()["daemon_errors"], 5)
        self.daemon = Daemon(f"--listen={address}")
        up = time.monotonic()
        # The first call after retry_after reaches the daemon within about
        # a second (max_reconnect_backoff), creates the namespace and saves.
        deadline = up + 15
        while time.monotonic() < deadline:
            a.add(Request(f"r{time.monotonic()}", prompt + [1], 1))
            a.run()
            for w in a.workers:
                w.connector.store.flush()
            if self.stats(a)[0]["saved_pages"] > 0:
                break
            time.sleep(0.2)
        connect_seconds = time.monotonic() - up
        self.assertTrue(a.workers[0].connector.store.namespace_ready)
        self.assertGreater(self.stats(a)[0]["saved_pages"], 0)
        self.assertLess(connect_seconds, 5, "first connect took "
                        f"{connect_seconds:.1f} s")
        b = self.engine(cfg)
        b.add(Request("b", prompt + [1, 2, 3], 1))
        b.run()
        self.assertGreater(self.stats(b)[0]["loaded_pages"], 0)
        self.assertEqual(b.load_errors, 0)

    def test_fp8_caches_allocated_as_uint8(self):
        """--kv-cache-dtype fp8 / fp8_e4m3: vLLM's uint8 caches are stored as
        FP8_E4M3 and loaded byte for byte; fp8_e5m2 is refused at start,
        naming cache_config.cache_dtype; uint8 without a cache dtype is
        refused naming the cache."""
        for cache_dtype in ("fp8", "fp8_e4m3"):
            with self.subTest(cache_dtype=cache_dtype):
                cfg = self.config(namespace=f"f8_{cache_dtype}")
                prompt = list(range(90, 90 + 21))
                a = self.engine(cfg, dtype=torch.uint8,
                                kv_cache_dtype=cache_dtype)
                a.add(Request("a", prompt, 1))
                a.run()
                # Saves are asynchronous (a save thread): the finished
                # request's last page may still be on its way.
                for w in a.workers:
                    w.connector.store.flush()
                info = kvharbor.Client(self.daemon.address).describe_namespace(
                    f"f8_{cache_dtype}")
                self.assertEqual(info.geometry.dtype, kvharbor.DType.FP8_E4M3)
                b = self.engine(cfg, dtype=torch.uint8,
                                kv_cache_dtype=cache_dtype)
                b.add(Request("b", prompt + [4], 1))
                b.run()  # the sim checks every loaded byte
                self.assertEqual(self.stats(b)[0]["loaded_pages"], 5)
                self.assertEqual(b.computed_tokens, 22 - 20)
        side = kvh_vllm.WorkerSide(self.config(namespace="e5"), 0, 1,
                                   kv_cache_dtype="fp8_e5m2")
        with self.assertRaises(kvharbor.InvalidArgumentError) as cm:
            side.register_kv_caches(make_caches("flash", 2, 8, 2, 4,
                                                torch.uint8))
        self.assertIn("cache_config.cache_dtype", cm.exception.message)
        self.assertIn("E5M2", cm.exception.message)
        side = kvh_vllm.WorkerSide(self.config(namespace="u8"), 0, 1)
        with self.assertRaises(kvharbor.InvalidArgumentError) as cm:
            side.register_kv_caches(make_caches("flash", 2, 8, 2, 4,
                                                torch.uint8))
        self.assertIn("kv_caches", cm.exception.message)

    def test_save_kv_layer_does_not_wait_for_the_daemon(self):
        """The forward's save_kv_layer and wait_for_save only queue work: a
        step completes while the daemon's Insert is held back; the pages
        are stored once it goes on, and load byte for byte."""
        cfg = self.config(namespace="async")
        a = self.engine(cfg)
        store = a.workers[0].connector.store
        gate = threading.Event()
        begin = store.client.begin_insert

        def held(*args, **kwargs):
            if not gate.wait(30):
                raise AssertionError("the gate was not opened")
            return begin(*args, **kwargs)

        store.client.begin_insert = held
        prompt = list(range(200, 200 + 17))
        a.add(Request("a", prompt, 0))
        out = a.schedule(64)
        self.assertEqual(len(out.kv_connector_metadata.saves), 1)
        done = threading.Event()

        def step():
            a.update(out, *a.execute(out))
            done.set()

        t = threading.Thread(target=step)
        t.start()
        self.assertTrue(done.wait(10), "the step waited for the daemon")
        self.assertEqual(store.stats()["saved_pages"], 0)
        gate.set()
        t.join()
        store.flush()
        self.assertEqual(store.stats()["saved_pages"], 4)
        b = self.engine(cfg)
        b.add(Request("b", prompt, 1))
        b.run()
        self.assertEqual(self.stats(b)[0]["loaded_pages"], 4)

    def test_one_unleased_match_per_lookup(self):
        """With TP=2 the scheduler makes one Match per lookup, without a
        lease (no lease outlives a request vLLM does not schedule); each
        rank leases its own pages for its load, and releases them."""
        cfg = self.config(namespace="one")
        prompt = list(range(300, 300 + 33))
        a = self.engine(cfg, tp=2)
        a.add(Request("a", prompt, 0))
        a.run()
        b = self.engine(cfg, tp=2)
        calls = []
        match = b.sched.lookup.client.match
        b.sched.lookup.client.match = lambda *a_, **k: (calls.append(k), match(
            *a_, **k))[1]
        req = Request("b", prompt + [1, 2], 1)
        n, load_async = b.sched.get_num_new_matched_tokens(req, 0)
        self.assertEqual((n, load_async), (32, False))
        self.assertEqual(len(calls), 1)
        self.assertFalse(calls[0]["lock"])
        client = kvharbor.Client(self.daemon.address)
        # Not scheduled (vLLM had no blocks): nothing is leased.
        self.assertEqual(
            client.describe_namespace("one.tp0of2").stats.active_leases, 0)
        b.add(req)
        b.run()
        self.assertEqual([s["loaded_pages"] for s in self.stats(b)], [8, 8])
        for name in ("one.tp0of2", "one.tp1of2"):
            self.assertEqual(
                client.describe_namespace(name).stats.active_leases, 0)

    def test_publishable_block_hashes_and_events(self):
        """block_hashes keys with vLLM's EAGLE prefix-cache hashing: only
        request.num_publishable_block_hashes blocks are stored (without it
        vLLM leaves the count at 0 and every block is stored); take_events
        reports them (BlockStored, vLLM's hashes) and a later lookup that
        no longer finds them (BlockRemoved)."""
        off = self.engine(self.config(namespace="pub_off", keys="block_hashes"))
        req = Request("o", list(range(500, 500 + 33)), 0)
        req.num_publishable_block_hashes = 0  # vLLM without EAGLE hashing
        off.add(req)
        off.run()
        self.assertEqual(self.stats(off)[0]["saved_pages"], 8)
        cfg = self.config(namespace="pub", keys="block_hashes")
        a = self.engine(cfg)
        a.sched.eagle_hashing = True  # set_eagle_prefix_cache_hashing(True)
        req = Request("a", list(range(500, 500 + 33)), 0)  # 8 whole blocks
        req.num_publishable_block_hashes = 5
        a.add(req)
        a.run()
        hashes = req.block_hashes
        self.assertEqual(self.stats(a)[0]["saved_pages"], 5)
        events = a.sched.take_events()
        stored = [e for e in events if e[0] == "stored"]
        self.assertEqual([h for e in stored for h in e[1]], hashes[:5])
        self.assertEqual(stored[0][2], None)  # the first block has no parent
        self.assertEqual(stored[0][3], req.all_token_ids[:len(stored[0][1])
                                                         * BLOCK])
        self.assertEqual(a.sched.take_events(), [])
        kvharbor.Client(self.daemon.address).evict_all("pub")
        probe = Request("p", req.all_token_ids + [1], 0)
        self.assertEqual(a.sched.get_num_new_matched_tokens(probe, 0),
                         (0, False))
        self.assertEqual(a.sched.take_events(), [("removed", hashes[:5])])

    def test_connector_stats_per_path(self):
        cfg = self.config(namespace="stats")
        prompt = list(range(700, 700 + 23))  # 5 pages, a 6th decoded
        a = self.engine(cfg)
        a.add(Request("a", prompt, 3))
        a.run()
        for w in a.workers:
            w.connector.store.flush()
        saved = a.workers[0].connector.take_stats()
        page_bytes = a.workers[0].connector.paged.geometry().page_bytes
        self.assertEqual(saved["save.insert_by_layer.pages"], 5)
        self.assertEqual(saved["save.insert_by_layer.bytes"], 5 * page_bytes)
        self.assertEqual(saved["save.insert.pages"], 1)  # decoded at the end
        self.assertGreater(saved["save.insert.seconds"], 0)
        self.assertEqual(a.workers[0].connector.take_stats(), {})
        b = self.engine(cfg)
        b.add(Request("b", prompt + a.done["a"].output + [1], 1))
        b.run()
        loaded = b.workers[0].connector.take_stats()
        path = "cpu" if DEVICE.type == "cpu" else next(
            k.split(".")[1] for k in loaded if k.startswith("load."))
        # Two layer groups (load_layer_group 2 of 3 layers): two fetches,
        # each page counted once.
        self.assertEqual(loaded[f"load.{path}.transfers"], 2)
        self.assertEqual(loaded[f"load.{path}.pages"], 6)
        self.assertEqual(loaded[f"load.{path}.tokens"], 6 * BLOCK)
        self.assertEqual(loaded[f"load.{path}.bytes"], 6 * page_bytes)
        self.assertGreater(loaded[f"load.{path}.seconds"], 0)
        summary = kvh_vllm.reduce_stats(kvh_vllm.aggregate_stats(saved, loaded))
        self.assertEqual(summary["load_pages"], 6)
        self.assertEqual(summary["save_pages"], 6)
        self.assertIn(f"load.{path}.GBps", summary)

    def restart_daemon(self):
        address = self.daemon.address
        self.daemon.stop()
        self.daemon = Daemon(f"--listen={address}")

    def test_daemon_restart_under_the_engine(self):
        cfg = self.config(namespace="rs")
        prompt = list(range(50, 50 + 33))  # 8 whole pages
        a = self.engine(cfg)
        a.add(Request("a", prompt, 1))
        a.run()
        address = self.daemon.address
        self.daemon.stop()
        # Down: lookups miss, saves fail; nothing raises, all is computed.
        b = self.engine_after_registration(cfg, a)
        b.add(Request("b", prompt, 1))
        b.run()
        self.assertEqual(b.computed_tokens, 33)
        sched = b.sched.stores[0].stats()
        self.assertGreater(sched["daemon_errors"] + sched["skipped_calls"], 0)
        self.assertEqual(sched["hit_pages"], 0)
        ws = self.stats(b)[0]
        self.assertGreater(ws["save_errors"], 0)
        # Back, empty: the scheduler misses (no namespace), the workers
        # create it again on their first failing save and save again.
        self.daemon = Daemon(f"--listen={address}")
        time.sleep(0.3)  # past retry_after
        for store in [b.sched.stores[0]] + [w.connector.store for w in b.workers]:
            store.client.wait_connected(5)  # reconnects within a second
        b.add(Request("c", prompt + [5, 6, 7, 8, 9], 2))
        b.run()
        ws = self.stats(b)[0]
        self.assertEqual(ws["namespace_recreated"], 1)
        c = self.engine(cfg)
        c.add(Request("d", prompt + [5, 6, 7, 8, 9, 1], 1))
        c.run()
        self.assertEqual(self.stats(c)[0]["loaded_pages"], 9)
        self.assertEqual(c.load_errors, 0)

    def engine_after_registration(self, cfg, like):
        """An engine whose workers registered while the daemon was up (vLLM
        registers once, at start): it reuses ``like``'s worker sides with
        fresh caches, so only the scheduling starts over."""
        eng = Engine(kvh_vllm.SchedulerSide(cfg, BLOCK, 1), like.workers,
                     LAYERS, DIM, BLOCKS)
        for w in eng.workers:
            for t in w.caches.values():
                t.zero_()
        self.addCleanup(eng.sched.close)
        return eng

    def test_lease_lost_before_the_load_is_recomputed(self):
        cfg = self.config(namespace="lost")
        prompt = list(range(10, 10 + 25))
        a = self.engine(cfg)
        a.add(Request("a", prompt, 1))
        a.run()
        b = self.engine(cfg)
        b.add(Request("b", prompt, 1))
        out = b.schedule(64)  # matched and leased: 6 pages to load
        self.assertEqual(len(out.kv_connector_metadata.loads), 1)
        self.restart_daemon()  # the lease and the pages are gone
        errors, sending = b.execute(out)
        self.assertEqual(errors, set(out.kv_connector_metadata.loads[0].block_ids))
        b.update(out, errors, sending)
        b.run()  # recomputed from the first failed block; the sim checks bytes
        self.assertEqual(b.load_errors, 1)
        self.assertEqual(b.computed_tokens, 25)
        self.assertEqual(self.stats(b)[0]["load_errors"], 1)

    def test_requests_the_daemon_refuses_are_misses(self):
        """A prompt over the daemon's store.max_tokens_per_request: lookups
        miss and saves fail, counted; the engine computes everything."""
        self.daemon.stop()
        tmp = tempfile.mkdtemp(prefix="kvh_vllm_limit_")
        self.addCleanup(shutil.rmtree, tmp)
        self.daemon = Kvharbord(os.environ["KVHARBORD"], ["--pool_bytes=64MiB"],
                                config={"store": {"max_tokens_per_request": 16}},
                                workdir=tmp)
        cfg = self.config(namespace="limit")
        eng = self.engine(cfg)
        eng.add(Request("a", list(range(37)), 2))
        eng.run()
        self.assertEqual(eng.computed_tokens, 38)
        ws, ss = self.stats(eng)[0], eng.sched.stores[0].stats()
        self.assertGreater(ws["save_errors"], 0)
        self.assertGreater(ss["daemon_errors"], 0)
        self.assertEqual(ss["hit_pages"], 0)

    def test_layer_wise_load_moves_each_layer_once(self):
        """LayerLoad on the test device (CUDA on the GPU machine): one
        fetch_to_layout per layer group, each moving only its layers
        (bytes_moved), layer 0 usable while later layers are still being
        fetched, every layer equal to the same layers of the stored pages."""
        from kvharbor.integrations._engine import EngineStore, LayerLoad, LoadJob
        gen = torch.Generator().manual_seed(5)
        src = make_caches("flash", LAYERS, BLOCKS, HEADS, DIM, torch.float32)
        for t in src.values():
            t.copy_(torch.randn(t.shape, generator=gen))
        paged_src = PagedKv.from_vllm(src)
        store = EngineStore(self.daemon.address, "lw",
                            geometry=paged_src.geometry(),
                            spec={"capacity_bytes": 1 << 20})
        self.addCleanup(store.close)
        store.ensure_namespace()
        n = 6
        seq = list(range(300, 300 + n * BLOCK))
        stored = paged_src.gather(list(range(10, 10 + n))).cpu()
        self.assertTrue(store.insert(seq, stored))
        dst = make_caches("flash", LAYERS, BLOCKS, HEADS, DIM, torch.float32)
        paged = PagedKv.from_vllm(dst)
        blocks = [40, 3, 17, 8, 25, 1]
        # Fetches of layers >= 1 wait until the test saw layer 0 loaded.
        gate, calls = threading.Event(), []
        fetch = store.client.fetch_to_layout

        def gated(ns, lease, layout, block_ids, **kw):
            if layout.layer_begin >= 1 and not gate.wait(30):
                raise AssertionError("layer 0 was not ready before layer 1")
            r = fetch(ns, lease, layout, block_ids, **kw)
            calls.append((layout.layer_begin, len(layout.k), r))
            return r

        store.client.fetch_to_layout = gated
        lease = store.match(seq)
        self.assertIsNotNone(lease)
        load = LayerLoad(store, paged,
                         [LoadJob("r", lease.id, 0, blocks)], group=1)

        def check_layer(l):
            for i, b in enumerate(blocks):
                for kv, views in ((0, paged.k), (1, paged.v)):
                    self.assertTrue(torch.equal(
                        views[l][b].cpu(), stored[i, kv, l]), (l, i, kv))

        load.wait_layer(0)
        check_layer(0)
        self.assertEqual(len(calls), 1)  # the later layers wait on the gate
        gate.set()
        load.finish()
        self.assertEqual(load.failed, [])
        for l in range(LAYERS):
            check_layer(l)
        self.assertEqual([(b, k) for b, k, _ in calls],
                         [(l, 1) for l in range(LAYERS)])
        page_bytes = paged.geometry().page_bytes
        for _b, _k, r in calls:
            # Every path moves only the layer's bytes (raw pages).
            self.assertEqual(r.bytes_moved, n * page_bytes // LAYERS, r.path)
            self.assertEqual(r.path == "cpu", DEVICE.type == "cpu", r.path)
        self.assertEqual(store.stats()["loaded_pages"], n)

    def test_bad_input_names_the_field(self):
        cfg = self.config(namespace="bad")
        side = kvh_vllm.WorkerSide(cfg, 0, 1)
        good = make_caches("flash", 2, 8, 2, 4, torch.float32)
        cases = [
            (lambda: kvh_vllm.ConnectorConfig.from_extra({"adress": "x"}),
             "kv_connector_extra_config.adress"),
            (lambda: kvh_vllm.ConnectorConfig.from_extra({"timeout": "5"}),
             "kv_connector_extra_config.timeout"),
            (lambda: kvh_vllm.ConnectorConfig.from_extra({"save": 1}),
             "kv_connector_extra_config.save"),
            (lambda: kvh_vllm.ConnectorConfig.from_extra({"keys": "hashes"}),
             "kv_connector_extra_config.keys"),
            (lambda: side.register_kv_caches({"l0": torch.zeros(2, 8, 4, 2, 4,
                                                                dtype=torch.int32)}),
             "dtype"),
            (lambda: side.register_kv_caches({"l0": torch.zeros(3, 8, 4)}),
             "kv_caches[0]"),
            (lambda: side.register_kv_caches(
                {"l0": good["model.layers.0.self_attn.attn"],
                 "l1": torch.zeros(2, 8, 4, 3, 4)}), "kv_caches[1].k"),
            (lambda: side.register_kv_caches(
                {"l0": torch.zeros(2, 8, 4, 2, 4)[..., ::2]}), "head_dim"),
            (lambda: PagedKv.from_vllm(good).gather([0, 8]), "block_ids[1]"),
            (lambda: PagedKv.from_vllm(good).gather([0], layer_begin=1,
                                                    layer_end=3), "layer_begin"),
            (lambda: PagedKv.from_vllm(good).layout(1, 3), "layer_begin"),
            (lambda: PagedKv.from_vllm([]), "kv_caches"),
            (lambda: side.register_kv_caches(
                {"l0": good["model.layers.0.self_attn.attn"],
                 "l1": torch.zeros(2, 8, 4, 2, 4, device="meta")}),
             "kv_caches[1].k"),  # another device
            (lambda: page_key(""), "keys"),
            (lambda: page_key(7, "keys[3]"), "keys[3]"),
        ]
        for fn, field in cases:
            with self.subTest(field=field):
                with self.assertRaises(kvharbor.InvalidArgumentError) as cm:
                    fn()
                self.assertIn(field, cm.exception.message)
        # Nothing was created by the refused registrations.
        self.assertNotIn("bad", [n.name for n in kvharbor.Client(
            self.daemon.address).list_namespaces()])
        # Keys: str as UTF-8, longer than 32 bytes as their SHA-256.
        hexkey = "ab" * 32  # SGLang's page hashes: 64 hex digits
        self.assertEqual(page_key(hexkey),
                         hashlib.sha256(hexkey.encode()).digest())
        self.assertEqual(len(page_key(b"x" * 33)), 32)
        self.assertEqual(page_key("short"), b"short")
        # A geometry clash with an existing namespace is a startup error.
        kvharbor.Client(self.daemon.address).create_namespace(
            "clash", kvharbor.Geometry(2, 2, 4, BLOCK), capacity_bytes=1 << 20)
        clash = kvh_vllm.WorkerSide(self.config(namespace="clash"), 0, 1)
        with self.assertRaises(kvharbor.AlreadyExistsError):
            clash.register_kv_caches(make_caches("flash", 3, 8, 2, 4,
                                                 torch.float32))
        clash.close()
        side.close()


if __name__ == "__main__":
    unittest.main()
