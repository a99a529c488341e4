"""KV sample files (docs/kv_samples.md) from Python, with NumPy only: the
input of kvharbor-calibrate, written from a model's own cache, and a small
safetensors reader for checks against the C++ tools' output.

write_kv_samples takes k, v [tokens][layers][kv_heads][head_dim] as NumPy
arrays or torch tensors (float32, float16 or bfloat16, on any device; they
are copied to host memory) and positions [tokens]. Nothing is kept.
"""

import json
import struct

import numpy as np

_NP = {"F32": "<f4", "F16": "<f2", "I64": "<i8", "BF16": "<u2"}


def _host(a):
    """(safetensors dtype, contiguous little-endian NumPy array)."""
    if hasattr(a, "detach"):  # a torch tensor
        import torch
        t = a.detach().contiguous().cpu()
        if t.dtype == torch.bfloat16:
            return "BF16", t.view(torch.int16).numpy().view("<u2")
        a = t.numpy()
    a = np.asarray(a)
    kind = {np.dtype("float32"): "F32", np.dtype("float16"): "F16",
            np.dtype("int64"): "I64"}.get(a.dtype)
    if kind is None:
        raise ValueError(f"dtype {a.dtype} is not float32, float16, bfloat16 or int64")
    return kind, np.ascontiguousarray(a, dtype=_NP[kind])


def write_safetensors(path, tensors, metadata):
    """tensors: [(name, array or tensor)] in file order."""
    parts = [(name,) + _host(a) for name, a in tensors]
    header = {"__metadata__": dict(metadata)}
    off = 0
    for name, kind, a in parts:
        header[name] = {"dtype": kind, "shape": list(a.shape),
                        "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * (-len(hj) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for _, _, a in parts:
            f.write(a.tobytes())


def write_kv_samples(path, k, v, positions, rope_style, rope_theta=None,
                     keys_roped=True, **extra):
    """A KV sample file: k, v [T][L][H][D] (roped keys unless keys_roped is
    False), positions [T] (0 starts a sequence). rope_style: "none",
    "interleaved" or "half_split". `extra` goes to __metadata__ as strings
    (e.g. model=..., source=...)."""
    if tuple(k.shape) != tuple(v.shape) or len(k.shape) != 4:
        raise ValueError(f"k, v: shapes {tuple(k.shape)} and {tuple(v.shape)} "
                         "must be equal [tokens, layers, kv_heads, head_dim]")
    T, L, H, D = (int(x) for x in k.shape)
    meta = {"format": "kvharbor.kv_samples", "format_version": "1",
            "num_layers": str(L), "num_kv_heads": str(H), "head_dim": str(D),
            "rope_style": rope_style}
    if rope_style != "none":
        meta["rope_theta"] = repr(float(rope_theta))
        meta["keys_roped"] = "true" if keys_roped else "false"
    meta.update({key: str(val) for key, val in extra.items()})
    pos = np.asarray(positions, dtype=np.int64).reshape(T)
    write_safetensors(path, [("k", k), ("v", v), ("positions", pos)], meta)


def read_safetensors(path):
    """({name: NumPy array}, __metadata__) of a safetensors file (BF16 comes
    back as float32)."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack_from("<Q", data)[0]
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    out = {}
    for name, h in header.items():
        lo, hi = h["data_offsets"]
        a = np.frombuffer(data, dtype=_NP[h["dtype"]], count=(hi - lo)
                          // np.dtype(_NP[h["dtype"]]).itemsize, offset=8 + n + lo)
        if h["dtype"] == "BF16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        out[name] = a.reshape(h["shape"])
    return out, meta
