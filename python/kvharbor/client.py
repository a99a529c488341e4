"""kvharbor.Client: the Python client of the kvharbor KV-cache daemon.

A thin layer over libkvharbor_c (the C ABI of the C++ SDK) through ctypes.
One Client holds one gRPC channel; it may be used from many threads at once
(the GIL is released during every call), but close() must not race with
other calls. Page data moves without copies from and to any object with the
buffer protocol (bytes, bytearray, memoryview, NumPy arrays) and PyTorch CPU
tensors; the SDK verifies every fetched page's checksum (DataLossError).

Tiers (docs/tiers.md): create_namespace takes a codec with its calibration
and the host-compressed / disk budgets, match reports each page's tier,
demote moves pages to colder tiers, get_calibration returns what decoding
needs, and fetches in FetchFormat.COMPRESSED move codec buffers over the
wire that the SDK decodes on the CPU into raw pages.

Timeouts are in seconds; None uses the client's default. Failures raise
KvHarborError subclasses carrying the status code and a message that names
the bad field.
"""

import contextlib
import ctypes
import numbers
import json
from typing import Optional, Sequence

from . import _native, engine
from ._args import (_enum, _fetch_source, _handles, _int, _mode, _ms,
                    _opt_str, _str, _timeout_ms, _Tokens, _u64)
from ._native import (Buffer, NativeHandle, buffer_list, check, library, need,
                      take_string)
from ._layouts import LayoutsMixin
from ._tiers import TiersMixin
from .errors import StatusCode, error_for, invalid
from .types import (CreateNamespaceResult, EvictResult, FetchFormat,
                    FetchResult, FetchTransform, Geometry, InsertResult,
                    KeyKind, KvtcRowKind, LeasePages, NamespaceInfo,
                    OnlineCalibration, RopeStyle, Stats, Tier, Topology,
                    TransferResult, TreeDump, _tier)


def _set_online_calibration(out, value):
    """Fills a _native._OnlineCalibration from an OnlineCalibration (None =
    off), naming online_calibration.<field> for bad values."""
    out.sink_tokens = -1
    if value is None:
        return
    if not isinstance(value, OnlineCalibration):
        raise invalid("online_calibration", "must be a kvharbor.OnlineCalibration "
                      f"or None, got {type(value).__name__}")
    field = "online_calibration."
    out.enabled = 1
    out.min_tokens = _u64(value.min_tokens, field + "min_tokens")
    out.max_sample_tokens = _u64(value.max_sample_tokens,
                                 field + "max_sample_tokens")
    ratio = value.target_ratio
    if isinstance(ratio, bool) or not isinstance(ratio, numbers.Real):
        raise invalid(field + "target_ratio", f"must be a number, got {ratio!r}")
    out.target_ratio = float(ratio)  # range: the daemon checks it
    out.row_kind = _enum(value.row_kind, KvtcRowKind, field + "row_kind")
    out.rope_style = _enum(value.rope_style, RopeStyle, field + "rope_style")
    if value.sink_tokens is not None:
        sink = _u64(value.sink_tokens, field + "sink_tokens")
        if sink >= 2**32:
            raise invalid(field + "sink_tokens", f"{sink} must be < 2^32")
        out.sink_tokens = sink


def _set_topology(out, value):
    """Fills a _native._Topology from a Topology (None = the whole model),
    naming topology.<field> for bad values (the daemon checks the ranges
    against the geometry)."""
    if value is None:
        return
    if not isinstance(value, Topology):
        raise invalid("topology", "must be a kvharbor.Topology or None, got "
                      f"{type(value).__name__}")
    out.model = _opt_str(value.model, "topology.model")
    for name in ("total_layers", "layer_begin", "layer_end", "total_kv_heads",
                 "kv_head_begin", "kv_head_end"):
        v = _int(getattr(value, name), "topology." + name)
        if not 0 <= v < 2**32:
            raise invalid("topology." + name, f"{v} must be in [0, 2^32)")
        setattr(out, name, v)


class Lease(LeasePages):
    """What Client.match returns: the matched prefix and, with lock=True, a
    lease that keeps its pages from eviction until release() or expiry.
    A context manager: leaving the block releases the lease."""

    def __init__(self, client, namespace, lease_id, expires_at, handles,
                 matched_tokens, page_bytes, page_tiers=None):
        self.client = client
        self.namespace = namespace
        self.id = lease_id
        self.expires_at = expires_at  # Unix seconds; None without a lease
        self.handles = handles  # one per matched page, prompt order
        self.matched_tokens = matched_tokens
        self.page_bytes = page_bytes
        # Tier of each page at match time (Tier.RAW for all with a library
        # older than ABI 2, which cannot tell).
        self.page_tiers = (tuple(page_tiers) if page_tiers is not None
                           else (Tier.RAW,) * len(handles))
        self._released = False

    @property
    def nbytes(self):
        return self.num_pages * self.page_bytes

    def release(self, timeout=None):
        """Gives the lease back (a no-op without one or when done already)."""
        if self.locked and not self._released:
            self._released = True
            self.client.release(self.id, timeout=timeout)

    def extend(self, ttl, timeout=None):
        self.expires_at = self.client.extend_lease(self.id, ttl, timeout=timeout)
        return self.expires_at

    def fetch_into(self, dst, start_page=0, page_count=0,
                   format=FetchFormat.RAW, timeout=None, *, layer_begin=0,
                   layer_end=0):
        """Fetches the lease's pages (by handle when not locked) into dst.

        ``format``: RAW (the daemon sends raw pages, decoding cold ones) or
        COMPRESSED (it sends the stored codec buffers, the SDK decodes them
        here); dst receives raw pages either way, KVTC ones within the
        codec's error bounds. ``layer_begin``/``layer_end``: only those
        layers of each page (Client.fetch_into)."""
        layers = {"layer_begin": layer_begin, "layer_end": layer_end}
        if self.locked:
            return self.client.fetch_into(self.namespace, dst, lease=self.id,
                                          start_page=start_page,
                                          page_count=page_count, format=format,
                                          timeout=timeout, **layers)
        try:
            start, count = int(start_page), int(page_count)
        except (TypeError, ValueError) as e:
            raise invalid("start_page", str(e)) from None
        if not 0 <= start < len(self.handles) or count < 0:
            raise invalid("start_page", f"[{start_page}, +{page_count}) is not "
                          f"within the lease's {len(self.handles)} pages")
        end = len(self.handles) if count == 0 else start + count
        return self.client.fetch_into(self.namespace, dst,
                                      handles=self.handles[start:end],
                                      format=format, timeout=timeout, **layers)

    def fetch_to_layout(self, layout, block_ids, start_page=0, stream=None,
                        format=None, timeout=None) -> TransferResult:
        """Fetches lease pages [start_page, start_page + len(block_ids))
        into an engine's KV cache: page i into block ``block_ids[i]`` of
        every layer ``layout`` holds, by the fastest path (docs/hit_paths.md);
        returns once the cache holds them. ``format``: None (automatic), or
        FetchFormat.RAW / COMPRESSED to force that gRPC stream. ``stream``: a
        CUDA stream (or its handle) whose earlier work the fetch waits for.
        Needs a locked lease (match(lock=True))."""
        if not self.locked:
            raise invalid("lease", "fetch_to_layout needs a locked lease "
                          "(match(..., lock=True))")
        return self.client.fetch_to_layout(
            self.namespace, self.id, layout, block_ids, start_page=start_page,
            page_tiers=self.page_tiers, stream=stream, format=format,
            timeout=timeout)

    def _source(self):
        """The lease's pages for a fetch: by lease id when locked, else by
        handle."""
        if self.locked:
            return {"lease": self.id}
        if not self.handles:
            raise invalid("lease", "matched no page")
        return {"handles": self.handles}

    def fetch_compressed(self, timeout=None):
        """The matched pages' codec buffers, undecoded (Client.
        fetch_compressed)."""
        return self.client.fetch_compressed(self.namespace, timeout=timeout,
                                            **self._source())

    def fetch_transformed(self, dst, transform=FetchTransform.KVCM,
                          timeout=None):
        """The matched pages through the daemon's KVCM compressor (Client.
        fetch_transformed; lossy, fewer tokens)."""
        return self.client.fetch_transformed(self.namespace, dst,
                                             transform=transform,
                                             timeout=timeout, **self._source())

    def host_handles(self, timeout=None):
        return self.client.host_handles(self.namespace, self.id, timeout=timeout)

    def device_handles(self, timeout=None):
        return self.client.device_handles(self.namespace, self.id,
                                          timeout=timeout)

    def fetch(self, format=FetchFormat.RAW, timeout=None):
        """All matched pages as one new bytearray."""
        dst = bytearray(self.nbytes)
        if dst:
            self.fetch_into(dst, format=format, timeout=timeout)
        return dst

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __repr__(self):
        return (f"Lease(id={self.id}, pages={self.num_pages}, "
                f"matched_tokens={self.matched_tokens})")


class Client(NativeHandle, TiersMixin, LayoutsMixin):
    """A connection to one kvharbord (see the module docstring)."""

    def __init__(self, address="127.0.0.1:50051", timeout=30.0, *,
                 tls=False, tls_ca_file=None, tls_cert_file=None,
                 tls_key_file=None, tls_server_name=None, token=None,
                 host_fetch="auto", device_ipc=True, gpu_decode=True,
                 own_connection=False, max_reconnect_backoff=None,
                 fetch_chunk_bytes=None, insert_chunk_bytes=None,
                 checksums=True, stage_cold=False, gpu_decode_gemm="tf32",
                 data_plane="auto", data_plane_connections=None):
        """Connects lazily to ``address`` (HOST:PORT).

        Paths of fetches (docs/hit_paths.md; need libkvharbor_c ABI 4 when
        not the defaults): ``host_fetch`` ("auto", "on", "off"): copy leased
        pages out of the daemon's shared memory when it is on this host;
        ``device_ipc`` (True = "auto", False = "off", or "on"): map the
        daemon's GPU arena with CUDA IPC for fetches into GPU layouts;
        ``gpu_decode``: cold pages of such fetches come compressed and are
        decoded on this GPU (False: the daemon decodes them). ``device_ipc``
        also picks the path of ``insert_from_layout`` from GPU layouts: the
        daemon's device tier by CUDA IPC (DeviceInsert) when allowed, else
        pinned staging + the Insert stream.

        GPU hit paths (ABI 6): ``stage_cold=True``: fetches into GPU layouts
        through device_ipc ask the daemon to decode the lease's cold pages on
        its GPU into its device tier first (falling back when it has no
        room); ``gpu_decode_gemm`` ("fp32", "tf32", "bf16"): the arithmetic
        of the reconstruction GEMM of cold pages decoded on this GPU.

        Bulk data plane (ABI 7; docs/data_plane.md): ``data_plane``
        ("auto", "on", "off"): RAW fetches (``fetch``, ``fetch_to_layout``
        of a daemon on another host) ask for the page bytes on TCP
        connections beside gRPC; "auto" does when the channel has no TLS (the
        plane is plain TCP), "on" with TLS too, "off" never (everything then
        streams over gRPC; for benchmarks). ``data_plane_connections``: the
        connections one fetch opens (None = 4; 1 to 16). A daemon without
        the plane streams as before (``TransferResult.path`` says which).

        Reconnects (ABI 5): ``own_connection`` gives this client a channel of
        its own (not shared with other clients of the address, whose
        reconnect backoff it would inherit); ``max_reconnect_backoff`` caps
        the pause between reconnect attempts to a daemon that went away, in
        seconds (None = gRPC's default, up to 120 s): an engine that must
        see a restarted daemon quickly sets about 1. Transfers (ABI 5):
        ``fetch_chunk_bytes`` is FetchRequest.max_chunk_bytes (None = the
        daemon's default, 1 MiB; else >= 1024), ``insert_chunk_bytes`` the
        page bytes per Insert message (None = 1 MiB); ``checksums=False``
        sends no page checksums with inserts and verifies none of fetched
        pages (the default sends and verifies them).

        Security (docs/operations.md "Security"): TLS is on when ``tls`` is
        true or any ``tls_*`` file is given (PEM paths, read here):
        ``tls_ca_file`` verifies the daemon, ``tls_cert_file`` and
        ``tls_key_file`` are the client's certificate for mutual TLS,
        ``tls_server_name`` overrides the name checked in the daemon's
        certificate. ``token`` is the bearer token sent with every call
        (e.g. ``token=os.environ["KVHARBOR_TOKEN"]``). These need
        libkvharbor_c ABI 3.
        """
        self._lib = library()
        self._handle = None
        handle = ctypes.c_void_p()
        options = {"tls": tls, "tls_ca_file": tls_ca_file,
                   "tls_cert_file": tls_cert_file, "tls_key_file": tls_key_file,
                   "tls_server_name": tls_server_name, "token": token,
                   "host_fetch": host_fetch, "device_ipc": device_ipc,
                   "gpu_decode": gpu_decode, "own_connection": own_connection,
                   "max_reconnect_backoff": max_reconnect_backoff,
                   "fetch_chunk_bytes": fetch_chunk_bytes,
                   "insert_chunk_bytes": insert_chunk_bytes,
                   "checksums": checksums, "stage_cold": stage_cold,
                   "gpu_decode_gemm": gpu_decode_gemm,
                   "data_plane": data_plane,
                   "data_plane_connections": data_plane_connections}
        opts = self._connect_options(timeout, options)
        if opts is not None:
            check(need("kvh_connect_with")(_str(address, "address"),
                                           ctypes.byref(opts),
                                           ctypes.byref(handle)))
        else:
            check(self._lib.kvh_connect(_str(address, "address"),
                                        _ms(timeout, "timeout"),
                                        ctypes.byref(handle)))
        self._handle = handle
        self.address = address

    _SECURITY = ("tls", "tls_ca_file", "tls_cert_file", "tls_key_file",
                 "tls_server_name", "token")
    _PATHS = ("host_fetch", "device_ipc", "gpu_decode")
    _CONNECTION = ("own_connection", "max_reconnect_backoff",
                   "fetch_chunk_bytes", "insert_chunk_bytes", "checksums")
    _GPU = ("stage_cold", "gpu_decode_gemm")
    _DATA_PLANE = ("data_plane", "data_plane_connections")
    _DEFAULTS = {"tls": False, "host_fetch": "auto", "device_ipc": True,
                 "gpu_decode": True, "own_connection": False, "checksums": True}
    # kvh_connect_options.gpu_decode_gemm (KVH_GEMM_*; 0 = the default, TF32).
    _GEMMS = {"fp32": 1, "tf32": 2, "bf16": 3}

    @staticmethod
    def _connect_options(timeout, options, always=False):
        """kvh_connect_options from a default deadline (seconds) and the
        security, path and connection keyword arguments of __init__ (None
        = unset), or None when every option has its default (kvh_connect
        serves) unless ``always``. The struct is the oldest ABI that holds what is set, so an
        older library takes it."""
        known = (Client._SECURITY + Client._PATHS + Client._CONNECTION
                 + Client._GPU + Client._DATA_PLANE)
        unknown = set(options) - set(known)
        if unknown:
            raise invalid(sorted(unknown)[0], "is not a connection option; "
                          f"known: {', '.join(known)}")
        lib = library()
        opts = _native._ConnectOptions()
        opts.default_timeout_ms = _ms(timeout, "timeout")
        opts.tls = 1 if options.get("tls") else 0
        size = _native.CONNECT_OPTIONS_V3_SIZE
        paths = [_mode(options.get(k, Client._DEFAULTS[k]), k)
                 for k in Client._PATHS]
        if any(paths):
            if not hasattr(lib, "kvh_fetch_to_layout"):
                need("kvh_fetch_to_layout")  # raises: the library is too old
            opts.host_fetch, opts.device_ipc, opts.gpu_decode = paths
            size = _native.CONNECT_OPTIONS_V4_SIZE
        backoff = options.get("max_reconnect_backoff")
        fetch_chunk = options.get("fetch_chunk_bytes")
        insert_chunk = options.get("insert_chunk_bytes")
        checksums = options.get("checksums", True)
        if (options.get("own_connection") or not checksums
                or any(v is not None for v in (backoff, fetch_chunk,
                                               insert_chunk))):
            if not hasattr(lib, "kvh_upload_calibration"):
                raise error_for(StatusCode.UNIMPLEMENTED, (
                    "own_connection, max_reconnect_backoff, *_chunk_bytes, "
                    "checksums: need libkvharbor_c ABI 5, loaded ABI "
                    f"{lib.kvh_abi_version()}"))
            opts.own_connection = 1 if options.get("own_connection") else 0
            opts.max_reconnect_backoff_ms = _ms(backoff, "max_reconnect_backoff")
            for field, value in (("fetch_chunk_bytes", fetch_chunk),
                                 ("insert_chunk_bytes", insert_chunk)):
                if value is not None:
                    value = _u64(value, field)
                    if value >= 2**32:
                        raise invalid(field, f"{value} must be < 2^32")
                    setattr(opts, field, value)
            opts.no_checksums = 0 if checksums else 1
            size = _native.CONNECT_OPTIONS_V5_SIZE
        stage_cold = options.get("stage_cold", False)
        gemm = options.get("gpu_decode_gemm", "tf32")
        if not isinstance(stage_cold, bool):
            raise invalid("stage_cold", f"must be True or False, got {stage_cold!r}")
        if gemm not in Client._GEMMS:
            raise invalid("gpu_decode_gemm", 'must be "fp32", "tf32" or '
                          f'"bf16", got {gemm!r}')
        if stage_cold or gemm != "tf32":
            if not hasattr(lib, "kvh_insert_from_layout_with"):
                raise error_for(StatusCode.UNIMPLEMENTED, (
                    "stage_cold, gpu_decode_gemm: need libkvharbor_c ABI 6, "
                    f"loaded ABI {lib.kvh_abi_version()}"))
            opts.stage_cold = 1 if stage_cold else 0
            opts.gpu_decode_gemm = Client._GEMMS[gemm]
            size = _native.CONNECT_OPTIONS_V6_SIZE
        plane = _mode(options.get("data_plane", "auto"), "data_plane")
        conns = options.get("data_plane_connections")
        if conns is not None and (isinstance(conns, bool)
                                  or not isinstance(conns, int)
                                  or not 1 <= conns <= 16):
            raise invalid("data_plane_connections",
                          f"must be an int from 1 to 16, got {conns!r}")
        if plane or conns is not None:
            if lib.kvh_abi_version() < 7:
                raise error_for(StatusCode.UNIMPLEMENTED, (
                    "data_plane, data_plane_connections: need libkvharbor_c "
                    f"ABI 7, loaded ABI {lib.kvh_abi_version()}"))
            opts.data_plane = plane
            opts.data_plane_connections = conns or 0
            size = ctypes.sizeof(_native._ConnectOptions)
        secure = False
        for field in Client._SECURITY[1:]:
            value = options.get(field)
            if value is None:
                continue
            if field == "token" and (not isinstance(value, str) or not value):
                # Never echo a token, not even a malformed one.
                raise invalid("token", "must be a non-empty str")
            setattr(opts, field, _str(value, field))
            secure = True
        if not (opts.tls or secure or always) and \
                size == _native.CONNECT_OPTIONS_V3_SIZE:
            return None
        opts.struct_size = size
        return opts

    # ---- Lifecycle: close(), with, _h() (NativeHandle) ----
    _FREE = "kvh_close"
    _WHAT = "client"

    def wait_connected(self, timeout=10.0):
        check(self._lib.kvh_wait_connected(self._h(), _ms(timeout, "timeout")))

    @staticmethod
    def version():
        return library().kvh_version().decode()

    # ---- Namespaces ----
    def create_namespace(self, name, geometry: Geometry, capacity_bytes=0,
                         codec="", if_not_exists=False, timeout=None, *,
                         calibration_path="", calibration=None,
                         host_compressed_bytes=0, disk_dir="",
                         disk_bytes=0, kvcm_path="", online_calibration=None,
                         key_kind=KeyKind.TOKENS,
                         topology=None) -> CreateNamespaceResult:
        """Creates a namespace (with if_not_exists, returns the existing one).

        ``codec``: "" (identity), "kvtc", "int8_c8" or "commvq". A calibrated
        codec needs its calibration: ``calibration_path`` (a path on the
        daemon's machine) or ``calibration`` (the canonical bytes, any
        buffer; what get_calibration returns). Tiers (docs/tiers.md):
        ``host_compressed_bytes`` (0 = no cold tiers), ``disk_dir`` (a
        directory on the daemon's machine, "" = none) and ``disk_bytes``
        (0 = unlimited). ``kvcm_path``: KVCM compressor weights on the
        daemon's machine, enabling fetch_transformed. ``online_calibration``:
        an OnlineCalibration (codec "kvtc"; docs/calibration.md), None =
        off. ``key_kind``: KeyKind.TOKENS (default), PAGE_KEYS (one opaque
        key per page) or PAGE_HASHES (the same keys, each a chained hash that
        finds its page alone; docs/engines_api.md). ``topology``: a
        kvharbor.Topology (model id, layer range of the pipeline stage,
        KV-head range of the tensor-parallel rank), None = the whole model;
        with if_not_exists, an existing namespace with another topology,
        geometry or key kind raises AlreadyExistsError naming the field. The
        daemon checks them and names the field.
        """
        spec, cal = self._namespace_spec(
            name, geometry, capacity_bytes, codec,
            calibration_path=calibration_path, calibration=calibration,
            host_compressed_bytes=host_compressed_bytes, disk_dir=disk_dir,
            disk_bytes=disk_bytes, kvcm_path=kvcm_path,
            online_calibration=online_calibration, key_kind=key_kind,
            topology=topology)
        created = ctypes.c_int()
        out = ctypes.c_void_p()
        try:
            if cal is None and not hasattr(self._lib, "kvh_namespace_create_spec"):
                # A library older than ABI 2 creates namespaces without
                # calibration or tiers.
                if (spec.calibration_path or spec.host_compressed_bytes
                        or spec.disk_dir or spec.disk_bytes):
                    need("kvh_namespace_create_spec")
                check(self._lib.kvh_namespace_create(
                    self._h(), spec.name, ctypes.byref(spec.geometry),
                    spec.capacity_bytes, spec.codec, int(bool(if_not_exists)),
                    _timeout_ms(timeout), ctypes.byref(created),
                    ctypes.byref(out)))
            else:
                check(need("kvh_namespace_create_spec")(
                    self._h(), ctypes.byref(spec), int(bool(if_not_exists)),
                    _timeout_ms(timeout), ctypes.byref(created),
                    ctypes.byref(out)))
        finally:
            if cal is not None:
                cal.release()
        info = NamespaceInfo.from_dict(json.loads(take_string(out)))
        return CreateNamespaceResult(info=info, created=bool(created.value))

    @staticmethod
    def _namespace_spec(name, geometry, capacity_bytes=0, codec="", *,
                        calibration_path="", calibration=None,
                        host_compressed_bytes=0, disk_dir="", disk_bytes=0,
                        kvcm_path="", online_calibration=None,
                        key_kind=KeyKind.TOKENS, topology=None):
        """A kvh_namespace_spec checked field by field, and the Buffer
        holding ``calibration`` (release it after the call) or None."""
        lib = library()
        if not isinstance(geometry, Geometry):
            raise invalid("geometry", f"must be a kvharbor.Geometry, got {type(geometry).__name__}")
        try:
            g = _native._Geometry(geometry.num_layers, geometry.num_kv_heads,
                                  geometry.head_dim, geometry.page_size,
                                  int(geometry.dtype), int(geometry.layout),
                                  float(geometry.rope_theta))
        except (TypeError, OverflowError) as e:
            raise invalid("geometry", str(e)) from None
        spec = _native._NamespaceSpec()
        spec.struct_size = ctypes.sizeof(_native._NamespaceSpec)
        spec.name = _str(name, "name")
        spec.geometry = g
        spec.capacity_bytes = _u64(capacity_bytes, "capacity_bytes")
        spec.codec = _opt_str(codec, "codec")
        spec.calibration_path = _opt_str(calibration_path, "calibration_path")
        spec.host_compressed_bytes = _u64(host_compressed_bytes,
                                          "host_compressed_bytes")
        spec.disk_dir = _opt_str(disk_dir, "disk_dir")
        spec.disk_bytes = _u64(disk_bytes, "disk_bytes")
        if isinstance(calibration, str):
            raise invalid("calibration", "must be bytes (a buffer), not str; "
                          "a file on the daemon's machine is calibration_path")
        spec.kvcm_path = _opt_str(kvcm_path, "kvcm_path")
        _set_online_calibration(spec.online_calibration, online_calibration)
        spec.key_kind = _enum(key_kind, KeyKind, "key_kind")
        _set_topology(spec.topology, topology)
        if lib.kvh_abi_version() < 8:
            # An ABI 5..7 library reads the spec up to key_kind.
            if topology is not None or spec.key_kind == KeyKind.PAGE_HASHES:
                raise error_for(StatusCode.UNIMPLEMENTED, (
                    "topology, key_kind PAGE_HASHES: need libkvharbor_c ABI "
                    f"8, loaded ABI {lib.kvh_abi_version()}"))
            spec.struct_size = _native.NAMESPACE_SPEC_V5_SIZE
        if not hasattr(lib, "kvh_upload_calibration"):
            # A library older than ABI 5 reads the ABI 2 prefix of the spec.
            if (spec.kvcm_path or online_calibration is not None
                    or spec.key_kind):
                raise error_for(StatusCode.UNIMPLEMENTED, (
                    "kvcm_path, online_calibration, key_kind: need "
                    f"libkvharbor_c ABI 5, loaded ABI {lib.kvh_abi_version()}"))
            spec.struct_size = ctypes.sizeof(_native._NamespaceSpecV2)
        cal = Buffer(calibration, "calibration") if calibration is not None else None
        if cal is not None:
            spec.calibration, spec.calibration_len = cal.ptr, cal.nbytes
        return spec, cal

    def describe_namespace(self, name, timeout=None) -> NamespaceInfo:
        out = ctypes.c_void_p()
        check(self._lib.kvh_namespace_describe(
            self._h(), _str(name, "name"), _timeout_ms(timeout), ctypes.byref(out)))
        return NamespaceInfo.from_dict(json.loads(take_string(out)))

    def list_namespaces(self, timeout=None):
        out = ctypes.c_void_p()
        check(self._lib.kvh_namespace_list(self._h(), _timeout_ms(timeout),
                                           ctypes.byref(out)))
        return [NamespaceInfo.from_dict(d) for d in json.loads(take_string(out))]

    def delete_namespace(self, name, force=False, timeout=None):
        check(self._lib.kvh_namespace_delete(
            self._h(), _str(name, "name"), int(bool(force)), _timeout_ms(timeout)))

    # ---- Match and leases ----
    def match(self, namespace, tokens=None, lock=False, ttl=None, timeout=None,
              *, keys=None) -> Lease:
        """Longest cached prefix of ``tokens`` (or, in a page-key namespace,
        of ``keys``: one per page, see kvharbor.engine; in a page-hash
        namespace, the longest run of leading ``keys`` each present on its
        own); with lock, leased for ``ttl`` seconds (None = the daemon's
        default)."""
        ns = _str(namespace, "namespace")
        ttl_ms = _ms(ttl, "ttl")
        if keys is not None:
            if tokens is not None:
                raise invalid("keys", "give tokens or keys, not both")
            r, handles, tiers = engine.match_seq(
                self, ns, engine.Sequence(keys=keys), lock, ttl_ms,
                _timeout_ms(timeout))
            expires = r.lease_expires_unix_ms / 1000.0 if r.lease_id else None
            return Lease(self, namespace, r.lease_id, expires,
                         tuple(handles[:r.num_pages]), r.matched_tokens,
                         r.page_bytes, [_tier(x) for x in tiers[:r.num_pages]])
        with_tiers = hasattr(self._lib, "kvh_match_tiers")
        with _Tokens(tokens) as t:
            handles = (ctypes.c_uint64 * t.count)()
            tiers = (ctypes.c_int32 * t.count)()
            r = _native._MatchResult()
            if with_tiers:
                check(self._lib.kvh_match_tiers(
                    self._h(), ns, t.ptr, t.count, int(bool(lock)), ttl_ms,
                    handles, tiers, t.count, ctypes.byref(r), _timeout_ms(timeout)))
            else:
                check(self._lib.kvh_match(
                    self._h(), ns, t.ptr, t.count, int(bool(lock)), ttl_ms,
                    handles, t.count, ctypes.byref(r), _timeout_ms(timeout)))
        expires = r.lease_expires_unix_ms / 1000.0 if r.lease_id else None
        page_tiers = ([_tier(x) for x in tiers[:r.num_pages]] if with_tiers
                      else None)
        return Lease(self, namespace, r.lease_id, expires,
                     tuple(handles[:r.num_pages]), r.matched_tokens, r.page_bytes,
                     page_tiers)

    def release(self, lease_id, timeout=None):
        check(self._lib.kvh_release(self._h(), int(lease_id), _timeout_ms(timeout)))

    def extend_lease(self, lease_id, ttl, timeout=None) -> float:
        """New expiry (Unix seconds), ``ttl`` seconds from now."""
        out = ctypes.c_int64()
        check(self._lib.kvh_extend_lease(self._h(), int(lease_id), _ms(ttl, "ttl"),
                                         ctypes.byref(out), _timeout_ms(timeout)))
        return out.value / 1000.0

    # ---- Insert ----
    def insert(self, namespace, tokens=None, pages=None, page_bytes=0,
               timeout=None, *, keys=None, skip_pages=0,
               prefix_lease=None) -> InsertResult:
        """Stores the pages of ``tokens`` (a whole number of pages), or of
        ``keys`` in a page-key namespace (``insert(ns, pages, keys=[...])``;
        in a page-hash namespace each page is stored under its key alone,
        without the pages before it, and present ones are deduplicated).

        ``pages`` is one buffer holding them back to back, or a list/tuple
        of per-page buffers (then page_bytes defaults to their size).
        Append (docs/engines_api.md): with ``skip_pages=N`` the first N
        pages are cached and are not sent; ``pages`` holds every page (then
        only the new ones are sent, and all of them again when the prefix is
        gone) or only the new ones (then a prefix no longer cached raises
        FailedPreconditionError naming header.skip_pages). With
        ``prefix_lease`` (a Lease or its id) the lease's pages are skipped.
        """
        ns = _str(namespace, "namespace")
        if int(page_bytes) < 0:
            raise invalid("page_bytes", "must not be negative")
        if keys is not None and pages is None:
            tokens, pages = None, tokens  # insert(ns, pages, keys=[...])
        if pages is None:
            raise invalid("pages", "no pages given")
        options = engine.insert_options(skip_pages, prefix_lease)
        if keys is not None or options is not None:
            with self._sequence(tokens, keys) as seq:
                return engine.insert_seq(self, ns, seq, options, pages,
                                         int(page_bytes), _timeout_ms(timeout))
        r = _native._InsertResult()
        with _Tokens(tokens) as t:
            if isinstance(pages, (list, tuple)):
                self._insert_pages(ns, t, pages, int(page_bytes), r, timeout)
            else:
                with Buffer(pages, "pages") as b:
                    check(self._lib.kvh_insert(self._h(), ns, t.ptr, t.count,
                                               b.ptr, b.nbytes, int(page_bytes),
                                               ctypes.byref(r), _timeout_ms(timeout)))
        return InsertResult(r.already_present_tokens, r.pages_stored, r.pages_evicted)

    def _insert_pages(self, ns, t, pages, page_bytes, r, timeout):
        with buffer_list(pages, "pages", page_bytes=page_bytes) as (bufs, ptrs):
            check(self._lib.kvh_insert_pages(self._h(), ns, t.ptr, t.count, ptrs,
                                             len(bufs), bufs[0].nbytes,
                                             ctypes.byref(r), _timeout_ms(timeout)))

    @contextlib.contextmanager
    def _sequence(self, tokens, keys):
        """The engine.Sequence of token ids or page keys (exactly one)."""
        if keys is not None and tokens is not None:
            raise invalid("keys", "give tokens or keys, not both")
        if tokens is None:
            yield engine.Sequence(keys=keys)
            return
        with _Tokens(tokens) as t:
            yield engine.Sequence(tokens=t)

    def begin_insert(self, namespace, tokens=None, *, keys=None, skip_pages=0,
                     prefix_lease=None, layer_major=True,
                     timeout=None) -> "engine.Upload":
        """Opens a layer-by-layer upload of the pages of ``tokens`` (or
        ``keys``) after ``skip_pages`` (or ``prefix_lease``'s pages): see
        kvharbor.engine.Upload. Returns once the daemon accepted it (a
        skipped prefix no longer cached raises FailedPreconditionError
        naming header.skip_pages here). ``timeout`` covers the whole upload,
        up to commit()."""
        ns = _str(namespace, "namespace")
        if not layer_major:
            raise invalid("layer_major", "begin_insert uploads layer by "
                          "layer; page after page is insert()")
        options = engine.insert_options(skip_pages, prefix_lease)
        with self._sequence(tokens, keys) as seq:
            return engine.begin_insert(self, ns, seq, options,
                                       _timeout_ms(timeout))

    # ---- Fetch ----
    def fetch_into(self, namespace, dst, lease=None, start_page=0, page_count=0,
                   handles: Optional[Sequence[int]] = None,
                   format=FetchFormat.RAW, timeout=None, *, layer_begin=0,
                   layer_end=0) -> FetchResult:
        """Fetches pages into ``dst`` (one writable buffer, page i at
        i * page_bytes, or a list of per-page buffers): a lease's pages
        [start_page, start_page + page_count) (0 = to the end), or pages by
        handle. Returns how many pages and bytes were written.

        ``format``: FetchFormat.RAW (default) or COMPRESSED: codec buffers
        over the wire, decoded by the SDK on the CPU (it loads the
        namespace's calibration once per client); raw pages land in dst
        either way (KVTC ones within the codec's error bounds).

        ``layer_begin``, ``layer_end``: only those layers of each page (0, 0
        = all), each page then ``page_bytes * (end - begin) / num_layers``
        bytes in the page layout restricted to them; RAW format only."""
        ns = _str(namespace, "namespace")
        fmt = _enum(format, FetchFormat, "format")
        layers = (_int(layer_begin, "layer_begin"), _int(layer_end, "layer_end"))
        src, _keep = _fetch_source(lease, handles, start_page, page_count)
        if layers != (0, 0):
            if fmt != FetchFormat.RAW:
                raise invalid("layer_begin", "a layer range needs format RAW")
            return engine.fetch_layers(self, ns, src, layers, dst,
                                       _timeout_ms(timeout))
        r = _native._FetchResult()
        if isinstance(dst, (list, tuple)):
            self._fetch_pages(ns, src, fmt, dst, r, timeout)
        else:
            with Buffer(dst, "dst", writable=True) as b:
                check(self._lib.kvh_fetch(self._h(), ns, ctypes.byref(src),
                                          fmt, b.ptr, b.nbytes,
                                          ctypes.byref(r), _timeout_ms(timeout)))
        return FetchResult(r.num_pages, r.page_bytes, r.bytes_written)

    def _fetch_pages(self, ns, src, fmt, dsts, r, timeout):
        with buffer_list(dsts, "dst", writable=True) as (bufs, ptrs):
            cap = min(b.nbytes for b in bufs)
            check(self._lib.kvh_fetch_pages(self._h(), ns, ctypes.byref(src), fmt,
                                            ptrs, len(bufs), cap, ctypes.byref(r),
                                            _timeout_ms(timeout)))

    # ---- Eviction ----
    def _evict_result(self, r):
        return EvictResult(r.pages_evicted, r.bytes_freed)

    def evict_pages(self, namespace, handles, timeout=None) -> EvictResult:
        """These pages and every page that extends them."""
        arr = _handles(handles, "handles")
        r = _native._EvictResult()
        check(self._lib.kvh_evict_pages(self._h(), _str(namespace, "namespace"),
                                        arr, len(arr), ctypes.byref(r),
                                        _timeout_ms(timeout)))
        return self._evict_result(r)

    def evict_bytes(self, namespace, nbytes, timeout=None) -> EvictResult:
        """At least ``nbytes`` of unlocked pages, least recently used first."""
        if not isinstance(nbytes, int) or nbytes <= 0:
            raise invalid("nbytes", f"must be a positive int, got {nbytes!r}")
        r = _native._EvictResult()
        check(self._lib.kvh_evict_bytes(self._h(), _str(namespace, "namespace"),
                                        nbytes, ctypes.byref(r), _timeout_ms(timeout)))
        return self._evict_result(r)

    def evict_all(self, namespace, timeout=None) -> EvictResult:
        r = _native._EvictResult()
        check(self._lib.kvh_evict_all(self._h(), _str(namespace, "namespace"),
                                      ctypes.byref(r), _timeout_ms(timeout)))
        return self._evict_result(r)

    # ---- Introspection ----
    def stats(self, namespace="", timeout=None) -> Stats:
        """One namespace's counters, or every namespace's when empty."""
        out = ctypes.c_void_p()
        check(self._lib.kvh_stats(self._h(), (namespace or "").encode(),
                                  _timeout_ms(timeout), ctypes.byref(out)))
        return Stats.from_dict(json.loads(take_string(out)))

    def dump_tree(self, namespace, max_nodes=0, timeout=None) -> TreeDump:
        out = ctypes.c_void_p()
        nodes = ctypes.c_uint64()
        check(self._lib.kvh_dump_tree(self._h(), _str(namespace, "namespace"),
                                      int(max_nodes), _timeout_ms(timeout),
                                      ctypes.byref(out), ctypes.byref(nodes)))
        return TreeDump(take_string(out), nodes.value)
