"""The engine's K/V memory: per layer, one pool of fixed-size pages that requests take a page at a time, and the
prefix cache over it (vLLM's block pool and prefix caching, DESIGN §14).

A request's cache positions live in the pages its row of a page table names (model/dual_mode.KVCache); page 0 is
the null page, named by every unused entry. The pool is made once, at its full size, when the runtime first
needs it (so captured iterations see fixed addresses); its memory is left uninitialised, and a page is zeroed
the first time it is handed out (on the CPU, untouched pages stay unallocated, so an engine's memory follows the
tokens it has held). Everything here is host bookkeeping but those two tensors.

Prefix cache: a full page whose tokens are final is published under the hash of its tokens chained to the hash
of the page before it (`page_hashes`). A request whose prompt starts with published pages shares them (by
reference count) and prefills only the rest; a page nobody holds stays published on an LRU list and is evicted
only when a fresh page is needed and no free one is left. A pool serves one model in one dtype, and a drafting
adapter writes no committed K/V (its rows are scratch), so the tokens alone key a page.
"""
from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch


def pages_for(positions: int, page_size: int) -> int:
    """Pages that hold `positions` cache positions."""
    return -(-positions // page_size)


def page_hashes(tokens: list[int], page_size: int) -> list[bytes]:
    """The chained hash of every full page of `tokens`: page i's covers tokens[: (i + 1) * page_size]."""
    hashes, parent = [], b""
    for end in range(page_size, len(tokens) + 1, page_size):
        parent = hashlib.sha256(parent + np.asarray(tokens[end - page_size:end], dtype=np.int64).tobytes()).digest()
        hashes.append(parent)
    return hashes


@dataclass(frozen=True)
class KVUsage:
    """What the K/V pool holds now, and what its prefix cache did so far (Engine.kv_usage)."""
    pages: int            # in the pool, the null page not counted
    page_size: int        # cache positions per page
    page_bytes: int       # K and V of one page, every layer
    held: int              # pages some request holds
    cached: int            # pages published in the prefix cache (held or idle)
    queried_tokens: int    # prompt tokens looked up in the prefix cache
    hit_tokens: int        # of those, found there (not prefilled)
    evictions: int         # published pages taken back for fresh ones
    preemptions: int       # running requests that gave their pages back (and came back later)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0


class KVPool:
    """`pages` pages of `page_size` positions for `model` (page 0: the null page), their reference counts, and
    the published pages by hash. Counters for the metrics: `hit_tokens` / `queried_tokens` (prompt tokens found
    in / looked up in the prefix cache), `evictions`."""

    def __init__(self, model, pages: int, page_size: int):
        if pages < 2:
            raise ValueError(f"kv_cache_bytes must hold at least 2 pages of {page_size} positions (one is the null "
                             f"page), got room for {pages}")
        self.k, self.v = model.kv_pools(pages, page_size)
        self.pages, self.page_size = pages, page_size
        self._zeroed = np.zeros(pages, dtype=bool)
        self._zero([0])
        self._free = list(range(pages - 1, 0, -1))      # held by nobody, published under no hash: a stack, so
        #                                                  that the pages used last (their memory touched) go first
        self._refs = np.zeros(pages, dtype=np.int64)
        self._hash_of: dict[int, bytes] = {}
        self._page_of: dict[bytes, int] = {}
        self._idle: OrderedDict[int, None] = OrderedDict()   # published, held by nobody: least recently used first
        self.hit_tokens = self.queried_tokens = self.evictions = 0

    @property
    def page_bytes(self) -> int:
        return 2 * self.k[:, 0].numel() * self.k.element_size()

    @property
    def available(self) -> int:
        """Pages a request could take now: free ones and published ones nobody holds."""
        return len(self._free) + len(self._idle)

    @property
    def held(self) -> int:
        """Pages some request holds."""
        return self.pages - 1 - self.available

    def usage(self, preemptions: int) -> KVUsage:
        return KVUsage(self.pages - 1, self.page_size, self.page_bytes, self.held, len(self._hash_of),
                       self.queried_tokens, self.hit_tokens, self.evictions, preemptions)

    def take(self, n: int) -> list[int] | None:
        """`n` pages for one request (free ones first, then the least recently used idle published ones), or None
        (and nothing taken) when fewer are available."""
        if n == 0:
            return []
        if n > self.available:
            return None
        taken = [self._free.pop() if self._free else self._evict() for _ in range(n)]
        self._refs[taken] = 1
        self._zero(taken)
        return taken

    def release(self, pages: list[int]) -> None:
        """A request gives its pages back: published ones nobody else holds go to the idle list, the rest free."""
        for page in reversed(pages):                          # on the stack in order: taken again first to last
            self._refs[page] -= 1
            if self._refs[page] == 0:
                if page in self._hash_of:
                    self._idle[page] = None
                else:
                    self._free.append(page)

    def acquire(self, tokens: list[int], cacheable: int, positions: int) -> tuple[list[int], int] | None:
        """Pages for a request that needs `positions` cache positions now and whose first `cacheable` `tokens` may come
        from the prefix cache: the published pages of the longest run of its full pages there (held once more),
        then fresh ones; and how many tokens those published pages hold. None, holding nothing, when the pool
        has too few pages."""
        found = []
        for h in page_hashes(tokens[:cacheable], self.page_size):
            page = self._page_of.get(h)
            if page is None:
                break
            found.append(page)
        for page in found:                                   # held first, so that taking fresh ones keeps them
            self._refs[page] += 1
            self._idle.pop(page, None)
        fresh = self.take(max(0, pages_for(positions, self.page_size) - len(found)))
        if fresh is None:
            self.release(found)
            return None
        self.queried_tokens += cacheable
        self.hit_tokens += len(found) * self.page_size
        return found + fresh, len(found) * self.page_size

    def extend(self, pages: list[int], positions: int) -> list[int] | None:
        """Fresh pages to append to a request's `pages` so that they hold `positions` cache positions ([] when they do),
        or None (nothing taken) when the pool has too few."""
        return self.take(max(0, pages_for(positions, self.page_size) - len(pages)))

    def publish(self, pages: list[int], tokens: list[int]) -> None:
        """A request's `pages` hold the final K/V of `tokens` (its cache positions 0, 1, ...): each full page of them
        is published under its hash; a hash already published (another request computed the same page) keeps
        its page."""
        for page, h in zip(pages, page_hashes(tokens, self.page_size)):
            if h not in self._page_of and page not in self._hash_of:
                self._page_of[h], self._hash_of[page] = page, h

    def _evict(self) -> int:
        page, _ = self._idle.popitem(last=False)
        del self._page_of[self._hash_of.pop(page)]
        self.evictions += 1
        return page

    def _zero(self, pages: list[int]) -> None:
        fresh = [b for b in pages if not self._zeroed[b]]
        if fresh:
            index = torch.tensor(fresh, device=self.k.device)
            self.k.index_fill_(1, index, 0)
            self.v.index_fill_(1, index, 0)
            self._zeroed[fresh] = True


GPU_MEMORY_FRACTION = 0.8   # of the free memory when the pool is made (vLLM's gpu_memory_utilization, of the free)
CPU_POOL_BYTES = 4 << 30    # at most (vLLM's CPU default, VLLM_CPU_KVCACHE_SPACE), and a quarter of the host's memory


def pool_pages(model, page_size: int, most_tokens: int, kv_cache_bytes: int | None) -> int:
    """Pages of the pool: `kv_cache_bytes` worth (or the environment's PACKED_SS_KV_CACHE_BYTES), or by default
    GPU_MEMORY_FRACTION of the free GPU memory, or on a CPU the least of CPU_POOL_BYTES and a quarter of the host's
    memory (only the pages used are ever touched); at most `most_tokens` positions' worth."""
    k, _ = model.kv_pools(1, page_size)
    page_bytes = 2 * k.numel() * k.element_size()
    kv_cache_bytes = kv_cache_bytes or int(os.environ.get("PACKED_SS_KV_CACHE_BYTES", 0)) or None
    if kv_cache_bytes is None:
        device = torch.device(model.device)
        if device.type == "cuda":
            there = int(GPU_MEMORY_FRACTION * torch.cuda.mem_get_info(device)[0])
        else:
            there = min(CPU_POOL_BYTES, os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 4)
        kv_cache_bytes = min(there, pages_for(most_tokens, page_size) * page_bytes)
    return kv_cache_bytes // page_bytes
