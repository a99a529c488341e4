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
  vLLM's block hashes as page keys) in every tensor-parallel rank's
  namespace with a lease and offers the shortest match beyond what vLLM
  has locally (synchronous load: load_kv_async False). update_state_after_
  alloc keeps or releases the leases; build_connector_meta tells the
  workers what to load (lease, first page, blocks) and what to save: the
  prompt pages each step completes (prefill), and at a request's end
  (request_finished, which then keeps the blocks until the workers report
  the save in get_finished) the pages decoding completed.
- Workers: register_kv_caches creates the rank's namespace; start_load_kv
  starts fetching the step's pages layer group by layer group on a thread
  (layer ranges) and wait_for_layer_load(layer) waits for one layer only;
  save_kv_layer sends a layer of the saved pages as the forward computes
  it (an Insert by layer, appending after the cached prefix); wait_for_save
  commits, and sends the pages of finished requests from host copies on a
  background thread; get_finished reports those requests; blocks whose
  load failed are reported by get_block_ids_with_load_errors (vLLM
  recomputes them).
- Tensor parallelism: every rank stores its own KV heads in a namespace of
  its own, "<namespace>.tp<rank>of<size>" (geometry: the heads of one
  rank); another TP degree uses other namespaces.
- The daemon's trouble never reaches vLLM (integrations/_engine.py): a
  restarted or unreachable daemon means misses and failed saves, counted.
"""

import dataclasses
import logging
from typing import Dict, List, Optional

from ..errors import invalid
from ._engine import (EngineStore, LayerLoad, LoadJob, SaveJob, StoreConfig,
                      gather_for_insert, namespace_name)
from ._paged import PagedKv

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
    lease_ids: List[int]   # per TP rank
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
    pending: Optional[ReqLoad] = None  # offered by get_num_new_matched_tokens


class SchedulerSide:
    """The scheduler half of KvHarborConnector (vLLM's calls, duck-typed)."""

    def __init__(self, config: ConnectorConfig, block_size, tp_size):
        self.config, self.block_size, self.tp_size = config, block_size, tp_size
        self.stores = [config.store(namespace_name(config.namespace, r, tp_size),
                                    key_kind=config.key_kind())
                       for r in range(tp_size)]
        self.states: Dict[str, _ReqState] = {}
        self.finish_saves: List[ReqSave] = []

    def close(self):
        for s in self.stores:
            s.close()

    def _seq(self, request, pages):
        if self.config.keys == "block_hashes":
            return self.stores[0].seq(list(request.block_hashes[:pages]))
        return list(request.all_token_ids[:pages * self.block_size])

    def _release(self, load: Optional[ReqLoad]):
        if load is not None:
            for store, lease in zip(self.stores, load.lease_ids):
                store.release(lease)

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        st = self.states.setdefault(request.request_id, _ReqState(request))
        self._release(st.pending)  # asked again: the newest answer counts
        st.pending = None
        tokens = len(request.all_token_ids)
        pages = (tokens - 1) // self.block_size  # vLLM computes the last token
        if self.config.keys == "block_hashes":
            pages = min(pages, len(request.block_hashes))
        if pages * self.block_size <= num_computed_tokens:
            return 0, False
        seq = self._seq(request, pages)
        leases = [store.match(seq, lock=True) for store in self.stores]
        matched = min(l.num_pages if l is not None else 0 for l in leases)
        ids = [l.id if l is not None else 0 for l in leases]
        start = num_computed_tokens // self.block_size
        self.stores[0]._count(hit_pages=max(0, matched - start),
                              miss_pages=pages - max(start, matched))
        st.saved_pages = matched
        if matched <= start:
            self._release(ReqLoad(request.request_id, ids, 0, []))
            return 0, False
        st.pending = ReqLoad(request.request_id, ids, start, [])
        return (matched - start) * self.block_size, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        st = self.states.setdefault(request.request_id, _ReqState(request))
        st.block_ids = list(blocks.get_block_ids()[0])
        pending, st.pending = st.pending, None
        if num_external_tokens == 0 or pending is None:
            self._release(pending)
            return
        pages = num_external_tokens // self.block_size
        start = pending.start_page
        st.load = ReqLoad(request.request_id, pending.lease_ids, start,
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
            end_pages = min(end_pages, len(st.request.block_hashes))
        if end_pages > st.saved_pages:
            meta.saves.append(ReqSave(req_id, self._seq(st.request, end_pages),
                                      st.block_ids[:end_pages], st.saved_pages,
                                      False))
            st.saved_pages = end_pages

    def request_finished(self, request, block_ids):
        st = self.states.get(request.request_id)
        if st is not None:
            self._release(st.pending)
            st.pending = None
        if not self.config.save or st is None:
            return False, None
        computed = min(request.num_computed_tokens,
                       len(block_ids) * self.block_size)
        end_pages = computed // self.block_size
        if self.config.keys == "block_hashes":
            end_pages = min(end_pages, len(request.block_hashes))
        if end_pages <= st.saved_pages:
            return False, None
        self.finish_saves.append(ReqSave(
            request.request_id, self._seq(request, end_pages),
            list(block_ids[:end_pages]), st.saved_pages, True))
        st.saved_pages = end_pages
        return True, None  # blocks stay until get_finished reports the save


class WorkerSide:
    """The worker half of KvHarborConnector (one per TP rank)."""

    def __init__(self, config: ConnectorConfig, tp_rank, tp_size):
        self.config = config
        self.namespace = namespace_name(config.namespace, tp_rank, tp_size)
        self.tp_rank = tp_rank
        self.store: Optional[EngineStore] = None
        self.paged: Optional[PagedKv] = None
        self.layer_index: Dict[str, int] = {}
        self.load: Optional[LayerLoad] = None
        self.uploads = {}  # req_id -> open Insert by layer
        self.commits = {}  # req_id -> the future of its last upload's commit
        self.load_errors = set()
        self.saved = set()          # finished requests whose pages are copied
        self.finished_seen = set()  # ids vLLM passed to get_finished
        # Requests a save of failed: their later saves send every page (the
        # prefix they would skip may be missing).
        self.tainted = set()

    def register_kv_caches(self, kv_caches):
        self.paged = PagedKv.from_vllm(kv_caches)
        self.layer_index = {name: i for i, name in enumerate(kv_caches)}
        self.store = self.config.store(self.namespace, self.paged.geometry(),
                                       self.config.key_kind())
        self.store.ensure_namespace()
        log.info("kvharbor: rank %d stores %d layers x %d KV heads x %d in %s "
                 "on %s (%s)", self.tp_rank, self.paged.num_layers,
                 self.paged.num_kv_heads, self.paged.head_dim, self.namespace,
                 self.config.address, self.store.key_kind)

    def close(self):
        self._finish_load()
        if self.store is not None:
            self.store.close()

    # ---- Loads ----
    def start_load_kv(self, meta: ConnectorMetadata):
        self._finish_load()
        jobs = [LoadJob(l.req_id, l.lease_ids[self.tp_rank], l.start_page,
                        l.block_ids) for l in meta.loads]
        if jobs and self.store is not None:
            self.load = LayerLoad(self.store, self.paged, jobs,
                                  self.config.load_layer_group)

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
        """Sends this layer of the step's prompt pages (an Insert by layer
        per request, appending after the cached prefix)."""
        if self.store is None:
            return
        layer = self.layer_index.get(layer_name)
        if layer is None:
            return
        for save in meta.saves:
            if save.at_finish:
                continue
            if layer == 0:
                self._begin_upload(save)
            if save.req_id not in self.uploads:
                continue
            up, skip = self.uploads[save.req_id]
            pages = self.paged.gather_layer(save.block_ids[skip:], layer).cpu()
            if not self.store._call("insert",
                                    lambda: up.send_layer(layer, pages) or True):
                self.uploads.pop(save.req_id)
                self.tainted.add(save.req_id)
                self.store._count(save_errors=1)

    def _begin_upload(self, save: ReqSave):
        """Opens the request's Insert by layer: after its cached prefix, or
        from its first page when that prefix was evicted meanwhile (the
        check is synchronous, so the blocks are still the request's)."""
        args, kwargs = self.store._seq_args(save.seq)
        pending = self.commits.pop(save.req_id, None)
        if pending is not None:
            # The pages this upload skips are those of the request's last
            # one: they are cached once its commit (on the save thread) ran.
            pending.result()
        first = 0 if save.req_id in self.tainted else save.skip_pages
        for skip in ((first, 0) if first else (0,)):
            up = self.store._call("insert", lambda: self.store.client.begin_insert(
                self.store.namespace, *args, skip_pages=skip, layer_major=True,
                timeout=self.store.timeout, **kwargs))
            if up is not None:
                self.uploads[save.req_id] = (up, skip)
                return
        # The daemon is down or refused: this step's pages are not saved,
        # and the request's later saves send every page.
        self.tainted.add(save.req_id)
        self.store._count(save_errors=1)

    def wait_for_save(self, meta: ConnectorMetadata):
        self._finish_load()
        if self.store is None:
            return
        for req_id, (up, _skip) in self.uploads.items():
            self.commits[req_id] = self.store.submit(self._commit, up)
            self._watch(req_id, self.commits[req_id])
        self.uploads = {}
        for save in meta.saves:
            if not save.at_finish:
                continue  # sent layer by layer
            skip = 0 if save.req_id in self.tainted else save.skip_pages
            job = SaveJob(save.req_id, save.seq, save.block_ids, skip)
            seq, host, skip = gather_for_insert(self.store, self.paged, job)
            if save.at_finish:
                self.saved.add(save.req_id)  # host copy made: blocks reusable
                self.tainted.discard(save.req_id)
            self._watch(save.req_id, self.store.submit(self.store.insert, seq,
                                                       host, skip))

    def _watch(self, req_id, future):
        def done(f):
            if not f.result():
                self.tainted.add(req_id)
        future.add_done_callback(done)

    def _commit(self, up):
        r = self.store._call("insert", up.commit)
        if r is None:
            self.store._count(save_errors=1)
            return False
        self.store._count(saved_pages=r.pages_stored, sent_pages=up.sent_pages)
        return True

    def get_finished(self, finished_req_ids):
        self.finished_seen.update(finished_req_ids)
        for req_id in finished_req_ids or ():
            self.commits.pop(req_id, None)  # no later upload waits for it
        done = self.saved & self.finished_seen
        self.saved -= done
        self.finished_seen -= done
        return (done or None), None


def _make_vllm_classes():
    """KvHarborConnector and its metadata class over vLLM's base classes
    (imported here, on first use)."""
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: PLC0415
        KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole)

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
            if parallel.pipeline_parallel_size > 1:
                raise invalid("pipeline_parallel_size", "KvHarborConnector "
                              "supports tensor parallelism only")
            tp = parallel.tensor_parallel_size
            self._scheduler = self._worker = None
            if role == KVConnectorRole.SCHEDULER:
                self._scheduler = SchedulerSide(
                    config, vllm_config.cache_config.block_size, tp)
            else:
                from vllm.distributed.parallel_state import (  # noqa: PLC0415
                    get_tensor_model_parallel_rank)
                self._worker = WorkerSide(config,
                                          get_tensor_model_parallel_rank(), tp)

        @classmethod
        def requires_piecewise_for_cudagraph(cls, extra_config):
            return True  # wait_for_layer_load / save_kv_layer do real work

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

        def shutdown(self):
            for side in (self._scheduler, self._worker):
                if side is not None:
                    side.close()

    for cls in (KvHarborConnector, KvHarborConnectorMetadata):
        # Pickled by name between vLLM's processes (module __getattr__ makes
        # the class again on the other side).
        cls.__module__, cls.__qualname__ = __name__, cls.__name__
    return {"KvHarborConnector": KvHarborConnector,
            "KvHarborConnectorMetadata": KvHarborConnectorMetadata}


def __getattr__(name):
    if name in ("KvHarborConnector", "KvHarborConnectorMetadata"):
        globals().update(_make_vllm_classes())
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
