"""What a scheduler's requests decode on: one batch-major state (a row per slot), the batch's cache, its poll,
and the iteration (every step of the program for the first `size` slots, then the publish) as one call,
run eagerly, compiled, or replayed from a CUDA graph."""
from __future__ import annotations

from typing import Callable

from ..model.dual_mode import KVCache
from .graphs import CapturedIteration
from .poll import Poll
from .request import Request

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
    """A batch of `slots` rows: the state, the cache ([layers, slots, ...]), the poll and the iterations."""

    def __init__(self, runtime, program, slots: int, shape: Shape, cache: KVCache, tokens: int):
        self.runtime, self.program, self.shape, self.cache = runtime, program, shape, cache
        self.tokens = tokens            # prompt + new tokens a request may have
        one = program.new_state(Request([], shape.max_new, 0, [], []), **shape.kwargs())
        shape.out_len = one.out.shape[1]             # the program's padding
        self.state = type(one).cat([one] * slots)
        self.state.done.fill_(True)                  # idle slots: their rows ride along, changing nothing
        # A joining request's first table carries its prefill's token, its entry iteration's (Linear-SS) and
        # one batch iteration's: at most 2B + 1 tokens.
        self.poll = Poll(runtime.model.device, 2 * program.block + 1, slots)
        self.clock = Clock()
        self.shared_cache = True                     # on the runtime's shared cache (set by Runtime.hold)
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
        steps = self.program.shapes[shape] if hasattr(self.program, "shapes") else self.program.steps
        runners = [runtime.runner(step, st, cache, self.clock) for step in steps]

        def iteration(runs) -> Callable[[], None]:
            def run_all() -> None:
                for run in runs:
                    run()
                self.poll.publish(st)
            return CapturedIteration(run_all) if runtime.mode == "graph" else run_all

        full = iteration(runners)
        entry = getattr(self.program, "entry", 0)
        return (full if entry == 0 else iteration(runners[entry:])), full

    def iterate(self, first: bool, shape: int = 0) -> None:
        """One iteration in call shape `shape`; the batch's first starts at the program's `entry` step
        (Linear-SS: its prefills drafted already, so the first iteration only verifies, and no draft call
        follows the last one)."""
        key = (self.size, shape)
        if key not in self._iterations:
            self._iterations[key] = self._build(self.size, shape)
        self._iterations[key][0 if first else 1]()

    def move(self, src: int, dst: int) -> None:
        """The request in slot `src` continues in slot `dst` (device copies); `src` is left done."""
        self.state.move(src, dst)
        self.cache.k[:, dst].copy_(self.cache.k[:, src])
        self.cache.v[:, dst].copy_(self.cache.v[:, src])
        self.poll.move(src, dst)
        self.state.done[src].fill_(True)

    def take(self, other: "Batch", src: int, dst: int) -> None:
        """The request in slot `src` of `other`, a batch of the same state shapes, continues in slot `dst` of this
        one (device copies: a batch that grows, in slots or in cache length)."""
        self.state.slot(dst).copy_(other.state.slot(src))
        n = min(self.cache.capacity, other.cache.capacity)       # a batch with a longer cache: the old length
        self.cache.k[:, dst, :, :n].copy_(other.cache.k[:, src, :, :n])
        self.cache.v[:, dst, :, :n].copy_(other.cache.v[:, src, :, :n])
        self.poll.start[dst].copy_(other.poll.start[src])
