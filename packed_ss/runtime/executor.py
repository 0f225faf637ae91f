"""How an iteration runs: its steps called one by one (`Eager`), each step compiled whole (`Compiled`), or the
whole iteration captured in a CUDA graph and replayed (`Graphs`). The runtime holds one executor and asks it,
never a mode's name, how to run a step, how many slots a batch of n requests takes, how long a page table is
and whether a batch is kept for the next busy period.

Eager steps run over the batch's requests and page tables as long as its longest request can grow. Compiled
and captured steps run over batch sizes padded to powers of two (few sizes compiled or captured, the padding
slots idle) and tables of CACHE_QUANTUM multiples. A captured iteration reads and writes fixed addresses, so
`Graphs` keeps one batch per program and slot count, with page tables of a power-of-two length, and captures
again only when a longer request comes. Only eager calls are timed one by one (a compiled or captured call's
time is its launch).
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from .batch import CACHE_QUANTUM, padded
from .graphs import CapturedIteration
from .program import Step

# Every compiled step is the one lambda of Compiled.runner, so Dynamo counts all of a process's variants
# against one code object: programs (greedy or sampled, widths) x steps x padded batch sizes.
RECOMPILE_LIMIT = 64

Call = Callable[[Step, object, object, object], None]     # Runtime.call(step, st, cache, clock)


class Executor:
    """What the runtime asks of an executor, with the answers of calling each step as it comes (`Eager`):
    `name` (for records), `compile_backend`, whether it `times_model` call by call and `keeps_batches`."""
    name: str
    compile_backend: str | None = None
    times_model = True
    keeps_batches = False

    def runner(self, call: Call, step: Step, st, cache, clock) -> Callable[[], None]:
        return lambda: call(step, st, cache, clock)

    def iteration(self, run_all: Callable[[], None]) -> Callable[[], None]:
        return run_all

    def batch_size(self, requests: int) -> int:
        return requests

    def table_length(self, need: int, most: int) -> int:
        """Cache positions per request of a page table that must hold `need` (at most `most`; the runtime rounds
        it up to whole pages): here `need` itself, so attention reads no more pages than a request may fill."""
        return need


class Eager(Executor):
    """Each step's model call and update run as Python calls; model time is counted per call."""
    name = "eager"


class Compiled(Executor):
    """Each step compiled with torch.compile(fullgraph=True, backend=compile_backend), once per step."""
    name = "compile"
    times_model = False

    def __init__(self, compile_backend: str):
        self.compile_backend = compile_backend
        self.compiled: dict[int, tuple] = {}         # id(step) -> (step, its compiled call)
        dynamo = torch._dynamo.config
        dynamo.recompile_limit = max(dynamo.recompile_limit, RECOMPILE_LIMIT)

    def runner(self, call: Call, step: Step, st, cache, clock) -> Callable[[], None]:
        if id(step) not in self.compiled:
            compiled = torch.compile(lambda state, kv: call(step, state, kv, None), fullgraph=True,
                                     backend=self.compile_backend)
            self.compiled[id(step)] = (step, compiled)      # holding the step keeps its id
        compiled = self.compiled[id(step)][1]
        return lambda: compiled(st, cache)

    def batch_size(self, requests: int) -> int:
        return padded(max(1, requests))

    def table_length(self, need: int, most: int) -> int:
        """Tables in multiples of CACHE_QUANTUM positions: few shapes to compile as requests grow."""
        return CACHE_QUANTUM * math.ceil(need / CACHE_QUANTUM)


class Graphs(Compiled):
    """The whole iteration (every step and the poll's publish) captured once and replayed; its steps compiled
    inside the graph when `compile_backend` is given, so a replay launches fused kernels."""
    name = "graph"
    keeps_batches = True

    def __init__(self, compile_backend: str | None = None):
        if compile_backend is not None:
            super().__init__(compile_backend)
        else:
            self.compile_backend, self.compiled = None, {}

    def runner(self, call: Call, step: Step, st, cache, clock) -> Callable[[], None]:
        if self.compile_backend is not None:
            return super().runner(call, step, st, cache, clock)
        return lambda: call(step, st, cache, None)

    def iteration(self, run_all: Callable[[], None]) -> Callable[[], None]:
        return CapturedIteration(run_all)

    def table_length(self, need: int, most: int) -> int:
        return min(most, padded(max(CACHE_QUANTUM, need)))


def executor_for(cuda_graph: bool, compile_backend: str | None) -> Executor:
    """The executor of an engine's options: CUDA graphs (their steps compiled when a backend is given), compiled
    steps, or eager."""
    if cuda_graph:
        return Graphs(compile_backend)
    return Compiled(compile_backend) if compile_backend is not None else Eager()
