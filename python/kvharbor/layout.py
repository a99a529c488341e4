"""An engine's paged KV cache as a fetch destination or insert source.

``PagedKvLayout`` describes where each (layer, K or V, block, token, head)
row of an engine's KV cache lives, so that ``Lease.fetch_to_layout`` writes
fetched pages straight into it (on the GPU for CUDA tensors: the library's
scatter kernel, no copy through CPU memory) and ``Client.insert_from_layout``
reads pages out of it. Page i of a call fills block ``block_ids[i]`` of every
layer the layout holds; a block holds a namespace page's tokens
(``block_size`` == the namespace's ``page_size``). Within a (layer, K or V)
block the dimension order is [token][kv_head][head_dim], head_dim contiguous,
the other strides in elements (docs/hit_paths.md).

Tensors are taken by duck typing (``data_ptr()``, ``stride()``, ``shape``,
``dtype``, ``device``, ``element_size()``): PyTorch CUDA or CPU tensors work
and the package never imports torch. The layout keeps references to them,
and records how many bytes each addresses, which the library checks, so a
layout never writes outside its tensors. Plain int addresses are accepted
too (then nothing can be checked but the addresses' alignment and, for GPU
memory, that they are device memory of ``device``).
"""

import ctypes

from ._native import struct
from .errors import invalid
from .types import DType

HOST = -1  # PagedKvLayout.device of host memory

_TORCH_DTYPES = {
    "torch.bfloat16": DType.BF16,
    "torch.float16": DType.FP16,
    "torch.float32": DType.FP32,
    "torch.float8_e4m3fn": DType.FP8_E4M3,
}


_KvLayout = struct(
    "_KvLayout", "size struct_size, i32 dtype, i32 device, u32 layer_begin, "
    "u32 num_layers, u64* k, u64* v, u64* k_bytes, u64* v_bytes, "
    "u32 num_kv_heads, u32 head_dim, u32 block_size, u64 num_blocks, "
    "i64 block_stride, i64 token_stride, i64 head_stride",
    "kvh_kv_layout (ABI 4); struct_size = ctypes.sizeof(_KvLayout).")


def _is_tensor(obj):
    return all(hasattr(obj, a) for a in ("data_ptr", "stride", "shape",
                                          "dtype", "device", "element_size"))


def _device_of(t):
    dev = t.device
    if getattr(dev, "type", str(dev)) == "cpu":
        return HOST
    index = getattr(dev, "index", None)
    return 0 if index is None else int(index)


def _dtype_of(t, field, declared=None):
    """The DType of tensor ``t``. A torch.uint8 tensor is taken as the
    layout's declared FP8_E4M3: engines allocate fp8 caches as bytes (vLLM's
    --kv-cache-dtype fp8, SGLang's fp8 host pools)."""
    name = str(t.dtype)
    if name == "torch.uint8" and declared == DType.FP8_E4M3:
        return declared
    if name not in _TORCH_DTYPES:
        raise invalid(field, f"tensor dtype {name} is not bf16, fp16, fp32 "
                      "or float8_e4m3fn")
    return _TORCH_DTYPES[name]


def _extent_bytes(shape, strides, element_size):
    """Bytes from element 0 to one past the last element of a strided view."""
    if any(int(s) == 0 for s in shape):
        return 0
    last = sum((int(n) - 1) * int(st) for n, st in zip(shape, strides))
    return (last + 1) * element_size


def _tensors(tensors, field, ndim):
    """A non-empty list of tensors of `ndim` dims, one dtype, one device,
    one shape and strides; returns (tensors, dtype, device)."""
    if isinstance(tensors, (str, bytes)) or not hasattr(tensors, "__len__"):
        raise invalid(field, "must be a list of tensors (one per layer)")
    tensors = list(tensors)
    if not tensors:
        raise invalid(field, "must not be empty")
    first = tensors[0]
    for i, t in enumerate(tensors):
        f = f"{field}[{i}]"
        if not _is_tensor(t):
            raise invalid(f, f"must be a tensor, got {type(t).__name__}")
        if len(t.shape) != ndim:
            raise invalid(f, f"has shape {tuple(t.shape)}, need {ndim} dims")
        if int(t.stride()[-1]) != 1:
            raise invalid(f, "head_dim (the last dim) must be contiguous")
        if tuple(t.shape) != tuple(first.shape) or \
                tuple(t.stride()) != tuple(first.stride()):
            raise invalid(f, "shape and strides differ from layer 0's")
        if str(t.dtype) != str(first.dtype):
            raise invalid(f, f"dtype {t.dtype} differs from layer 0's")
        if _device_of(t) != _device_of(first):
            raise invalid(f, f"on {t.device}, layer 0 on {first.device}")
    return tensors, _dtype_of(first, f"{field}[0]"), _device_of(first)


def _positive(value, field):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise invalid(field, f"must be a positive int, got {value!r}")
    return value


def _matching_kv(keys, values, kfield, vfield, ndim):
    """Per-layer K and V tensors that agree in count, shape, strides, dtype
    and device: (ks, vs, dtype, device)."""
    ks, dtype, device = _tensors(keys, kfield, ndim)
    vs, vdtype, vdevice = _tensors(values, vfield, ndim)
    if len(vs) != len(ks) or tuple(vs[0].shape) != tuple(ks[0].shape) or \
            tuple(vs[0].stride()) != tuple(ks[0].stride()):
        raise invalid(vfield, f"must match {kfield} (layers, shape, strides)")
    if vdtype != dtype or vdevice != device:
        raise invalid(vfield, f"dtype or device differs from {kfield}")
    return ks, vs, dtype, device


def _blocks(page_size, slots, unit):
    """(page_size checked, whole pages in `slots`), at least one."""
    page = _positive(page_size, "page_size")
    blocks = slots // page
    if blocks < 1:
        raise invalid("page_size", f"{page} is more than the {slots} {unit}")
    return page, blocks


class PagedKvLayout:
    """Per layer K and V bases, strides (in elements), dtype and device.

    ``k`` / ``v``: per layer a tensor or an int address of element 0 of that
    layer's K (V) cache. ``device``: CUDA ordinal, or -1 for host memory.
    ``layer_begin``: the namespace layer ``k[0]`` holds (layer ranges).
    ``num_kv_heads``, ``head_dim`` and ``block_size`` default to the
    namespace's (0). Prefer the constructors below for engine layouts.
    """

    def __init__(self, k, v, num_blocks, block_stride, token_stride,
                 head_stride, dtype, device=HOST, layer_begin=0, *,
                 num_kv_heads=0, head_dim=0, block_size=0):
        try:
            self.dtype = DType(dtype)
        except ValueError:
            raise invalid("dtype", f"unknown DType {dtype!r}") from None
        if isinstance(device, bool) or not isinstance(device, int) or \
                device < HOST:
            raise invalid("device", f"must be a CUDA ordinal or -1, got {device!r}")
        self.device = device
        self.num_blocks = _positive(num_blocks, "num_blocks")
        self.block_stride = _positive(block_stride, "block_stride")
        self.token_stride = _positive(token_stride, "token_stride")
        self.head_stride = _positive(head_stride, "head_stride")
        if not isinstance(layer_begin, int) or layer_begin < 0:
            raise invalid("layer_begin", f"must be an int >= 0, got {layer_begin!r}")
        self.layer_begin = layer_begin
        for name, value in (("num_kv_heads", num_kv_heads),
                            ("head_dim", head_dim), ("block_size", block_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise invalid(name, f"must be an int >= 0, got {value!r}")
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim
        self.block_size = block_size
        self._keep = []  # tensors the addresses point into
        self.k, self.k_bytes = self._bases(k, "k")
        self.v, self.v_bytes = self._bases(v, "v")
        if len(self.v) != len(self.k):
            raise invalid("v", f"{len(self.v)} layers, k has {len(self.k)}")

    def _bases(self, items, field):
        if isinstance(items, (str, bytes)) or not hasattr(items, "__len__"):
            raise invalid(field, "must be a list (one entry per layer)")
        if len(items) == 0:
            raise invalid(field, "must not be empty")
        addresses, sizes = [], []
        for i, item in enumerate(items):
            f = f"layout.{field}[{i}]"
            if _is_tensor(item):
                if _device_of(item) != self.device:
                    raise invalid(f, f"tensor on {item.device}, but "
                                  f"device is {self.device}")
                if _dtype_of(item, f, self.dtype) != self.dtype:
                    raise invalid(f, f"tensor dtype {item.dtype}, but dtype "
                                  f"is {self.dtype.name}")
                self._keep.append(item)
                addresses.append(int(item.data_ptr()))
                sizes.append(_extent_bytes(item.shape, item.stride(),
                                           int(item.element_size())))
            elif isinstance(item, int) and not isinstance(item, bool):
                if not 0 < item < 2**64:
                    raise invalid(f, f"address {item} out of range")
                addresses.append(item)
                sizes.append(0)
            else:
                raise invalid(f, f"must be a tensor or an int address, got "
                              f"{type(item).__name__}")
        return addresses, sizes

    @property
    def num_layers(self):
        return len(self.k)

    @classmethod
    def _from_bases(cls, k, v, k_bytes, v_bytes, tensors, **kw):
        layout = cls(k, v, **kw)
        layout.k_bytes, layout.v_bytes = list(k_bytes), list(v_bytes)
        layout._keep = list(tensors)
        return layout

    # ---- Engine layouts ----
    @classmethod
    def _per_layer(cls, ks, vs, dtype, device, page_size, unit, token_axis,
                   head_axis, layer_begin):
        """Separate K and V tensors per layer, all of one shape whose last
        dimension is D; blocks of page_size along `token_axis` (`unit`)."""
        t = ks[0]
        page, blocks = _blocks(page_size, int(t.shape[token_axis]), unit)
        s, es = [int(x) for x in t.stride()], int(t.element_size())
        size = _extent_bytes(t.shape, s, es)
        return cls._from_bases(
            [int(x.data_ptr()) for x in ks], [int(x.data_ptr()) for x in vs],
            [size] * len(ks), [size] * len(vs), ks + vs,
            num_blocks=blocks, block_stride=page * s[token_axis],
            token_stride=s[token_axis], head_stride=s[head_axis], dtype=dtype,
            device=device, layer_begin=layer_begin,
            num_kv_heads=int(t.shape[head_axis]), head_dim=int(t.shape[-1]),
            block_size=page)

    @classmethod
    def from_vllm(cls, kv_caches, layer_begin=0):
        """vLLM: per layer a [2, num_blocks, block_size, H, D] tensor."""
        return cls._kv_in_one(kv_caches, 0, layer_begin)

    @classmethod
    def from_vllm_flashinfer(cls, kv_caches, layer_begin=0):
        """vLLM with FlashInfer: per layer [num_blocks, 2, block_size, H, D]."""
        return cls._kv_in_one(kv_caches, 1, layer_begin)

    @classmethod
    def _kv_in_one(cls, kv_caches, kv_axis, layer_begin):
        """Per layer one 5-dim tensor holding K and V along `kv_axis` (0 or 1)
        and the blocks along the other of dims 0 and 1, then
        [block_size, H, D]."""
        ts, dtype, device = _tensors(kv_caches, "kv_caches", 5)
        t = ts[0]
        if int(t.shape[kv_axis]) != 2:
            raise invalid("kv_caches[0]",
                          f"shape {tuple(t.shape)}: dim {kv_axis} must be 2 (K, V)")
        blocks_axis = 1 - kv_axis
        s, es = [int(x) for x in t.stride()], int(t.element_size())
        shape = [int(t.shape[blocks_axis])] + [int(x) for x in t.shape[2:]]
        sub = _extent_bytes(shape, [s[blocks_axis]] + s[2:], es)
        return cls._from_bases(
            [int(x.data_ptr()) for x in ts],
            [int(x.data_ptr()) + s[kv_axis] * es for x in ts],
            [sub] * len(ts), [sub] * len(ts), ts,
            num_blocks=int(t.shape[blocks_axis]), block_stride=s[blocks_axis],
            token_stride=s[2], head_stride=s[3], dtype=dtype, device=device,
            layer_begin=layer_begin, num_kv_heads=int(t.shape[3]),
            head_dim=int(t.shape[4]), block_size=int(t.shape[2]))

    @classmethod
    def from_sglang(cls, k_buffers, v_buffers, page_size, layer_begin=0):
        """SGLang layer-first: per layer K and V [slots, H, D]; block b is
        slots [b * page_size, (b + 1) * page_size)."""
        ks, vs, dtype, device = _matching_kv(k_buffers, v_buffers,
                                             "k_buffers", "v_buffers", 3)
        return cls._per_layer(ks, vs, dtype, device, page_size, "slots",
                              token_axis=0, head_axis=1,
                              layer_begin=layer_begin)

    @classmethod
    def from_sglang_page_first(cls, kv_buffer, page_size, num_layers,
                               layer_begin=0):
        """SGLang page-first: one [2, slots, num_layers, H, D] tensor."""
        (t,), dtype, device = _tensors([kv_buffer], "kv_buffer", 5)
        if int(t.shape[0]) != 2:
            raise invalid("kv_buffer", f"shape {tuple(t.shape)}: dim 0 must be 2 (K, V)")
        layers = _positive(num_layers, "num_layers")
        if int(t.shape[2]) != layers:
            raise invalid("num_layers", f"{layers}, but kv_buffer holds {int(t.shape[2])}")
        page, blocks = _blocks(page_size, int(t.shape[1]), "slots")
        s, es = [int(x) for x in t.stride()], int(t.element_size())
        base = int(t.data_ptr())
        total = _extent_bytes(t.shape, s, es)
        k = [base + l * s[2] * es for l in range(layers)]
        v = [base + (s[0] + l * s[2]) * es for l in range(layers)]
        return cls._from_bases(
            k, v, [total - (a - base) for a in k], [total - (a - base) for a in v],
            [t], num_blocks=blocks, block_stride=page * s[1],
            token_stride=s[1], head_stride=s[3], dtype=dtype, device=device,
            layer_begin=layer_begin, num_kv_heads=int(t.shape[3]),
            head_dim=int(t.shape[4]), block_size=page)

    @classmethod
    def from_dense(cls, keys, values, page_size, layer_begin=0):
        """A dense cache (HF DynamicCache layers): per layer K and V
        [1, H, S, D]; block b is tokens [b * page_size, (b + 1) * page_size)."""
        ks, vs, dtype, device = _matching_kv(keys, values, "keys", "values", 4)
        if int(ks[0].shape[0]) != 1:
            raise invalid("keys[0]", f"shape {tuple(ks[0].shape)}: batch must be 1")
        return cls._per_layer(ks, vs, dtype, device, page_size, "tokens",
                              token_axis=2, head_axis=1,
                              layer_begin=layer_begin)

    def _as_c(self):
        """(kvh_kv_layout, the arrays it points to)."""
        n = len(self.k)
        arrays = [(ctypes.c_uint64 * n)(*a) for a in
                  (self.k, self.v, self.k_bytes, self.v_bytes)]
        c = _KvLayout()
        c.struct_size = ctypes.sizeof(_KvLayout)
        c.dtype, c.device = int(self.dtype), self.device
        c.layer_begin, c.num_layers = self.layer_begin, n
        c.k, c.v, c.k_bytes, c.v_bytes = [
            ctypes.cast(a, ctypes.POINTER(ctypes.c_uint64)) for a in arrays]
        c.num_kv_heads, c.head_dim = self.num_kv_heads, self.head_dim
        c.block_size, c.num_blocks = self.block_size, self.num_blocks
        c.block_stride, c.token_stride = self.block_stride, self.token_stride
        c.head_stride = self.head_stride
        return c, arrays

    def __repr__(self):
        return (f"PagedKvLayout(layers=[{self.layer_begin}, "
                f"{self.layer_begin + len(self.k)}), blocks={self.num_blocks}, "
                f"strides=({self.block_stride}, {self.token_stride}, "
                f"{self.head_stride}), dtype={self.dtype.name}, "
                f"device={self.device})")
