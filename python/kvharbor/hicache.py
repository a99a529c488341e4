"""An engine-facing adapter in the shape of SGLang's HiCache storage backend.

SGLang's HiCacheStorage (sglang/srt/mem_cache/hicache_storage.py) stores KV
pages under per-page keys and asks three batch questions: batch_exists(keys)
-> how many keys, from the first, are stored (the consecutive hit count);
batch_get(keys, target_locations) -> fill the engine's host buffers;
batch_set(keys, values) -> store pages. kvharbor indexes a page by its whole
token prefix (a radix tree), so a key here is a PageKey: page `index` of a
token sequence, made by page_keys(token_ids, page_size). Keys of one batch
must be consecutive pages of one sequence.

Page buffers are anything with the buffer protocol (or CPU torch tensors) of
exactly the namespace's page_bytes; they move without copies. The adapter is
as thread-safe as the Client under it: it keeps no mutable state.
"""

import dataclasses
from typing import List, Optional, Sequence

from .client import Client
from .errors import InvalidArgumentError, KvHarborError, invalid


class _TokenSequence:
    """The token ids of one prompt, shared by all of its PageKeys."""

    __slots__ = ("tokens", "page_size")

    def __init__(self, tokens, page_size):
        self.tokens = tuple(int(t) for t in tokens)
        self.page_size = page_size


@dataclasses.dataclass(frozen=True)
class PageKey:
    seq: _TokenSequence
    index: int  # page number within seq

    def prefix_tokens(self):
        """Token ids from the sequence start through this page."""
        return self.seq.tokens[: (self.index + 1) * self.seq.page_size]


def page_keys(token_ids: Sequence[int], page_size: int) -> List[PageKey]:
    """One key per whole page of ``token_ids`` (a partial last page has none)."""
    if page_size <= 0:
        raise invalid("page_size", "must be > 0")
    seq = _TokenSequence(token_ids, page_size)
    return [PageKey(seq, i) for i in range(len(seq.tokens) // page_size)]


class KvHarborHiCacheStorage:
    """HiCache-style storage on a kvharbor namespace."""

    def __init__(self, client: Client, namespace: str, timeout=None):
        self.client = client
        self.namespace = namespace
        self.timeout = timeout
        info = client.describe_namespace(namespace, timeout=timeout)
        self.page_size = info.geometry.page_size
        self.page_bytes = info.stats.page_bytes or info.geometry.page_bytes

    def page_keys(self, token_ids):
        return page_keys(token_ids, self.page_size)

    def _check_keys(self, keys):
        if not keys:
            raise invalid("keys", "must not be empty")
        first = keys[0]
        for i, k in enumerate(keys):
            if not isinstance(k, PageKey):
                raise invalid(f"keys[{i}]", f"must be a PageKey, got {type(k).__name__}")
            if k.seq is not first.seq or k.index != first.index + i:
                raise invalid(f"keys[{i}]", "keys must be consecutive pages of one sequence")
            if k.seq.page_size != self.page_size:
                raise invalid(f"keys[{i}]", f"page_size {k.seq.page_size} != "
                              f"namespace page_size {self.page_size}")
        return first.index, keys[-1].prefix_tokens()

    # ---- HiCacheStorage interface ----
    def batch_exists(self, keys: Sequence[PageKey]) -> int:
        """How many of ``keys``, from the first, are stored."""
        start, tokens = self._check_keys(keys)
        lease = self.client.match(self.namespace, tokens, timeout=self.timeout)
        return max(0, min(lease.num_pages, start + len(keys)) - start)

    def exists(self, key: PageKey) -> bool:
        return self.batch_exists([key]) == 1

    def batch_get(self, keys: Sequence[PageKey],
                  target_locations: Optional[Sequence] = None) -> List:
        """Per key: its page (written into target_locations[i] when given,
        else a new bytearray) while keys hit, then None."""
        start, tokens = self._check_keys(keys)
        if target_locations is not None and len(target_locations) != len(keys):
            raise invalid("target_locations", f"has {len(target_locations)} "
                          f"entries for {len(keys)} keys")
        out = [None] * len(keys)
        with self.client.match(self.namespace, tokens, lock=True,
                               timeout=self.timeout) as lease:
            hits = max(0, min(lease.num_pages, start + len(keys)) - start)
            if hits == 0:
                return out
            dsts = (list(target_locations[:hits]) if target_locations is not None
                    else [bytearray(self.page_bytes) for _ in range(hits)])
            lease.fetch_into(dsts, start_page=start, page_count=hits)
        out[:hits] = dsts
        return out

    def get(self, key: PageKey, target_location=None):
        targets = None if target_location is None else [target_location]
        return self.batch_get([key], targets)[0]

    def batch_set(self, keys: Sequence[PageKey], values: Sequence) -> bool:
        """Stores the pages of ``keys``. Pages before keys[0] must be stored
        already: the daemon inserts whole prefixes, so the adapter fetches
        them back to send them along (deduplicated by the daemon). False when
        that prefix is missing or the daemon cannot store the pages."""
        start, tokens = self._check_keys(keys)
        if values is None or len(values) != len(keys):
            raise invalid("values", f"need one page per key ({len(keys)})")
        pages = list(values)
        try:
            if start > 0:
                prefix = tokens[: start * self.page_size]
                with self.client.match(self.namespace, prefix, lock=True,
                                       timeout=self.timeout) as lease:
                    if lease.num_pages < start:
                        return False
                    head = bytearray(start * self.page_bytes)
                    lease.fetch_into(head)
                view = memoryview(head)
                pages = [view[i * self.page_bytes:(i + 1) * self.page_bytes]
                         for i in range(start)] + pages
            self.client.insert(self.namespace, tokens, pages,
                               page_bytes=self.page_bytes, timeout=self.timeout)
        except InvalidArgumentError:
            raise
        except KvHarborError:
            return False
        return True

    def set(self, key: PageKey, value) -> bool:
        return self.batch_set([key], [value])
