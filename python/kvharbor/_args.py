"""Argument checks shared by the kvharbor client classes: every one raises
kvharbor.InvalidArgumentError naming the argument, before any native call.
Stateless; _Tokens holds its buffer while the call that uses it runs."""

import array
import ctypes
import math
import operator

from . import _native
from ._native import Buffer
from .errors import invalid


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


def _handles(handles, field):
    try:
        arr = (ctypes.c_uint64 * len(handles))(*handles)
    except (TypeError, OverflowError) as e:
        raise invalid(field, f"must be a sequence of uint64 handles ({e})") from None
    if len(arr) == 0:
        raise invalid(field, "must not be empty")
    return arr


def _fetch_source(lease, handles, start_page=0, page_count=0):
    """A kvh_fetch_source for a lease's pages [start_page, +page_count) or
    pages by handle, and the handle array it points into (keep it alive
    while the call runs)."""
    src = _native._FetchSource()
    keep = None
    if lease is not None and handles is not None:
        raise invalid("lease", "give either lease or handles, not both")
    if lease is not None:
        lease_id = getattr(lease, "id", lease)
        src.lease_id = _u64(lease_id, "lease")
        if src.lease_id == 0:
            raise invalid("lease", "is not a lease (match with lock=True)")
        start, count = _int(start_page, "start_page"), _int(page_count, "page_count")
        if not 0 <= start < 2**32 or not 0 <= count < 2**32:
            raise invalid("start_page", f"[{start}, +{count}) must be uint32")
        src.start_page, src.page_count = start, count
    elif handles is not None:
        keep = _handles(handles, "handles")
        src.handles = ctypes.cast(keep, ctypes.POINTER(ctypes.c_uint64))
        src.num_handles = len(keep)
    else:
        raise invalid("lease", "give a lease or handles")
    return src, keep


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
