"""The decode loop both orders share: a prefill call, then the program's iterations until the poll says done.

Every iteration runs the program's steps (eagerly, compiled with torch.compile(fullgraph=True), or replayed
from a CUDA graph), publishes the status row on the device and queues its copy to the host; the host reads
one row per iteration (poll.py). `decode` is a generator: it yields each iteration's new tokens as the poll
delivers them and returns the GenerateResult, so `Engine.generate` and `Engine.stream` are the same loop.
"""
from __future__ import annotations

import contextlib
import math
import time
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
    """Runs programs on one model: the KV cache, the loop in one of MODES, and each program's poll."""

    def __init__(self, model: DualModeModel, attend, mode: str = "eager", compile_backend: str = "inductor",
                 max_seq_len: int | None = None):
        self.model, self.attend, self.mode, self.compile_backend = model, attend, mode, compile_backend
        self.max_seq_len = max_seq_len or model.cfg.max_seq_len
        self.model_s = 0.0
        self._cache: KVCache | None = None
        self._compiled: dict[int, object] = {}   # id(step) -> its compiled runner
        self._slots: dict[int, _Slot] = {}       # id(program) -> persistent state and iteration (graph mode)
        self._polls: dict[int, tuple] = {}       # id(program) -> (program, its poll)

    # -- the model call --------------------------------------------------------------------------------
    def forward(self, inp: ModelInput, cache: KVCache) -> torch.Tensor:
        return self.model(inp.tokens, inp.positions, inp.layout, cache, inp.cache_len, attend=self.attend)

    def _timed(self, step: Step, st, cache: KVCache) -> None:
        inp = step.inputs(st)
        t0 = time.perf_counter()
        logits = self.forward(inp, cache)
        self.model_s += time.perf_counter() - t0
        step.update(st, logits)

    def _runner(self, step: Step, st, cache: KVCache):
        """The step as one function of (state, cache): timed eagerly, or compiled whole."""
        if self.mode == "eager":
            return lambda: self._timed(step, st, cache)
        if self.mode == "compile":
            if id(step) not in self._compiled:
                def run(state, kv):
                    step.update(state, self.forward(step.inputs(state), kv))
                self._compiled[id(step)] = (step, torch.compile(run, fullgraph=True, backend=self.compile_backend))
            compiled = self._compiled[id(step)][1]
            return lambda: compiled(st, cache)
        return lambda: step.update(st, self.forward(step.inputs(st), cache))

    def poll(self, program) -> Poll:
        if id(program) not in self._polls:
            self._polls[id(program)] = (program, Poll(self.model.device, program.block))
        return self._polls[id(program)][1]

    # -- the cache -------------------------------------------------------------------------------------
    def cache_for(self, capacity: int) -> KVCache:
        """A view of the runtime's cache with room for `capacity` slots (rounded up to CACHE_QUANTUM).

        The buffer only grows; a shorter request gets a shorter view, so the reference backend's attention
        cost follows this request's length, not the longest so far."""
        capacity = CACHE_QUANTUM * math.ceil(capacity / CACHE_QUANTUM)
        if self._cache is None or self._cache.capacity < capacity:
            self._cache = self.model.new_cache(capacity)
        return KVCache(self._cache.k[:, :, :capacity], self._cache.v[:, :, :capacity])

    # -- the loop --------------------------------------------------------------------------------------
    def decode(self, program, request: Request, stream: bool = False) -> Iterator[list[int]]:
        """Returns the GenerateResult; when `stream`, first yields the tokens each iteration adds to the
        output (they travel in the poll's row; otherwise the output is read once at the end)."""
        self.model_s = 0.0
        start = time.perf_counter()
        slot = self._slot(program, request)
        st, cache, poll = slot.state, slot.cache, slot.poll
        iterations, limit = 0, request.max_new_tokens + poll.lag + 2   # every live iteration emits >= 1 token
        caller_mode = torch.is_inference_mode_enabled()
        checked = SyncCheck() if SyncCheck.wanted(self.model.device) else contextlib.nullcontext()
        with torch.inference_mode():
            poll.reset(st, stream or self.mode == "graph")   # a graph captures one kind of row: the streaming one
            prompt = torch.tensor(request.prompt, dtype=torch.int64, device=self.model.device)
            self._timed(program.prefill(prompt), st, cache)
            poll.publish(st)
            poll.issue()
            while True:
                with checked:
                    status = poll.read() if poll.due else None
                    if status is None or not (status.done or status.hold):
                        iterations += 1
                        if iterations > limit:
                            raise RuntimeError("decoder made no progress; this is a bug")
                        slot.iterate(first=iterations == 1)
                        poll.issue()
                if status is not None and status.hold and not status.done:   # rare (any-order truncation)
                    while poll.in_flight:
                        poll.read()                      # iterations queued behind the hold were no-ops
                    program.resume(st, lambda inp: self.forward(inp, cache))
                    poll.publish(st)
                    poll.issue()
                if stream and status is not None and status.tokens:
                    with torch.inference_mode(caller_mode):   # the consumer runs in its own mode
                        yield status.tokens
                if status is not None and status.done:
                    break
            counts = torch.stack([st.nfe, st.n_verify, st.n_accepted, st.n_out])
            output = st.out[: request.max_new_tokens]   # a graph slot's buffer is max_seq_len long
            nfe, n_verify, n_accepted, n_out, *output = poll.fetch(torch.cat([counts, output]))
            extras = program.finish(st, poll.fetch) if hasattr(program, "finish") else {}
        model_s = self.model_s if self.mode == "eager" else math.nan
        return GenerateResult(output[:n_out], nfe, time.perf_counter() - start, model_s, n_verify, n_accepted,
                              **extras)

    def _slot(self, program, request: Request) -> "_Slot":
        """State, cache and poll for this request. Eager and compiled loops take fresh ones; the graph loop
        keeps one persistent slot per program (the graph reads fixed addresses) and resets its state."""
        if self.mode != "graph":
            cache = self.cache_for(len(request.prompt) + request.max_new_tokens + program.reserve)
            return _Slot(self, program, program.new_state(request), cache)
        slot = self._slots.get(id(program))
        if slot is None or not slot.fits(request):
            shape = _Shape.for_request(request, self.max_seq_len)
            state = program.new_state(Request([], self.max_seq_len, 0, [], []), **shape.kwargs())
            shape.out_len = state.out.numel()   # the program may pad the output buffer
            cache = self.cache_for(self.max_seq_len + program.reserve)
            slot = self._slots[id(program)] = _Slot(self, program, state, cache, shape)
        slot.state.copy_(program.new_state(request, **slot.shape.kwargs()))
        return slot


class _Shape:
    """Fixed shapes of a persistent state: output length and stop tables, sized up front for reuse."""

    def __init__(self, out_len: int, stop_slots: int, sequence_slots: tuple[int, int]):
        self.out_len, self.stop_slots, self.sequence_slots = out_len, stop_slots, sequence_slots

    @classmethod
    def for_request(cls, request: Request, max_seq_len: int) -> "_Shape":
        longest = max(map(len, request.stop_sequences), default=0)
        return cls(max_seq_len, max(8, len(request.stop_ids)), (max(4, len(request.stop_sequences)), max(8, longest)))

    def kwargs(self) -> dict:
        return {"out_len": self.out_len, "stop_slots": self.stop_slots, "sequence_slots": self.sequence_slots}

    def fits(self, request: Request) -> bool:
        n_seq, seq_len = self.sequence_slots
        return (len(request.stop_ids) <= self.stop_slots and len(request.stop_sequences) <= n_seq
                and all(len(s) <= seq_len for s in request.stop_sequences))


class _Slot:
    """What one request decodes on: state, cache, poll, and the iteration (steps + publish) as one call."""

    def __init__(self, runtime: Runtime, program, state, cache: KVCache, shape: _Shape | None = None):
        self.program, self.state, self.cache, self.shape = program, state, cache, shape
        self.poll = runtime.poll(program)
        runners = [runtime._runner(step, state, cache) for step in program.steps]

        def iteration(runs) -> Callable[[], None]:
            def run_all() -> None:
                for run in runs:
                    run()
                self.poll.publish(state, stream=runtime.mode == "graph" or None)
            return CapturedIteration(run_all) if runtime.mode == "graph" else run_all

        self.full = iteration(runners)
        entry = getattr(program, "entry", 0)
        self.first = self.full if entry == 0 else iteration(runners[entry:])

    def iterate(self, first: bool) -> None:
        """One iteration; a request's first starts at the program's `entry` step (Linear-SS: its prefill
        drafted already, so the first iteration only verifies, and no draft call follows the last one)."""
        (self.first if first else self.full)()

    def fits(self, request: Request) -> bool:
        return self.shape is not None and self.shape.fits(request)
