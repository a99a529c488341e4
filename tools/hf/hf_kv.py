"""The glue between a Hugging Face transformers Llama and kvharbor's dense
layout: per-layer K/V tensors out of an HF cache after prefill, an HF cache
built around tensors kvharbor filled, and forward calls that work across
transformers 4.5x and 5.x.

HF's DynamicCache keeps, per layer, keys and values of shape
[batch][kv_heads][seq][head_dim] (cache.layers[i].keys / .values in 4.56+
and 5.x; cache.key_cache[i] / .value_cache[i] before). That is exactly what
kvharbor.PagedKvLayout.from_dense describes, so kvharbor can write fetched
pages straight into tensors the model then attends to.

cache_from_tensors builds a DynamicCache whose layers ARE views of the given
tensors (no copy): it opens each layer through the public update() with a
zero-length slice, then points the layer at the prefix view, and checks that
the cache reports the right length. Where a transformers version does not
allow that (no .layers), it falls back to update() with the whole prefix,
which copies; the second return value says which happened. The model's next
forward appends to the layer (DynamicLayer concatenates into new tensors),
so the given tensors are never written by the model.

Nothing here is thread-safe; tensors are the caller's.
"""

import torch


def layer_kv(cache):
    """[(keys, values)] per layer of an HF cache ([1][H][S][D] each)."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    if hasattr(cache, "key_cache"):
        return list(zip(cache.key_cache, cache.value_cache))
    return [(k, v) for k, v in cache]  # legacy tuple of tuples


def cache_from_tensors(config, keys, values, length):
    """(DynamicCache holding keys[l][:, :, :length] and values[l][...] for
    every layer, zero_copy). keys/values: per layer [1][H][capacity][D]."""
    from transformers import DynamicCache

    if len(keys) != len(values):
        raise ValueError(f"keys, values: {len(keys)} and {len(values)} layers")
    try:
        cache = DynamicCache(config=config)
    except TypeError:  # versions whose DynamicCache takes no config
        cache = DynamicCache()
    views = [(k[:, :, :length], v[:, :, :length]) for k, v in zip(keys, values)]
    for l, (k, v) in enumerate(views):
        cache.update(k[:, :, :0], v[:, :, :0], l)
    if hasattr(cache, "layers") and len(cache.layers) == len(views):
        for layer, (k, v) in zip(cache.layers, views):
            layer.keys, layer.values = k, v
        if cache.get_seq_length() == length:
            return cache, True
    try:
        cache = DynamicCache(config=config)
    except TypeError:
        cache = DynamicCache()
    for l, (k, v) in enumerate(views):
        cache.update(k, v, l)
    if cache.get_seq_length() != length:
        raise RuntimeError(f"DynamicCache reports {cache.get_seq_length()} "
                           f"tokens after loading {length}")
    return cache, False


def forward(model, ids, cache=None, last_only=False):
    """(logits [T][vocab] or, with last_only, [vocab] of the last token;
    the cache after the call). ids: LongTensor [T] on the model's device.
    last_only asks the model for the last position's logits only
    (logits_to_keep=1: a 32K prefill would otherwise materialise 32K x
    vocab logits)."""
    kwargs = {"input_ids": ids[None], "use_cache": True}
    if cache is not None:
        kwargs["past_key_values"] = cache
    if last_only:
        try:
            out = model(**kwargs, logits_to_keep=1)
        except TypeError:  # transformers < 4.50
            out = model(**kwargs, num_logits_to_keep=1)
        return out.logits[0, -1], out.past_key_values
    out = model(**kwargs)
    return out.logits[0], out.past_key_values


def llama_config(d, attn_implementation=None):
    """A LlamaConfig from a config.json-style dict (rope_theta and
    rope_scaling as hub checkpoints write them; transformers 5.x converts
    them to rope_parameters)."""
    from transformers import LlamaConfig

    cfg = LlamaConfig.from_dict(dict(d))
    if attn_implementation:
        try:
            cfg._attn_implementation = attn_implementation
        except Exception:  # noqa: BLE001 -- a version without the setter keeps its default
            pass
    return cfg


def rope_description(cfg):
    """What RoPE the built config uses, as transformers reports it."""
    params = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None)
    theta = getattr(cfg, "rope_theta", None)
    return f"rope_theta={theta} rope={params}"


def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
