"""What a scheduler's requests decode on: one batch-major state (a row per slot), the batch's page table into
the runtime's K/V pool (kv_pool.py), its poll, and the iteration (every step of the program for the first
`size` slots, then the publish) as one call, run eagerly, compiled, or replayed from a CUDA graph.

A slot's row of the table names pages only while its request takes part in the iterations: every other row
names the null page, so the anchors an idle row's calls write (idle rows ride along, changing no state) land
where no request reads."""
from __future__ import annotations

from typing import Callable

import torch

from ..model.dual_mode import KVCache
from .poll import Poll
from .request import Request
from .staging import staged

CACHE_QUANTUM = 256


def padded(slots: int) -> int:
    """The batch size a compiled or captured step runs at: the next power of two (the padding slots idle)."""
    return 1 << (slots - 1).bit_length()


class Clock:
    """Model-call time accumulated by a batch's eager calls."""

    def __init__(self):
        self.model_s = 0.0


class Shape:
    """Fixed shapes of a batch's state: output length and stop tables, sized up front for every request
    (`max_new` tokens at most: by default the requests' longest rounded up to a power of two, at least
    CACHE_QUANTUM, so that requests joining later fit; `out_len` is the output buffer, which the program may
    pad)."""

    def __init__(self, max_new: int, stop_slots: int, sequence_slots: tuple[int, int]):
        self.max_new, self.out_len, self.stop_slots, self.sequence_slots = max_new, max_new, stop_slots, sequence_slots

    @classmethod
    def for_requests(cls, requests: list[Request], max_new: int | None = None) -> "Shape":
        longest = max((len(s) for r in requests for s in r.stop_sequences), default=0)
        max_new = max_new or padded(max(CACHE_QUANTUM, *(r.max_new_tokens for r in requests)))
        return cls(max_new, max(8, *(len(r.stop_ids) for r in requests)),
                   (max(4, *(len(r.stop_sequences) for r in requests)), max(8, longest)))

    def kwargs(self) -> dict:
        return {"out_len": self.out_len, "stop_slots": self.stop_slots, "sequence_slots": self.sequence_slots}

    def fits(self, request: Request) -> bool:
        n_seq, seq_len = self.sequence_slots
        return (request.max_new_tokens <= self.max_new and len(request.stop_ids) <= self.stop_slots
                and len(request.stop_sequences) <= n_seq and all(len(s) <= seq_len for s in request.stop_sequences))


class Batch:
    """A batch of `slots` rows: the state, the page table ([slots, capacity / page_size] over the runtime's pool)
    with its host copy `pages` (each slot's pages, in order), the poll and the iterations."""

    def __init__(self, runtime, program, slots: int, shape: Shape, capacity: int):
        self.runtime, self.program, self.shape = runtime, program, shape
        self.pool = runtime.pool
        self.tokens = capacity - program.reserve      # prompt + new tokens a request may have
        self.table = torch.zeros(slots, -(-capacity // self.pool.page_size), dtype=torch.int64,
                                 device=runtime.model.device)
        self.pages: list[list[int]] = [[] for _ in range(slots)]
        self.cache = KVCache(self.pool.k, self.pool.v, self.table)
        one = program.new_state(Request([], shape.max_new, 0, [], []), **shape.kwargs())
        shape.out_len = one.out.shape[1]             # the program's padding
        self.state = type(one).cat([one] * slots)
        self.state.done.fill_(True)                  # idle slots: their rows ride along, changing nothing
        # A joining request's first table carries its prefill's token, its entry iteration's (Linear-SS) and
        # one batch iteration's: at most 2B + 1 tokens.
        self.poll = Poll(runtime.model.device, 2 * program.block + 1, slots)
        self.clock = Clock()
        self.size = 0                                # the first `size` slots take part in the calls
        self._iterations: dict[tuple[int, int], tuple[Callable[[], None], Callable[[], None]]] = {}

    @property
    def slots(self) -> int:
        return self.state.batch

    def fits(self, request: Request) -> bool:
        return self.shape.fits(request) and len(request.prompt) + request.max_new_tokens <= self.tokens

    @property
    def live(self):
        """The state of the slots that take part in the calls (views)."""
        return self.state.rows(0, self.size)

    def _build(self, size: int, shape: int):
        """(first, full) iterations over the first `size` slots: every step of call shape `shape` (a program
        with `shapes` offers several, each a list of steps; others have their `steps`), then the publish."""
        runtime, st = self.runtime, self.state.rows(0, size)
        cache = self.cache.rows(0, size)
        steps = self.program.shapes[shape]
        runners = [runtime.runner(step, st, cache, self.clock) for step in steps]

        def iteration(runs) -> Callable[[], None]:
            def run_all() -> None:
                for run in runs:
                    run()
                self.poll.publish(st)
            return runtime.executor.iteration(run_all)

        full = iteration(runners)
        entry = self.program.entry
        return (full if entry == 0 else iteration(runners[entry:])), full

    def iterate(self, first: bool, shape: int = 0) -> None:
        """One iteration in call shape `shape`; the batch's first starts at the program's `entry` step
        (Linear-SS: its prefills drafted already, so the first iteration only verifies, and no draft call
        follows the last one)."""
        key = (self.size, shape)
        if key not in self._iterations:
            self._iterations[key] = self._build(self.size, shape)
        self._iterations[key][0 if first else 1]()

    # -- pages ------------------------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        """Cache positions per request."""
        return self.cache.capacity

    def give(self, slot: int, pages: list[int]) -> None:
        """`pages` join the end of the slot's pages (its table row names them from the next call on)."""
        if not pages:
            return
        start = len(self.pages[slot])
        self.pages[slot] = self.pages[slot] + pages
        self.table[slot, start:start + len(pages)] = staged(torch.tensor(pages, dtype=torch.int64),
                                                             self.table.device)

    def free(self, slot: int) -> list[int]:
        """The slot's pages, which it no longer holds (its table row names the null page again)."""
        pages, self.pages[slot] = self.pages[slot], []
        self.table[slot].zero_()
        return pages

    def move(self, src: int, dst: int) -> None:
        """The request in slot `src` continues in slot `dst` (its state row and table row move; no K/V is
        copied); `src` is left done, naming no page."""
        self.state.move(src, dst)
        self.table[dst].copy_(self.table[src])
        self.pages[dst] = self.free(src)
        self.poll.move(src, dst)
        self.state.done[src].fill_(True)

    def take(self, other: "Batch", src: int, dst: int) -> None:
        """The request in slot `src` of `other`, a batch of the same state shapes, continues in slot `dst` of this
        one (a batch that grows, in slots or in cache length): its state row and table row are copied, its pages
        change hands, no K/V is copied."""
        self.state.slot(dst).copy_(other.state.slot(src))
        n = other.table.shape[1]
        self.table[dst, :n].copy_(other.table[src])
        self.pages[dst] = other.free(src)
        self.poll.start[dst].copy_(other.poll.start[src])
