"""kvharbor.integrations.vllm: KvHarborConnector, a vLLM KV connector.

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KvHarborConnector",
      "kv_connector_module_path": "kvharbor.integrations.vllm",
      "kv_role": "kv_both", "kv_connector_extra_config":
      {"address": "127.0.0.1:50051", "namespace": "llama3-8b"}}'

Follows KVConnectorBase_V1 of vLLM at commit 003df2961dd8
(vllm/distributed/kv_transfer/kv_connector/v1/base.py; the constructor
takes kv_cache_config, as since v0.11.1) and the calls its scheduler
(v1/core/sched/scheduler.py) and model runner (v1/worker/
kv_connector_model_runner_mixin.py, the attention layer's
wait_for_kv_layer_from_connector / maybe_save_kv_layer_to_connector) make;
docs/vllm.md lists them. vLLM is imported only when KvHarborConnector is
first looked up (module __getattr__): this module imports without it, and
its logic lives in SchedulerSide and WorkerSide, which take vLLM's objects
by duck typing (tests/python/test_vllm_connector.py replays vLLM's calls).

What it does:
- Scheduler: get_num_new_matched_tokens matches the prompt (token ids, or
  vLLM's publishable block hashes as page keys) with one Match, without a
  lease, in the namespace of TP rank 0 of stage 0 (every rank saves the
  same pages) and offers the match beyond what vLLM has locally
  (synchronous load: load_kv_async False). update_state_after_alloc notes
  what to load; build_connector_meta tells the workers what to load (the
  pages' sequence, first page, blocks) and what to save: the prompt pages
  each step completes (prefill), and at a request's end (request_finished,
  which then keeps the blocks until the workers report the save in
  get_finished) the pages decoding completed. take_events reports the
  blocks sent to be saved (BlockStored) and those a lookup no longer finds
  (BlockRemoved), medium "kvharbor".
- Workers: register_kv_caches creates the rank's namespace (or, with the
  daemon unreachable, leaves it to the first call once it answers);
  start_load_kv leases the pages in the rank's own namespace and fetches
  them layer group by layer group on a thread (layer ranges), and
  wait_for_layer_load(layer) waits for one layer only; it also queues the
  saves of finished requests (every vLLM version calls it, even on the
  empty steps some skip wait_for_save on). save_kv_layer copies a layer of
  the saved pages out as the forward computes it (CUDA: to pinned memory on
  a side stream, no host sync) and a save thread sends it (an Insert by
  layer, appending after the cached prefix); wait_for_save queues the
  commits; get_finished reports finished requests once their pages are
  copied; blocks whose load failed are reported by
  get_block_ids_with_load_errors (vLLM recomputes them).
  get_kv_connector_stats: pages, tokens, bytes and seconds of the loads and
  saves per path (KvHarborConnectorStats).
- Parallelism: every tensor-parallel rank of every pipeline stage stores
  its own KV heads of its own layers in a namespace of its own,
  "<namespace>[.tp<r>of<n>][.pp<s>of<m>]"; another TP or PP degree uses
  other namespaces. Context parallelism (decode or prefill) is refused.
- fp8 caches (uint8 tensors): stored as FP8_E4M3 for cache_dtype fp8 /
  fp8_e4m3; fp8_e5m2 is refused at start (integrations/_paged.py).
- The daemon's trouble never reaches vLLM (integrations/_engine.py): a
  restarted or unreachable daemon, also at start, means misses and failed
  saves, counted and logged at most every 10 s per kind.
"""

import dataclasses
import logging
import time
from typing import Dict, List, Optional

from ..errors import invalid
from ._engine import (EngineStore, LayerLoad, LoadJob, SaveJob, StoreConfig,
                      gather_for_insert, namespace_name)
from ._paged import PagedKv, _torch, fp8_kind

log = logging.getLogger("kvharbor.integrations.vllm")

VLLM_COMMIT = "003df2961dd8830c317a61f9745ccd557da9fa06"


@dataclasses.dataclass(frozen=True)
class ConnectorConfig(StoreConfig):
    """kv_connector_extra_config (docs/vllm.md): StoreConfig's keys and
    these."""
    namespace: str = "vllm"
    keys: str = "tokens"          # or "block_hashes" (page-key namespace)
    load_layer_group: int = 4     # layers per fetch
    save: bool = True

    _TYPES = dict(StoreConfig._TYPES, keys=str, load_layer_group=int,
                  save=bool)

    @classmethod
    def from_extra(cls, extra):
        config = cls.from_dict(extra or {}, "kv_connector_extra_config")
        if config.keys not in ("tokens", "block_hashes"):
            raise invalid("kv_connector_extra_config.keys",
                          f"{config.keys!r} is not 'tokens' or 'block_hashes'")
        if config.load_layer_group < 1:
            raise invalid("kv_connector_extra_config.load_layer_group",
                          "must be >= 1")
        return config

    def key_kind(self):
        return "page_keys" if self.keys == "block_hashes" else "tokens"


# ---- Metadata (scheduler -> workers; pickled between processes) ----

@dataclasses.dataclass
class ReqLoad:
    req_id: str
    seq: list              # token ids, or block hashes, of the pages to lease
    start_page: int
    block_ids: List[int]   # destination of pages start_page...


@dataclasses.dataclass
class ReqSave:
    req_id: str
    seq: list              # token ids, or block hashes, of whole pages
    block_ids: List[int]   # every page of seq
    skip_pages: int        # pages cached already
    at_finish: bool        # the request ended: workers report it in get_finished


@dataclasses.dataclass
class ConnectorMetadata:
    loads: List[ReqLoad] = dataclasses.field(default_factory=list)
    saves: List[ReqSave] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _ReqState:
    request: object
    block_ids: List[int] = dataclasses.field(default_factory=list)
    saved_pages: int = 0            # pages known to be in kvharbor
    load: Optional[ReqLoad] = None  # confirmed, not yet sent to workers
    offered: Optional[tuple] = None  # (start page, pages) of the last offer


# Block hashes the scheduler reported stored in KV events, at most this many
# (the oldest are forgotten: no removal event is sent for them).
_MAX_REPORTED = 1 << 18


class SchedulerSide:
    """The scheduler half of KvHarborConnector (vLLM's calls, duck-typed).

    A lookup is one Match, without a lease, in the namespace of TP rank 0 of
    pipeline stage 0: every rank saves the same pages, so its answer stands
    for all of them, and an unleased Match has no side effect (vLLM may ask
    again, or never schedule the request). Each worker takes its own lease
    when it loads (LayerLoad), for the duration of the load; blocks whose
    pages its namespace no longer holds are reported as load errors and
    recomputed."""

    def __init__(self, config: ConnectorConfig, block_size, tp_size,
                 pp_size=1):
        self.config, self.block_size = config, block_size
        self.tp_size, self.pp_size = tp_size, pp_size
        self.lookup = config.store(
            namespace_name(config.namespace, 0, tp_size, 0, pp_size),
            key_kind=config.key_kind())
        self.stores = [self.lookup]
        self.states: Dict[str, _ReqState] = {}
        self.finish_saves: List[ReqSave] = []
        self.events: list = []  # ("stored", hashes, parent, tokens) / ("removed", hashes)
        self._reported: Dict[object, None] = {}  # insertion-ordered set
        # vLLM's engine-wide EAGLE prefix-cache hashing (set_eagle_prefix_
        # cache_hashing): only then does num_publishable_block_hashes fence
        # the block hashes (vLLM advances it only in that mode).
        self.eagle_hashing = False

    def close(self):
        self.lookup.close()

    def _hash_pages(self, request):
        """How many block hashes kvharbor may use for a request's pages:
        with EAGLE prefix-cache hashing, the publishable ones (vLLM's
        num_publishable_block_hashes: a successor-aware hash whose draft KV
        is not materialized yet is not), else all of them."""
        hashes = getattr(request, "block_hashes", None) or []
        n = getattr(request, "num_publishable_block_hashes", None)
        if not self.eagle_hashing or n is None:
            return len(hashes)
        return min(len(hashes), int(n))

    def _seq(self, request, pages):
        if self.config.keys == "block_hashes":
            return self.lookup.seq(list(request.block_hashes[:pages]))
        return list(request.all_token_ids[:pages * self.block_size])

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        st = self.states.setdefault(request.request_id, _ReqState(request))
        st.offered = None
        tokens = len(request.all_token_ids)
        pages = (tokens - 1) // self.block_size  # vLLM computes the last token
        if self.config.keys == "block_hashes":
            pages = min(pages, self._hash_pages(request))
        if pages * self.block_size <= num_computed_tokens:
            return 0, False
        lease = self.lookup.match(self._seq(request, pages), lock=False)
        matched = lease.num_pages if lease is not None else 0
        start = num_computed_tokens // self.block_size
        self.lookup._count(hit_pages=max(0, matched - start),
                           miss_pages=pages - max(start, matched))
        self._note_removed(request, matched, pages)
        st.saved_pages = matched
        if matched <= start:
            return 0, False
        st.offered = (start, matched - start)
        return (matched - start) * self.block_size, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        st = self.states.setdefault(request.request_id, _ReqState(request))
        st.block_ids = list(blocks.get_block_ids()[0])
        offered, st.offered = st.offered, None
        if num_external_tokens == 0 or offered is None:
            return
        start = offered[0]
        pages = num_external_tokens // self.block_size
        st.load = ReqLoad(request.request_id,
                          self._seq(request, start + pages), start,
                          st.block_ids[start:start + pages])

    def build_connector_meta(self, scheduler_output) -> ConnectorMetadata:
        meta = ConnectorMetadata()
        out = scheduler_output
        computed = {}
        for new in out.scheduled_new_reqs:
            st = self.states.get(new.req_id)
            if st is None:
                continue
            st.block_ids = list(new.block_ids[0])
            computed[new.req_id] = new.num_computed_tokens
        cached = out.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            st = self.states.get(req_id)
            if st is None:
                continue
            new_ids = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:
                st.block_ids = list(new_ids[0]) if new_ids else []
            elif new_ids:
                st.block_ids.extend(new_ids[0])
            computed[req_id] = cached.num_computed_tokens[i]
        for req_id, before in computed.items():
            st = self.states[req_id]
            if st.load is not None:
                meta.loads.append(st.load)
                st.load = None
            after = before + out.num_scheduled_tokens.get(req_id, 0)
            self._save_prompt(meta, req_id, st, after)
        meta.saves.extend(self.finish_saves)
        self.finish_saves = []
        for req_id in out.finished_req_ids:
            self.states.pop(req_id, None)
        return meta

    def _save_prompt(self, meta, req_id, st, computed_after):
        """The prompt pages this step completes (prefill, chunk by chunk)."""
        if not self.config.save:
            return
        prompt = len(st.request.prompt_token_ids)
        end = min(computed_after, prompt, len(st.block_ids) * self.block_size)
        end_pages = end // self.block_size
        if self.config.keys == "block_hashes":
            end_pages = min(end_pages, self._hash_pages(st.request))
        if end_pages > st.saved_pages:
            meta.saves.append(ReqSave(req_id, self._seq(st.request, end_pages),
                                      st.block_ids[:end_pages], st.saved_pages,
                                      False))
            self._note_stored(st.request, st.saved_pages, end_pages)
            st.saved_pages = end_pages

    def request_finished(self, request, block_ids):
        st = self.states.get(request.request_id)
        if st is not None:
            st.offered = None
        if not self.config.save or st is None:
            return False, None
        computed = min(request.num_computed_tokens,
                       len(block_ids) * self.block_size)
        end_pages = computed // self.block_size
        if self.config.keys == "block_hashes":
            end_pages = min(end_pages, self._hash_pages(request))
        if end_pages <= st.saved_pages:
            return False, None
        self.finish_saves.append(ReqSave(
            request.request_id, self._seq(request, end_pages),
            list(block_ids[:end_pages]), st.saved_pages, True))
        self._note_stored(request, st.saved_pages, end_pages)
        st.saved_pages = end_pages
        return True, None  # blocks stay until get_finished reports the save

    # ---- KV cache events (take_events) ----
    def _note_stored(self, request, first, end):
        """A BlockStored event for pages [first, end) sent to be saved: vLLM's
        block hashes (of the publishable blocks only), their tokens and the
        parent hash."""
        hashes = list(getattr(request, "block_hashes", None) or [])
        end = min(end, self._hash_pages(request))
        if end <= first:
            return
        new = hashes[first:end]
        bs = self.block_size
        self.events.append(("stored", new, hashes[first - 1] if first else None,
                            list(request.all_token_ids[first * bs:end * bs])))
        for h in new:
            self._reported.pop(h, None)
            self._reported[h] = None
        while len(self._reported) > _MAX_REPORTED:
            self._reported.pop(next(iter(self._reported)))

    def _note_removed(self, request, matched, pages):
        """A BlockRemoved event for blocks reported stored that a lookup no
        longer finds (evicted, or a save that failed)."""
        hashes = list(getattr(request, "block_hashes", None) or [])
        gone = [h for h in hashes[matched:pages] if h in self._reported]
        if gone:
            for h in gone:
                del self._reported[h]
            self.events.append(("removed", gone))

    def take_events(self):
        events, self.events = self.events, []
        return events


class _Upload:
    """One request's Insert by layer in one step. Its calls run in order on
    the store's save thread (begin, a send per layer, commit), so the
    forward never waits for the daemon; ``failed`` makes the rest no-ops."""

    def __init__(self, save: ReqSave, skip: int):
        self.req_id, self.seq, self.skip = save.req_id, save.seq, skip
        self.up = None
        self.failed = False
        self.nbytes = 0
        self.started = time.monotonic()


class WorkerSide:
    """The worker half of KvHarborConnector (one per TP rank and PP stage)."""

    def __init__(self, config: ConnectorConfig, tp_rank, tp_size, pp_rank=0,
                 pp_size=1, kv_cache_dtype=None):
        self.config = config
        self.namespace = namespace_name(config.namespace, tp_rank, tp_size,
                                        pp_rank, pp_size)
        self.tp_rank, self.pp_rank = tp_rank, pp_rank
        self.kv_cache_dtype = kv_cache_dtype
        self.store: Optional[EngineStore] = None
        self.paged: Optional[PagedKv] = None
        self.layer_index: Dict[str, int] = {}
        self.load: Optional[LayerLoad] = None
        self.uploads: Dict[str, _Upload] = {}  # this step's Inserts by layer
        self.load_errors = set()
        self.saved = set()          # finished requests whose pages are copied
        self.finished_seen = set()  # ids vLLM passed to get_finished
        # Requests a save of failed: their later saves send every page (the
        # prefix they would skip may be missing).
        self.tainted = set()
        self._finish_meta = None    # the metadata whose finish saves ran
        self._side = None           # CUDA stream of the layer copies

    def register_kv_caches(self, kv_caches):
        fp8 = None
        if self.kv_cache_dtype is not None:
            fp8 = fp8_kind(self.kv_cache_dtype, "cache_config.cache_dtype")
        self.paged = PagedKv.from_vllm(kv_caches, fp8=fp8)
        self.layer_index = {name: i for i, name in enumerate(kv_caches)}
        self.store = self.config.store(self.namespace, self.paged.geometry(),
                                       self.config.key_kind())
        # False when kvharbord is unreachable: vLLM starts anyway; lookups
        # miss until the daemon answers, and the first call after that
        # creates the namespace.
        ready = self.store.ensure_namespace()
        log.info("kvharbor: rank %d (stage %d) stores %d layers x %d KV heads "
                 "x %d in %s on %s (%s)%s", self.tp_rank, self.pp_rank,
                 self.paged.num_layers, self.paged.num_kv_heads,
                 self.paged.head_dim, self.namespace, self.config.address,
                 self.store.key_kind,
                 "" if ready else "; the daemon is not reachable yet")

    def close(self):
        self._finish_load()
        if self.store is not None:
            self.store.flush()
            self.store.close()

    # ---- Loads ----
    def start_load_kv(self, meta: ConnectorMetadata):
        self._finish_load()
        jobs = [LoadJob(l.req_id, None, l.start_page, l.block_ids, l.seq)
                for l in meta.loads]
        if jobs and self.store is not None:
            self.load = LayerLoad(self.store, self.paged, jobs,
                                  self.config.load_layer_group)
        # Every vLLM version calls start_load_kv each step, empty steps
        # included; some skip wait_for_save on an empty step, which is when a
        # request that finished alone has its pages saved.
        self._save_finished(meta)

    def wait_for_layer_load(self, layer_name):
        if self.load is not None and layer_name in self.layer_index:
            self.load.wait_layer(self.layer_index[layer_name])

    def _finish_load(self):
        if self.load is not None:
            self.load.finish()
            self.load_errors.update(self.load.failed)
            self.load = None

    def get_block_ids_with_load_errors(self):
        errors, self.load_errors = self.load_errors, set()
        return errors

    # ---- Saves ----
    def save_kv_layer(self, layer_name, meta: ConnectorMetadata):
        """Copies this layer of the step's prompt pages out of the cache and
        queues its send (an Insert by layer per request, appending after
        the cached prefix). No host sync: CUDA caches are copied to pinned
        memory on a side stream, which the save thread waits for."""
        if self.store is None:
            return
        layer = self.layer_index.get(layer_name)
        if layer is None:
            return
        for save in meta.saves:
            if save.at_finish:
                continue
            if layer == 0:
                skip = 0 if save.req_id in self.tainted else save.skip_pages
                u = _Upload(save, skip)
                self.uploads[save.req_id] = u
                self.store.submit(self._begin, u)
            u = self.uploads.get(save.req_id)
            if u is None:
                continue
            pages, ready = self._copy_layer(save.block_ids[u.skip:], layer)
            self.store.submit(self._send, u, layer, pages, ready)

    def _copy_layer(self, block_ids, layer):
        """One layer of the pages of block_ids in host memory, and the CUDA
        event after which it is there (None for host caches)."""
        dev = self.paged.gather_layer(block_ids, layer)
        if self.paged.device.type != "cuda":
            return dev, None
        torch = _torch()
        if self._side is None:
            self._side = torch.cuda.Stream(self.paged.device)
        host = torch.empty(dev.shape, dtype=dev.dtype, pin_memory=True)
        self._side.wait_stream(torch.cuda.current_stream(self.paged.device))
        with torch.cuda.stream(self._side):
            host.copy_(dev, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self._side)
        dev.record_stream(self._side)  # freed only after the copy
        return host, done

    def _begin(self, u: _Upload):
        """Opens the Insert by layer after the request's cached prefix (the
        request's earlier uploads ran before on this thread). If that prefix
        is gone, this step's pages are not saved and the request's later
        saves send every page."""
        args, kwargs = self.store._seq_args(u.seq)
        u.up = self.store._call("insert", lambda: self.store.client.begin_insert(
            self.store.namespace, *args, skip_pages=u.skip, layer_major=True,
            timeout=self.store.timeout, **kwargs))
        if u.up is None:
            self._fail(u)

    def _send(self, u: _Upload, layer, pages, ready):
        if u.failed:
            return
        if ready is not None:
            ready.synchronize()
        if self.store._call("insert",
                            lambda: u.up.send_layer(layer, pages) or True):
            u.nbytes += pages.numel() * pages.element_size()
        else:
            self._fail(u)

    def _fail(self, u: _Upload):
        u.failed = True
        self.tainted.add(u.req_id)
        self.store._count(save_errors=1)
        if u.up is not None:
            u.up.close()

    def _commit(self, u: _Upload):
        if u.failed:
            return False
        r = self.store._call("insert", u.up.commit)
        u.up.close()
        if r is None:
            self._fail(u)
            return False
        self.store._count(saved_pages=r.pages_stored, sent_pages=u.up.sent_pages)
        self.store.record("save", "insert_by_layer", u.up.sent_pages, u.nbytes,
                          time.monotonic() - u.started)
        return True

    def wait_for_save(self, meta: ConnectorMetadata):
        self._finish_load()
        if self.store is None:
            return
        if self._side is not None:
            # The step's next kernels (and the blocks' next owners) come after
            # the layer copies: a GPU-side wait, not a host sync.
            torch = _torch()
            torch.cuda.current_stream(self.paged.device).wait_stream(self._side)
        for u in self.uploads.values():
            self.store.submit(self._commit, u)
        self.uploads = {}
        self._save_finished(meta)

    def _save_finished(self, meta: ConnectorMetadata):
        """Copies the pages of the step's finished requests to host memory
        and queues their insert (once per step: start_load_kv or
        wait_for_save, whichever comes first); get_finished then reports
        them, and vLLM frees their blocks."""
        if self.store is None or meta is self._finish_meta:
            return
        self._finish_meta = meta
        for save in meta.saves:
            if not save.at_finish:
                continue  # sent layer by layer
            skip = 0 if save.req_id in self.tainted else save.skip_pages
            job = SaveJob(save.req_id, save.seq, save.block_ids, skip)
            seq, host, skip = gather_for_insert(self.store, self.paged, job)
            self.saved.add(save.req_id)  # host copy made: blocks reusable
            self.tainted.discard(save.req_id)
            self._watch(save.req_id, self.store.submit(self.store.insert, seq,
                                                       host, skip))

    def _watch(self, req_id, future):
        def done(f):
            if not f.result():
                self.tainted.add(req_id)
        future.add_done_callback(done)

    def get_finished(self, finished_req_ids):
        self.finished_seen.update(finished_req_ids or ())
        done = self.saved & self.finished_seen
        self.saved -= done
        self.finished_seen -= done
        return (done or None), None

    def take_stats(self):
        """The transfers since the last call as KvHarborStats data."""
        if self.store is None:
            return {}
        return stats_data(self.store.take_transfers(), self.paged.block_size)


def stats_data(transfers, block_size):
    """{(kind, path): [n, pages, bytes, seconds]} as the flat dict of
    KvHarborConnectorStats: "<kind>.<path>.<transfers|pages|tokens|bytes|
    seconds>" (kind "load" or "save")."""
    data = {}
    for (kind, path), (n, pages, nbytes, seconds) in transfers.items():
        p = f"{kind}.{path}."
        data[p + "transfers"] = n
        data[p + "pages"] = pages
        data[p + "tokens"] = pages * block_size
        data[p + "bytes"] = nbytes
        data[p + "seconds"] = seconds
    return data


def aggregate_stats(a, b):
    """Sums two stats data dicts (ranks, steps)."""
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return out


def reduce_stats(data):
    """Totals per kind and GB/s per path, for vLLM's log line."""
    out = {}
    for k, v in sorted(data.items()):
        kind, _, metric = k.partition(".")
        metric = metric.rpartition(".")[2]
        if metric in ("pages", "tokens", "bytes", "transfers"):
            out[f"{kind}_{metric}"] = out.get(f"{kind}_{metric}", 0) + v
        if metric == "bytes":
            seconds = data.get(k[:-len("bytes")] + "seconds", 0)
            if seconds > 0:
                out[k[:-len("bytes")] + "GBps"] = round(v / seconds / 1e9, 3)
    return out


def _stats_class(base):
    """KvHarborConnectorStats over vLLM's KVConnectorStats (a dataclass
    with ``data``): flat sums (stats_data), aggregated by addition."""

    class KvHarborConnectorStats(base):
        def reset(self):
            self.data = {}

        def aggregate(self, other):
            if other is not None and other.data:
                self.data = aggregate_stats(self.data or {}, other.data)
            return self

        def reduce(self):
            return reduce_stats(self.data or {})

        def is_empty(self):
            return not self.data

    return KvHarborConnectorStats


def _event_types():
    try:
        from vllm.distributed.kv_events import (  # noqa: PLC0415
            BlockRemoved, BlockStored)
    except ImportError:
        return None
    return BlockStored, BlockRemoved


def _make_event(cls, **fields):
    """An event of vLLM's msgspec struct ``cls`` with the fields it has
    (they grew over versions; the later ones default)."""
    names = getattr(cls, "__struct_fields__", None)
    if names is not None:
        fields = {k: v for k, v in fields.items() if k in names}
        for k in names:  # fields without a default in this version
            fields.setdefault(k, None)
    return cls(**fields)


EVENTS_MEDIUM = "kvharbor"  # BlockStored/BlockRemoved.medium


def _make_vllm_classes():
    """KvHarborConnector and its metadata class over vLLM's base classes
    (imported here, on first use)."""
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: PLC0415
        KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole)
    try:
        from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (  # noqa: PLC0415
            KVConnectorStats)
    except ImportError:  # vLLM before connector stats
        KVConnectorStats = None
    stats_cls = _stats_class(KVConnectorStats) if KVConnectorStats else None

    class KvHarborConnectorMetadata(ConnectorMetadata, KVConnectorMetadata):
        pass

    class KvHarborConnector(KVConnectorBase_V1):
        """kvharbor as vLLM's external KV cache (module docstring)."""

        def __init__(self, vllm_config, role, kv_cache_config=None):
            super().__init__(vllm_config=vllm_config, role=role,
                             kv_cache_config=kv_cache_config)
            config = ConnectorConfig.from_extra(
                self._kv_transfer_config.kv_connector_extra_config)
            parallel = vllm_config.parallel_config
            for field in ("decode_context_parallel_size",
                          "prefill_context_parallel_size"):
                if getattr(parallel, field, 1) > 1:
                    raise invalid(field, "KvHarborConnector does not support "
                                  "context parallelism (each rank holds some "
                                  "of every block's tokens)")
            tp = parallel.tensor_parallel_size
            pp = parallel.pipeline_parallel_size
            self._scheduler = self._worker = None
            if role == KVConnectorRole.SCHEDULER:
                self._scheduler = SchedulerSide(
                    config, vllm_config.cache_config.block_size, tp, pp)
            else:
                from vllm.distributed.parallel_state import (  # noqa: PLC0415
                    get_pp_group, get_tensor_model_parallel_rank)
                self._worker = WorkerSide(
                    config, get_tensor_model_parallel_rank(), tp,
                    get_pp_group().rank_in_group if pp > 1 else 0, pp,
                    kv_cache_dtype=getattr(vllm_config.cache_config,
                                           "cache_dtype", None))

        @classmethod
        def requires_piecewise_for_cudagraph(cls, extra_config):
            # wait_for_layer_load and save_kv_layer do work between layers,
            # which a full CUDA graph would skip on replay: vLLM runs
            # PIECEWISE graphs (attention outside the graphs) instead.
            return True

        def set_eagle_prefix_cache_hashing(self, enabled):
            setter = getattr(super(), "set_eagle_prefix_cache_hashing", None)
            if setter is not None:
                setter(enabled)
            if self._scheduler is not None:
                self._scheduler.eagle_hashing = bool(enabled)

        @property
        def requires_kv_delivery(self):
            return False  # a cache: a save lost to preemption is a future miss

        # Scheduler side
        def get_num_new_matched_tokens(self, request, num_computed_tokens):
            return self._scheduler.get_num_new_matched_tokens(
                request, num_computed_tokens)

        def update_state_after_alloc(self, request, blocks, num_external_tokens):
            self._scheduler.update_state_after_alloc(request, blocks,
                                                     num_external_tokens)

        def build_connector_meta(self, scheduler_output):
            meta = self._scheduler.build_connector_meta(scheduler_output)
            return KvHarborConnectorMetadata(meta.loads, meta.saves)

        def request_finished(self, request, block_ids):
            return self._scheduler.request_finished(request, block_ids)

        def take_events(self):
            records = self._scheduler.take_events()
            types_ = _event_types() if records else None
            if not types_:
                return ()
            stored, removed = types_
            bs = self._scheduler.block_size
            out = []
            for r in records:
                if r[0] == "stored":
                    out.append(_make_event(
                        stored, block_hashes=r[1], parent_block_hash=r[2],
                        token_ids=r[3], block_size=bs, lora_id=None,
                        medium=EVENTS_MEDIUM, lora_name=None))
                else:
                    out.append(_make_event(removed, block_hashes=r[1],
                                           medium=EVENTS_MEDIUM))
            return out

        # Worker side
        def register_kv_caches(self, kv_caches):
            self._worker.register_kv_caches(kv_caches)

        def start_load_kv(self, forward_context, **kwargs):
            self._worker.start_load_kv(self._get_connector_metadata())

        def wait_for_layer_load(self, layer_name):
            self._worker.wait_for_layer_load(layer_name)

        def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
            self._worker.save_kv_layer(layer_name,
                                       self._get_connector_metadata())

        def wait_for_save(self):
            self._worker.wait_for_save(self._get_connector_metadata())

        def get_finished(self, finished_req_ids):
            return self._worker.get_finished(finished_req_ids)

        def get_block_ids_with_load_errors(self):
            return self._worker.get_block_ids_with_load_errors()

        def get_kv_connector_stats(self):
            if stats_cls is None or self._worker is None:
                return None
            data = self._worker.take_stats()
            return stats_cls(data=data) if data else None

        @classmethod
        def build_kv_connector_stats(cls, data=None):
            if stats_cls is None:
                return None
            return stats_cls(data=dict(data or {}))

        def shutdown(self):
            for side in (self._scheduler, self._worker):
                if side is not None:
                    side.close()

    classes = {"KvHarborConnector": KvHarborConnector,
               "KvHarborConnectorMetadata": KvHarborConnectorMetadata}
    if stats_cls is not None:
        classes["KvHarborConnectorStats"] = stats_cls
    for cls in classes.values():
        # Pickled by name between vLLM's processes (module __getattr__ makes
        # the class again on the other side).
        cls.__module__, cls.__qualname__ = __name__, cls.__name__
    return classes


def __getattr__(name):
    if name in ("KvHarborConnector", "KvHarborConnectorMetadata",
                "KvHarborConnectorStats"):
        globals().update(_make_vllm_classes())
        if name in globals():
            return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
