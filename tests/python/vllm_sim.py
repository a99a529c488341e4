"""A replay of the calls vLLM makes on a KV connector, around real torch
paged caches, for tests/python/test_vllm_connector.py.

The sequence follows vLLM at commit 003df2961dd8 (kvharbor.integrations.
vllm.VLLM_COMMIT):
- v1/core/sched/scheduler.py Scheduler.schedule(): for a waiting request
  with nothing computed, the local prefix-cache lookup, then
  connector.get_num_new_matched_tokens(request, block-aligned local hit),
  allocate_slots, connector.update_state_after_alloc(request,
  kv_cache_manager.get_blocks(request_id), num_external_computed_tokens);
  the SchedulerOutput (scheduled_new_reqs with block_ids and
  num_computed_tokens, scheduled_cached_reqs with new_block_ids and
  num_computed_tokens, num_scheduled_tokens, finished_req_ids), then
  connector.build_connector_meta(scheduler_output);
- Scheduler._free_request -> connector.request_finished(request,
  block_ids[0]); blocks are freed at once unless it returns True, then when
  a worker reports the request in finished_sending;
- v1/worker/kv_connector_model_runner_mixin.py _get_kv_connector_output:
  bind_connector_metadata, start_load_kv, the forward, wait_for_save,
  get_finished(scheduler_output.finished_req_ids) (through
  get_transfer_results in newer commits), get_block_ids_with_load_errors,
  clear_connector_metadata;
- the attention layer: wait_for_kv_layer_from_connector(layer) before and
  maybe_save_kv_layer_to_connector(layer, kv_cache) after each layer's
  attention.

The "model" writes each computed token's K and V as a function of the
token's whole prefix (as a transformer's are), so a loaded block holds the
right bytes only if it came from the same prefix; the runner checks every
block it reads before computing. Block ids a worker reports as failed are
recomputed, as vLLM's "recompute" load-failure policy does.
"""

import dataclasses
import os
import types
from typing import Dict, List, Optional, Sequence

import torch

BLOCK = 4
# The caches' device: KVHARBOR_TEST_DEVICE=cuda on the GPU machine
# (scripts/gpu_checks.sh), the CPU otherwise.
DEVICE = torch.device(os.environ.get("KVHARBOR_TEST_DEVICE", "cpu"))


def kv_value(prefix_hash, pos, layer, kv, heads, dim, head_offset=0,
             dtype=torch.float32):
    """K (kv 0) or V (kv 1) of one token: [heads, dim] of ``dtype``
    (uint8: fp8 bytes as vLLM allocates fp8 caches, every byte a function of
    the prefix, layer and head)."""
    base = ((prefix_hash * 1000003 + pos * 97 + layer * 13 + kv * 7) % 65521)
    h = torch.arange(head_offset, head_offset + heads,
                     dtype=torch.float32).view(-1, 1)
    d = torch.arange(dim, dtype=torch.float32).view(1, -1)
    if dtype == torch.uint8:
        return ((base + h * 31 + d * 7) % 256).to(torch.uint8)
    return ((base % 251) / 251.0 + h * 0.125 + d / 64.0).to(dtype)


def prefix_hashes(tokens):
    out, h = [], 0
    for t in tokens:
        h = (h * 31 + t + 1) % 2**61
        out.append(h)
    return out


class Request:
    """The attributes of vllm.v1.request.Request the connector reads."""

    def __init__(self, request_id, prompt, max_new_tokens):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt)
        self.all_token_ids = list(prompt)
        self.num_computed_tokens = 0
        self.max_new_tokens = max_new_tokens
        self.output = []

    @property
    def block_hashes(self):
        """Chained hashes of whole blocks, bytes (vLLM's BlockHash)."""
        hashes = prefix_hashes(self.all_token_ids)
        n = len(self.all_token_ids) // BLOCK
        return [hashes[(i + 1) * BLOCK - 1].to_bytes(32, "little")
                for i in range(n)]


class Blocks:
    """KVCacheBlocks: get_block_ids() -> one list per KV cache group."""

    def __init__(self, ids):
        self.ids = ids

    def get_block_ids(self):
        return (list(self.ids),)


@dataclasses.dataclass
class Worker:
    """One tensor-parallel rank of one pipeline stage: its paged cache (one
    tensor per layer of the stage, named by the model's layer index, in one
    of vLLM's layouts) and its connector worker side."""
    connector: object
    caches: Dict[str, torch.Tensor]
    layout: str
    heads: int
    head_offset: int
    layer_ids: Optional[Sequence[int]] = None  # the stage's layers; None: all

    def owns(self, layer):
        return self.layer_ids is None or layer in self.layer_ids

    def k_v(self, name):
        t = self.caches[name]
        if self.layout == "flash":      # [2, blocks, block, H, D]
            return t[0], t[1]
        if self.layout == "flashinfer":  # [blocks, 2, block, H, D]
            return t[:, 0], t[:, 1]
        d = t.shape[-1] // 2            # packed [blocks, H, block, 2D]
        return t[..., :d].transpose(1, 2), t[..., d:].transpose(1, 2)


def make_caches(layout, layers, blocks, heads, dim, dtype):
    """``layers``: a number (layers 0...) or the layer ids of a pipeline
    stage (vLLM names a stage's layers by their index in the model)."""
    shape = {"flash": (2, blocks, BLOCK, heads, dim),
             "flashinfer": (blocks, 2, BLOCK, heads, dim),
             "packed": (blocks, heads, BLOCK, 2 * dim)}[layout]
    ids = range(layers) if isinstance(layers, int) else layers
    return {f"model.layers.{l}.self_attn.attn":
            torch.zeros(shape, dtype=dtype, device=DEVICE) for l in ids}


class Engine:
    """vLLM's scheduler and model runner around a connector's two sides."""

    def __init__(self, scheduler_side, workers: List[Worker], layers, dim,
                 num_blocks, dtype=torch.float32, local_cache=False,
                 empty_step_skips_wait_for_save=False):
        """``empty_step_skips_wait_for_save``: the model runners of vLLM
        versions whose step without scheduled tokens (kv_connector_no_
        forward) calls start_load_kv and get_finished but not
        wait_for_save."""
        self.empty_step_skips_wait_for_save = empty_step_skips_wait_for_save
        self.sched = scheduler_side
        self.workers = workers
        self.layers, self.dim, self.dtype = layers, dim, dtype
        self.free = list(range(num_blocks))
        self.blocks: Dict[str, List[int]] = {}
        self.waiting: List[Request] = []
        self.running: List[Request] = []
        self.finished_req_ids = set()
        self.held = {}  # req_id -> blocks kept for an asynchronous save
        self.done: Dict[str, Request] = {}  # finished requests
        self.bad_reads = set()  # blocks read this step with wrong bytes
        self.computed_tokens = 0  # tokens the model computed, all requests
        self.load_errors = 0
        self.local_cache = local_cache
        self.local: Dict[tuple, int] = {}  # prefix of whole blocks -> block

    def add(self, request):
        self.waiting.append(request)

    # ---- Scheduler.schedule() ----
    def schedule(self, chunk):
        new_reqs, cached = [], types.SimpleNamespace(
            req_ids=[], resumed_req_ids=set(), new_token_ids=[],
            all_token_ids={}, new_block_ids=[], num_computed_tokens=[],
            num_output_tokens=[])
        num_scheduled = {}
        for req in list(self.running):
            n = min(chunk, len(req.all_token_ids) - req.num_computed_tokens)
            new = self._alloc(req, req.num_computed_tokens + n)
            cached.req_ids.append(req.request_id)
            cached.new_block_ids.append((new,) if new else None)
            cached.num_computed_tokens.append(req.num_computed_tokens)
            cached.num_output_tokens.append(len(req.output))
            num_scheduled[req.request_id] = n
        while self.waiting:
            req = self.waiting.pop(0)
            local = self._local_hit(req)
            ext, load_async = self.sched.get_num_new_matched_tokens(req, local)
            assert not load_async and ext % BLOCK == 0
            computed = local + ext
            n = min(chunk, len(req.all_token_ids) - computed)
            self._alloc(req, computed + n)
            self.sched.update_state_after_alloc(
                req, Blocks(self.blocks[req.request_id]), ext)
            req.num_computed_tokens = computed
            new_reqs.append(types.SimpleNamespace(
                req_id=req.request_id, prompt_token_ids=req.prompt_token_ids,
                block_ids=(list(self.blocks[req.request_id]),),
                num_computed_tokens=computed))
            num_scheduled[req.request_id] = n
            self.running.append(req)
        out = types.SimpleNamespace(
            scheduled_new_reqs=new_reqs, scheduled_cached_reqs=cached,
            num_scheduled_tokens=num_scheduled,
            total_num_scheduled_tokens=sum(num_scheduled.values()),
            finished_req_ids=set(self.finished_req_ids))
        self.finished_req_ids.clear()
        out.kv_connector_metadata = self.sched.build_connector_meta(out)
        return out

    def _local_hit(self, req):
        """vLLM's own prefix cache (block-aligned), when enabled."""
        if not self.local_cache:
            return 0
        ids, toks = [], req.all_token_ids
        for b in range((len(toks) - 1) // BLOCK):
            block = self.local.get(tuple(toks[:(b + 1) * BLOCK]))
            if block is None or block in self.free:
                break
            ids.append(block)
        if ids:
            self.blocks[req.request_id] = list(ids)
        return len(ids) * BLOCK

    def _alloc(self, req, tokens):
        have = self.blocks.setdefault(req.request_id, [])
        need = -(-tokens // BLOCK) - len(have)
        new = [self.free.pop(0) for _ in range(max(0, need))]
        have.extend(new)
        return new

    # ---- The model runner (one step) ----
    def execute(self, out):
        meta = out.kv_connector_metadata
        for w in self.workers:
            w.connector.start_load_kv(meta)
        empty = out.total_num_scheduled_tokens == 0
        skip_save = empty and self.empty_step_skips_wait_for_save
        for l in range(self.layers if not skip_save else 0):
            name = f"model.layers.{l}.self_attn.attn"
            for w in self.workers:
                if not w.owns(l):
                    continue
                w.connector.wait_for_layer_load(name)
                self._attention(w, l, name, out)
                w.connector.save_kv_layer(name, meta)
        errors, finished = set(), []
        for w in self.workers:
            if not skip_save:
                w.connector.wait_for_save(meta)
            sending, _ = w.connector.get_finished(out.finished_req_ids)
            finished.append(sending or set())
            errors |= w.connector.get_block_ids_with_load_errors()
        # vLLM discards what the forward computed from failed blocks; any
        # other block read with wrong bytes is a wrong answer.
        wrong = {b for b in self.bad_reads if b not in errors}
        self.bad_reads.clear()
        if wrong:
            raise AssertionError(f"blocks {sorted(wrong)} held other bytes and "
                                 "were not reported as load errors")
        return errors, set.intersection(*finished) if finished else set()

    def _attention(self, w, l, name, out):
        """Checks the layer's KV of every computed token of the scheduled
        requests (loaded or computed earlier), then writes the new tokens'."""
        k, v = w.k_v(name)
        for req in self.running:
            n = out.num_scheduled_tokens.get(req.request_id, 0)
            if n == 0:
                continue
            hashes = prefix_hashes(req.all_token_ids)
            ids = self.blocks[req.request_id]
            for pos in range(req.num_computed_tokens + n):
                b, off = ids[pos // BLOCK], pos % BLOCK
                for kv, cache in ((0, k), (1, v)):
                    want = kv_value(hashes[pos], pos, l, kv, w.heads, self.dim,
                                    w.head_offset, self.dtype).to(DEVICE)
                    if pos >= req.num_computed_tokens:
                        cache[b, off] = want
                    elif not torch.equal(cache[b, off], want):
                        self.bad_reads.add(b)

    # ---- Scheduler.update_from_output() ----
    def update(self, out, errors, finished_sending):
        for req_id in finished_sending:
            self.free.extend(self.held.pop(req_id))
        for req in list(self.running):
            n = out.num_scheduled_tokens.get(req.request_id, 0)
            ids = self.blocks[req.request_id]
            bad = [i for i, b in enumerate(ids) if b in errors]
            if bad:  # recompute from the first failed block
                self.load_errors += 1
                req.num_computed_tokens = min(req.num_computed_tokens,
                                              bad[0] * BLOCK)
                continue
            req.num_computed_tokens += n
            self.computed_tokens += n
            if self.local_cache:
                toks = req.all_token_ids
                for b in range(req.num_computed_tokens // BLOCK):
                    self.local.setdefault(tuple(toks[:(b + 1) * BLOCK]), ids[b])
            if req.num_computed_tokens < len(req.all_token_ids):
                continue
            if len(req.output) < req.max_new_tokens:  # sample one token
                token = (sum(req.all_token_ids) * 7 + 3) % 1000
                req.output.append(token)
                req.all_token_ids.append(token)
                if len(req.output) < req.max_new_tokens:
                    continue  # the last sampled token is never computed
            self.running.remove(req)
            self.done[req.request_id] = req
            self.finished_req_ids.add(req.request_id)
            delay, _ = self.sched.request_finished(req, list(ids))
            blocks = self.blocks.pop(req.request_id)
            if delay:
                self.held[req.request_id] = blocks
            elif not self.local_cache:
                self.free.extend(blocks)

    def run(self, chunk=8, max_steps=200):
        for _ in range(max_steps):
            if not (self.waiting or self.running or self.held):
                return
            out = self.schedule(chunk)
            errors, sending = self.execute(out)
            self.update(out, errors, sending)
        raise AssertionError("the engine did not finish its requests")
