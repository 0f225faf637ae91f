"""One program's requests from every caller, in one running batch: waiting and running requests, slots,
admission, compaction, abort, and `step`, one turn of the decode loop.

Callers (`Runtime.decode`: a generate, a stream, a batch, a thread) add their requests as a `Group` and drive
the loop themselves: whichever caller needs tokens it does not have yet runs `step` under the runtime's lock,
and every request's tokens and result land in its own group's events, so a caller gets exactly what its
requests get alone, whoever ran the iteration that made them. A step:
1. admits waiting requests into free slots (those in consecutive slots prefill in one call; the batch grows
   when it has no free slot, and moves to a longer cache for a request whose prompt and new tokens do not
   fit its cache; a request whose other shapes (stop tables, length cap) do not fit, or whose cache the K/V
   budget cannot hold at the batch's size, waits, and holds the queue, until the batch has drained). A prompt longer than the runtime's `prefill_chunk` enters its cache a chunk per step
   (K/V only) before its last part and first block are prefilled, so that a long prompt holds the running
   requests up by one chunk's call per step at most;
2. runs one iteration of the whole batch (every step of the program, then the status table) and queues
   the table's copy to the host;
3. reads the table that is due (poll.py: at once on the CPU, one iteration late on CUDA) and hands out
   its new tokens, finished requests' results (read once, when they end) and holds;
4. once nothing waits, compacts: the running requests move to the front slots and the batch shrinks.
A group closed early (a generator closed, an exception in its caller) aborts its requests: their slots are
freed at the next step and nothing else changes.
"""
from __future__ import annotations

import contextlib
import math
import time
from collections import deque

import torch

from .batch import Batch
from .graphs import SyncCheck
from .request import GenerateResult, Request

MAX_SLOTS = 256   # requests in one batch at most


class Group:
    """A caller's requests: how many may run at once, and what happened to them, in order (`events`: (index,
    tokens) as iterations add them when streamed, (index, GenerateResult) when one ends)."""

    def __init__(self, requests: list[Request], limit: int, stream: bool):
        self.requests, self.limit, self.stream = requests, limit, stream
        self.events: deque[tuple[int, list[int] | GenerateResult]] = deque()
        self.results: list[GenerateResult | None] = [None] * len(requests)
        self.running = self.finished = 0
        self.aborted = False
        self.error: BaseException | None = None
        self.scheduler: "Scheduler | None" = None    # the scheduler it joined

    @property
    def done(self) -> bool:
        return self.finished == len(self.requests) or self.aborted or self.error is not None


class Running:
    """A request in a slot: its group and index, its slots (each from the first poll table that shows it
    there), its clocks, and whether another request shared an iteration with it."""

    def __init__(self, group: Group, index: int, slot: tuple[int, int], began: float, model_s: float):
        self.group, self.index = group, index
        self.request = group.requests[index]
        self.slots, self.began, self.model_s = [slot], began, model_s
        self.shared = False

    def slot_at(self, seq: int) -> int | None:
        """Its row in the table published `seq`-th, None if it was not yet admitted then."""
        at = None
        for since, slot in self.slots:
            if since <= seq:
                at = slot
        return at


class Prefilling:
    """A request whose prompt is longer than the prefill chunk, in its slot: the first `cached` tokens of its
    prompt are in its cache (its row of the state stays idle until its prefill)."""

    def __init__(self, group: Group, index: int, began: float, model_s: float):
        self.group, self.index, self.began, self.model_s = group, index, began, model_s
        self.prompt = group.requests[index].prompt
        self.cached = 0


class Scheduler:
    def __init__(self, runtime, program):
        self.runtime, self.program = runtime, program
        self.waiting: deque[tuple[Group, int]] = deque()
        self.batch: Batch | None = None
        self.running: list[Running | None] = []
        self.prefilling: dict[int, Prefilling] = {}  # slot -> a long prompt entering its cache, oldest first
        self.shape = 0                               # the call shape the program chose last (poll table)
        self.iterations = self.slot_iterations = 0   # of the current (or last) busy period
        self.model_s = 0.0                           # model-call time of the last busy period (eager)
        self._limit = 0                              # iterations the busy period's requests may take at most
        self._began_model_s = 0.0

    @property
    def idle(self) -> bool:
        return self.batch is None and not self.waiting

    def add(self, requests: list[Request], limit: int, stream: bool) -> Group:
        runtime = self.runtime
        for i, r in enumerate(requests):
            capacity = runtime.capacity(self.program, [r])
            if runtime.max_slots(capacity) < 1:
                raise ValueError(f"request {i}: its K/V cache ({capacity} positions, {runtime.slot_bytes(capacity)} "
                                 f"bytes) exceeds kv_cache_bytes {runtime.kv_cache_bytes}")
        group = Group(requests, limit, stream)
        group.scheduler = self
        self.waiting.extend((group, i) for i in range(len(requests)))
        return group

    def abort(self, group: Group, results: bool = False) -> None:
        """The group's requests leave: the waiting ones at once, the running ones' slots freed now (their rows
        are marked done, so iterations change nothing there). `results`: a running request's GenerateResult so
        far (its output and counts, one read) goes to the group's results first."""
        group.aborted = True
        self.waiting = deque(w for w in self.waiting if w[0] is not group)
        self.prefilling = {b: p for b, p in self.prefilling.items() if p.group is not group}
        with torch.inference_mode():
            for slot, r in enumerate(self.running):
                if r is not None and r.group is group:
                    if results:
                        group.results[r.index] = self._finish(slot, r)
                    self.batch.state.done[slot].fill_(True)
                    self.running[slot] = None
            self._end_if_idle()

    # -- one turn of the loop ------------------------------------------------------------------------------
    def step(self) -> None:
        """Admit, iterate, read what is due, hand it out, compact (module docstring). Under the runtime's lock."""
        if self.idle:
            return
        checked = SyncCheck() if SyncCheck.wanted(self.runtime.model.device) else contextlib.nullcontext()
        try:
            with torch.inference_mode():
                started = self.batch is None
                self._admit()
                self._prefill_chunk()
                batch, poll = self.batch, self.batch.poll
                if started and batch.size:        # the first table: requests may end in their prefill
                    poll.publish(batch.live)
                    poll.issue()
                with checked:
                    status = poll.read() if poll.due else None
                    if status is not None:
                        self.shape = self._chosen_shape(status)
                    if self._may_iterate(status):
                        self.iterations += 1
                        if self.iterations > self._limit:
                            raise RuntimeError("decoder made no progress; this is a bug")
                        self.slot_iterations += batch.size
                        live = [r for r in self.running if r is not None]
                        for r in live if len(live) > 1 else ():
                            r.shared = True
                        batch.iterate(first=self.iterations == 1, shape=self.shape)
                        poll.issue()
                if status is not None:
                    self._deliver(status)
                if not self.waiting and not self.prefilling:
                    self._compact()
                self._end_if_idle()
        except BaseException as err:
            self._fail(err)
            raise

    def _may_iterate(self, status) -> bool:
        """Whether any running request may still be live (not done in `status`) and none is held."""
        seen = [None if r is None or status is None else r.slot_at(status.seq) for r in self.running]
        live = any(r is not None and (b is None or not status.done[b]) for r, b in zip(self.running, seen))
        held = any(b is not None and status.hold[b] and not status.done[b] for b in seen)
        return live and not held

    def _chosen_shape(self, status) -> int:
        """The next call's shape: an adaptive program's policy picks it from the live rows (Policy.next_call)."""
        policy = getattr(self.program, "policy", None)
        if policy is None:
            return 0
        seen = [r.slot_at(status.seq) for r in self.running if r is not None]
        rows = [None if b is None else (status.choice[b], status.quiet[b]) for b in seen
                if b is None or not status.done[b]]
        return policy.next_call(rows, self.batch.poll.lag)

    def _deliver(self, status) -> None:
        """Hand out a table's tokens and results; resume held requests; free finished requests' slots."""
        batch = self.batch
        for slot, r in enumerate(self.running):
            b = None if r is None else r.slot_at(status.seq)
            if b is None:                               # idle, or admitted after this table
                continue
            if status.hold[b] and not status.done[b]:   # rare (any-order truncation; batches of one)
                self._resume(slot)
            if r.group.stream and status.tokens[b]:
                r.group.events.append((r.index, status.tokens[b]))
            if status.done[b]:
                result = self._finish(slot, r)
                r.group.results[r.index] = result
                r.group.events.append((r.index, result))
                r.group.running -= 1
                r.group.finished += 1
                self.running[slot] = None
                batch.state.done[slot].fill_(True)

    def _resume(self, slot: int) -> None:
        batch, poll = self.batch, self.batch.poll
        while poll.in_flight:
            poll.read()                                 # iterations queued behind the hold were no-ops
        self.program.resume(batch.state.slot(slot),
                            lambda inp: self.runtime.forward(inp, batch.cache.rows(slot, slot + 1)))
        poll.publish(batch.live)
        poll.issue()

    def _finish(self, slot: int, r: Running) -> GenerateResult:
        """A finished request's counts and output, read in one fetch (plus the program's extras)."""
        st, poll = self.batch.state.slot(slot), self.batch.poll
        counts = torch.cat([st.nfe, st.n_verify, st.n_accepted, st.n_bonus, st.n_out, st.accepted_at[0]])
        output = st.out[0, : r.request.max_new_tokens]   # the batch's buffers fit its longest request
        nfe, n_verify, n_accepted, n_bonus, n_out, *rest = poll.fetch(torch.cat([counts, output]))
        width = st.accepted_at.shape[1]
        accepted_at, output = rest[:width], rest[width:]
        extras = self.program.finish(st, poll.fetch) if hasattr(self.program, "finish") else {}
        # Model time is this request's alone only when it ran alone, eagerly.
        alone = self.runtime.mode == "eager" and not r.shared
        model_s = self.batch.clock.model_s - r.model_s if alone else math.nan
        return GenerateResult(output[:n_out], nfe, time.perf_counter() - r.began, model_s, n_verify, n_accepted,
                              n_bonus, accepted_at, **extras)

    # -- slots -------------------------------------------------------------------------------------------
    def _admissible(self) -> tuple[list[tuple[Group, int]], Request | None]:
        """The waiting requests that may start now, in order: every group within its limit, and none after one
        the batch does not fit (it waits until the batch has drained, then a batch is made to fit it); and that
        request, if one blocks the queue."""
        taken, admissible = {}, []
        for group, i in self.waiting:
            if group.running + taken.get(group, 0) >= group.limit:
                continue
            if self.batch is not None and not self.batch.fits(group.requests[i]):
                return admissible, group.requests[i]
            taken[group] = taken.get(group, 0) + 1
            admissible.append((group, i))
        return admissible, None

    def _free(self) -> list[int]:
        return [b for b, r in enumerate(self.running) if r is None and b not in self.prefilling]

    def _admit(self) -> None:
        most = getattr(self.program, "max_batch", None) or MAX_SLOTS
        admissible, blocked = self._admissible()
        if self.batch is not None:
            if blocked is not None and self._lengthen(blocked):
                admissible, _ = self._admissible()
            most = min(most, self.runtime.max_slots(self.batch.cache.capacity))
            if self.batch.slots >= most:                          # it cannot grow: the free slots only
                admissible = admissible[:len(self._free())]
        if not admissible:
            return
        if self.batch is None:   # as many as the K/V budget holds at the cache length they need
            capacity = self.runtime.capacity(self.program, [g.requests[i] for g, i in admissible[:most]])
            most = min(most, max(1, self.runtime.max_slots(capacity)))
            admissible = admissible[:most]
            self.batch = self.runtime.hold(self.program, [g.requests[i] for g, i in admissible], len(admissible))
            self.running = [None] * self.batch.slots
            self.iterations = self.slot_iterations = self._limit = 0
            self._began_model_s = self.batch.clock.model_s
        free = self._free()
        if len(free) < len(admissible):
            self._grow(len(admissible) - len(free), most)
            free = self._free()
        admissible = admissible[:len(free)]
        starts = []
        for slot, (group, i) in zip(free, admissible):
            self.waiting.remove((group, i))
            group.running += 1
            if len(group.requests[i].prompt) > self.runtime.prefill_chunk:
                self.prefilling[slot] = Prefilling(group, i, time.perf_counter(), self.batch.clock.model_s)
            else:
                starts.append((slot, (group, i)))
        while starts:       # each run of consecutive free slots prefills in one call
            run = 1
            while run < len(starts) and starts[run][0] == starts[0][0] + run:
                run += 1
            self._start(starts[0][0], [entry for _, entry in starts[:run]])
            starts = starts[run:]

    def _prefill_chunk(self) -> None:
        """The oldest long prompt's next chunk into its cache, or, when the rest fits one chunk, its prefill."""
        if not self.prefilling:
            return
        slot, p = next(iter(self.prefilling.items()))
        chunk, batch = self.runtime.prefill_chunk, self.batch
        if len(p.prompt) - p.cached > chunk:
            self.runtime.prefix(p.prompt[p.cached:p.cached + chunk], p.cached, batch.cache.rows(slot, slot + 1),
                                batch.clock)
            p.cached += chunk
            return
        del self.prefilling[slot]
        self._start(slot, [(p.group, p.index)], p.cached, p.began, p.model_s)

    def _start(self, first: int, entries: list[tuple[Group, int]], cached: int = 0, began: float | None = None,
               model_s: float | None = None) -> None:
        """Requests `entries` into slots first, first + 1, ...: fresh states (built on the host, copied without
        waiting) and one prefill call for all of them (`cached`: the prompt tokens in the cache already, a
        long prompt's chunks). A program whose first iteration starts later than its others (`entry`,
        Linear-SS) runs that iteration for them too when they join a batch already running; any other joins
        the batch's next iteration."""
        batch, end, device = self.batch, first + len(entries), self.runtime.model.device
        requests = [group.requests[i] for group, i in entries]
        began = time.perf_counter() if began is None else began
        model_s = batch.clock.model_s if model_s is None else model_s
        st, cache = batch.state.rows(first, end), batch.cache.rows(first, end)
        fresh = [self.program.new_state(r, **batch.shape.kwargs(), device="cpu") for r in requests]
        st.copy_(type(st).cat(fresh).pinned(device), non_blocking=True)
        batch.poll.start[first:end].zero_()
        prompts = [torch.tensor(r.prompt[cached:], dtype=torch.int64) for r in requests]   # staged by the prefill
        self.runtime.call(self.program.prefill(*prompts, cached=[cached] * len(requests)), st, cache,
                          batch.clock)
        if self.iterations > 0 and getattr(self.program, "entry", 0):
            for step in self.program.steps[self.program.entry:]:
                self.runtime.call(step, st, cache, batch.clock)
        for b, (group, i) in enumerate(entries, first):
            self.running[b] = Running(group, i, (batch.poll.issued, b), began, model_s)
            self._limit += group.requests[i].max_new_tokens + batch.poll.lag + 3   # >= 1 token per live iteration
        batch.size = max(batch.size, self.runtime.batch_size(end))

    def _grow(self, more: int, most: int) -> None:
        """At least `more` free slots: the running requests move to a batch of twice the slots (or as many as
        needed; at most `most`)."""
        taken = sum(r is not None for r in self.running) + len(self.prefilling)
        self._regrow(min(max(2 * self.batch.slots, taken + more), most))

    def _lengthen(self, request: Request) -> bool:
        """A request that blocks the queue because it needs a longer cache than the batch has (its other shapes
        fit): the batch moves to a cache that long, if the K/V budget holds its slots at that length (True);
        otherwise the request waits for the batch to drain."""
        capacity = self.runtime.capacity(self.program, [request])
        if not (self.batch.shape.fits(request) and self.runtime.max_slots(capacity) >= self.batch.slots):
            return False
        self._regrow(self.batch.slots, capacity)
        return True

    def _regrow(self, slots: int, capacity: int | None = None) -> None:
        """The running (and prefilling) requests move to a batch of `slots` slots and at least `capacity` cache
        positions, after the tables in flight are handed out."""
        old = self.batch
        while old.poll.in_flight:
            self._deliver(old.poll.read())
        running = [(b, r) for b, r in enumerate(self.running) if r is not None]
        new = self.runtime.regrow(old, slots, capacity)
        self.running = [None] * new.slots
        for dst, (src, r) in enumerate(running):
            new.take(old, src, dst)
            r.slots = [(new.poll.issued, dst)]
            self.running[dst] = r
        prefilling, self.prefilling = self.prefilling, {}
        for dst, (src, p) in enumerate(prefilling.items(), len(running)):
            new.take(old, src, dst)
            self.prefilling[dst] = p
        new.size = self.runtime.batch_size(len(running))
        self.batch = new

    def _compact(self) -> None:
        """Once nothing waits, finished requests' slots stop riding along: the running requests move to the
        front slots (state and cache copied on the device, at most once per finished request) and the batch
        shrinks to them (compiled and graph modes: to the next power of two, so few sizes are compiled or
        captured). A table already in flight is read with each request's slot at the time it was issued."""
        batch = self.batch
        live = [b for b in range(batch.size) if self.running[b] is not None]
        size = self.runtime.batch_size(len(live))
        if not live or size >= batch.size:
            return
        for slot, b in enumerate(live):
            if slot != b:
                batch.move(b, slot)
                self.running[slot], self.running[b] = self.running[b], None
                self.running[slot].slots.append((batch.poll.issued, slot))
        batch.size = size

    def _end_if_idle(self) -> None:
        """A busy period ends when no request runs and none waits, or the next one waiting does not fit the
        batch: the batch goes back to the runtime (the next step makes one that fits)."""
        if self.batch is None or any(self.running) or self.prefilling:
            return
        if not self.waiting or not self.batch.fits(self.waiting[0][0].requests[self.waiting[0][1]]):
            self.model_s = self.batch.clock.model_s - self._began_model_s
            self.runtime.release(self.batch)
            self.batch, self.running = None, []

    def _fail(self, err: BaseException) -> None:
        """An exception inside a step: every request of this scheduler ends with it (their callers raise it),
        and the scheduler starts afresh."""
        groups = ({r.group for r in self.running if r is not None} | {g for g, _ in self.waiting}
                  | {p.group for p in self.prefilling.values()})
        for group in groups:
            group.error = err
        self.waiting.clear()
        if self.batch is not None:
            self.runtime.release(self.batch)
        self.batch, self.running, self.prefilling = None, [], {}

