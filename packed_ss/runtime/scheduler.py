"""One program's requests from every caller, in one running batch: waiting and running requests, slots, their
K/V pages, admission, preemption, compaction, abort, and `step`, one turn of the decode loop.

Callers (`Runtime.decode`: a generate, a stream, a batch, a thread) add their requests as a `Group` and drive
the loop themselves: whichever caller needs tokens it does not have yet runs `step` under the runtime's lock,
and every request's tokens and result land in its own group's events, so a caller gets exactly what its
requests get alone, whoever ran the iteration that made them. A step:
1. admits waiting requests into free slots, up to the runtime's `max_batch` running in all its schedulers (those
   waiting longer in another scheduler first), while the K/V pool has pages for
   them (those in consecutive slots prefill in one call; the batch grows when it has no free slot, and widens
   its page table for a request whose prompt and new tokens do not fit it; a request whose other shapes (stop
   tables, length cap) do not fit waits, and holds the queue, until the batch has drained). A prompt that starts
   with pages in the prefix cache (kv_pool.py) shares them and prefills only the rest. A prompt longer than the
   runtime's `prefill_chunk` enters its cache a chunk per step (K/V only) before its last part and first block
   are prefilled, so that a long prompt holds the running requests up by one chunk's call per step at most;
2. reads the table that is due (poll.py: at once on the CPU, one iteration late on CUDA) and hands out
   its new tokens, finished requests' results (read once, when they end; their pages go back, the full ones
   published) and holds;
3. gives every running request the pages its next call may write (`_slots_now`); when the pool has none
   left, the latest admitted request is preempted: its pages go back, its state row is kept, and it waits
   at the head of the queue to re-read its tokens' K/V and continue where it stopped;
4. runs one iteration of the whole batch (every step of the program, then the status table; an adaptive
   program's policy is told whether requests wait, Policy.batch_tokens) and queues the table's copy to the host;
5. once nothing waits, compacts: the running requests move to the front slots and the batch shrinks.
A group closed early (a generator closed, an exception in its caller) aborts its requests: their slots and
pages are freed at once and nothing else changes.
"""
from __future__ import annotations

import contextlib
import math
import time
import weakref
from collections import deque

import torch

from .admission import Admission
from .batch import Batch
from .graphs import SyncCheck
from .request import GenerateResult, Request
from .running import Group, Preempted, Prefilling, Running


class Scheduler(Admission):
    """`prefix_cache`: whether prompts (and, for programs whose committed cache follows the output, outputs) share
    published pages; the engine's option."""

    def __init__(self, runtime, program, prefix_cache: bool):
        self.runtime, self.program, self.prefix_cache = runtime, program, prefix_cache
        self.waiting: deque[tuple[Group, int]] = deque()
        self.groups: weakref.WeakSet[Group] = weakref.WeakSet()   # every group added whose caller still holds it
        self.batch: Batch | None = None
        self.running: list[Running | None] = []
        self.prefilling: dict[int, Prefilling] = {}  # slot -> a long prompt entering its cache, oldest first
        self.preempted: dict[tuple[Group, int], Preempted] = {}   # waiting to come back, at the head of the queue
        self.preemptions = 0
        self._admitted = 0                           # requests admitted so far (Running.admitted)
        self.shape = 0                               # the call shape the program chose last (poll table)
        self.iterations = self.slot_iterations = 0   # of the current (or last) busy period
        self.model_s = 0.0                           # model-call time of the last busy period (eager)
        self._limit = 0                              # iterations the busy period's requests may take at most
        self._began_model_s = 0.0

    @property
    def idle(self) -> bool:
        return self.batch is None and not self.waiting

    @property
    def pool(self):
        return self.runtime.pool

    def add(self, requests: list[Request], limit: int, stream: bool) -> Group:
        pool = self.pool
        for i, r in enumerate(requests):
            pages = self.runtime.pages_for(self._slots_at_most(r))
            if pages > pool.pages - 1:
                raise ValueError(f"request {i}: its K/V cache ({pages} pages, {pages * pool.page_bytes} bytes) "
                                 f"exceeds the K/V pool ({pool.pages - 1} pages, kv_cache_bytes "
                                 f"{self.runtime.kv_cache_bytes})")
        group = Group(requests, limit, stream, next(self.runtime.arrivals))
        group.scheduler = self
        self.groups.add(group)
        self.waiting.extend((group, i) for i in range(len(requests)))
        return group

    def abort(self, group: Group, results: bool = False) -> None:
        """The group's requests leave: the waiting ones at once, the running ones' slots freed now (their rows
        are marked done, so iterations change nothing there). `results`: a running request's GenerateResult so
        far (its output and counts, one read) goes to the group's results first."""
        group.aborted = True
        self.waiting = deque(w for w in self.waiting if w[0] is not group)
        for key in [k for k in self.preempted if k[0] is group]:
            del self.preempted[key]
        for slot in [b for b, p in self.prefilling.items() if p.group is group]:
            self.pool.release(self.prefilling.pop(slot).pages)
        with torch.inference_mode():
            for slot, r in enumerate(self.running):
                if r is not None and r.group is group:
                    if results:
                        group.results[r.index] = self._finish(slot, r)
                    self._leave(slot)
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
                if self.batch is None:            # its requests wait for slots the other schedulers hold
                    return
                self._prefill_chunk()
                batch, poll = self.batch, self.batch.poll
                if started and batch.size:        # the first table: requests may end in their prefill
                    poll.publish(batch.live)
                    poll.issue()
                with checked:
                    status = poll.read() if poll.due else None
                if status is not None:
                    self.shape = self._chosen_shape(status)
                    self._deliver(status)
                if self._may_iterate(status) and self._reserve():
                    self.iterations += 1
                    if self.iterations > self._limit:
                        raise RuntimeError("decoder made no progress; this is a bug")
                    self.slot_iterations += batch.size
                    live = [r for r in self.running if r is not None]
                    for r in live if len(live) > 1 else ():
                        r.shared = True
                    if self.program.policy is not None:     # a quick request's tokens are worth more while others wait
                        batch.state.queued.fill_(bool(self.waiting))
                    with checked:
                        self.batch.iterate(first=self.iterations == 1, shape=self.shape)
                        self.batch.poll.issue()
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
        policy = self.program.policy
        if policy is None:
            return 0
        seen = [r.slot_at(status.seq) for r in self.running if r is not None]
        rows = [None if b is None else (status.choice[b], status.quiet[b]) for b in seen
                if b is None or not status.done[b]]
        return policy.next_call(rows, self.batch.poll.lag)

    def _deliver(self, status) -> None:
        """Hand out a table's tokens and results; resume held requests; free finished requests' slots."""
        for slot, r in enumerate(self.running):
            b = None if r is None else r.slot_at(status.seq)
            if b is None:                               # idle, or admitted after this table
                continue
            r.n_out = status.n_out[b]                   # what `_slots_now` counts from
            if status.hold[b] and not status.done[b]:   # rare (any-order truncation; batches of one)
                self._resume(slot)
            if r.group.stream and status.tokens[b]:
                r.group.events.append((r.index, status.tokens[b]))
            if status.done[b]:
                result = self._finish(slot, r)
                r.group.results[r.index] = result
                r.group.events.append((r.index, result))
                r.group.finished += 1
                self._leave(slot)

    def _leave(self, slot: int) -> None:
        """The request in `slot` leaves it: its row is done, its pages go back to the pool."""
        self.running[slot].group.running -= 1
        self.running[slot] = None
        self.batch.state.done[slot].fill_(True)
        self.pool.release(self.batch.free(slot))

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
        publish = self.prefix_cache and self.program.cache_in_order   # its cache positions hold prompt + output
        counts = torch.cat([st.nfe, st.n_verify, st.n_accepted, st.n_bonus, st.n_out, st.accepted_at[0]]
                           + ([st.cache_len] if publish else []))
        output = st.out[0, : r.request.max_new_tokens]   # the batch's buffers fit its longest request
        nfe, n_verify, n_accepted, n_bonus, n_out, *rest = poll.fetch(torch.cat([counts, output]))
        width = st.accepted_at.shape[1]
        accepted_at, rest = rest[:width], rest[width:]
        output = rest[1:] if publish else rest
        if publish:
            self.pool.publish(self.batch.pages[slot], (r.request.prompt + output[:n_out])[:rest[0]])
        extras = self.program.finish(st, poll.fetch)
        # Model time is this request's alone only when it ran alone, timed call by call.
        alone = self.runtime.executor.times_model and not r.shared
        model_s = self.batch.clock.model_s - r.model_s if alone else math.nan
        return GenerateResult(output[:n_out], nfe, time.perf_counter() - r.began, model_s, n_verify, n_accepted,
                              n_bonus, accepted_at, cached_tokens=r.cached, **extras)

    # -- pages of running requests ---------------------------------------------------------------------
    def _reserve(self) -> bool:
        """Pages for the next call of every running request, the earliest admitted first. When the pool has too
        few, the latest admitted request is preempted (it may be the one in need), until the others have theirs.
        Whether any request is left to iterate."""
        batch = self.batch
        for slot in sorted((b for b, r in enumerate(self.running) if r is not None),
                           key=lambda b: self.running[b].admitted):
            r = self.running[slot]
            while r is not None and self.running[slot] is r:   # until it has its pages or has left (preempted, done)
                more = self.pool.extend(batch.pages[slot], self._slots_now(r.request, r.n_out))
                if more is not None:
                    batch.give(slot, more)
                    break
                if not self.program.cache_in_order:    # holds its pages from the start: it never asks for more
                    raise RuntimeError("an any-order request asked for K/V pages; this is a bug")
                self._preempt(max((b for b, q in enumerate(self.running) if q is not None),
                                  key=lambda b: self.running[b].admitted))
        return any(r is not None for r in self.running)

    def _preempt(self, slot: int) -> None:
        """The request in `slot` gives its pages back and waits at the head of the queue with its state row
        and the tokens whose K/V its cache held (read once, with the tables in flight handed out first)."""
        batch, poll = self.batch, self.batch.poll
        while poll.in_flight:
            self._deliver(poll.read())
        r = self.running[slot]
        if r is None:                                   # it ended in the tables just read
            return
        st = batch.state.slot(slot)
        n_out, cache_len, *output = poll.fetch(torch.cat([st.n_out, st.cache_len,
                                                          st.out[0, :r.request.max_new_tokens]]))
        key = (r.group, r.index)
        self.preempted[key] = Preempted(r, type(st).cat([st]), (r.request.prompt + output[:n_out])[:cache_len], n_out,
                                        entry_due=self.iterations == 0)
        r.slots.append((poll.issued, None))             # in no slot from the next table on
        self._leave(slot)
        self.waiting.appendleft(key)
        self.preemptions += 1

    def _regrow(self, slots: int, capacity: int | None = None) -> None:
        """The running (and prefilling) requests move to a batch of `slots` slots and at least `capacity` cache
        positions per request (their pages change tables, no K/V moves), after the tables in flight are handed
        out."""
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
        front slots (state and table rows copied on the device, at most once per finished request) and the batch
        shrinks to them (as many slots as the executor pads them to). A table already in flight is read with each
        request's slot at the time it was issued."""
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
        batch's shapes (its buffers and stop tables; a longer page table only is a regrow, admission's
        `_lengthen`): the batch is let go (the next step makes one that fits)."""
        if self.batch is None or any(self.running) or self.prefilling:
            return
        if not self.waiting or not self.batch.shape.fits(self.waiting[0][0].requests[self.waiting[0][1]]):
            self.model_s = self.batch.clock.model_s - self._began_model_s
            self.batch, self.running = None, []

    def _fail(self, err: BaseException) -> None:
        """An exception inside a step: every request of this scheduler ends with it (their callers raise it),
        those it was starting or restoring when it failed included, and the scheduler starts afresh."""
        for group in list(self.groups):
            if not group.done:
                group.error = err
        self.waiting.clear()
        self.preempted.clear()
        for p in self.prefilling.values():
            self.pool.release(p.pages)
        if self.batch is not None:
            with torch.inference_mode():
                for slot in range(self.batch.slots):
                    self.pool.release(self.batch.free(slot))
        self.batch, self.running, self.prefilling = None, [], {}

