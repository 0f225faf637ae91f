"""The decode loop both orders share: the model call, its executor (eager, compiled, CUDA graphs: executor.py),
the K/V pool, and a scheduler per program (scheduler.py) that every caller's requests join.

The batch is one state (decode/state.py: every field has a leading batch dimension, a row per slot), so a
step is one batched input, one model call and one batched update whatever the batch size (batch.py); a
request's prefill, admission and result work on its row (`state.slot(b)`, views).

`decode` is a caller's view of it, a generator: it adds the caller's requests to the program's scheduler and
runs the scheduler's steps until they are done, yielding each iteration's new tokens per request as the poll
delivers them (when streamed) and returning their GenerateResults; `Engine.generate`, `stream`,
`generate_batch` and `stream_batch` are all this loop. Requests of several callers with the same program
(generators consumed in turn, threads) decode in one batch; steps run under the runtime's lock, released
while a caller yields, and a caller closed early aborts its own requests only. Schedulers of different
programs (greedy, sampled: a request's sampling settings are rows of its batch's state) take turns, each batch
with its own page table into the one pool: a caller waiting for tokens runs a step of every scheduler with
work, and `max_batch` bounds their running requests together, admitted in the order they came.
"""
from __future__ import annotations

import itertools
import threading
import time
from typing import Callable, Iterator

import torch

from ..model.attention import Layout
from ..model.dual_mode import PAGE_SIZE, DualModeModel, KVCache, own_cache
from .batch import CACHE_QUANTUM, Batch, Clock, Shape
from .executor import Eager, Executor
from .kv_pool import KVPool, KVUsage, pages_for, pool_pages
from .program import ModelInput, Step
from .admission import MAX_BATCH
from .request import GenerateResult, Request, SamplingParams
from .scheduler import Group, Scheduler
from .staging import staged

PREFILL_CHUNK = 1024   # prompt tokens per prefill call at most (Runtime)
COST_REPS = 8          # timed iterations per shape and batch size (Runtime.shape_costs)


class Runtime:
    """Runs programs on one model: the KV cache, the loop, a scheduler per program.

    `executor`: how an iteration runs (executor.py: Eager, Compiled or Graphs; default Eager). `prefill_chunk`:
    the most prompt tokens one call prefills; a longer prompt enters its cache in chunks of that many, one per
    scheduler step (scheduler.py). `kv_cache_bytes`: the size of the K/V pool all its batches share
    (kv_pool.py; None: a fraction of the device's memory, `pool_pages`), in pages of `page_size` cache
    positions; a scheduler admits requests while the pool has pages for them and preempts the latest when a
    running one needs a page it cannot have. `prefix_cache`: prompts share the published pages of earlier
    requests' prompts and outputs (kv_pool.py). `max_batch`: the most requests running at once, in all its
    batches together (at most MAX_BATCH); the others wait in their schedulers' queues and start in the order
    they came, whichever scheduler they joined."""

    def __init__(self, model: DualModeModel, attend, executor: Executor | None = None, max_seq_len: int | None = None,
                 prefill_chunk: int = PREFILL_CHUNK, kv_cache_bytes: int | None = None, page_size: int = PAGE_SIZE,
                 prefix_cache: bool = True, max_batch: int = MAX_BATCH):
        self.model, self.attend, self.executor = model, attend, executor or Eager()
        self.max_seq_len = max_seq_len or model.cfg.max_seq_len
        self.prefill_chunk = prefill_chunk
        self.kv_cache_bytes, self.page_size, self.prefix_cache = kv_cache_bytes, page_size, prefix_cache
        self.max_batch = max_batch
        self._pool: KVPool | None = None
        self._lock = threading.RLock()
        self._batches: dict[tuple, Batch] = {}        # (id(program), slots) -> batch kept (keeps_batches)
        self._schedulers: dict[int, tuple[object, Scheduler]] = {}   # id(program) -> (program, its scheduler)
        self._last: Scheduler | None = None
        self._callers = 0                             # decodes running now (generators, threads)
        self.arrivals = itertools.count()             # the order groups come in, across its schedulers

    # -- what the last busy period of a scheduler did (benchmarks) -----------------------------------------
    @property
    def iterations(self) -> int:
        return self._last.iterations if self._last else 0

    @property
    def slot_iterations(self) -> int:
        """The batch sizes summed over the iterations."""
        return self._last.slot_iterations if self._last else 0

    @property
    def model_s(self) -> float:
        """Model-call time (an executor that `times_model`)."""
        return self._last.model_s if self._last else 0.0

    # -- the model call --------------------------------------------------------------------------------
    def forward(self, inp: ModelInput, cache: KVCache) -> torch.Tensor:
        return self.model(inp.tokens, inp.positions, inp.layout, cache, inp.cache_len, attend=self.attend,
                          rows=inp.logit_rows)

    def call(self, step: Step, st, cache: KVCache, clock: Clock | None) -> None:
        """One step for a batch `st` (the batch's state, or one request's row of it: a batch of one): one model
        call over every request's rows [B, R], one update from its logits [B, R, V]; model time counted on
        `clock` when given."""
        inp = step.inputs(st)
        t0 = time.perf_counter() if clock is not None else 0.0
        logits = self.forward(inp, cache)
        if clock is not None:
            clock.model_s += time.perf_counter() - t0
        step.fold(st, logits)

    def prefix(self, tokens: list[int], start: int, cache: KVCache, clock: Clock) -> None:
        """A chunk of a long prompt into one request's cache (`cache`: its row, a batch of one) at positions
        start, start + 1, ...: causal anchors after the chunks before it, K/V only (no logits). Built on the
        host and staged; not counted as a model call of the request (its prefill is)."""
        device, n = self.model.device, len(tokens)
        anchors = torch.arange(n)
        layout = Layout(n, staged(torch.zeros_like(anchors), device), staged(anchors, device))
        t0 = time.perf_counter()
        self.model(staged(torch.tensor([tokens]), device), staged(start + anchors[None], device), layout, cache,
                   staged(torch.tensor([start]), device), attend=self.attend, head=False)
        clock.model_s += time.perf_counter() - t0

    def runner(self, step: Step, st, cache: KVCache, clock: Clock) -> Callable[[], None]:
        """The step as one function, as the executor runs it."""
        return self.executor.runner(self.call, step, st, cache, clock)

    @torch.inference_mode()
    def shape_costs(self, program, batch_sizes: tuple[int, ...], params: SamplingParams | None = None,
                    cached: int = CACHE_QUANTUM) -> list[tuple]:
        """ms of one eager iteration in each of a program's call shapes (`shapes`: an adaptive program's), its
        inputs, model call and whole update, at each of `batch_sizes`, requests sampling with `params` (default:
        greedy), over `cached` cached tokens with a full draft: the fastest of COST_REPS after three warm-ups, each from the same state, the shapes taking turns.
        For the cost model an adaptive program bets with (decode/policy.py), measured once when it is built."""
        sync = torch.cuda.synchronize if self.model.device.type == "cuda" else (lambda: None)
        period = min(64, self.model.cfg.vocab_size - 2)   # tokens of the model's vocabulary, repeating
        prompt = [2 + i % period for i in range(cached)]
        priced = program.shapes[:len(program.policy.shapes)]     # the shapes its policy bets between (not QUIET)
        costs = [[] for _ in priced]
        for batch in batch_sizes:
            one = program.new_state(Request(prompt, 8, 0, [], [], params or SamplingParams()))
            start = type(one).cat([one] * batch)
            start.cache_len.fill_(cached)
            start.draft_len.fill_(program.width)
            st = type(one).cat([start])                   # a copy, reset before every iteration
            cache = own_cache(self.model, cached + program.reserve, batch)
            times = [[] for _ in priced]
            for _ in range(COST_REPS + 3):                # in rounds, every shape once: a busy spell hits them all
                for steps, timed in zip(priced, times):
                    st.copy_(start)
                    sync()
                    t0 = time.perf_counter()
                    for step in steps:
                        self.call(step, st, cache, None)
                    sync()
                    timed.append(time.perf_counter() - t0)
            for cost, timed in zip(costs, times):
                cost.append(1e3 * min(timed[3:]))
        return [tuple(c) for c in costs]

    # -- the K/V pool and batches ------------------------------------------------------------------------
    @property
    def pool(self) -> KVPool:
        """The K/V pool every batch of this runtime takes pages from, made at its full size when first needed."""
        if self._pool is None:
            with self._lock:              # a server's metrics may ask from another thread
                if self._pool is None:
                    cap = MAX_BATCH * (self.max_seq_len + CACHE_QUANTUM)      # more than any batch could ever hold
                    self._pool = KVPool(self.model, pool_pages(self.model, self.page_size, cap,
                                                               self.kv_cache_bytes), self.page_size)
        return self._pool

    def kv_usage(self) -> KVUsage:
        return self.pool.usage(sum(scheduler.preemptions for _, scheduler in self._schedulers.values()))

    def pages_for(self, tokens: int) -> int:
        """Pages that hold `tokens` cache positions."""
        return pages_for(tokens, self.page_size)

    def capacity(self, program, requests: list[Request]) -> int:
        """Cache positions per request of a batch made for `requests` (and the program's reserve), as long as the
        executor's tables are made (executor.py). It sizes the page table, not the memory held."""
        need = max(len(r.prompt) + r.max_new_tokens for r in requests) + program.reserve
        return self.page_size * self.pages_for(self.executor.table_length(need, self.max_seq_len + program.reserve))

    def batch_size(self, requests: int) -> int:
        """The slots a step runs over for `requests` requests (the executor's padding)."""
        return self.executor.batch_size(requests)

    def hold(self, program, requests: list[Request], slots: int) -> Batch:
        """State, page table and poll for `slots` requests at a time (as many as the executor pads them to), held
        by a scheduler for a busy period, sized for `requests`: output buffers and stop tables for the longest,
        the table for the longest prompt + new tokens (and the program's reserve). An executor that
        `keeps_batches` (CUDA graphs) keeps one per program and slot count, captured again when a longer request
        comes."""
        slots = self.batch_size(slots)
        capacity = self.capacity(program, requests)
        if not self.executor.keeps_batches:
            return Batch(self, program, slots, Shape.for_requests(requests), capacity)
        key = (id(program), slots)
        batch = self._batches.get(key)
        if batch is None or not all(batch.fits(r) for r in requests):
            batch = self._batches[key] = Batch(self, program, slots,
                                               Shape.for_requests(requests, capacity - program.reserve), capacity)
        batch.size = 0
        return batch

    def regrow(self, old: Batch, slots: int, capacity: int | None = None) -> Batch:
        """A batch like `old` (its shapes) with more slots, or a longer page table (`capacity` cache positions per
        request)."""
        slots = self.batch_size(slots)
        batch = Batch(self, old.program, slots, old.shape, max(capacity or 0, old.capacity))
        if self.executor.keeps_batches:
            self._batches[(id(old.program), slots)] = batch
        return batch

    # -- a caller's requests ---------------------------------------------------------------------------
    def scheduler(self, program) -> Scheduler:
        if id(program) not in self._schedulers:
            # holding the program keeps its id
            self._schedulers[id(program)] = (program, Scheduler(self, program, self.prefix_cache))
        return self._schedulers[id(program)][1]

    def add(self, program, requests: list[Request], slots: int = 1, stream: bool = True) -> Group:
        """`requests` join the program's scheduler; a caller that drives the loop itself (`step`; a server's
        decode thread) reads the group's events."""
        with self._lock:
            return self.scheduler(program).add(requests, slots, stream)

    def step(self) -> bool:
        """One step of every scheduler with work, under the lock; whether any has work left. A step that fails
        ends its scheduler's requests with the error (their groups' `error`) and the others go on."""
        with self._lock:
            for _, scheduler in list(self._schedulers.values()):
                if not scheduler.idle:
                    self._last = scheduler
                    try:
                        scheduler.step()
                    except Exception:   # noqa: BLE001 -- recorded on the groups by Scheduler._fail
                        pass
            return any(not scheduler.idle for _, scheduler in self._schedulers.values())

    @property
    def occupied(self) -> int:
        """Requests holding a slot in any of its batches (at most `max_batch`)."""
        return sum(scheduler.occupied for _, scheduler in self._schedulers.values())

    def waiting_elsewhere(self, scheduler: Scheduler) -> list[tuple[int, int]]:
        """The requests waiting in its other schedulers, as (their group's arrival, index), in order: a scheduler
        leaves them the slots they came first for."""
        return sorted((group.arrival, i) for _, other in self._schedulers.values() if other is not scheduler
                      for group, i in other.waiting)

    def load(self) -> tuple[int, int]:
        """(running, waiting) requests in all its batches now."""
        with self._lock:
            return self.occupied, sum(len(s.waiting) for _, s in self._schedulers.values())

    def abort(self, group: Group) -> None:
        """The group's requests leave their batch; a running one's result so far is kept in `group.results`."""
        with self._lock:
            group.scheduler.abort(group, results=True)

    def decode(self, program, requests: list[Request], slots: int = 1, stream: bool = False,
               on_finish: Callable[[int, GenerateResult], None] | None = None) -> Iterator[tuple[int, list[int]]]:
        """Decodes `requests`, up to `slots` of them at a time, in the program's running batch; returns their
        GenerateResults in order (and hands each to `on_finish` as its request ends). When `stream`, first
        yields (request index, tokens) as each iteration adds tokens to an output (they travel in the poll's
        table; otherwise each output is read once, when its request ends)."""
        if stream and len(requests) > slots:
            raise ValueError("streaming decodes every request in its own slot: slots >= len(requests)")
        scheduler = self.scheduler(program)
        with self._lock:
            group = scheduler.add(requests, slots, stream)
            self._callers += 1
        try:
            while True:
                with self._lock:                # one step at a time: other callers join or step in between
                    if group.error is not None:
                        raise group.error
                    events, waiting = list(group.events), not group.events and not group.done
                    group.events.clear()
                    if waiting:
                        self.step()             # every scheduler's: slots its requests wait for may be another's
                if waiting:
                    if self._callers > 1:
                        time.sleep(0)           # another caller waiting for the lock (a thread) steps in now
                    continue
                for index, event in events:
                    if isinstance(event, GenerateResult):
                        if on_finish is not None:
                            on_finish(index, event)
                    else:
                        yield index, event
                if group.done and not group.events:
                    return group.results
        finally:
            with self._lock:
                self._callers -= 1
                if not group.done:
                    scheduler.abort(group)
