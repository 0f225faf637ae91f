"""The decode loop both orders share: requests in a batch of slots, each a prefill call, then the program's
iterations, one model call per step for the whole batch, until the poll says every request is done.

The batch is one state (decode/state.py: every field has a leading batch dimension, a row per slot), so a
step is one batched input, one model call and one batched update whatever the batch size; a request's
prefill, its admission and its result work on its row (`state.slot(b)`, views).

Every iteration runs the program's steps (eagerly, compiled with torch.compile(fullgraph=True), or replayed
from a CUDA graph), publishes the status table on the device and queues its copy to the host; the host reads
one table per iteration (poll.py). A request that finishes frees its slot, and the next waiting request is
admitted there (its prefill runs alone): continuous batching. `decode` is a generator: it yields each
iteration's new tokens per request as the poll delivers them and returns the GenerateResults, so
`Engine.generate`, `Engine.stream` and `Engine.generate_batch` are the same loop.

Several decodes may run on one runtime at once (generators consumed in turn, threads): each runs on a cache
of its own (the runtime's shared one when no other decode holds it) and its own batch, and their iterations
take turns under the runtime's lock, released while a decode yields; a decode closed early releases what it
held. (Requests of different callers do not share a batch yet.)
"""
from __future__ import annotations

import contextlib
import math
import threading
import time
from collections import deque
from typing import Callable, Iterator

import torch

from ..model.dual_mode import DualModeModel, KVCache
from .graphs import CapturedIteration, SyncCheck
from .poll import Poll
from .program import ModelInput, Step
from .request import GenerateResult, Request

MODES = ("eager", "compile", "graph")
CACHE_QUANTUM = 256


class Runtime:
    """Runs programs on one model: the KV cache, the loop in one of MODES, and each program's batches."""

    def __init__(self, model: DualModeModel, attend, mode: str = "eager", compile_backend: str = "inductor",
                 max_seq_len: int | None = None):
        self.model, self.attend, self.mode, self.compile_backend = model, attend, mode, compile_backend
        self.max_seq_len = max_seq_len or model.cfg.max_seq_len
        self.model_s = 0.0                           # model-call time of the last decode (eager)
        self.iterations = self.slot_iterations = 0   # of the last decode, and the sum of its batch sizes
        self._cache: KVCache | None = None
        self._cache_held = False                      # a running decode holds the shared cache
        self._lock = threading.RLock()
        self._compiled: dict[int, tuple] = {}         # id(step) -> (step, its compiled call)
        self._batches: dict[tuple, _Batch] = {}       # (id(program), slots) -> persistent batch (graph mode)

    # -- the model call --------------------------------------------------------------------------------
    def forward(self, inp: ModelInput, cache: KVCache) -> torch.Tensor:
        return self.model(inp.tokens, inp.positions, inp.layout, cache, inp.cache_len, attend=self.attend)

    def _call(self, step: Step, st, cache: KVCache, clock: "_Clock | None") -> None:
        """One step for a batch `st` (the batch's state, or one request's row of it: a batch of one): one model
        call over every request's rows [B, R], one update from its logits [B, R, V]; model time counted on
        `clock` when given."""
        inp = step.inputs(st)
        t0 = time.perf_counter() if clock is not None else 0.0
        logits = self.forward(inp, cache)
        if clock is not None:
            clock.model_s += time.perf_counter() - t0
        step.update(st, logits)

    def _runner(self, step: Step, st, cache: KVCache, clock: "_Clock") -> Callable[[], None]:
        """The step as one function: timed eagerly, compiled whole, or plain (to be captured)."""
        if self.mode == "compile":
            if id(step) not in self._compiled:
                compiled = torch.compile(lambda state, kv: self._call(step, state, kv, None), fullgraph=True,
                                         backend=self.compile_backend)
                self._compiled[id(step)] = (step, compiled)
            compiled = self._compiled[id(step)][1]
            return lambda: compiled(st, cache)
        timed = clock if self.mode == "eager" else None
        return lambda: self._call(step, st, cache, timed)

    # -- the cache -------------------------------------------------------------------------------------
    def cache_for(self, capacity: int, slots: int = 1, private: bool = False) -> KVCache:
        """A view of the runtime's cache, [layers, slots, ...], with room for `capacity` slots per request
        (rounded up to CACHE_QUANTUM). The buffer only grows; a shorter request gets a shorter view, so the
        reference backend's attention cost follows this batch's length, not the longest so far. `private`: a
        new buffer of that size (for a decode that runs while another holds the shared one)."""
        capacity = CACHE_QUANTUM * math.ceil(capacity / CACHE_QUANTUM)
        if private:
            return self.model.new_cache(capacity, batch=slots)
        cache = self._cache
        if cache is None or cache.capacity < capacity or cache.k.shape[1] < slots:
            grown = max(capacity, cache.capacity if cache else 0), max(slots, cache.k.shape[1] if cache else 0)
            self._cache = cache = self.model.new_cache(grown[0], batch=grown[1])
        return KVCache(cache.k[:, :slots, :, :capacity], cache.v[:, :slots, :, :capacity])

    # -- the loop --------------------------------------------------------------------------------------
    def decode(self, program, requests: list[Request], slots: int = 1, stream: bool = False,
               on_finish: Callable[[int, GenerateResult], None] | None = None) -> Iterator[tuple[int, list[int]]]:
        """Decodes `requests` in up to `slots` at a time; returns their GenerateResults in order (and hands
        each to `on_finish` as its request ends). When `stream`, first yields (request index, tokens) as each
        iteration adds tokens to an output (they travel in the poll's table; otherwise each output is read
        once, when its request ends)."""
        if stream and len(requests) > slots:
            raise ValueError("streaming decodes every request in its own slot: slots >= len(requests)")
        with self._lock:
            batch = self._hold(program, requests, min(slots, len(requests)))
        try:
            return (yield from self._loop(program, batch, requests, stream, on_finish))
        finally:
            with self._lock:
                self._release(batch)

    def _loop(self, program, batch: "_Batch", requests: list[Request], stream: bool, on_finish):
        """decode()'s loop on a batch it holds: every section under the lock, which a yield releases."""
        poll, lock = batch.poll, self._lock
        batch.size = batch.state.batch
        waiting, results = deque(enumerate(requests)), [None] * len(requests)
        running: list[_Running | None] = [None] * batch.size
        iterations, slot_iterations, limit = 0, 0, sum(r.max_new_tokens + poll.lag + 3 for r in requests)   # >= 1 token per live one
        began_s = batch.clock.model_s
        caller_mode = torch.is_inference_mode_enabled()
        checked = SyncCheck() if SyncCheck.wanted(self.model.device) else contextlib.nullcontext()
        with torch.inference_mode():
            with lock:
                poll.reset(batch.state, stream or self.mode == "graph")   # a graph captures one kind of table: streaming
                for b in range(batch.size):
                    running[b] = self._admit(batch, b, waiting, poll, joining=False)
                poll.publish(batch.live)
                poll.issue()
            while any(running):
                with lock, checked:
                    status = poll.read() if poll.due else None
                    seen = [None if r is None or status is None else r.slot_at(status.seq) for r in running]
                    live = [r is not None and (b is None or not status.done[b]) for r, b in zip(running, seen)]
                    held = any(b is not None and status.hold[b] and not status.done[b] for b in seen)
                    if any(live) and not held:
                        iterations += 1
                        if iterations > limit:
                            raise RuntimeError("decoder made no progress; this is a bug")
                        slot_iterations += batch.size
                        batch.iterate(first=iterations == 1)
                        poll.issue()
                if status is None:
                    continue
                for slot, (r, b) in enumerate(zip(running, seen)):
                    if b is None:                               # idle, or admitted after this table
                        continue
                    if status.hold[b] and not status.done[b]:   # rare (any-order truncation; batches of one)
                        with lock:
                            while poll.in_flight:
                                poll.read()                     # iterations queued behind the hold were no-ops
                            program.resume(batch.state.slot(slot),
                                           lambda inp: self.forward(inp, batch.cache.rows(slot, slot + 1)))
                            poll.publish(batch.live)
                            poll.issue()
                    if stream and status.tokens[b]:
                        with torch.inference_mode(caller_mode):   # the consumer runs in its own mode
                            yield r.index, status.tokens[b]
                    if status.done[b]:
                        with lock:
                            results[r.index] = self._finish(program, batch.state.slot(slot), r, poll, batch)
                            running[slot] = self._admit(batch, slot, waiting, poll, joining=True)
                        if on_finish is not None:
                            on_finish(r.index, results[r.index])
                if not waiting:
                    with lock:
                        self._compact(batch, running, poll)
        self.iterations, self.slot_iterations = iterations, slot_iterations
        self.model_s = batch.clock.model_s - began_s
        return results

    def _compact(self, batch: "_Batch", running: list, poll: Poll) -> None:
        """Once nothing waits, finished requests' slots stop riding along: the running requests move to the
        front slots (state and cache copied on the device, at most once per finished request) and the batch
        shrinks to them (compiled and graph modes: to the next power of two, so few sizes are compiled or
        captured). A table already in flight is read with each request's slot at the time it was issued."""
        live = [b for b in range(batch.size) if running[b] is not None]
        size = len(live) if self.mode == "eager" else _padded(max(1, len(live)))
        if not live or size >= batch.size:
            return
        for slot, b in enumerate(live):
            if slot != b:
                batch.move(b, slot)
                poll.move(b, slot)
                running[slot], running[b] = running[b], None
                running[slot].slots.append((poll.issued, slot))
        batch.size = size

    def _admit(self, batch: "_Batch", b: int, waiting: deque, poll: Poll, joining: bool) -> "_Running | None":
        """The next waiting request into slot `b`: fresh state and its prefill alone. A program whose first
        iteration starts later than its others (`entry`, Linear-SS) runs that iteration alone too when the
        request joins a batch already running; any other joins the batch's next iteration. None when none
        waits."""
        st = batch.state.slot(b)
        if not waiting:
            st.done.fill_(True)   # an idle slot: its rows ride along, changing nothing
            return None
        index, request = waiting.popleft()
        began, model_s = time.perf_counter(), batch.clock.model_s
        st.copy_(batch.program.new_state(request, **batch.shape.kwargs()))
        poll.restart(b)
        cache = batch.cache.rows(b, b + 1)
        prompt = torch.tensor(request.prompt, dtype=torch.int64, device=self.model.device)
        self._call(batch.program.prefill(prompt), st, cache, batch.clock)
        entry = getattr(batch.program, "entry", 0)
        if joining and entry:
            for step in batch.program.steps[entry:]:
                self._call(step, st, cache, batch.clock)
        return _Running(index, request, (poll.issued, b), began, model_s)

    def _finish(self, program, st, r: "_Running", poll: Poll, batch: "_Batch") -> GenerateResult:
        """A finished request's counts and output (`st`: its row), read in one fetch (plus the program's extras)."""
        counts = torch.cat([st.nfe, st.n_verify, st.n_accepted, st.n_bonus, st.n_out])
        output = st.out[0, : r.request.max_new_tokens]   # a graph batch's buffers fit its longest request
        nfe, n_verify, n_accepted, n_bonus, n_out, *output = poll.fetch(torch.cat([counts, output]))
        extras = program.finish(st, poll.fetch) if hasattr(program, "finish") else {}
        # Model time is this request's alone only when it ran alone, eagerly.
        alone = self.mode == "eager" and batch.state.batch == 1
        model_s = batch.clock.model_s - r.model_s if alone else math.nan
        return GenerateResult(output[:n_out], nfe, time.perf_counter() - r.began, model_s, n_verify, n_accepted,
                              n_bonus, **extras)

    def _hold(self, program, requests: list[Request], slots: int) -> "_Batch":
        """States, cache and poll for `slots` requests at a time, held by one decode until `_release`. Eager and
        compiled loops size them to these requests; the graph loop keeps one persistent batch per (program,
        slots padded to a power of two: few sizes are captured, the padding slots idle), its cache sized for the
        requests' prompt + new tokens (and the program's reserve) up to the next power of two (at least
        CACHE_QUANTUM, at most max_seq_len), captured again when a longer request comes.
        While another decode holds the shared cache, the batch gets a cache (and, in graph mode, graphs) of its
        own."""
        private = self._cache_held
        need = max(len(r.prompt) + r.max_new_tokens for r in requests) + program.reserve
        if self.mode == "compile":
            slots = _padded(slots)      # each batch size compiles the step anew: few sizes
        if self.mode != "graph":
            cache = self.cache_for(need, slots, private)
            batch = _Batch(self, program, slots, _Shape.for_requests(requests, None), cache)
        else:
            slots = _padded(slots)
            key = (id(program), slots)
            batch = None if private else self._batches.get(key)
            if batch is None or not all(batch.fits(r) for r in requests):
                # sized for these requests, rounded up to a power of two (few re-captures as requests grow)
                capacity = min(self.max_seq_len + program.reserve, _padded(max(CACHE_QUANTUM, need)))
                tokens = capacity - program.reserve
                shape = _Shape.for_requests(requests, tokens)
                cache = self.cache_for(capacity, slots, private)
                batch = _Batch(self, program, slots, shape, cache, tokens)
                if not private:   # batches on a buffer the shared cache outgrew would keep it alive: drop them
                    current = self._cache.k.untyped_storage().data_ptr()
                    self._batches = {k: b for k, b in self._batches.items()
                                     if b.cache.k.untyped_storage().data_ptr() == current}
                    self._batches[key] = batch
        batch.shared_cache = not private
        self._cache_held |= not private
        return batch

    def _release(self, batch: "_Batch") -> None:
        if batch.shared_cache:
            self._cache_held = False


def _padded(slots: int) -> int:
    """The batch size a compiled or captured step runs at: the next power of two (the padding slots idle)."""
    return 1 << (slots - 1).bit_length()


class _Clock:
    """Model-call time accumulated by a batch's eager calls."""

    def __init__(self):
        self.model_s = 0.0


class _Running:
    """A request in a slot: its index, its slots (each from the first poll table that shows it there), its
    clocks."""

    def __init__(self, index: int, request: Request, slot: tuple[int, int], began: float, model_s: float):
        self.index, self.request, self.slots, self.began, self.model_s = index, request, [slot], began, model_s

    def slot_at(self, seq: int) -> int | None:
        """Its row in the table published `seq`-th, None if it was not yet admitted then."""
        at = None
        for since, slot in self.slots:
            if since <= seq:
                at = slot
        return at


class _Shape:
    """Fixed shapes of a batch's states: output length and stop tables, sized up front for every request
    (`max_new` tokens at most; `out_len` is the output buffer, which the program may pad)."""

    def __init__(self, max_new: int, stop_slots: int, sequence_slots: tuple[int, int]):
        self.max_new, self.out_len, self.stop_slots, self.sequence_slots = max_new, max_new, stop_slots, sequence_slots

    @classmethod
    def for_requests(cls, requests: list[Request], max_new: int | None) -> "_Shape":
        longest = max((len(s) for r in requests for s in r.stop_sequences), default=0)
        return cls(max_new or max(r.max_new_tokens for r in requests), max(8, *(len(r.stop_ids) for r in requests)),
                   (max(4, *(len(r.stop_sequences) for r in requests)), max(8, longest)))

    def kwargs(self) -> dict:
        return {"out_len": self.out_len, "stop_slots": self.stop_slots, "sequence_slots": self.sequence_slots}

    def fits(self, request: Request) -> bool:
        n_seq, seq_len = self.sequence_slots
        return (request.max_new_tokens <= self.max_new and len(request.stop_ids) <= self.stop_slots
                and len(request.stop_sequences) <= n_seq and all(len(s) <= seq_len for s in request.stop_sequences))


class _Batch:
    """What requests decode on: the batch's state (a row per slot), the batch cache, the poll, and the
    iteration (every step for the first `size` slots, then the publish) as one call."""

    def __init__(self, runtime: Runtime, program, slots: int, shape: _Shape, cache: KVCache,
                 tokens: int | None = None):
        self.runtime, self.program, self.shape, self.cache = runtime, program, shape, cache
        self.tokens = tokens            # prompt + new tokens a request may have (None: sized for its requests)
        one = program.new_state(Request([], shape.max_new, 0, [], []), **shape.kwargs())
        shape.out_len = one.out.shape[1]             # the program's padding
        self.state = type(one).cat([one] * slots)
        self.poll = Poll(runtime.model.device, program.block, slots)
        self.clock = _Clock()
        self.shared_cache = True                     # on the runtime's shared cache (set by Runtime._hold)
        self.size = slots                            # the first `size` slots take part in the calls
        self._iterations: dict[int, tuple[Callable[[], None], Callable[[], None]]] = {}

    def fits(self, request: Request) -> bool:
        return self.shape.fits(request) and len(request.prompt) + request.max_new_tokens <= self.tokens

    @property
    def live(self):
        """The state of the slots that take part in the calls (views)."""
        return self.state.rows(0, self.size)

    def _build(self, size: int):
        """(first, full) iterations over the first `size` slots: every step, then the publish."""
        runtime, st = self.runtime, self.state.rows(0, size)
        cache = self.cache.rows(0, size)
        runners = [runtime._runner(step, st, cache, self.clock) for step in self.program.steps]

        def iteration(runs) -> Callable[[], None]:
            def run_all() -> None:
                for run in runs:
                    run()
                self.poll.publish(st, stream=runtime.mode == "graph" or None)
            return CapturedIteration(run_all) if runtime.mode == "graph" else run_all

        full = iteration(runners)
        entry = getattr(self.program, "entry", 0)
        return (full if entry == 0 else iteration(runners[entry:])), full

    def iterate(self, first: bool) -> None:
        """One iteration; the batch's first starts at the program's `entry` step (Linear-SS: its prefills
        drafted already, so the first iteration only verifies, and no draft call follows the last one)."""
        if self.size not in self._iterations:
            self._iterations[self.size] = self._build(self.size)
        self._iterations[self.size][0 if first else 1]()

    def move(self, src: int, dst: int) -> None:
        """The request in slot `src` continues in slot `dst` (device copies); `src` is left done."""
        self.state.move(src, dst)
        self.cache.k[:, dst].copy_(self.cache.k[:, src])
        self.cache.v[:, dst].copy_(self.cache.v[:, src])
        self.state.done[src].fill_(True)
