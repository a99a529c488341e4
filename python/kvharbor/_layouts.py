"""The Client calls that move pages between the daemon and an engine's
paged KV cache (docs/hit_paths.md), as a mixin of kvharbor.Client:
fetch_to_layout, insert_from_layout and gpu_transfers. The layout is a
kvharbor.PagedKvLayout (kvharbor/layout.py)."""

import ctypes
import json

from . import _native
from ._args import (_block_ids, _enum, _int, _ms, _str, _stream, _timeout_ms,
                    _Tokens, _u64)
from ._native import check, library, need, take_string
from .errors import invalid
from .layout import PagedKvLayout
from .types import FetchFormat, LayoutInsertResult, TransferResult


def _layout(layout):
    if not isinstance(layout, PagedKvLayout):
        raise invalid("layout", f"must be a kvharbor.PagedKvLayout, got {type(layout).__name__}")
    return layout._as_c()


class LayoutsMixin:
    """Methods of kvharbor.Client; ``self._h()`` is the native handle."""

    def fetch_to_layout(self, namespace, lease, layout, block_ids,
                        start_page=0, page_tiers=None, stream=None,
                        format=None, timeout=None) -> TransferResult:
        """Lease pages [start_page, start_page + len(block_ids)) into blocks
        ``block_ids`` of ``layout`` (see Lease.fetch_to_layout).
        ``page_tiers``: the lease's tiers (Lease.page_tiers), which pick the
        path of cold pages."""
        ns = _str(namespace, "namespace")
        lease_id = _u64(getattr(lease, "id", lease), "lease")
        if lease_id == 0:
            raise invalid("lease", "is not a lease (match with lock=True)")
        if page_tiers is None and hasattr(lease, "page_tiers"):
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
                           stream=None, timeout=None, *, device_ipc=None,
                           ttl=None) -> LayoutInsertResult:
        """Stores the pages of ``tokens`` (a whole number of pages), page i
        read from block ``block_ids[i]`` of ``layout`` (all the namespace's
        layers). From a GPU layout: "device_ipc" (the daemon's device tier
        on this host: a gather kernel writes the pages straight into the
        slots it reserved, through CUDA IPC; one device-to-device copy)
        when the client's ``device_ipc`` allows it, else, or when the daemon
        cannot take it (no device tier, IPC not allowed, another host;
        ``transfer.fallbacks`` says why), "host_shm" (a daemon on this host
        with host pools: a gather kernel into this process's staging
        region, which the daemon copies the pages out of), else "pinned"
        (a gather kernel into pinned memory, then the Insert stream). Host
        layouts: "cpu". ``device_ipc`` overrides the client's choice for
        this call: False = "host_shm" or "pinned", True = "device_ipc" or
        FailedPreconditionError naming device_ipc (a host layout:
        InvalidArgumentError). ``ttl``: seconds the daemon holds the
        reserved device slots (None = its default lease TTL). The result is
        an InsertResult with ``path`` and ``transfer``. ``device_ipc`` and
        ``ttl`` need libkvharbor_c ABI 6."""
        ns = _str(namespace, "namespace")
        ids = _block_ids(block_ids)
        c_layout, keep = _layout(layout)
        opts = None
        if device_ipc is not None or ttl is not None:
            opts = _native._LayoutInsertOptions()
            opts.struct_size = ctypes.sizeof(opts)
            opts.cuda_stream = _stream(stream)
            if device_ipc is not None:
                if not isinstance(device_ipc, bool):
                    raise invalid("device_ipc", "must be None, True or False, "
                                  f"got {device_ipc!r}")
                opts.device_ipc = 1 if device_ipc else 2
            if ttl is not None:
                ms = _ms(ttl, "ttl")
                if ms >= 2**32:
                    raise invalid("ttl", f"{ttl} s does not fit in 2^32 ms")
                opts.ttl_ms = ms
        r = _native._InsertResult()
        out = ctypes.c_void_p()
        with _Tokens(tokens) as t:
            if opts is not None:
                check(need("kvh_insert_from_layout_with")(
                    self._h(), ns, t.ptr, t.count, ctypes.byref(c_layout), ids,
                    len(ids), ctypes.byref(opts), ctypes.byref(r),
                    _timeout_ms(timeout), ctypes.byref(out)))
            else:
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
