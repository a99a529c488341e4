"""An engine's paged KV cache as per-layer K and V views, and the copies
between it and kvharbor pages (torch; CPU or CUDA tensors).

PagedKv holds, for each layer l of the engine's cache, a K view and a V view
of logical shape [num_blocks, block_size, num_kv_heads, head_dim]: any
strides, head_dim contiguous, views into the engine's own tensors (no copy).
Block b of every layer holds tokens [b * block_size, (b + 1) * block_size)
of some sequence, so a kvharbor page (page_size == block_size) is block b of
every layer. The constructors recognise vLLM's and SGLang's layouts:

- vLLM, per layer: [2, num_blocks, block_size, H, D] (FlashAttention, the
  K/V split first), [num_blocks, 2, block_size, H, D] (FlashInfer), or the
  packed [num_blocks, H, block_size, 2 * D] (K and V in the content dim);
- SGLang host pools (MHATokenToKVPoolHost.kv_buffer): layer_first
  [2, L, slots, H, D], page_first [2, slots, L, H, D], page_first_direct
  [2, pages, L, page, H, D] and page_head [2, pages, H, page, L, D].

layout() describes the views as a kvharbor.PagedKvLayout, into which the
library fetches pages (docs/hit_paths.md). gather copies pages out of the
cache in a namespace's page layout, restricted to a range of layers
[layer_begin, layer_end): KV_LAYER_TOKEN_HEAD_DIM pages are [2][layers]
[token][head][dim], LAYER_KV_TOKEN_HEAD_DIM pages [layers][2][token][head]
[dim] (what inserts send, the new pages only when the daemon appends).

fp8 caches: vLLM (--kv-cache-dtype fp8, fp8_e4m3, fp8_e5m2) and SGLang's
host pools allocate them as torch.uint8, so the bytes alone do not say
which fp8 format they hold; the engine's KV cache dtype does (fp8_kind).
E4M3 caches are stored as kvharbor's DType.FP8_E4M3 (1 byte, the format
the daemon's tiers and codecs read). E5M2 is refused, naming the engine's
field: kvharbord has no E5M2 dtype, and E5M2 bytes in an E4M3 namespace
would be decoded as E4M3 by a tier codec (wrong KV, silently).

Not thread-safe by itself: a PagedKv is read by the threads that copy
pages; the engine guarantees no block is written while it is copied.
"""

from ..errors import invalid
from ..types import DType, Geometry, PageLayout

_TORCH_DTYPES = {"bfloat16": DType.BF16, "float16": DType.FP16,
                 "float32": DType.FP32, "float8_e4m3fn": DType.FP8_E4M3}


def _torch():
    import torch  # noqa: PLC0415 (the integrations need torch; kvharbor does not)
    return torch


_NOT_FP8 = ("auto", "", "none", "bfloat16", "bf16", "float16", "fp16",
            "half", "float32", "float", "fp32")


def fp8_kind(kv_cache_dtype, field):
    """"e4m3" for an engine's fp8 E4M3 KV cache dtype (vLLM's "fp8" and
    "fp8_e4m3", torch.float8_e4m3fn), None for an unquantized one ("auto",
    "bfloat16", torch.float16, ...). InvalidArgumentError naming ``field``
    for E5M2 (see the module docstring), ROCm's fp8 (E4M3FNUZ: other bytes
    than E4M3FN for the same value) and any other kind."""
    name = str(kv_cache_dtype).replace("torch.", "").lower()
    if name in _NOT_FP8:
        return None
    if name in ("fp8", "fp8_e4m3", "float8_e4m3fn"):
        if getattr(_torch().version, "hip", None):
            raise invalid(field, f"{kv_cache_dtype}: on ROCm fp8 caches may "
                          "hold E4M3FNUZ, which kvharbor does not store")
        return "e4m3"
    if name in ("fp8_e5m2", "float8_e5m2"):
        raise invalid(field, f"{kv_cache_dtype}: fp8 E5M2 is not a dtype "
                      "kvharbord stores (its fp8 is E4M3, which its tier "
                      "codecs decode); use an E4M3 (fp8, fp8_e4m3) or an "
                      "unquantized KV cache")
    raise invalid(field, f"{kv_cache_dtype!r} is not a KV cache dtype kvharbor "
                  "stores (auto, bfloat16, float16, float32, fp8, fp8_e4m3)")


def dtype_of(tensor, field, fp8=None):
    """The kvharbor DType of a torch tensor, InvalidArgumentError naming
    ``field`` for any other dtype. ``fp8`` ("e4m3", from fp8_kind) says what
    a torch.uint8 tensor holds; a uint8 tensor without it is refused."""
    name = str(tensor.dtype).replace("torch.", "")
    if name == "uint8":
        if fp8 == "e4m3":
            return DType.FP8_E4M3
        raise invalid(field, f"dtype {tensor.dtype}: an fp8 cache allocated as "
                      "bytes needs the engine's KV cache dtype (fp8, fp8_e4m3) "
                      "to be stored")
    if name == "float8_e5m2":
        fp8_kind(name, field)  # raises, naming the field
    if name not in _TORCH_DTYPES:
        raise invalid(field, f"dtype {tensor.dtype} is not one kvharbor "
                      f"stores ({', '.join(_TORCH_DTYPES)}, or uint8 holding "
                      "fp8 E4M3)")
    return _TORCH_DTYPES[name]


def _is_tensor(x):
    return hasattr(x, "shape") and hasattr(x, "stride") and hasattr(x, "dtype")


class PagedKv:
    """Per-layer K and V views [num_blocks, block_size, H, D] of one
    engine's cache (see the module docstring)."""

    def __init__(self, k, v, *, field="kv_caches", fp8=None):
        if len(k) != len(v) or not k:
            raise invalid(field, f"{len(k)} K and {len(v)} V layers; need the "
                          "same non-zero number")
        first = k[0]
        for name, views in (("k", k), ("v", v)):
            for i, t in enumerate(views):
                where = f"{field}[{i}].{name}"
                if not _is_tensor(t) or t.dim() != 4:
                    raise invalid(where, "must be a 4-D tensor [blocks, "
                                  "block_size, kv_heads, head_dim]")
                if tuple(t.shape) != tuple(first.shape):
                    raise invalid(where, f"shape {tuple(t.shape)} differs from "
                                  f"layer 0's {tuple(first.shape)}")
                if t.dtype != first.dtype or t.device != first.device:
                    raise invalid(where, f"{t.dtype} on {t.device} differs from "
                                  f"layer 0's {first.dtype} on {first.device}")
                if t.stride(-1) != 1:
                    raise invalid(where, "head_dim must be contiguous")
        self.k, self.v = list(k), list(v)
        self.num_blocks, self.block_size, self.num_kv_heads, self.head_dim = (
            int(x) for x in first.shape)
        self.dtype = dtype_of(first, field, fp8)
        self.torch_dtype = first.dtype
        self.device = first.device

    @property
    def num_layers(self):
        return len(self.k)

    def geometry(self, layout=PageLayout.KV_LAYER_TOKEN_HEAD_DIM,
                 rope_theta=0.0) -> Geometry:
        """The namespace geometry of pages of this cache."""
        return Geometry(self.num_layers, self.num_kv_heads, self.head_dim,
                        self.block_size, self.dtype, layout, rope_theta)

    # ---- Constructors ----
    @classmethod
    def from_vllm(cls, kv_caches, num_kv_heads=None, head_size=None,
                  fp8=None):
        """vLLM's per-layer tensors (a list in layer order, or the dict of
        register_kv_caches, whose order is the model's): 5-D [2, blocks,
        block, H, D] or [blocks, 2, block, H, D], or 4-D packed [blocks, H,
        block, 2 * D] (``head_size`` tells D; without it D = last dim / 2).
        ``fp8``: fp8_kind of vLLM's cache_config.cache_dtype (uint8 caches)."""
        layers = list(kv_caches.values()) if isinstance(kv_caches, dict) \
            else list(kv_caches)
        if not layers:
            raise invalid("kv_caches", "no layer given")
        k, v = [], []
        for i, t in enumerate(layers):
            field = f"kv_caches[{i}]"
            if not _is_tensor(t):
                raise invalid(field, f"must be a tensor, got {type(t).__name__}")
            if t.dim() == 5 and t.shape[0] == 2:  # FlashAttention
                k.append(t[0])
                v.append(t[1])
            elif t.dim() == 5 and t.shape[1] == 2:  # FlashInfer
                k.append(t[:, 0])
                v.append(t[:, 1])
            elif t.dim() == 4:  # packed K|V in the content dim
                d = head_size or t.shape[-1] // 2
                if t.shape[-1] != 2 * d:
                    raise invalid(field, f"packed K|V of {t.shape[-1]} is not "
                                  f"2 * head_size ({d})")
                k.append(t[..., :d].transpose(1, 2))
                v.append(t[..., d:].transpose(1, 2))
            else:
                raise invalid(field, f"shape {tuple(t.shape)} is none of vLLM's "
                              "[2, blocks, block, H, D], [blocks, 2, block, H, "
                              "D] or [blocks, H, block, 2 * D]")
            if num_kv_heads is not None and k[-1].shape[2] != num_kv_heads:
                raise invalid(field, f"{k[-1].shape[2]} KV heads, the model has "
                              f"{num_kv_heads} per rank")
        return cls(k, v, fp8=fp8)

    @classmethod
    def from_sglang_host(cls, kv_buffer, layout, page_size, fp8=None):
        """An SGLang MHA host pool's kv_buffer in one of its layouts; block b
        is host slots [b * page_size, (b + 1) * page_size). ``fp8``: fp8_kind
        of the device pool's dtype (fp8 pools store uint8)."""
        torch = _torch()
        t = kv_buffer
        if not _is_tensor(t) or t.shape[0] != 2:
            raise invalid("kv_buffer", "must be a tensor [2, ...] (K, V)")
        dims = {"layer_first": 5, "page_first": 5, "page_first_direct": 6,
                "page_head": 6}
        if dims.get(layout) != t.dim():
            raise invalid("kv_buffer", f"shape {tuple(t.shape)} is not SGLang's "
                          f"'{layout}' host layout (layouts: {', '.join(dims)})")
        if layout in ("layer_first", "page_first"):
            slots = t.shape[2] if layout == "layer_first" else t.shape[1]
            if slots % page_size:
                raise invalid("kv_buffer", f"{slots} slots are not a whole "
                              f"number of pages of {page_size}")
            shape = (slots // page_size, page_size) + tuple(t.shape[3:])
        if layout == "layer_first":  # [2, L, slots, H, D]
            views = [[t[kv, l].view(shape) for l in range(t.shape[1])]
                     for kv in range(2)]
        elif layout == "page_first":  # [2, slots, L, H, D]
            views = [[torch.as_strided(
                t, shape,
                (page_size * t.stride(1), t.stride(1), t.stride(3), t.stride(4)),
                t.storage_offset() + kv * t.stride(0) + l * t.stride(2))
                for l in range(t.shape[2])] for kv in range(2)]
        elif layout == "page_first_direct":  # [2, pages, L, page, H, D]
            views = [[t[kv, :, l] for l in range(t.shape[2])] for kv in range(2)]
        else:  # page_head: [2, pages, H, page, L, D]
            views = [[t[kv, :, :, :, l].transpose(1, 2)
                      for l in range(t.shape[4])] for kv in range(2)]
        return cls(views[0], views[1], field="kv_buffer", fp8=fp8)

    # ---- Copies ----
    def block_index(self, block_ids, field="block_ids"):
        """block_ids as an int64 tensor on this cache's device, each checked
        against num_blocks (InvalidArgumentError naming field[i])."""
        torch = _torch()
        ids = [int(b) for b in block_ids]
        for i, b in enumerate(ids):
            if not 0 <= b < self.num_blocks:
                raise invalid(f"{field}[{i}]", f"block {b} is outside the "
                              f"cache's {self.num_blocks} blocks")
        index = torch.tensor(ids, dtype=torch.int64)
        if self.device.type != "cuda":
            return index.to(self.device)
        # torch.tensor(..., device="cuda") copies from pageable memory and
        # waits for the stream (every kernel queued before it, e.g. the
        # forward so far); from pinned memory the copy is queued instead.
        return index.pin_memory().to(self.device, non_blocking=True)

    def _layers(self, layer_begin, layer_end):
        end = self.num_layers if layer_end is None else layer_end
        if not 0 <= layer_begin < end <= self.num_layers:
            raise invalid("layer_begin", f"[{layer_begin}, {end}) is not within "
                          f"the cache's {self.num_layers} layers")
        return range(layer_begin, end)

    def page_shape(self, layout, num_layers):
        """Shape of one page of ``num_layers`` layers in ``layout``."""
        inner = (self.block_size, self.num_kv_heads, self.head_dim)
        if int(layout) == PageLayout.LAYER_KV_TOKEN_HEAD_DIM:
            return (num_layers, 2) + inner
        return (2, num_layers) + inner

    def _slot(self, pages, layout, kv, j):
        """pages[:, kv, j] in the KV-first layout, pages[:, j, kv] otherwise."""
        if int(layout) == PageLayout.LAYER_KV_TOKEN_HEAD_DIM:
            return pages[:, j, kv]
        return pages[:, kv, j]

    def gather(self, block_ids, layout=PageLayout.KV_LAYER_TOKEN_HEAD_DIM,
               layer_begin=0, layer_end=None, out=None):
        """The pages of ``block_ids`` (layers [layer_begin, layer_end)) as a
        tensor [n, *page_shape] on this cache's device, or copied into
        ``out`` (any device, e.g. pinned host memory)."""
        layers = self._layers(layer_begin, layer_end)
        ids = self.block_index(block_ids)
        torch = _torch()
        shape = (len(ids),) + self.page_shape(layout, len(layers))
        pages = torch.empty(shape, dtype=self.torch_dtype, device=self.device)
        for j, l in enumerate(layers):
            self._slot(pages, layout, 0, j).copy_(self.k[l].index_select(0, ids))
            self._slot(pages, layout, 1, j).copy_(self.v[l].index_select(0, ids))
        if out is None:
            return pages
        out.view(shape).copy_(pages)
        return out

    def layout(self, layer_begin=0, layer_end=None):
        """The layers [layer_begin, layer_end) as a kvharbor.PagedKvLayout
        (the C ABI's engine layout): fetch_to_layout writes pages straight
        into these views (the library's scatter; on the GPU for CUDA
        tensors)."""
        import kvharbor  # noqa: PLC0415 (the package this module belongs to)
        layers = self._layers(layer_begin, layer_end)
        k = [self.k[l] for l in layers]
        t = k[0]
        device = -1 if self.device.type == "cpu" else (self.device.index or 0)
        return kvharbor.PagedKvLayout(
            k, [self.v[l] for l in layers], self.num_blocks, t.stride(0),
            t.stride(1), t.stride(2), self.dtype, device, layers.start,
            num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
            block_size=self.block_size)

    def empty_pages(self, n, layout=PageLayout.KV_LAYER_TOKEN_HEAD_DIM,
                    num_layers=None, pin=None):
        """A contiguous host tensor for ``n`` pages (pinned when this cache
        is on a GPU, so copies to and from it can be asynchronous)."""
        torch = _torch()
        shape = (n,) + self.page_shape(layout, num_layers or self.num_layers)
        if pin is None:
            pin = self.device.type == "cuda"
        return torch.empty(shape, dtype=self.torch_dtype, pin_memory=pin)

    def gather_layer(self, block_ids, layer):
        """One layer of the pages of ``block_ids`` in the layer-major order of
        an Insert by layer: per page, K then V, [n, 2, block, H, D]."""
        return self.gather(block_ids, PageLayout.LAYER_KV_TOKEN_HEAD_DIM,
                           layer, layer + 1)
