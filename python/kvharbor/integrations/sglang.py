"""kvharbor.integrations.sglang: KvHarborHiCacheStorage, an SGLang HiCache
storage backend (L3) on a kvharbor page-key namespace.

    python -m sglang.launch_server ... --enable-hierarchical-cache \\
      --hicache-storage-backend dynamic --hicache-storage-backend-extra-config \\
      '{"backend_name": "kvharbor", "module_path": "kvharbor.integrations.sglang",
        "class_name": "KvHarborHiCacheStorage", "interface_v1": 1,
        "kvharbor": {"address": "127.0.0.1:50051", "namespace": "llama3-8b"}}'

Follows HiCacheStorage of SGLang at commit 001067fffe33
(python/sglang/srt/mem_cache/hicache_storage.py; the "dynamic" backend of
storage/backend_factory.py builds it as cls(storage_config, kwargs) and
then calls register_mem_pool_host(host_pool)) and the calls of managers/
cache_controller.py at that commit: batch_exists(keys, extra_info) per
batch of up to 128 page hashes while prefetching, batch_get_v1(keys,
host_indices, extra_info) / batch_set_v1 with "interface_v1" (zero copy
into the host pool), batch_get(keys, target_locations) / batch_set(keys,
values) of flat host pages otherwise. SGLang is imported only when the
class is first looked up (module __getattr__); the logic lives in
HiCacheCore (tests/python/test_sglang_backend.py replays those calls on
real torch host pools).

Keys: SGLang's page hashes (64 hex digits, SHA-256 chained over the
prefix, so each names its page and every page before it) are stored as
32-byte keys of a KEY_KIND_PAGE_HASHES namespace: each page is stored and
found by its own hash, with no path from the root. A batch is looked up as
its own keys (the leading run of them that is cached) and stored as its
own pages; ``extra_info.prefix_keys`` is ignored, so neither the
controller's 128-page backup batches nor a prefetch that passes only the
ancestors' hashes can orphan pages, and "hicache_storage_pass_prefix_keys"
is not needed (issue 32, rows (a) and (b)).

Parallelism (HiCacheStorageConfig): each process stores the part of a
page it holds in a namespace of its own: "<namespace>.tp<r>of<n>" for its
KV heads (attention TP rank under attention DP), ".pp<r>of<n>" for its
pipeline stage's layers (every stage's host pool starts at its layer 0, so
without it stage 1 would load stage 0's layers), ".cp<r>of<n>" for its
attention context-parallel slice; dimensions of size 1 add nothing
(_engine.namespace_name). Attention-DP replicas (dp_rank) hold the same KV
and share namespaces; tp_lcm_size (split heads) is not used: another TP
degree uses other namespaces. MLA host pools are not supported (refused at
construction). fp8 host pools (uint8) are stored as FP8_E4M3 when the
device pool's dtype is E4M3; E5M2 is refused (_paged.fp8_kind). The
daemon's trouble is answered with misses and failed sets (integrations/
_engine.py); nothing raises into SGLang's prefetch and backup threads, and
the backend registers while kvharbord is unreachable (the namespace is
created once it answers).
"""

import dataclasses
import time
from typing import List, Optional

from ..errors import invalid
from ..types import PageLayout
from ._engine import EngineStore, StoreConfig, namespace_name
from ._paged import PagedKv, _torch, fp8_kind

SGLANG_COMMIT = "001067fffe33427bee0ed2f007fb7551a1d76b44"

# Shape of one flat host page (get_data_page(flat=True)) per host layout,
# and the permutation to kvharbor's [2][layer][token][head][dim].
_FLAT = {
    "layer_first": (lambda L, P, H, D: (2, L, P, H, D), (0, 1, 2, 3, 4)),
    "page_first": (lambda L, P, H, D: (2, P, L, H, D), (0, 2, 1, 3, 4)),
    "page_first_direct": (lambda L, P, H, D: (2, L, P, H, D), (0, 1, 2, 3, 4)),
    "page_head": (lambda L, P, H, D: (2, H, P, L, D), (0, 3, 2, 1, 4)),
}


@dataclasses.dataclass
class _Metrics:
    """What SGLang's StorageMetrics holds, since the last get_stats()."""
    prefetch_pgs: List[int] = dataclasses.field(default_factory=list)
    backup_pgs: List[int] = dataclasses.field(default_factory=list)
    prefetch_bandwidth: List[float] = dataclasses.field(default_factory=list)
    backup_bandwidth: List[float] = dataclasses.field(default_factory=list)


class HiCacheCore:
    """The logic of KvHarborHiCacheStorage (SGLang's objects duck-typed)."""

    def __init__(self, storage_config, kwargs=None):
        extra = dict(getattr(storage_config, "extra_config", None) or {})
        self.config = StoreConfig.from_dict(extra.get("kvharbor", {}),
                                            "extra_config.kvharbor")
        if getattr(storage_config, "is_mla_model", False):
            raise invalid("storage_config.is_mla_model", "MLA host pools are "
                          "not supported by KvHarborHiCacheStorage")
        c = storage_config
        self.namespace = namespace_name(
            self.config.namespace, c.tp_rank, c.tp_size,
            getattr(c, "pp_rank", 0), getattr(c, "pp_size", 1),
            getattr(c, "attn_cp_rank", 0), getattr(c, "attn_cp_size", 1))
        self.store: Optional[EngineStore] = None
        self.paged: Optional[PagedKv] = None
        self.host_pool = None
        self.metrics = _Metrics()

    def register_mem_pool_host(self, host_pool):
        self.host_pool = host_pool
        # fp8 pools store uint8 (pool_host: dtype = device_pool.store_dtype);
        # the device pool's dtype says which fp8.
        device_pool = getattr(host_pool, "device_pool", None)
        fp8 = None
        if device_pool is not None and hasattr(device_pool, "dtype"):
            fp8 = fp8_kind(device_pool.dtype, "mem_pool_host.device_pool.dtype")
        self.paged = PagedKv.from_sglang_host(host_pool.kv_buffer,
                                              host_pool.layout,
                                              host_pool.page_size, fp8=fp8)
        self.layout = self.paged.layout()
        # SGLang's page hashes are chained (each names its page and every
        # page before it): a page is stored and found by its own hash, so
        # neither a 128-page backup batch nor a prefetch that passes only
        # ancestors' hashes can orphan pages (issue 32).
        self.store = self.config.store(self.namespace, self.paged.geometry(),
                                       key_kind="page_hashes")
        # False while kvharbord is unreachable: SGLang starts, L3 misses
        # until the daemon answers (the namespace is created then).
        self.store.ensure_namespace()

    def close(self):
        if self.store is not None:
            self.store.close()

    def _path(self, keys, extra_info):
        # extra_info.prefix_keys is not needed (and not trusted): each
        # page hash is a key of its own.
        if not keys:
            raise invalid("keys", "must not be empty")
        return self.store.seq(list(keys)), 0

    def _blocks(self, host_indices, n):
        ps = self.paged.block_size
        idx = host_indices.tolist() if hasattr(host_indices, "tolist") \
            else list(host_indices)
        if len(idx) != n * ps:
            raise invalid("host_indices", f"{len(idx)} slots for {n} pages of "
                          f"{ps}")
        return [idx[i * ps] // ps for i in range(n)]

    def _hits(self, seq, skip, lock):
        lease = self.store.match(seq, lock=lock)
        hits = max(0, lease.num_pages - skip) if lease is not None else 0
        self.store._count(hit_pages=hits, miss_pages=len(seq) - skip - hits)
        return lease, hits

    # ---- Lookups ----
    def batch_exists(self, keys, extra_info=None):
        seq, skip = self._path(keys, extra_info)
        _, hits = self._hits(seq, skip, lock=False)
        return hits

    def exists(self, key):
        return self.batch_exists([key]) == 1

    # ---- Zero-copy v1 ----
    def batch_get_v1(self, keys, host_indices, extra_info=None):
        seq, skip = self._path(keys, extra_info)
        blocks = self._blocks(host_indices, len(keys))
        start = time.monotonic()
        lease, hits = self._hits(seq, skip, lock=True)
        ok = False
        if hits:  # straight into the host pool's slots
            ok = self.store.fetch_to_layout(lease.id, skip, self.layout,
                                            blocks[:hits])
            if ok:
                self.store._count(loaded_pages=hits)
                self._record("prefetch", hits, start)
            else:
                self.store._count(load_errors=1)
        if lease is not None:
            self.store.release(lease.id)
        return [ok and i < hits for i in range(len(keys))]

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        seq, skip = self._path(keys, extra_info)
        blocks = self._blocks(host_indices, len(keys))
        start = time.monotonic()
        pages = self.paged.gather(blocks)
        ok = self._insert(seq, pages, skip)
        if ok:
            self._record("backup", len(keys), start)
        return [ok] * len(keys)

    def _insert(self, seq, pages, skip):
        return bool(self.store.insert(seq, pages, skip))

    # ---- Generic (flat host pages) ----
    def _flat_view(self, flat):
        shape, perm = _FLAT[self.host_pool.layout]
        p = self.paged
        return flat.view(shape(p.num_layers, p.block_size, p.num_kv_heads,
                               p.head_dim)).permute(*perm)

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        seq, _ = self._path(keys, None)
        out = [None] * len(keys)
        lease, hits = self._hits(seq, 0, lock=True)
        if hits:
            pages = self.paged.empty_pages(hits, pin=False)
            if self.store.fetch(lease.id, 0, pages):
                for i in range(hits):
                    target = (target_locations[i] if target_locations is not None
                              else self.host_pool.get_dummy_flat_data_page())
                    self._flat_view(target).copy_(pages[i])
                    out[i] = target
                self.store._count(loaded_pages=hits)
        if lease is not None:
            self.store.release(lease.id)
        return out

    def get(self, key, target_location=None, target_sizes=None):
        targets = None if target_location is None else [target_location]
        return self.batch_get([key], targets)[0]

    def batch_set(self, keys, values=None, target_locations=None,
                  target_sizes=None):
        if values is None or len(values) != len(keys):
            raise invalid("values", f"need one flat page per key ({len(keys)})")
        seq, _ = self._path(keys, None)
        torch = _torch()
        pages = torch.stack([self._flat_view(v).contiguous() for v in values])
        return self._insert(seq, pages, 0)

    def set(self, key, value=None, target_location=None, target_sizes=None):
        return self.batch_set([key], [value])

    # ---- Housekeeping ----
    def clear(self):
        r = self.store._call("evict_all", lambda: self.store.client.evict_all(
            self.store.namespace, timeout=self.store.timeout))
        return r is not None

    def _record(self, kind, pages, start):
        seconds = max(time.monotonic() - start, 1e-9)
        gbps = pages * self.paged.geometry(PageLayout.KV_LAYER_TOKEN_HEAD_DIM) \
            .page_bytes / seconds / 1e9
        getattr(self.metrics, f"{kind}_pgs").append(pages)
        getattr(self.metrics, f"{kind}_bandwidth").append(gbps)

    def take_metrics(self):
        m, self.metrics = self.metrics, _Metrics()
        return m


def _make_sglang_class():
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage  # noqa: PLC0415

    class KvHarborHiCacheStorage(HiCacheStorage):
        """kvharbor as SGLang's HiCache L3 (module docstring)."""

        def __init__(self, storage_config, kwargs=None):
            self._core = HiCacheCore(storage_config, kwargs)

        def register_mem_pool_host(self, mem_pool_host):
            super().register_mem_pool_host(mem_pool_host)
            self._core.register_mem_pool_host(mem_pool_host)

        def batch_exists(self, keys, extra_info=None):
            return self._core.batch_exists(keys, extra_info)

        def exists(self, key):
            return self._core.exists(key)

        def batch_get_v1(self, keys, host_indices, extra_info=None):
            return self._core.batch_get_v1(keys, host_indices, extra_info)

        def batch_set_v1(self, keys, host_indices, extra_info=None):
            return self._core.batch_set_v1(keys, host_indices, extra_info)

        def get(self, key, target_location=None, target_sizes=None):
            return self._core.get(key, target_location, target_sizes)

        def batch_get(self, keys, target_locations=None, target_sizes=None):
            return self._core.batch_get(keys, target_locations, target_sizes)

        def set(self, key, value=None, target_location=None, target_sizes=None):
            return self._core.set(key, value, target_location, target_sizes)

        def batch_set(self, keys, values=None, target_locations=None,
                      target_sizes=None):
            return self._core.batch_set(keys, values, target_locations,
                                        target_sizes)

        def clear(self):
            return self._core.clear()

        def get_stats(self):
            m = self._core.take_metrics()
            try:
                from sglang.srt.metrics.collector import StorageMetrics  # noqa: PLC0415
            except ImportError:
                return None
            out = StorageMetrics()
            for field in dataclasses.fields(m):
                setattr(out, field.name, getattr(m, field.name))
            return out

        def close(self):
            self._core.close()

    KvHarborHiCacheStorage.__module__ = __name__
    return KvHarborHiCacheStorage


def __getattr__(name):
    if name == "KvHarborHiCacheStorage":
        globals()[name] = _make_sglang_class()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
