"""The engine-neutral core of kvharbor's engine integrations (vLLM's
KVConnector, SGLang's HiCache storage backend): one process's connection to
kvharbord for one namespace, and the page moves between the daemon and an
engine's paged cache (PagedKv), layer by layer.

EngineStore never lets the daemon's trouble reach the engine: a call that
fails (daemon down or restarted, lease expired, pages evicted meanwhile) is
logged, counted and answered as a miss or a failed save; the engine then
recomputes. After UNAVAILABLE or a deadline the daemon is left alone for
``retry_after`` seconds (calls in between are misses without a round trip);
a namespace the daemon lost (restart) is created again from the spec the
store was given, and one the daemon never confirmed (unreachable when the
engine started) is created by the first call once it answers. The client
reconnects within about a second (own_connection, max_reconnect_backoff);
a client that never reached the daemon takes a fresh channel once the
daemon's port accepts connections (gRPC's own retry takes 10 to 20 s
there). Warnings are rate-limited per kind of call. Only the engine's own
mistakes, caught before any call (bad block ids, tensors of the wrong dtype, shape or
device, a bad config), raise InvalidArgumentError naming the field.

Pages are fetched straight into the engine's cache (fetch_to_layout,
docs/hit_paths.md), a group of layers at a time, and gathered out of it
with torch for inserts (PagedKv.gather). The engine API
(docs/engines_api.md) carries them: page-key namespaces for engines that
name pages by hashes, appends (skip_pages: only the pages after the cached
prefix are sent), and inserts by layer (Client.begin_insert).

Thread safety: an EngineStore may be used from several threads (the
Client is thread-safe; the counters and the down-until time have a lock).
A LayerLoad runs on its own thread; wait_layer and finish are for the
thread that drives the engine step.
"""

import dataclasses
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import List, Optional, Sequence

from .. import engine
from ..client import Client
from ..errors import (DeadlineExceededError, FailedPreconditionError,
                      KvHarborError, NotFoundError, UnavailableError, invalid)
from ._paged import PagedKv

log = logging.getLogger("kvharbor.integrations")
_PREFIX_GONE = object()


def _port_open(address, timeout):
    """Whether ``address`` (host:port, [v6]:port, unix:path; an optional
    ipv4:/ipv6:/dns:/// scheme) accepts a connection now. False for a form
    it cannot parse."""
    import socket  # noqa: PLC0415
    a = address
    try:
        if a.startswith("unix:"):
            path = a[len("unix:"):]
            path = path[2:] if path.startswith("//") else path
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(timeout)
                s.connect(path)
            return True
        for scheme in ("dns:///", "ipv4:", "ipv6:"):
            if a.startswith(scheme):
                a = a[len(scheme):]
        host, _, port = a.rpartition(":")
        host = host.strip("[]")
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def page_key(key, field="keys"):
    """An engine's page key as kvharbor stores it (kvharbor.engine.page_key:
    str as UTF-8, a key over 32 bytes as its SHA-256)."""
    return engine.page_key(key, field)


def namespace_name(base, tp_rank=0, tp_size=1, pp_rank=0, pp_size=1,
                   cp_rank=0, cp_size=1):
    """The namespace of one engine process: the part of every page it holds.
    A tensor-parallel rank holds its own KV heads (".tp<rank>of<size>"), a
    pipeline stage its own layers (".pp<rank>of<size>"), an attention
    context-parallel rank its own slice of every page (".cp<rank>of<size>");
    a dimension of size 1 adds nothing, so a single process uses the base
    itself. Processes that hold different parts of a page therefore never
    share a namespace, and the daemon refuses a second process that claims
    a name with another geometry (layer count, KV heads, head dim, page
    size, dtype)."""
    for field, rank, size in (("tp_rank", tp_rank, tp_size),
                              ("pp_rank", pp_rank, pp_size),
                              ("cp_rank", cp_rank, cp_size)):
        if not (isinstance(size, int) and isinstance(rank, int)
                and size >= 1 and 0 <= rank < size):
            raise invalid(field, f"{rank!r} is not a rank of a group of "
                          f"{size!r}")
    name = base
    for tag, rank, size in (("tp", tp_rank, tp_size), ("pp", pp_rank, pp_size),
                            ("cp", cp_rank, cp_size)):
        if size > 1:
            name += f".{tag}{rank}of{size}"
    return name


@dataclasses.dataclass(frozen=True)
class StoreConfig:
    """The daemon and namespace options of an engine integration, from the
    engine's JSON config (docs/vllm.md, docs/sglang.md); from_dict checks
    every key and type, naming ``<field>.<key>``."""
    address: str = "127.0.0.1:50051"
    namespace: str = "kvharbor"
    timeout: float = 5.0          # seconds per daemon call
    lease_ttl: float = 30.0
    retry_after: float = 2.0      # seconds the daemon is left alone when down
    capacity_bytes: int = 0       # of the namespace the workers create
    codec: str = ""
    calibration_path: str = ""
    host_compressed_bytes: int = 0
    disk_dir: str = ""
    disk_bytes: int = 0
    token: Optional[str] = None   # bearer token
    tls_ca_file: Optional[str] = None

    _TYPES = {"address": str, "namespace": str, "timeout": (int, float),
              "lease_ttl": (int, float), "retry_after": (int, float),
              "capacity_bytes": int, "codec": str, "calibration_path": str,
              "host_compressed_bytes": int, "disk_dir": str, "disk_bytes": int,
              "token": str, "tls_ca_file": str}

    @classmethod
    def from_dict(cls, d, field):
        if not isinstance(d, dict):
            raise invalid(field, f"must be a JSON object, got {type(d).__name__}")
        for key, value in d.items():
            where = f"{field}.{key}"
            want = cls._TYPES.get(key)
            if want is None:
                raise invalid(where, f"unknown key; known: {', '.join(cls._TYPES)}")
            if (isinstance(value, bool) and want is not bool) or \
                    not isinstance(value, want):
                raise invalid(where, f"{value!r} is not of type {want}")
        return cls(**d)

    def spec(self):
        return {"capacity_bytes": self.capacity_bytes, "codec": self.codec,
                "calibration_path": self.calibration_path,
                "host_compressed_bytes": self.host_compressed_bytes,
                "disk_dir": self.disk_dir, "disk_bytes": self.disk_bytes}

    def store(self, namespace, geometry=None, key_kind="tokens"):
        """An EngineStore for ``namespace``; with ``geometry`` it may create
        the namespace (with this config's spec)."""
        client = {k: v for k, v in (("token", self.token),
                                    ("tls_ca_file", self.tls_ca_file)) if v}
        return EngineStore(
            self.address, namespace, geometry=geometry,
            spec=self.spec() if geometry is not None else None,
            key_kind=key_kind, timeout=self.timeout, lease_ttl=self.lease_ttl,
            retry_after=self.retry_after, client_options=client)


@dataclasses.dataclass
class Counters:
    """What an EngineStore did (stats(); never reset)."""
    lookups: int = 0
    hit_pages: int = 0
    miss_pages: int = 0
    loaded_pages: int = 0
    load_errors: int = 0     # loads that failed: the engine recomputes
    saved_pages: int = 0     # pages the daemon stored (dedup not counted)
    sent_pages: int = 0      # pages sent to the daemon
    save_errors: int = 0
    prefix_gone: int = 0     # appends whose cached prefix was evicted meanwhile
    daemon_errors: int = 0   # calls that failed for the daemon's reasons
    skipped_calls: int = 0   # calls not made while the daemon was down
    namespace_recreated: int = 0


class EngineStore:
    """One engine process's namespace on one kvharbord (see the module
    docstring). ``spec`` holds create_namespace's keyword arguments and the
    geometry; without it the store never creates the namespace (a
    scheduler that does not know the geometry) and treats its absence as
    a miss."""

    def __init__(self, address, namespace, *, geometry=None, spec=None,
                 key_kind="tokens", timeout=5.0, lease_ttl=30.0,
                 retry_after=2.0, client_options=None):
        if key_kind not in ("tokens", "page_keys", "page_hashes"):
            raise invalid("key_kind", f"must be 'tokens', 'page_keys' or "
                          f"'page_hashes', got {key_kind!r}")
        self.address, self.namespace = address, namespace
        self.geometry, self.spec = geometry, dict(spec or {})
        self.key_kind, self.timeout = key_kind, timeout
        self.lease_ttl, self.retry_after = lease_ttl, retry_after
        self._client_options = dict(client_options or {})
        self.client = self._new_client()
        # A channel that never reached the daemon takes 10 to 20 s to notice
        # it came up (gRPC's subchannel backoff, whatever the reconnect
        # options), one that was connected about a second. Until the first
        # answer, a call that finds the daemon unavailable probes its port;
        # when it accepts connections, the store takes a fresh channel
        # (at most _MAX_RENEWALS, one per RENEW_INTERVAL; the old ones stay
        # open until close(): uploads may still hold them).
        self._connected = False
        self._old_clients = []
        self._renewed_at = None
        self.counters = Counters()
        self._mu = threading.Lock()
        self._down_until = 0.0
        # False until the daemon confirmed the namespace (created or found
        # with this spec): an engine starts while kvharbord is unreachable,
        # and the first call after the daemon answers creates it.
        self._ns_ready = geometry is None
        self._logged = {}  # what -> (last time logged, calls not logged since)
        # (kind, path) -> [transfers, pages, bytes, seconds] since take_transfers
        self._transfers = {}
        self._io = ThreadPoolExecutor(1, thread_name_prefix="kvharbor-save")

    def _new_client(self):
        return Client(self.address, self.timeout, own_connection=True,
                      max_reconnect_backoff=1.0, **self._client_options)

    _MAX_RENEWALS = 8
    RENEW_INTERVAL = 2.0

    def _maybe_renew(self):
        """After UNAVAILABLE on a channel that never reached the daemon:
        a fresh channel if the daemon's port accepts connections now. True
        when the store renewed its client."""
        now = time.monotonic()
        with self._mu:
            if (self._connected or len(self._old_clients) >= self._MAX_RENEWALS
                    or (self._renewed_at is not None
                        and now - self._renewed_at < self.RENEW_INTERVAL)):
                return False
            self._renewed_at = now
        if not _port_open(self.address, min(self.timeout, 1.0)):
            return False
        fresh = self._new_client()
        with self._mu:
            self._old_clients.append(self.client)
            self.client = fresh
            self._down_until = 0.0
        log.info("kvharbor: %s accepts connections; new channel for %s",
                 self.address, self.namespace)
        return True

    def close(self):
        self._io.shutdown(wait=True)
        self.client.close()
        for c in self._old_clients:
            c.close()

    def stats(self):
        with self._mu:
            return dataclasses.asdict(self.counters)

    def record(self, kind, path, pages, nbytes, seconds):
        """Notes one transfer (kind "load" or "save") by ``path`` for
        take_transfers (the engine's connector stats)."""
        with self._mu:
            t = self._transfers.setdefault((kind, path), [0, 0, 0, 0.0])
            t[0] += 1
            t[1] += pages
            t[2] += nbytes
            t[3] += seconds

    def take_transfers(self):
        """{(kind, path): [transfers, pages, bytes, seconds]} since the last
        call."""
        with self._mu:
            out, self._transfers = self._transfers, {}
        return out

    def _count(self, **deltas):
        with self._mu:
            for k, v in deltas.items():
                setattr(self.counters, k, getattr(self.counters, k) + v)

    # ---- Namespace ----
    def ensure_namespace(self):
        """Creates the namespace unless it exists with this spec. True when
        the daemon confirmed it; False when the daemon is unreachable (the
        engine starts anyway: calls are misses until the daemon answers,
        and the first call after that creates the namespace). Raises (a
        configuration error) when the daemon refuses it, e.g. another
        geometry under the same name."""
        if self.geometry is None:
            raise invalid("geometry", "unknown: this store cannot create its "
                          "namespace")
        try:
            self._create()
        except (UnavailableError, DeadlineExceededError) as e:
            with self._mu:
                self._down_until = time.monotonic() + self.retry_after
            self._failed("create_namespace", e)
            return False
        self._connected = True
        return True

    def _create(self):
        kwargs = dict(self.spec)
        if self.key_kind != "tokens":
            import kvharbor  # noqa: PLC0415
            kwargs["key_kind"] = (kvharbor.KeyKind.PAGE_KEYS
                                  if self.key_kind == "page_keys"
                                  else kvharbor.KeyKind.PAGE_HASHES)
        self.client.create_namespace(self.namespace, self.geometry,
                                     if_not_exists=True, timeout=self.timeout,
                                     **kwargs)
        if not self._ns_ready:
            self._ns_ready = True
            log.info("kvharbor namespace %s ready on %s", self.namespace,
                     self.address)

    @property
    def namespace_ready(self):
        return self._ns_ready

    # ---- Guarded calls ----
    def _call(self, what, fn, default=None):
        """fn() or ``default`` when the daemon cannot serve it (counted and
        logged, never raised: a request the daemon refuses, e.g. a prompt
        over its max_tokens_per_request, is a miss like any other)."""
        with self._mu:
            if time.monotonic() < self._down_until:
                self.counters.skipped_calls += 1
                return default
        try:
            if not self._ns_ready:
                self._create()  # the daemon was unreachable until now
            r = fn()
            self._connected = True
            return r
        except (UnavailableError, DeadlineExceededError) as e:
            with self._mu:
                self._down_until = time.monotonic() + self.retry_after
            self._failed(what, e)
            if isinstance(e, UnavailableError):
                self._maybe_renew()
        except NotFoundError as e:
            self._failed(what, e)
            if "namespace" in e.message and self.geometry is not None:
                self._recreate()
        except KvHarborError as e:
            if not self._ns_ready:
                # The daemon refuses the namespace (another geometry under
                # this name): a configuration error the engine can no longer
                # be told about at start. Misses; retried after retry_after.
                with self._mu:
                    self._down_until = time.monotonic() + self.retry_after
                what = "create_namespace"
            self._failed(what, e)
        return default

    LOG_INTERVAL = 10.0  # seconds between two warnings of one kind

    def _failed(self, what, e):
        """Counts a failed call and logs it, at most once per LOG_INTERVAL
        per kind of call (an engine calls many times a second; a daemon that
        is down must not flood its log)."""
        now = time.monotonic()
        with self._mu:
            self.counters.daemon_errors += 1
            last, quiet = self._logged.get(what, (None, 0))
            if last is not None and now - last < self.LOG_INTERVAL:
                self._logged[what] = (last, quiet + 1)
                return
            self._logged[what] = (now, 0)
        more = f" ({quiet} more since the last warning)" if quiet else ""
        log.warning("kvharbor %s on %s (namespace %s): %s%s", what,
                    self.address, self.namespace, e, more)

    def _recreate(self):
        try:
            self._create()
            self._count(namespace_recreated=1)
            log.warning("kvharbor namespace %s created again on %s (the daemon "
                        "restarted?)", self.namespace, self.address)
        except KvHarborError as e:
            self._failed("create_namespace", e)

    # ---- Sequences ----
    def seq(self, items):
        """Token ids (a list of ints) or page keys (bytes each) as this
        namespace takes them."""
        if self.key_kind == "tokens":
            return list(items)
        return [page_key(k, f"keys[{i}]") for i, k in enumerate(items)]

    def _seq_args(self, seq):
        return ((seq,), {}) if self.key_kind == "tokens" \
            else ((), {"keys": seq})

    # ---- Match, fetch, insert ----
    def match(self, seq, lock=True):
        """The longest cached prefix of ``seq`` (whole pages): a Lease
        (locked when ``lock``), or None for a miss or a daemon failure."""
        args, kwargs = self._seq_args(seq)
        lease = self._call("match", lambda: self.client.match(
            self.namespace, *args, lock=lock, ttl=self.lease_ttl,
            timeout=self.timeout, **kwargs))
        self._count(lookups=1)
        return lease

    def release(self, lease_id):
        if lease_id:
            self._call("release", lambda: self.client.release(
                lease_id, timeout=self.timeout))

    def fetch(self, lease_id, start_page, dst, layer_begin=0, layer_end=None,
              num_layers=None):
        """Pages [start_page, start_page + len(dst)) of a lease into the host
        tensor ``dst`` ([n, *page_shape]); with a layer range only those
        layers of each page (whole pages when the daemon cannot). True on
        success."""
        kwargs = {}
        if layer_end is not None and (layer_begin, layer_end) != (0, num_layers):
            kwargs = {"layer_begin": layer_begin, "layer_end": layer_end}
        r = self._call("fetch", lambda: self.client.fetch_into(
            self.namespace, dst, lease=lease_id, start_page=start_page,
            page_count=dst.shape[0], timeout=self.timeout, **kwargs))
        return r is not None and r.num_pages == dst.shape[0]

    def fetch_to_layout(self, lease_id, start_page, layout, block_ids,
                        last_group=True):
        """Pages [start_page, start_page + len(block_ids)) of a lease
        straight into ``layout`` (a kvharbor.PagedKvLayout: an engine's
        cache, all its layers or a range). True on success. The transfer is
        recorded (take_transfers), its pages only with ``last_group`` (a
        layer-group load moves each page in several fetches)."""
        start = time.monotonic()
        r = self._call("fetch", lambda: self.client.fetch_to_layout(
            self.namespace, lease_id, layout, block_ids,
            start_page=start_page, timeout=self.timeout))
        if r is None or r.pages != len(block_ids):
            return False
        self.record("load", r.path, r.pages if last_group else 0,
                    r.bytes_moved, time.monotonic() - start)
        return True

    def insert(self, seq, pages, skip_pages=0):
        """Stores ``pages`` (a host tensor of whole pages) for ``seq``; with
        skip_pages the first skip_pages pages of seq are not sent (they
        must be cached). True when the daemon stored them, None when the
        skipped prefix is no longer cached (send every page then), False
        when the daemon could not store them."""
        args, kwargs = self._seq_args(seq)
        if skip_pages:
            kwargs["skip_pages"] = skip_pages

        def call():
            try:
                return self.client.insert(self.namespace, *args, pages=pages,
                                          timeout=self.timeout, **kwargs)
            except FailedPreconditionError as e:
                if skip_pages and "skip_pages" in e.message:
                    return _PREFIX_GONE
                raise

        start = time.monotonic()
        r = self._call("insert", call)
        if r is _PREFIX_GONE:
            self._count(save_errors=1, prefix_gone=1)
            return None
        if r is None:
            self._count(save_errors=1)
            return False
        self._count(saved_pages=r.pages_stored, sent_pages=pages.shape[0])
        self.record("save", "insert", pages.shape[0],
                    pages.numel() * pages.element_size(),
                    time.monotonic() - start)
        return True

    def submit(self, fn, *args):
        """Runs fn(*args) on the store's save thread (in order)."""
        return self._io.submit(fn, *args)

    def flush(self):
        """Waits until every save submitted so far has run."""
        self._io.submit(lambda: None).result()


@dataclasses.dataclass
class LoadJob:
    """Pages [start_page, start_page + len(block_ids)) of lease ``lease_id``
    go to ``block_ids`` of the cache. Without a lease (None), the load
    takes one itself: a Match of ``seq`` (the pages' sequence from the
    first page) in the store's namespace; blocks beyond what it still
    holds fail (the engine recomputes them)."""
    key: str  # the engine's request id
    lease_id: Optional[int]
    start_page: int
    block_ids: List[int]
    seq: Optional[Sequence] = None


class LayerLoad:
    """Loads a step's LoadJobs into the cache on a background thread,
    straight into the cache's views (fetch_to_layout: the library's
    scatter, on the GPU for CUDA caches), so the engine's layer l waits
    only for layer l (wait_layer). The cache is loaded in groups of
    ``group`` layers, each a fetch_to_layout of a layout of only those
    layers, which moves only their bytes (host caches: a layer-range fetch;
    CUDA caches: device_ipc, host_shm or raw_remote, docs/hit_paths.md
    "Layer-wise loads"; the fetches pass no page tiers, so cold pages take
    raw_remote, decoded by the daemon, not the compressed paths that
    decode whole pages once per group). Each fetch
    returns once its layers are in the cache, and the thread goes on with
    the next group while the engine computes the layers before it.
    Failed jobs' block ids are collected in ``failed`` (the engine
    recomputes them); every layer is marked ready anyway, and the leases
    released."""

    def __init__(self, store: EngineStore, paged: PagedKv, jobs, group=4):
        self.store, self.paged, self.jobs = store, paged, list(jobs)
        self.group = max(1, int(group))
        self.failed: List[int] = []
        self._ready = [threading.Event() for _ in range(paged.num_layers)]
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="kvharbor-load")
        self._thread.start()

    def wait_layer(self, layer):
        self._ready[layer].wait()

    def finish(self):
        """Waits for the whole load."""
        self._thread.join()

    def _lease(self, job):
        """Takes the job's lease (one Match in this rank's namespace) and
        trims block_ids to the pages it holds; the rest fail."""
        lease = self.store.match(job.seq, lock=True)
        have = (lease.num_pages if lease is not None else 0) - job.start_page
        have = max(0, min(have, len(job.block_ids)))
        if have < len(job.block_ids):
            self.failed.extend(job.block_ids[have:])
            self.store._count(load_errors=1)
        job.block_ids = job.block_ids[:have]
        job.lease_id = lease.id if lease is not None else 0

    def _run(self):
        p, failed = self.paged, set()
        try:
            for job in self.jobs:
                if job.lease_id is None:
                    self._lease(job)
            for b in range(0, p.num_layers, self.group):
                e = min(b + self.group, p.num_layers)
                layout = p.layout(b, e)
                for job in self.jobs:
                    if job.key in failed or not job.block_ids:
                        continue
                    if self.store.fetch_to_layout(job.lease_id, job.start_page,
                                                  layout, job.block_ids,
                                                  e == p.num_layers):
                        if e == p.num_layers:
                            self.store._count(loaded_pages=len(job.block_ids))
                        continue
                    failed.add(job.key)
                    self.failed.extend(job.block_ids)
                    self.store._count(load_errors=1)
                for l in range(b, e):
                    self._ready[l].set()
        finally:
            for ready in self._ready:  # never leave a layer waiting
                ready.set()
            for job in self.jobs:
                self.store.release(job.lease_id)


@dataclasses.dataclass
class SaveJob:
    """Pages [skip_pages, len(block_ids)) of the sequence ``seq`` (whole
    pages, len(block_ids) of them) from ``block_ids``: pages before
    skip_pages are cached already (sent only when the daemon lost them or
    cannot append)."""
    key: str
    seq: Sequence
    block_ids: List[int]
    skip_pages: int = 0


def gather_for_insert(store: EngineStore, paged: PagedKv, job: SaveJob):
    """(seq, host pages, skip) to insert for a job: the new pages with
    skip_pages when the daemon appends, else every page. The host copy is
    made now, so the insert may run later, after the blocks were reused."""
    skip = job.skip_pages
    host = paged.empty_pages(len(job.block_ids) - skip)
    paged.gather(job.block_ids[skip:], out=host)
    return job.seq, host, skip
