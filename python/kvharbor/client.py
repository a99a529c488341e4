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

import array
import ctypes
import json
import math
import operator
import threading
from typing import Optional, Sequence

from . import _native, engine
from ._native import Buffer, check, library, need, take_string
from .errors import invalid
from .layout import PagedKvLayout
from .types import (Calibration, CreateNamespaceResult, EvictResult,
                    FetchFormat, FetchResult, Geometry, InsertResult, KeyKind,
                    LayoutInsertResult, NamespaceInfo, Stats, Tier,
                    TransferResult, TreeDump, _tier)


def _ms(value, field, allow_none=True):
    """Seconds -> whole milliseconds (>= 1 when positive); None -> 0."""
    if value is None and allow_none:
        return 0
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise invalid(field, f"must be a number of seconds, got {value!r}") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise invalid(field, f"{value!r} must be a finite number >= 0")
    if seconds > 2**62 / 1000:
        raise invalid(field, f"{value!r} is too large")
    return max(1, math.ceil(seconds * 1000)) if seconds > 0 else 0


def _timeout_ms(timeout):
    ms = _ms(timeout, "timeout")
    if timeout is not None and ms == 0:
        raise invalid("timeout", "must be > 0 (None = the client default)")
    return ms


class _Tokens:
    """Token ids as a C int32 array: a zero-copy view of an int32 buffer, or
    a converted copy of any other sequence of ints."""

    def __init__(self, tokens, field="tokens"):
        self._buf = None
        if isinstance(tokens, (str, bytes)):
            raise invalid(field, "must be a sequence of int token ids")
        fmt = None
        try:
            view = memoryview(tokens)
            fmt = (view.format, view.itemsize)
            view.release()
        except TypeError:
            pass
        if fmt is not None and fmt[0] in ("i", "<i", "=i", "@i") and fmt[1] == 4:
            self._buf = Buffer(tokens, field)
            self.ptr, self.count = self._buf.ptr, self._buf.nbytes // 4
        else:
            try:
                self._arr = array.array("i", tokens)
            except OverflowError:
                raise invalid(field, "a token id does not fit in int32") from None
            except TypeError as e:
                raise invalid(field, f"must be a sequence of ints ({e})") from None
            self.ptr, self.count = (self._arr.buffer_info()[0], len(self._arr))
        if self.count == 0:
            self.release()
            raise invalid(field, "must not be empty")

    def release(self):
        if self._buf is not None:
            self._buf.release()
            self._buf = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


class _NoTokens:
    """A ``with`` stand-in for _Tokens when the sequence is page keys."""

    def __enter__(self):
        return None

    def __exit__(self, *exc):
        pass


def _str(value, field):
    if not isinstance(value, str) or not value:
        raise invalid(field, f"must be a non-empty str, got {value!r}")
    return value.encode()


def _opt_str(value, field):
    """An optional str argument ("" or None = unset) as bytes."""
    if value is None:
        return b""
    if not isinstance(value, str):
        raise invalid(field, f"must be a str, got {type(value).__name__}")
    if "\0" in value:
        raise invalid(field, "must not contain NUL characters")
    return value.encode()


def _int(value, field, what="an int"):
    if isinstance(value, bool):
        raise invalid(field, f"must be {what}, got {value!r}")
    try:
        return operator.index(value)  # ints, NumPy integers; not floats
    except TypeError:
        raise invalid(field, f"must be {what}, got {value!r}") from None


def _u64(value, field):
    value = _int(value, field)
    if not 0 <= value < 2**64:
        raise invalid(field, f"{value} must be in [0, 2^64)")
    return value


def _enum(value, cls, field):
    """An IntEnum member (or its int value) checked against ``cls``."""
    value = _int(value, field, f"a {cls.__name__}")
    if value not in cls._value2member_map_:
        raise invalid(field, f"unknown {cls.__name__} value {value}")
    return value


_MODES = {"auto": 0, "on": 1, "off": 2}


def _mode(value, field):
    """A path option: "auto", "on", "off", or True (auto) / False (off)."""
    if value is True:
        return 0
    if value is False:
        return 2
    if isinstance(value, str) and value in _MODES:
        return _MODES[value]
    raise invalid(field, f'must be "auto", "on", "off", True or False, got {value!r}')


def _block_ids(block_ids):
    """Block ids (ints, or anything with tolist(): a tensor, an array) as a
    C int64 array."""
    if hasattr(block_ids, "tolist"):
        block_ids = block_ids.tolist()
    if isinstance(block_ids, (str, bytes)):
        raise invalid("block_ids", "must be a sequence of ints")
    try:
        ids = [operator.index(b) for b in block_ids]
    except TypeError:
        raise invalid("block_ids", "must be a sequence of ints") from None
    if not ids:
        raise invalid("block_ids", "must not be empty")
    for i, b in enumerate(ids):
        if not -2**63 <= b < 2**63:
            raise invalid(f"block_ids[{i}]", f"{b} does not fit in int64")
    return (ctypes.c_int64 * len(ids))(*ids)


def _stream(stream):
    """A CUDA stream as an int: None (0), an int, or an object with
    .cuda_stream (torch.cuda.Stream)."""
    if stream is None:
        return 0
    handle = getattr(stream, "cuda_stream", stream)
    if isinstance(handle, bool) or not isinstance(handle, int) or handle < 0:
        raise invalid("stream", f"must be None, a CUDA stream or its handle, got {stream!r}")
    return handle


def _layout(layout):
    if not isinstance(layout, PagedKvLayout):
        raise invalid("layout", f"must be a kvharbor.PagedKvLayout, got {type(layout).__name__}")
    return layout._as_c()


def _handles(handles, field):
    try:
        arr = (ctypes.c_uint64 * len(handles))(*handles)
    except (TypeError, OverflowError) as e:
        raise invalid(field, f"must be a sequence of uint64 handles ({e})") from None
    if len(arr) == 0:
        raise invalid(field, "must not be empty")
    return arr


class Lease:
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
    def locked(self):
        return self.id != 0

    @property
    def num_pages(self):
        return len(self.handles)

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


class Client:
    """A connection to one kvharbord (see the module docstring)."""

    def __init__(self, address="127.0.0.1:50051", timeout=30.0, *,
                 tls=False, tls_ca_file=None, tls_cert_file=None,
                 tls_key_file=None, tls_server_name=None, token=None,
                 host_fetch="auto", device_ipc=True, gpu_decode=True):
        """Connects lazily to ``address`` (HOST:PORT).

        Paths of fetches (docs/hit_paths.md; need libkvharbor_c ABI 4 when
        not the defaults): ``host_fetch`` ("auto", "on", "off"): copy leased
        pages out of the daemon's shared memory when it is on this host;
        ``device_ipc`` (True = "auto", False = "off", or "on"): map the
        daemon's GPU arena with CUDA IPC for fetches into GPU layouts;
        ``gpu_decode``: cold pages of such fetches come compressed and are
        decoded on this GPU (False: the daemon decodes them).
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
        self._mu = threading.Lock()
        self._handle = None
        handle = ctypes.c_void_p()
        secure = {"tls_ca_file": tls_ca_file, "tls_cert_file": tls_cert_file,
                  "tls_key_file": tls_key_file,
                  "tls_server_name": tls_server_name, "token": token}
        paths = (_mode(host_fetch, "host_fetch"), _mode(device_ipc, "device_ipc"),
                 _mode(gpu_decode, "gpu_decode"))
        if any(paths) and (not hasattr(self._lib, "kvh_fetch_to_layout")):
            need("kvh_fetch_to_layout")  # raises: the library is too old
        if tls or any(v is not None for v in secure.values()) or any(paths):
            opts = _native._ConnectOptions()
            opts.struct_size = (ctypes.sizeof(_native._ConnectOptions)
                                if hasattr(self._lib, "kvh_fetch_to_layout")
                                else _native.CONNECT_OPTIONS_V3_SIZE)
            opts.host_fetch, opts.device_ipc, opts.gpu_decode = paths
            opts.default_timeout_ms = _ms(timeout, "timeout")
            opts.tls = 1 if tls else 0
            for field, value in secure.items():
                if value is None:
                    continue
                if field == "token" and (not isinstance(value, str)
                                         or not value):
                    # Never echo a token, not even a malformed one.
                    raise invalid("token", "must be a non-empty str")
                setattr(opts, field, _str(value, field))
            check(need("kvh_connect_with")(_str(address, "address"),
                                           ctypes.byref(opts),
                                           ctypes.byref(handle)))
        else:
            check(self._lib.kvh_connect(_str(address, "address"),
                                        _ms(timeout, "timeout"),
                                        ctypes.byref(handle)))
        self._handle = handle
        self.address = address

    # ---- Lifecycle ----
    def close(self):
        with self._mu:
            handle, self._handle = self._handle, None
        if handle is not None:
            self._lib.kvh_close(handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_handle", None) is not None:
            self.close()

    def _h(self):
        handle = self._handle
        if handle is None:
            raise invalid("client", "is closed")
        return handle

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
                         disk_bytes=0,
                         key_kind=KeyKind.TOKENS) -> CreateNamespaceResult:
        """Creates a namespace (with if_not_exists, returns the existing one).

        ``codec``: "" (identity), "kvtc", "int8_c8" or "commvq". A calibrated
        codec needs its calibration: ``calibration_path`` (a path on the
        daemon's machine) or ``calibration`` (the canonical bytes, any
        buffer; what get_calibration returns). Tiers (docs/tiers.md):
        ``host_compressed_bytes`` (0 = no cold tiers), ``disk_dir`` (a
        directory on the daemon's machine, "" = none) and ``disk_bytes``
        (0 = unlimited). ``key_kind``: KeyKind.TOKENS (default) or
        PAGE_KEYS (one opaque key per page; docs/engines_api.md). The
        daemon checks them and names the field.
        """
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
        spec.key_kind = _enum(key_kind, KeyKind, "key_kind")
        if not spec.key_kind:
            # What an ABI 2-4 library knows; key_kind needs ABI 5.
            spec.struct_size = _native.NAMESPACE_SPEC_V2_SIZE
        if isinstance(calibration, str):
            raise invalid("calibration", "must be bytes (a buffer), not str; "
                          "a file on the daemon's machine is calibration_path")
        created = ctypes.c_int()
        out = ctypes.c_void_p()
        plain = (calibration is None and not spec.calibration_path
                 and not spec.host_compressed_bytes and not spec.disk_dir
                 and not spec.disk_bytes and not spec.key_kind)
        if plain and not hasattr(self._lib, "kvh_namespace_create_spec"):
            # A library older than ABI 2 still creates namespaces without
            # calibration or tiers.
            check(self._lib.kvh_namespace_create(
                self._h(), spec.name, ctypes.byref(g), spec.capacity_bytes,
                spec.codec, int(bool(if_not_exists)), _timeout_ms(timeout),
                ctypes.byref(created), ctypes.byref(out)))
            info = NamespaceInfo.from_dict(json.loads(take_string(out)))
            return CreateNamespaceResult(info=info, created=bool(created.value))
        cal = Buffer(calibration, "calibration") if calibration is not None else None
        try:
            if cal is not None:
                spec.calibration, spec.calibration_len = cal.ptr, cal.nbytes
            check(need("kvh_namespace_create_spec")(
                self._h(), ctypes.byref(spec), int(bool(if_not_exists)),
                _timeout_ms(timeout), ctypes.byref(created), ctypes.byref(out)))
        finally:
            if cal is not None:
                cal.release()
        info = NamespaceInfo.from_dict(json.loads(take_string(out)))
        return CreateNamespaceResult(info=info, created=bool(created.value))

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
        of ``keys``: one per page, see kvharbor.engine); with lock, leased
        for ``ttl`` seconds (None = the daemon's default)."""
        ns = _str(namespace, "namespace")
        ttl_ms = _ms(ttl, "ttl")
        if keys is not None:
            if tokens is not None:
                raise invalid("keys", "give tokens or keys, not both")
            seq = engine.Sequence(keys=keys)
            r, handles, tiers = engine.match_seq(
                self, ns, seq, lock, ttl_ms, _timeout_ms(timeout))
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
        ``keys`` in a page-key namespace (``insert(ns, pages, keys=[...])``).

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
            if keys is not None and tokens is not None:
                raise invalid("keys", "give tokens or keys, not both")
            with _Tokens(tokens) if tokens is not None else _NoTokens() as t:
                seq = engine.Sequence(tokens=t if tokens is not None else None,
                                      keys=keys)
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
        if not pages:
            raise invalid("pages", "no page given")
        bufs = []
        try:
            for i, p in enumerate(pages):
                bufs.append(Buffer(p, f"pages[{i}]"))
            size = page_bytes or bufs[0].nbytes
            for i, b in enumerate(bufs):
                if b.nbytes != size:
                    raise invalid(f"pages[{i}]", f"holds {b.nbytes} bytes, expected {size}")
            ptrs = (ctypes.c_void_p * len(bufs))(*[b.ptr for b in bufs])
            check(self._lib.kvh_insert_pages(self._h(), ns, t.ptr, t.count, ptrs,
                                             len(bufs), size, ctypes.byref(r),
                                             _timeout_ms(timeout)))
        finally:
            for b in bufs:
                b.release()

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
        if keys is not None and tokens is not None:
            raise invalid("keys", "give tokens or keys, not both")
        options = engine.insert_options(skip_pages, prefix_lease)
        with _Tokens(tokens) if tokens is not None else _NoTokens() as t:
            seq = engine.Sequence(tokens=t if tokens is not None else None,
                                  keys=keys)
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
        src = _native._FetchSource()
        keep = None
        if lease is not None and handles is not None:
            raise invalid("lease", "give either lease or handles, not both")
        if lease is not None:
            src.lease_id = int(lease.id if isinstance(lease, Lease) else lease)
            if src.lease_id == 0:
                raise invalid("lease", "is not a lease (match with lock=True)")
            try:
                src.start_page, src.page_count = int(start_page), int(page_count)
            except (TypeError, OverflowError) as e:
                raise invalid("start_page", str(e)) from None
        elif handles is not None:
            keep = _handles(handles, "handles")
            src.handles = ctypes.cast(keep, ctypes.POINTER(ctypes.c_uint64))
            src.num_handles = len(keep)
        else:
            raise invalid("lease", "give a lease or handles")
        r = _native._FetchResult()
        if layers != (0, 0):
            if fmt != FetchFormat.RAW:
                raise invalid("layer_begin", "a layer range needs format RAW")
            return engine.fetch_layers(self, ns, src, layers, dst,
                                       _timeout_ms(timeout))
        if isinstance(dst, (list, tuple)):
            self._fetch_pages(ns, src, fmt, dst, r, timeout)
        else:
            with Buffer(dst, "dst", writable=True) as b:
                check(self._lib.kvh_fetch(self._h(), ns, ctypes.byref(src),
                                          fmt, b.ptr, b.nbytes,
                                          ctypes.byref(r), _timeout_ms(timeout)))
        return FetchResult(r.num_pages, r.page_bytes, r.bytes_written)

    def _fetch_pages(self, ns, src, fmt, dsts, r, timeout):
        if not dsts:
            raise invalid("dst", "no page buffer given")
        bufs = []
        try:
            for i, d in enumerate(dsts):
                bufs.append(Buffer(d, f"dst[{i}]", writable=True))
            cap = min(b.nbytes for b in bufs)
            ptrs = (ctypes.c_void_p * len(bufs))(*[b.ptr for b in bufs])
            check(self._lib.kvh_fetch_pages(self._h(), ns, ctypes.byref(src), fmt,
                                            ptrs, len(bufs), cap, ctypes.byref(r),
                                            _timeout_ms(timeout)))
        finally:
            for b in bufs:
                b.release()

    # ---- Engine layouts (docs/hit_paths.md) ----
    def fetch_to_layout(self, namespace, lease, layout, block_ids,
                        start_page=0, page_tiers=None, stream=None,
                        format=None, timeout=None) -> TransferResult:
        """Lease pages [start_page, start_page + len(block_ids)) into blocks
        ``block_ids`` of ``layout`` (see Lease.fetch_to_layout).
        ``page_tiers``: the lease's tiers (Lease.page_tiers), which pick the
        path of cold pages."""
        ns = _str(namespace, "namespace")
        lease_id = _u64(lease.id if isinstance(lease, Lease) else lease, "lease")
        if lease_id == 0:
            raise invalid("lease", "is not a lease (match with lock=True)")
        if page_tiers is None and isinstance(lease, Lease):
            page_tiers = lease.page_tiers
        start = _int(start_page, "start_page")
        if not 0 <= start < 2**32:
            raise invalid("start_page", f"{start} out of range")
        fmt = -1 if format is None else _enum(format, FetchFormat, "format")
        ids = _block_ids(block_ids)
        tiers = (ctypes.c_int32 * len(page_tiers))(*[int(t) for t in page_tiers]) \
            if page_tiers else None
        c_layout, keep = _layout(layout)
        out = ctypes.c_void_p()
        check(need("kvh_fetch_to_layout")(
            self._h(), ns, lease_id, start, tiers, len(page_tiers or ()),
            ctypes.byref(c_layout), ids, len(ids), fmt, _stream(stream),
            _timeout_ms(timeout), ctypes.byref(out)))
        del keep
        return TransferResult.from_dict(json.loads(take_string(out)))

    def insert_from_layout(self, namespace, tokens, layout, block_ids,
                           stream=None, timeout=None) -> LayoutInsertResult:
        """Stores the pages of ``tokens`` (a whole number of pages), page i
        read from block ``block_ids[i]`` of ``layout`` (all the namespace's
        layers): on the GPU a gather kernel into pinned memory, then the
        Insert stream; host layouts on the CPU. The result is an
        InsertResult with ``path`` and ``transfer``."""
        ns = _str(namespace, "namespace")
        ids = _block_ids(block_ids)
        c_layout, keep = _layout(layout)
        r = _native._InsertResult()
        out = ctypes.c_void_p()
        with _Tokens(tokens) as t:
            check(need("kvh_insert_from_layout")(
                self._h(), ns, t.ptr, t.count, ctypes.byref(c_layout), ids,
                len(ids), _stream(stream), ctypes.byref(r),
                _timeout_ms(timeout), ctypes.byref(out)))
        del keep
        transfer = TransferResult.from_dict(json.loads(take_string(out)))
        return LayoutInsertResult(r.already_present_tokens, r.pages_stored,
                                  r.pages_evicted, path=transfer.path,
                                  transfer=transfer)

    @staticmethod
    def gpu_transfers():
        """Whether the loaded library moves pages into GPU layouts (built
        with CUDA); False for an older library."""
        lib = library()
        return bool(lib.kvh_gpu_transfers()) if hasattr(lib, "kvh_gpu_transfers") else False

    # ---- Tiers ----
    def demote(self, namespace, tier, timeout=None) -> int:
        """Moves every unlocked page down to ``tier`` (Tier.HOST_COMPRESSED
        or Tier.DISK); returns how many pages moved."""
        ns = _str(namespace, "namespace")
        t = _enum(tier, Tier, "tier")
        moved = ctypes.c_uint64()
        check(need("kvh_demote")(self._h(), ns, t, ctypes.byref(moved),
                                 _timeout_ms(timeout)))
        return moved.value

    def get_calibration(self, namespace, timeout=None) -> Calibration:
        """The namespace's codec, calibration bytes and fingerprint."""
        ns = _str(namespace, "namespace")
        fn = need("kvh_get_calibration")
        cal = _native._Calibration()
        check(fn(self._h(), ns, _timeout_ms(timeout), ctypes.byref(cal)))
        try:
            codec = ctypes.string_at(cal.codec).decode() if cal.codec else ""
            data = ctypes.string_at(cal.bytes, cal.num_bytes) if cal.bytes else b""
            return Calibration(codec, data, cal.fingerprint)
        finally:
            self._lib.kvh_calibration_free(ctypes.byref(cal))

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
