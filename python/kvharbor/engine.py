"""The engine API of the Python client (docs/engines_api.md): sequences of
token ids or page keys, append options, and layer-by-layer uploads.

Page keys: each key is ``bytes`` (any bytes-like object) or ``str``
(encoded as UTF-8). Keys longer than 32 bytes -- SGLang's 64-character hex
page hashes, for one -- are hashed with SHA-256 to 32 bytes here, so every
engine's keys fit; the daemon refuses an empty key (``keys[i]``). The same
key always maps to the same stored key, so matching is unchanged.

``Upload`` (Client.begin_insert) holds one Insert stream open while an
engine's prefill finishes layer after layer: ``send_layer(l, buf)`` in order
0..num_layers-1, then ``commit()``. ``abort()``, an exception in a ``with``
block, or leaving the block without ``commit()`` stores nothing. Not
thread-safe: one thread drives an upload.
"""

import ctypes
import hashlib

from . import _native
from ._native import Buffer, buffer_list, check, need
from .errors import invalid
from .types import InsertResult

MAX_PAGE_KEY_BYTES = 32


_Sequence = _native.struct(
    "_Sequence", "size struct_size, ptr tokens, size num_tokens, ptr* keys, "
    "size* key_lens, size num_keys", "kvh_sequence (ABI 5).")
_InsertOptions = _native.struct(
    "_InsertOptions", "size struct_size, u32 skip_pages, u64 prefix_lease_id, "
    "int no_retry", "kvh_insert_options (ABI 5).")


def page_key(key, field="keys[0]"):
    """``key`` as the bytes stored: str as UTF-8, longer than 32 bytes as
    its SHA-256 digest."""
    if isinstance(key, str):
        data = key.encode("utf-8")
    else:
        try:
            data = bytes(memoryview(key))
        except TypeError:
            raise invalid(field, f"must be bytes or str, got "
                          f"{type(key).__name__}") from None
    if not data:
        raise invalid(field, "an empty page key (keys are 1..32 bytes)")
    if len(data) > MAX_PAGE_KEY_BYTES:
        data = hashlib.sha256(data).digest()
    return data


class Sequence:
    """A kvh_sequence built from token ids (a ``_Tokens``) or page keys,
    valid while the object lives."""

    def __init__(self, tokens=None, keys=None):
        if (tokens is None) == (keys is None):
            raise invalid("keys", "give tokens or keys, exactly one of them")
        self.c = _Sequence()
        self.c.struct_size = ctypes.sizeof(_Sequence)
        self._tokens = None
        if tokens is not None:
            self._tokens = tokens  # a client._Tokens, released by the caller
            self.c.tokens = tokens.ptr
            self.c.num_tokens = tokens.count
            self.count = tokens.count
            return
        if isinstance(keys, (str, bytes, bytearray)):
            raise invalid("keys", "must be a sequence of keys, one per page")
        try:
            self._keys = [page_key(k, f"keys[{i}]") for i, k in enumerate(keys)]
        except TypeError:
            raise invalid("keys", "must be a sequence of keys") from None
        if not self._keys:
            raise invalid("keys", "must not be empty")
        n = len(self._keys)
        self._bufs = [ctypes.create_string_buffer(k, len(k)) for k in self._keys]
        self._ptrs = (ctypes.c_void_p * n)(
            *[ctypes.addressof(b) for b in self._bufs])
        self._lens = (ctypes.c_size_t * n)(*[len(k) for k in self._keys])
        self.c.keys = self._ptrs
        self.c.key_lens = self._lens
        self.c.num_keys = n
        self.count = n

    def ref(self):
        return ctypes.byref(self.c)


def insert_options(skip_pages=0, prefix_lease=None):
    """A kvh_insert_options, or None when nothing is set."""
    skip = _index(skip_pages, "skip_pages")
    lease = prefix_lease
    if lease is not None and hasattr(lease, "id"):
        lease = lease.id
    lease = 0 if lease is None else _index(lease, "prefix_lease", 64)
    if skip == 0 and lease == 0:
        return None
    o = _InsertOptions()
    o.struct_size = ctypes.sizeof(_InsertOptions)
    o.skip_pages = skip
    o.prefix_lease_id = lease
    return o


def _index(value, field, bits=32):
    if isinstance(value, bool):
        raise invalid(field, f"must be an int, got {value!r}")
    try:
        value = int(value.__index__())
    except (AttributeError, TypeError):
        raise invalid(field, f"must be an int, got {value!r}") from None
    if not 0 <= value < 2**bits:
        raise invalid(field, f"{value} is out of range [0, 2^{bits})")
    return value


class Upload:
    """A layer-by-layer upload (Client.begin_insert; see the module doc)."""

    def __init__(self, client, handle):
        self._client = client  # keeps the connection open
        self._handle = handle
        self._done = False
        lib = _native.library()
        layers, pages = ctypes.c_uint32(), ctypes.c_uint32()
        nbytes = ctypes.c_uint64()
        check(lib.kvh_upload_info(handle, ctypes.byref(layers),
                                  ctypes.byref(pages), ctypes.byref(nbytes),
                                  None))
        self.num_layers = layers.value
        self.sent_pages = pages.value  # pages whose layers are sent
        self.layer_bytes = nbytes.value  # bytes of one layer

    @property
    def next_layer(self):
        nxt = ctypes.c_uint32()
        check(_native.library().kvh_upload_info(self._h(), None, None, None,
                                                ctypes.byref(nxt)))
        return nxt.value

    def _h(self):
        if self._handle is None:
            raise invalid("upload", "is closed")
        return self._handle

    def send_layer(self, layer, data):
        """Layer ``layer`` (the next one) of every sent page: for each page,
        K then V of the layer (page_size x num_kv_heads x head_dim elements
        each), ``layer_bytes`` in all. ``data``: one buffer, or a list of
        buffers whose concatenation is the layer (e.g. each page's K and V
        where the engine keeps them). A wrong layer or size raises
        InvalidArgumentError (``layer``, ``layer_pages``) and keeps the
        upload open; other errors end it."""
        lib = _native.library()
        layer = _index(layer, "layer")
        if isinstance(data, (list, tuple)):
            with buffer_list(data, "data") as (bufs, ptrs):
                n = len(bufs)
                lens = (ctypes.c_size_t * n)(*[b.nbytes for b in bufs])
                check(lib.kvh_upload_send_layer_pieces(self._h(), layer, ptrs,
                                                       lens, n))
            return
        with Buffer(data, "data") as b:
            check(lib.kvh_upload_send_layer(self._h(), layer, b.ptr, b.nbytes))

    def send_layer_from_layout(self, layer, layout, block_ids):
        """Layer ``layer`` gathered from an engine's KV cache in host memory
        (kvharbor.PagedKvLayout holding that layer): sent page i from block
        ``block_ids[i]``. GPU layouts raise UnimplementedError naming
        layout.device (gather the layer to host memory, then send_layer)."""
        from ._args import _block_ids
        from ._layouts import _layout
        ids = _block_ids(block_ids)
        c_layout, keep = _layout(layout)
        check(_native.library().kvh_upload_send_layer_from_layout(
            self._h(), _index(layer, "layer"), ctypes.byref(c_layout), ids,
            len(ids)))
        del keep

    def commit(self) -> InsertResult:
        """Makes the pages visible (InvalidArgumentError naming ``layer``
        while layers are missing; the upload stays open)."""
        r = _native._InsertResult()
        check(_native.library().kvh_upload_commit(self._h(), ctypes.byref(r)))
        self._done = True
        return InsertResult(r.already_present_tokens, r.pages_stored,
                            r.pages_evicted)

    def abort(self):
        """Ends the upload with nothing stored (a no-op once it ended)."""
        if self._handle is not None:
            _native.library().kvh_upload_abort(self._handle)

    def close(self):
        """Aborts unless committed, and frees the upload."""
        handle, self._handle = self._handle, None
        if handle is not None:
            _native.library().kvh_upload_free(handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()  # without commit(): nothing is stored

    def __del__(self):
        if getattr(self, "_handle", None) is not None:
            self.close()


def begin_insert(client, ns, seq, options, timeout_ms):
    """The Upload of kvh_begin_insert (Client.begin_insert)."""
    handle = ctypes.c_void_p()
    check(need("kvh_begin_insert")(
        client._h(), ns, seq.ref(),
        ctypes.byref(options) if options is not None else None, timeout_ms,
        ctypes.byref(handle)))
    return Upload(client, handle)


def match_seq(client, ns, seq, lock, ttl_ms, timeout_ms):
    """kvh_match_seq: (the result, handles, tiers) of a Match of ``seq``."""
    handles = (ctypes.c_uint64 * seq.count)()
    tiers = (ctypes.c_int32 * seq.count)()
    r = _native._MatchResult()
    check(need("kvh_match_seq")(client._h(), ns, seq.ref(), int(bool(lock)),
                                ttl_ms, handles, tiers, seq.count,
                                ctypes.byref(r), timeout_ms))
    return r, handles, tiers


def insert_seq(client, ns, seq, options, pages, page_bytes, timeout_ms):
    """kvh_insert_seq(_pages): stores ``pages`` (one buffer, or a list of
    per-page buffers) for ``seq`` with ``options``."""
    r = _native._InsertResult()
    opts = ctypes.byref(options) if options is not None else None
    if isinstance(pages, (list, tuple)):
        with buffer_list(pages, "pages", page_bytes=page_bytes) as (bufs, ptrs):
            check(need("kvh_insert_seq_pages")(
                client._h(), ns, seq.ref(), opts, ptrs, len(bufs),
                bufs[0].nbytes, ctypes.byref(r), timeout_ms))
    else:
        with Buffer(pages, "pages") as b:
            check(need("kvh_insert_seq")(client._h(), ns, seq.ref(), opts,
                                         b.ptr, b.nbytes, page_bytes,
                                         ctypes.byref(r), timeout_ms))
    return InsertResult(r.already_present_tokens, r.pages_stored,
                        r.pages_evicted)


def fetch_layers(client, ns, src, layers, dst, timeout_ms):
    """kvh_fetch(_pages)_layers of ``src`` (a _FetchSource) into ``dst``."""
    from .types import FetchResult
    begin, end = layers
    r = _native._FetchResult()
    if isinstance(dst, (list, tuple)):
        with buffer_list(dst, "dst", writable=True) as (bufs, ptrs):
            check(need("kvh_fetch_pages_layers")(
                client._h(), ns, ctypes.byref(src), begin, end, ptrs,
                len(bufs), min(b.nbytes for b in bufs), ctypes.byref(r),
                timeout_ms))
    else:
        with Buffer(dst, "dst", writable=True) as b:
            check(need("kvh_fetch_layers")(
                client._h(), ns, ctypes.byref(src), begin, end, b.ptr,
                b.nbytes, ctypes.byref(r), timeout_ms))
    return FetchResult(r.num_pages, r.page_bytes, r.bytes_written)
