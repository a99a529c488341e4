"""Loading libkvharbor_c.so and moving buffers across ctypes without copies.

The library is looked up, in order: the KVHARBOR_LIB environment variable
(a file path; nothing else is tried when it is set), next to this package
(a copy placed there before `pip install`), the build folders of a source
checkout (build*/capi/ at the repository root), PREFIX/lib of the
kvharbord found on PATH (what `cmake --install` and the GPU bundle lay
out), then /usr/local/lib(64) and /usr/lib(64). Loading happens once per
process; the library handle is shared and thread-safe.

Buffers: page data is passed to C as a raw pointer obtained through the
buffer protocol (PyObject_GetBuffer, part of the stable ABI since Python
3.11), so bytes, bytearray, memoryview, array.array and NumPy arrays cross
without a copy, read-only ones included. PyTorch CPU tensors, which do not
export the buffer protocol, are taken through data_ptr(); tensors on another
device (CUDA) are staged through host memory by torch: copied to a pinned
host tensor before an insert, and from one after a fetch. The object stays
exported (and so cannot be resized) while the call runs.
"""

import contextlib
import ctypes
import glob
import os
import shutil
import threading

from .errors import error_for, invalid

_HERE = os.path.dirname(os.path.abspath(__file__))
_LIB_NAME = "libkvharbor_c.so"
_lock = threading.Lock()
_lib = None


def _candidates():
    env = os.environ.get("KVHARBOR_LIB")
    if env:
        yield env
        return
    yield os.path.join(_HERE, _LIB_NAME)
    root = os.path.dirname(os.path.dirname(_HERE))  # python/kvharbor -> repo
    preferred = os.path.join(root, "build", "capi", _LIB_NAME)
    yield preferred
    for path in sorted(glob.glob(os.path.join(root, "build*", "capi", _LIB_NAME))):
        if path != preferred:
            yield path
    # Installed: `cmake --install` puts the library in PREFIX/lib next to
    # PREFIX/bin/kvharbord (the GPU bundle: .gpu/bin and .gpu/lib).
    daemon = shutil.which("kvharbord")
    if daemon:
        for path in (os.path.abspath(daemon), os.path.realpath(daemon)):
            yield os.path.join(os.path.dirname(os.path.dirname(path)), "lib",
                               _LIB_NAME)
    for prefix in ("/usr/local", "/usr"):
        yield os.path.join(prefix, "lib", _LIB_NAME)
        yield os.path.join(prefix, "lib64", _LIB_NAME)


# ---- The ABI's structs (capi/kvharbor_c.h), declared from a table ----

_CTYPES = {"u64": ctypes.c_uint64, "i64": ctypes.c_int64,
           "u32": ctypes.c_uint32, "i32": ctypes.c_int32, "int": ctypes.c_int,
           "size": ctypes.c_size_t, "ssize": ctypes.c_ssize_t,
           "float": ctypes.c_float, "double": ctypes.c_double,
           "str": ctypes.c_char_p, "ptr": ctypes.c_void_p}


def _fields(spec, **types):
    """ctypes _fields_ from "type name, type name, ...": a type of _CTYPES
    or a struct given in ``types``; a trailing * makes it a pointer to
    that type."""
    out = []
    for item in spec.split(","):
        kind, name = item.split()
        base = kind.rstrip("*")
        t = types[base] if base in types else _CTYPES[base]
        out.append((name, ctypes.POINTER(t) if kind.endswith("*") else t))
    return out


def struct(name, spec, doc=None, **types):
    """A ctypes.Structure subclass ``name`` laid out as ``spec`` (see
    _fields), for this module and kvharbor.engine / kvharbor.layout."""
    return type(name, (ctypes.Structure,),
                {"_fields_": _fields(spec, **types), "__doc__": doc,
                 "__module__": __name__})


_Geometry = struct(
    "_Geometry", "u32 num_layers, u32 num_kv_heads, u32 head_dim, "
    "u32 page_size, i32 dtype, i32 layout, float rope_theta")

_ConnectOptions = struct(
    "_ConnectOptions",
    # ABI 3
    "size struct_size, i64 default_timeout_ms, int tls, str tls_ca_file, "
    "str tls_cert_file, str tls_key_file, str tls_server_name, str token, "
    # ABI 4: KVH_MODE_AUTO (0), ON (1), OFF (2)
    "int host_fetch, int device_ipc, int gpu_decode, "
    # ABI 5
    "int own_connection, i64 max_reconnect_backoff_ms, u32 fetch_chunk_bytes, "
    "u32 insert_chunk_bytes, int no_checksums, "
    # ABI 6: stage_cold (0/1), gpu_decode_gemm (KVH_GEMM_*)
    "int stage_cold, int gpu_decode_gemm, "
    # ABI 7: data_plane (KVH_MODE_*), data_plane_connections (0 = 4)
    "int data_plane, u32 data_plane_connections",
    "kvh_connect_options; struct_size = ctypes.sizeof(_ConnectOptions).")


# struct_size of the ABI 3 kvh_connect_options (before the path options).
CONNECT_OPTIONS_V3_SIZE = _ConnectOptions.host_fetch.offset


# struct_size of the ABI 4 kvh_connect_options (before the ABI 5 fields).
CONNECT_OPTIONS_V4_SIZE = _ConnectOptions.own_connection.offset


# struct_size of the ABI 5 kvh_connect_options (before the ABI 6 fields).
CONNECT_OPTIONS_V5_SIZE = _ConnectOptions.stage_cold.offset


# struct_size of the ABI 6 kvh_connect_options (before the ABI 7 fields).
CONNECT_OPTIONS_V6_SIZE = _ConnectOptions.data_plane.offset

# device_ipc: KVH_MODE_AUTO (0), ON (1), OFF (2).
_LayoutInsertOptions = struct(
    "_LayoutInsertOptions",
    "size struct_size, u64 cuda_stream, int device_ipc, u32 ttl_ms",
    "kvh_layout_insert_options (ABI 6).")

_OnlineCalibration = struct(
    "_OnlineCalibration", "int enabled, u64 min_tokens, u64 max_sample_tokens, "
    "double target_ratio, i32 row_kind, i32 rope_style, i64 sink_tokens",
    "kvh_online_calibration (ABI 5).")

_SPEC_V2 = ("size struct_size, str name, Geometry geometry, "
            "u64 capacity_bytes, str codec, str calibration_path, "
            "ptr calibration, size calibration_len, u64 host_compressed_bytes, "
            "str disk_dir, u64 disk_bytes")
_NamespaceSpecV2 = struct(
    "_NamespaceSpecV2", _SPEC_V2,
    "kvh_namespace_spec as ABI 2 defined it (for an older library).",
    Geometry=_Geometry)
_Topology = struct(
    "_Topology", "str model, u32 total_layers, u32 layer_begin, "
    "u32 layer_end, u32 total_kv_heads, u32 kv_head_begin, u32 kv_head_end",
    "kvh_topology (ABI 8).")
# key_kind: KVH_KEY_TOKENS (0), _PAGE_KEYS (1) or (ABI 8) _PAGE_HASHES (2).
_NamespaceSpec = struct(
    "_NamespaceSpec", _SPEC_V2 + ", str kvcm_path, "
    "Online online_calibration, i32 key_kind, Topology topology",
    "kvh_namespace_spec (ABI 8); struct_size = ctypes.sizeof(_NamespaceSpec).",
    Geometry=_Geometry, Online=_OnlineCalibration, Topology=_Topology)
# struct_size of the ABI 5 kvh_namespace_spec (before the topology).
NAMESPACE_SPEC_V5_SIZE = _NamespaceSpec.topology.offset

_CompressedPage = struct(
    "_CompressedPage", "u64 handle, i32 tier, str codec, "
    "u64 calibration_fingerprint, ptr data, size size",
    "kvh_compressed_page; arrays freed with kvh_compressed_pages_free.")
_TransformResult = struct(
    "_TransformResult", "u64 input_tokens, u64 output_tokens, u64 bytes_written")
_HostFetchStats = struct(
    "_HostFetchStats", "u64 shm_fetches, u64 shm_pages, u64 fallbacks, "
    "u64 checksum_mismatches, u64 connects")
_ClusterOptions = struct(
    "_ClusterOptions", "size struct_size, str members, str dns, str etcd, "
    "str etcd_prefix, i64 member_timeout_ms, i64 retry_down_after_ms, "
    "Connect* client", "kvh_cluster_options (ABI 5).", Connect=_ConnectOptions)
_Calibration = struct(
    "_Calibration", "ptr codec, ptr bytes, size num_bytes, u64 fingerprint",
    "kvh_calibration; freed with kvh_calibration_free.")
_MatchResult = struct(
    "_MatchResult", "u64 lease_id, i64 lease_expires_unix_ms, "
    "u64 matched_tokens, u64 page_bytes, u64 num_pages")
_InsertResult = struct(
    "_InsertResult",
    "u64 already_present_tokens, u32 pages_stored, u32 pages_evicted")
_FetchSource = struct(
    "_FetchSource", "u64 lease_id, u32 start_page, u32 page_count, "
    "u64* handles, size num_handles")
_FetchResult = struct(
    "_FetchResult", "u32 num_pages, u64 page_bytes, u64 bytes_written")
_EvictResult = struct("_EvictResult", "u64 pages_evicted, u64 bytes_freed")


_c = ctypes
_P = ctypes.POINTER
_VP = ctypes.c_void_p
_CP = ctypes.c_char_p
_I64 = ctypes.c_int64
_U64 = ctypes.c_uint64
_SZ = ctypes.c_size_t
_I32P = _P(ctypes.c_int32)
_U64P = _P(ctypes.c_uint64)
_STRP = _P(ctypes.c_void_p)  # char** out: freed with kvh_string_free

_SIGNATURES = {
    "kvh_version": (_CP, []),
    "kvh_abi_version": (_c.c_int, []),
    "kvh_last_error_code": (_c.c_int, []),
    "kvh_last_error_message": (_CP, []),
    "kvh_string_free": (None, [_VP]),
    "kvh_connect": (_c.c_int, [_CP, _I64, _P(_VP)]),
    "kvh_wait_connected": (_c.c_int, [_VP, _I64]),
    "kvh_close": (None, [_VP]),
    "kvh_namespace_create": (_c.c_int, [_VP, _CP, _P(_Geometry), _U64, _CP,
                                        _c.c_int, _I64, _P(_c.c_int), _STRP]),
    "kvh_namespace_describe": (_c.c_int, [_VP, _CP, _I64, _STRP]),
    "kvh_namespace_list": (_c.c_int, [_VP, _I64, _STRP]),
    "kvh_namespace_delete": (_c.c_int, [_VP, _CP, _c.c_int, _I64]),
    "kvh_match": (_c.c_int, [_VP, _CP, _VP, _SZ, _c.c_int, _I64, _U64P, _SZ,
                             _P(_MatchResult), _I64]),
    "kvh_release": (_c.c_int, [_VP, _U64, _I64]),
    "kvh_extend_lease": (_c.c_int, [_VP, _U64, _I64, _P(_I64), _I64]),
    "kvh_insert": (_c.c_int, [_VP, _CP, _VP, _SZ, _VP, _SZ, _U64,
                              _P(_InsertResult), _I64]),
    "kvh_insert_pages": (_c.c_int, [_VP, _CP, _VP, _SZ, _P(_VP), _SZ, _U64,
                                    _P(_InsertResult), _I64]),
    "kvh_fetch": (_c.c_int, [_VP, _CP, _P(_FetchSource), _c.c_int, _VP, _SZ,
                             _P(_FetchResult), _I64]),
    "kvh_fetch_pages": (_c.c_int, [_VP, _CP, _P(_FetchSource), _c.c_int,
                                   _P(_VP), _SZ, _U64, _P(_FetchResult), _I64]),
    "kvh_evict_pages": (_c.c_int, [_VP, _CP, _U64P, _SZ, _P(_EvictResult), _I64]),
    "kvh_evict_bytes": (_c.c_int, [_VP, _CP, _U64, _P(_EvictResult), _I64]),
    "kvh_evict_all": (_c.c_int, [_VP, _CP, _P(_EvictResult), _I64]),
    "kvh_stats": (_c.c_int, [_VP, _CP, _I64, _STRP]),
    "kvh_dump_tree": (_c.c_int, [_VP, _CP, _c.c_uint32, _I64, _STRP, _U64P]),
    # ABI 2
    "kvh_namespace_create_spec": (_c.c_int, [_VP, _P(_NamespaceSpec), _c.c_int,
                                             _I64, _P(_c.c_int), _STRP]),
    "kvh_match_tiers": (_c.c_int, [_VP, _CP, _VP, _SZ, _c.c_int, _I64, _U64P,
                                   _I32P, _SZ, _P(_MatchResult), _I64]),
    "kvh_demote": (_c.c_int, [_VP, _CP, _c.c_int, _U64P, _I64]),
    "kvh_get_calibration": (_c.c_int, [_VP, _CP, _I64, _P(_Calibration)]),
    "kvh_calibration_free": (None, [_P(_Calibration)]),
    # ABI 3
    "kvh_connect_with": (_c.c_int, [_CP, _P(_ConnectOptions), _P(_VP)]),
    # ABI 4 (the layout struct is kvharbor.layout._KvLayout)
    "kvh_gpu_transfers": (_c.c_int, []),
    "kvh_fetch_to_layout": (_c.c_int, [_VP, _CP, _U64, _c.c_uint32, _I32P,
                                       _SZ, _VP, _P(_I64), _SZ, _c.c_int,
                                       _U64, _I64, _STRP]),
    "kvh_insert_from_layout": (_c.c_int, [_VP, _CP, _VP, _SZ, _VP, _P(_I64),
                                          _SZ, _U64, _P(_InsertResult), _I64,
                                          _STRP]),
    # ABI 5
    "kvh_get_calibration_fp": (_c.c_int, [_VP, _CP, _U64, _I64,
                                          _P(_Calibration)]),
    "kvh_upload_calibration": (_c.c_int, [_VP, _CP, _VP, _SZ, _c.c_int, _U64P,
                                          _I64]),
    "kvh_list_calibrations": (_c.c_int, [_VP, _CP, _I64, _STRP]),
    "kvh_pin_calibration": (_c.c_int, [_VP, _CP, _U64, _c.c_int, _I64]),
    "kvh_fetch_compressed": (_c.c_int, [_VP, _CP, _P(_FetchSource),
                                        _P(_P(_CompressedPage)), _P(_SZ),
                                        _I64]),
    "kvh_compressed_pages_free": (None, [_P(_CompressedPage), _SZ]),
    "kvh_decode_page": (_c.c_int, [_VP, _CP, _P(_CompressedPage), _VP, _SZ,
                                   _U64P, _I64]),
    "kvh_fetch_transformed": (_c.c_int, [_VP, _CP, _P(_FetchSource), _c.c_int,
                                         _VP, _SZ, _P(_TransformResult),
                                         _I64]),
    "kvh_get_host_handles": (_c.c_int, [_VP, _CP, _U64, _I64, _STRP]),
    "kvh_get_device_handles": (_c.c_int, [_VP, _CP, _U64, _I64, _STRP]),
    "kvh_get_host_fetch_stats": (_c.c_int, [_VP, _P(_HostFetchStats)]),
    "kvh_cluster_connect": (_c.c_int, [_P(_ClusterOptions), _P(_VP)]),
    "kvh_cluster_close": (None, [_VP]),
    "kvh_cluster_create_namespace": (_c.c_int, [_VP, _P(_NamespaceSpec),
                                                _I64]),
    "kvh_cluster_owner": (_c.c_int, [_VP, _CP, _VP, _SZ, _I64, _STRP]),
    "kvh_cluster_match": (_c.c_int, [_VP, _CP, _VP, _SZ, _c.c_int, _I64,
                                     _U64P, _SZ, _P(_MatchResult), _STRP,
                                     _I64]),
    "kvh_cluster_fetch": (_c.c_int, [_VP, _CP, _CP, _P(_FetchSource), _VP,
                                     _SZ, _P(_FetchResult), _I64]),
    "kvh_cluster_release": (_c.c_int, [_VP, _CP, _U64, _I64]),
    "kvh_cluster_lookup": (_c.c_int, [_VP, _CP, _VP, _SZ, _VP, _SZ,
                                      _P(_MatchResult), _STRP, _I64]),
    "kvh_cluster_insert": (_c.c_int, [_VP, _CP, _VP, _SZ, _VP, _SZ, _U64,
                                      _P(_InsertResult), _P(_c.c_int), _STRP,
                                      _I64]),
    "kvh_cluster_status": (_c.c_int, [_VP, _c.c_int, _STRP]),
    # ABI 5: the engine API (its structs are in kvharbor.engine)
    "kvh_match_seq": (_c.c_int, [_VP, _CP, _VP, _c.c_int, _I64, _U64P, _I32P,
                                 _SZ, _P(_MatchResult), _I64]),
    "kvh_insert_seq": (_c.c_int, [_VP, _CP, _VP, _VP, _VP, _SZ, _U64,
                                  _P(_InsertResult), _I64]),
    "kvh_insert_seq_pages": (_c.c_int, [_VP, _CP, _VP, _VP, _P(_VP), _SZ, _U64,
                                        _P(_InsertResult), _I64]),
    "kvh_fetch_layers": (_c.c_int, [_VP, _CP, _P(_FetchSource), _c.c_uint32,
                                    _c.c_uint32, _VP, _SZ, _P(_FetchResult),
                                    _I64]),
    "kvh_fetch_pages_layers": (_c.c_int, [_VP, _CP, _P(_FetchSource),
                                          _c.c_uint32, _c.c_uint32, _P(_VP),
                                          _SZ, _U64, _P(_FetchResult), _I64]),
    "kvh_begin_insert": (_c.c_int, [_VP, _CP, _VP, _VP, _I64, _P(_VP)]),
    "kvh_upload_info": (_c.c_int, [_VP, _P(_c.c_uint32), _P(_c.c_uint32),
                                   _U64P, _P(_c.c_uint32)]),
    "kvh_upload_send_layer": (_c.c_int, [_VP, _c.c_uint32, _VP, _SZ]),
    "kvh_upload_send_layer_pieces": (_c.c_int, [_VP, _c.c_uint32, _P(_VP),
                                                _P(_SZ), _SZ]),
    "kvh_upload_send_layer_from_layout": (_c.c_int, [_VP, _c.c_uint32, _VP,
                                                     _P(_I64), _SZ]),
    "kvh_upload_commit": (_c.c_int, [_VP, _P(_InsertResult)]),
    "kvh_upload_abort": (None, [_VP]),
    "kvh_upload_free": (None, [_VP]),
    # ABI 6
    "kvh_insert_from_layout_with": (_c.c_int, [_VP, _CP, _VP, _SZ, _VP,
                                               _P(_I64), _SZ,
                                               _P(_LayoutInsertOptions),
                                               _P(_InsertResult), _I64,
                                               _STRP]),
}

# Functions an older library may lack (its kvh_abi_version() is lower): the
# package still loads, and calling one raises UnimplementedError (need()).
_SINCE_ABI = {
    "kvh_namespace_create_spec": 2,
    "kvh_match_tiers": 2,
    "kvh_demote": 2,
    "kvh_get_calibration": 2,
    "kvh_calibration_free": 2,
    "kvh_connect_with": 3,
    "kvh_gpu_transfers": 4,
    "kvh_fetch_to_layout": 4,
    "kvh_insert_from_layout": 4,
}
_SINCE_ABI.update({name: 5 for name in (
    "kvh_get_calibration_fp", "kvh_upload_calibration",
    "kvh_list_calibrations", "kvh_pin_calibration", "kvh_fetch_compressed",
    "kvh_compressed_pages_free", "kvh_decode_page", "kvh_fetch_transformed",
    "kvh_get_host_handles", "kvh_get_device_handles",
    "kvh_get_host_fetch_stats", "kvh_cluster_connect", "kvh_cluster_close",
    "kvh_cluster_create_namespace", "kvh_cluster_owner", "kvh_cluster_match",
    "kvh_cluster_fetch", "kvh_cluster_release", "kvh_cluster_lookup",
    "kvh_cluster_insert", "kvh_cluster_status", "kvh_match_seq",
    "kvh_insert_seq", "kvh_insert_seq_pages", "kvh_fetch_layers",
    "kvh_fetch_pages_layers", "kvh_begin_insert", "kvh_upload_info",
    "kvh_upload_send_layer", "kvh_upload_send_layer_pieces",
    "kvh_upload_send_layer_from_layout", "kvh_upload_commit",
    "kvh_upload_abort", "kvh_upload_free")})
_SINCE_ABI["kvh_insert_from_layout_with"] = 6


class NativeHandle:
    """The life of an object holding a library handle (kvharbor.Client,
    kvharbor.ClusterClient): close() frees it once, through the library
    function named by ``_FREE`` (closing twice, or from two threads, frees
    it once), the object is a context manager and closes when collected,
    and _h() raises InvalidArgumentError naming ``_WHAT`` once closed."""

    _FREE = ""
    _WHAT = ""
    _handle = None
    _close_lock = threading.Lock()  # closes are rare: one lock for all

    def close(self):
        with NativeHandle._close_lock:
            handle, self._handle = self._handle, None
        if handle is not None:
            getattr(library(), self._FREE)(handle)

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
            raise invalid(self._WHAT, "is closed")
        return handle


def library():
    """The loaded libkvharbor_c (ctypes.CDLL), loading it on first use."""
    global _lib
    with _lock:
        if _lib is None:
            tried = []
            for path in _candidates():
                tried.append(path)
                if os.path.isfile(path):
                    lib = ctypes.CDLL(path)
                    for name, (restype, argtypes) in _SIGNATURES.items():
                        if name in _SINCE_ABI and not hasattr(lib, name):
                            continue
                        fn = getattr(lib, name)
                        fn.restype = restype
                        fn.argtypes = argtypes
                    _lib = lib
                    break
            if _lib is None:
                raise OSError(
                    f"{_LIB_NAME} not found (set KVHARBOR_LIB); tried: "
                    + ", ".join(tried))
        return _lib


def need(name):
    """The library function ``name``; UnimplementedError when the loaded
    library is older than the ABI that added it."""
    lib = library()
    fn = getattr(lib, name, None)
    if fn is None:
        raise error_for(12, f"{name}: libkvharbor_c (ABI {lib.kvh_abi_version()}) "
                        f"lacks it; it needs ABI {_SINCE_ABI.get(name, '?')}")
    return fn


def check(rc):
    """Raises the KvHarborError of a non-zero status code."""
    if rc != 0:
        lib = library()
        message = lib.kvh_last_error_message() or b""
        raise error_for(rc, message.decode("utf-8", "replace"))


def take_string(ptr):
    """The text of a library-allocated char* (then frees it)."""
    if not ptr:
        return ""
    try:
        return ctypes.string_at(ptr).decode("utf-8", "replace")
    finally:
        library().kvh_string_free(ptr)


# ---- Buffers ----

_PyBuffer = struct(
    "_PyBuffer", "ptr buf, ptr obj, ssize len, ssize itemsize, int readonly, "
    "int ndim, str format, ptr shape, ptr strides, ptr suboffsets, "
    "ptr internal")


_PyBUF_WRITABLE = 0x0001
_PyBUF_FORMAT = 0x0004
_PyBUF_C_CONTIGUOUS = 0x0038
_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_release_buffer.restype = None


def _is_torch_tensor(obj):
    return (hasattr(obj, "data_ptr") and hasattr(obj, "is_contiguous")
            and hasattr(obj, "element_size") and hasattr(obj, "device"))


class Buffer:
    """Pointer and size of a C-contiguous buffer, held for a ``with`` block.

    ``field`` names the argument in errors. ``writable`` requires memory the
    library may write (fetch destinations).
    """

    def __init__(self, obj, field, writable=False):
        self._view = None
        self._obj = obj
        self._write_back = None
        if _is_torch_tensor(obj):
            if not obj.is_contiguous():
                raise invalid(field, "tensor is not contiguous")
            if obj.device.type == "meta":
                raise invalid(field, "a meta tensor holds no data")
            if obj.device.type != "cpu":
                # Staged through host memory (pinned when CUDA is there):
                # copied in for reads, copied back to the tensor on release
                # for writes.
                pin = obj.device.type == "cuda"
                stage = obj.new_empty(obj.shape, device="cpu", pin_memory=pin)
                if writable:
                    self._write_back = (obj, stage)
                else:
                    stage.copy_(obj)
                obj = self._obj = stage
            self.ptr = obj.data_ptr()
            self.itemsize = obj.element_size()
            self.nbytes = obj.numel() * self.itemsize
            self.format = None
            return
        view = _PyBuffer()
        flags = _PyBUF_C_CONTIGUOUS | _PyBUF_FORMAT
        if writable:
            flags |= _PyBUF_WRITABLE
        try:
            _get_buffer(obj, ctypes.byref(view), flags)
        except (BufferError, TypeError, ValueError) as e:
            need = "a writable C-contiguous" if writable else "a C-contiguous"
            raise invalid(field, f"need {need} buffer ({type(obj).__name__}: {e})") from None
        self._view = view
        self.ptr = view.buf or 0
        self.nbytes = view.len
        self.itemsize = view.itemsize
        self.format = view.format.decode() if view.format else "B"

    def release(self):
        if self._view is not None:
            _release_buffer(ctypes.byref(self._view))
            self._view = None
        if self._write_back is not None:
            target, stage = self._write_back
            self._write_back = None
            target.copy_(stage)
        self._obj = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __del__(self):
        self.release()


@contextlib.contextmanager
def buffer_list(objs, field, writable=False, page_bytes=None):
    """Buffers of a list of objects (``field[i]`` in errors) and a C array
    of their pointers, released on exit: yields (buffers, pointers).
    ``page_bytes`` (0 = the first one's size) makes every buffer hold
    exactly that many bytes."""
    if not objs:
        raise invalid(field, "no buffer given")
    bufs = []
    try:
        for i, obj in enumerate(objs):
            bufs.append(Buffer(obj, f"{field}[{i}]", writable=writable))
        if page_bytes is not None:
            size = page_bytes or bufs[0].nbytes
            for i, b in enumerate(bufs):
                if b.nbytes != size:
                    raise invalid(f"{field}[{i}]",
                                  f"holds {b.nbytes} bytes, expected {size}")
        yield bufs, (ctypes.c_void_p * len(bufs))(*[b.ptr for b in bufs])
    finally:
        for b in bufs:
            b.release()
