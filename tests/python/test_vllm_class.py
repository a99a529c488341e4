"""kvharbor.integrations.vllm as vLLM loads it: KvHarborConnector made over
stand-ins of vLLM's modules (the base class of KVConnectorBase_V1 at commit
003df2961dd8, its metrics and kv_events, parallel_state) and driven through
the model runner's calls against a real kvharbord (metadata pickled, KV
events, connector stats, pipeline stage and context-parallel checks); and,
on the GPU machine (KVHARBOR_TEST_DEVICE=cuda), save_kv_layer's layer copy
out of a CUDA cache without a host sync. Needs torch (python3-torch)."""

import dataclasses
import pickle
import sys
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
    from kvharbor.integrations import vllm as kvh_vllm
    from kvharbor.integrations._paged import PagedKv
    from vllm_sim import BLOCK, DEVICE, Engine, Request, Worker, make_caches

LAYERS, HEADS, DIM, BLOCKS = 3, 4, 8, 64


@unittest.skipIf(torch is None or DEVICE.type != "cuda",
                 "CUDA caches only (KVHARBOR_TEST_DEVICE=cuda)")
class LayerCopyCudaTest(unittest.TestCase):
    """save_kv_layer's copy of a layer out of a CUDA cache: it returns
    without waiting for the GPU (a long kernel queued before it is still
    running), the host pages hold the layer once its event completed, and
    the blocks' next writers (after wait_for_save's stream wait) do not
    change them."""

    def test_copy_is_asynchronous_and_ordered(self):
        caches = make_caches("flash", LAYERS, BLOCKS, HEADS, DIM, torch.float16)
        gen = torch.Generator(device=DEVICE).manual_seed(3)
        for t in caches.values():
            t.copy_(torch.randn(t.shape, generator=gen, device=DEVICE))
        side = kvh_vllm.WorkerSide(kvh_vllm.ConnectorConfig.from_extra({}), 0, 1)
        side.paged = PagedKv.from_vllm(caches)
        blocks = [5, 1, 40, 7]
        want = side.paged.gather_layer(blocks, 1).cpu()
        big = torch.randn(4096, 4096, device=DEVICE)
        torch.cuda.synchronize()
        start = time.monotonic()
        for _ in range(100):  # a good part of a second of GPU work queued
            big = big @ big / 64
        queued = time.monotonic() - start
        host, done = side._copy_layer(blocks, 1)
        returned = time.monotonic() - start
        self.assertFalse(done.query(), "the copy waited for the queued work")
        self.assertTrue(host.is_pinned())
        # wait_for_save: the current stream waits for the side stream, so a
        # write into the blocks queued now lands after the copy.
        torch.cuda.current_stream().wait_stream(side._side)
        for t in caches.values():
            t.zero_()
        done.synchronize()
        self.assertTrue(torch.equal(host, want))
        torch.cuda.synchronize()
        self.assertLess(returned - queued, 0.05)


@unittest.skipIf(torch is None, "needs torch (python3-torch)")
class LazyVllmClassTest(unittest.TestCase):
    """The module imports without vLLM; KvHarborConnector subclasses vLLM's
    KVConnectorBase_V1 when vLLM is importable (here a stand-in package
    with the base class's constructor and metadata binding of 003df2961dd8)."""

    def test_without_vllm(self):
        if "vllm" in sys.modules:
            self.skipTest("a vllm module is loaded")
        with self.assertRaises(ImportError):
            kvh_vllm.KvHarborConnector

    def test_with_vllm(self):
        base = types.ModuleType("vllm.distributed.kv_transfer.kv_connector.v1.base")

        class KVConnectorRole:
            SCHEDULER, WORKER = 0, 1

        class KVConnectorMetadata:
            pass

        class KVConnectorBase_V1:
            def __init__(self, vllm_config, role, kv_cache_config):
                self._connector_metadata = None
                self._vllm_config = vllm_config
                self._kv_transfer_config = vllm_config.kv_transfer_config
                self._kv_cache_config = kv_cache_config
                self._role = role

            def bind_connector_metadata(self, meta):
                self._connector_metadata = meta

            def _get_connector_metadata(self):
                return self._connector_metadata

        base.KVConnectorRole = KVConnectorRole
        base.KVConnectorMetadata = KVConnectorMetadata
        base.KVConnectorBase_V1 = KVConnectorBase_V1
        state = types.ModuleType("vllm.distributed.parallel_state")
        state.get_tensor_model_parallel_rank = lambda: 0
        state.get_pp_group = lambda: types.SimpleNamespace(rank_in_group=0)
        # metrics.KVConnectorStats: a dataclass holding ``data``.
        metrics = types.ModuleType(
            "vllm.distributed.kv_transfer.kv_connector.v1.metrics")

        @dataclasses.dataclass
        class KVConnectorStats:
            data: dict = dataclasses.field(default_factory=dict)

        metrics.KVConnectorStats = KVConnectorStats
        # kv_events: msgspec structs; __struct_fields__ names their fields.
        events = types.ModuleType("vllm.distributed.kv_events")

        class _Event:
            def __init__(self, **fields):
                assert set(fields) == set(self.__struct_fields__), fields
                self.__dict__.update(fields)

        class BlockStored(_Event):
            __struct_fields__ = ("block_hashes", "parent_block_hash",
                                 "token_ids", "block_size", "lora_id",
                                 "medium", "lora_name", "extra_keys",
                                 "group_idx")

        class BlockRemoved(_Event):
            __struct_fields__ = ("block_hashes", "medium", "group_idx")

        events.BlockStored, events.BlockRemoved = BlockStored, BlockRemoved
        stand_in.install(self, {base.__name__: base, state.__name__: state,
                                metrics.__name__: metrics,
                                events.__name__: events},
                         forget=[(kvh_vllm, "KvHarborConnector"),
                                 (kvh_vllm, "KvHarborConnectorMetadata"),
                                 (kvh_vllm, "KvHarborConnectorStats")])

        daemon = Daemon()
        self.addCleanup(daemon.stop)
        cls = getattr(kvh_vllm, "KvHarborConnector")  # what vLLM's factory does
        self.assertTrue(issubclass(cls, KVConnectorBase_V1))
        self.assertTrue(cls.requires_piecewise_for_cudagraph({}))
        self.assertTrue(issubclass(kvh_vllm.KvHarborConnectorStats,
                                   KVConnectorStats))
        cfg = types.SimpleNamespace(
            kv_transfer_config=types.SimpleNamespace(kv_connector_extra_config={
                "address": daemon.address, "namespace": "lazy",
                "capacity_bytes": 1 << 20}),
            parallel_config=types.SimpleNamespace(tensor_parallel_size=1,
                                                  pipeline_parallel_size=1),
            cache_config=types.SimpleNamespace(block_size=BLOCK,
                                               cache_dtype="auto"))
        sched = cls(cfg, KVConnectorRole.SCHEDULER, None)
        worker = cls(cfg, KVConnectorRole.WORKER, None)
        self.addCleanup(sched.shutdown)
        self.addCleanup(worker.shutdown)
        caches = make_caches("flash", LAYERS, BLOCKS, HEADS, DIM, torch.float32)
        worker.register_kv_caches(caches)
        eng = Engine(sched, [Worker(_Bound(worker), caches, "flash", HEADS, 0)],
                     LAYERS, DIM, BLOCKS)
        eng.add(Request("a", list(range(21)), 2))
        eng.run()
        meta = sched.build_connector_meta(eng.schedule(8))
        self.assertIsInstance(meta, KVConnectorMetadata)
        self.assertEqual(type(pickle.loads(pickle.dumps(meta))), type(meta))
        worker._worker.store.flush()
        self.assertEqual(worker._worker.store.stats()["saved_pages"], 5)
        # A cache: a save lost to preemption is not worth a recompute.
        self.assertFalse(worker.requires_kv_delivery)
        sched.set_eagle_prefix_cache_hashing(True)  # the fence of publishable hashes
        self.assertTrue(sched._scheduler.eagle_hashing)
        # KV events: the blocks sent to be saved, by vLLM's block hashes.
        stored = sched.take_events()
        self.assertEqual({type(e) for e in stored}, {BlockStored})
        self.assertEqual([h for e in stored for h in e.block_hashes],
                         Request("x", list(range(21)), 0).block_hashes)
        self.assertEqual({e.medium for e in stored}, {"kvharbor"})
        self.assertIsNone(stored[0].parent_block_hash)
        for before, after in zip(stored, stored[1:]):  # chunked prefill
            self.assertEqual(after.parent_block_hash, before.block_hashes[-1])
        # Connector stats: per path, rebuilt from their data on the other
        # side of vLLM's IPC and aggregated over ranks.
        stats = worker.get_kv_connector_stats()
        self.assertEqual(stats.data["save.insert_by_layer.pages"], 5)
        other = cls.build_kv_connector_stats(data=dict(stats.data))
        total = cls.build_kv_connector_stats(data={}).aggregate(stats)
        total.aggregate(other)
        self.assertEqual(total.reduce()["save_pages"], 10)
        self.assertTrue(cls.build_kv_connector_stats().is_empty())
        self.assertIsNone(worker.get_kv_connector_stats())  # taken
        # Pipeline stage 1 of 2 (vLLM's get_pp_group) keys its namespace;
        # context parallelism is refused, naming the field.
        state.get_pp_group = lambda: types.SimpleNamespace(rank_in_group=1)
        cfg.parallel_config.pipeline_parallel_size = 2
        stage1 = cls(cfg, KVConnectorRole.WORKER, None)
        self.assertEqual(stage1._worker.namespace, "lazy.pp1of2")
        stage1.shutdown()
        cfg.parallel_config.decode_context_parallel_size = 2
        with self.assertRaises(kvharbor.InvalidArgumentError) as cm:
            cls(cfg, KVConnectorRole.WORKER, None)
        self.assertIn("decode_context_parallel_size", cm.exception.message)


class _Bound:
    """The model runner's view of a KvHarborConnector worker: it binds the
    step's metadata, then calls the hooks without it (as vLLM does)."""

    def __init__(self, connector):
        self.c = connector

    def start_load_kv(self, meta):
        self.c.bind_connector_metadata(meta)
        self.c.start_load_kv(None)

    def wait_for_layer_load(self, name):
        self.c.wait_for_layer_load(name)

    def save_kv_layer(self, name, meta):
        self.c.save_kv_layer(name, None, None)

    def wait_for_save(self, meta):
        self.c.wait_for_save()

    def get_finished(self, ids):
        return self.c.get_finished(ids)

    def get_block_ids_with_load_errors(self):
        return self.c.get_block_ids_with_load_errors()


if __name__ == "__main__":
    unittest.main()
