"""The half of the scheduler (scheduler.py) that brings waiting requests into slots: which may start, the pages
each must hold (its prompt's published pages from the prefix cache first), a long prompt read in a chunk per
step, a preempted request coming back to continue where it stopped, the prefill call, and the batch's growth
(more slots, a longer page table) when a request needs it."""
from __future__ import annotations

import bisect
import time

import torch

from ..model.dual_mode import KVCache
from .request import Request
from .running import Group, Prefilling, Running
from .staging import staged

MAX_BATCH = 256   # requests in one batch at most


class Admission:
    """Admission for a Scheduler (its base): the waiting queue, slots, pages and prefill it shares."""

    # -- slots -------------------------------------------------------------------------------------------
    def _admissible(self, room: int) -> tuple[list[tuple[Group, int]], Request | None]:
        """The waiting requests that may start now, in order, `room` at most, less the slots that requests waiting
        longer in the runtime's other schedulers take first (arrival order across schedulers); every group
        within its limit, and none after one the batch does not fit (it waits until the batch has drained, then
        a batch is made to fit it); and that request, if one blocks the queue."""
        taken, admissible = {}, []
        earlier = self.runtime.waiting_elsewhere(self) if self.waiting else []
        for group, i in self.waiting:
            if len(admissible) + bisect.bisect_left(earlier, (group.arrival, i)) >= room:
                break
            if group.running + taken.get(group, 0) >= group.limit:
                continue
            if self.batch is not None and not self.batch.fits(group.requests[i]):
                return admissible, group.requests[i]
            taken[group] = taken.get(group, 0) + 1
            admissible.append((group, i))
        return admissible, None

    @property
    def occupied(self) -> int:
        """Requests holding a slot: running, or a long prompt reading in."""
        return sum(r is not None for r in self.running) + len(self.prefilling)

    def _free(self) -> list[int]:
        return [b for b, r in enumerate(self.running) if r is None and b not in self.prefilling]

    def _admit(self) -> None:
        most = min(self.program.max_batch or MAX_BATCH, self.runtime.max_batch)
        room = min(most - self.occupied, self.runtime.max_batch - self.runtime.occupied)   # the rest wait
        admissible, blocked = self._admissible(room)
        if self.batch is not None and blocked is not None and self._lengthen(blocked):
            admissible, _ = self._admissible(room)
        if not admissible:
            return
        if self.batch is None:
            self.batch = self.runtime.hold(self.program, [g.requests[i] for g, i in admissible], len(admissible))
            self.running = [None] * self.batch.slots
            self.iterations = self.slot_iterations = self._limit = 0
            self._began_model_s = self.batch.clock.model_s
        free = self._free()
        if len(free) < len(admissible):
            self._grow(len(admissible) - len(free), most)
            free = self._free()
        starts = []
        for slot, entry in zip(free, admissible):
            placed = self._restore(slot, entry) if entry in self.preempted else self._place(slot, entry, starts)
            if not placed:         # the pool has no pages for it: it, and those after it, wait
                break
        while starts:       # each run of consecutive free slots prefills in one call
            run = 1
            while run < len(starts) and starts[run][0] == starts[0][0] + run:
                run += 1
            self._start(starts[0][0], [entry for _, entry, _ in starts[:run]], [c for *_, c in starts[:run]])
            starts = starts[run:]

    # -- pages --------------------------------------------------------------------------------------------
    def _slots_at_most(self, request: Request) -> int:
        return len(request.prompt) + request.max_new_tokens + self.program.reserve

    def _slots_now(self, request: Request, n_out: int) -> int:
        """Cache positions a request must hold before the next call: its prompt and its output as the last table
        showed it (`n_out`), what the iterations in flight may have added (a block each) and the slots a call may
        write past the output (the program's reserve); never more than it can ever use. A program whose
        committed cache does not follow the output (any order) holds all of that from the start."""
        if not self.program.cache_in_order:
            return self._slots_at_most(request)
        ahead = len(self.batch.poll.in_flight) * self.program.block + self.program.reserve
        return min(self._slots_at_most(request), len(request.prompt) + n_out + ahead)

    @property
    def _unseen(self) -> int:
        """The output length to count for a request no table has shown yet: the most its prefill and its entry
        iteration can emit."""
        return 1 + self.program.block

    def _place(self, slot: int, entry: tuple[Group, int], starts: list) -> bool:
        """A waiting request into `slot` if the pool has its pages (its prompt's published pages first): a long
        prompt starts reading in, any other joins `starts` (slot, entry, prompt tokens cached)."""
        group, i = entry
        prompt = group.requests[i].prompt
        got = self.pool.acquire(prompt, len(prompt) - 1 if self.prefix_cache else 0,     # the last row draws
                                self._slots_now(group.requests[i], self._unseen))
        if got is None:
            return False
        pages, cached = got
        self.waiting.remove(entry)
        group.running += 1
        if len(prompt) - cached > self.runtime.prefill_chunk:
            self.prefilling[slot] = Prefilling(group, i, time.perf_counter(), self.batch.clock.model_s, pages, cached)
        else:
            self.batch.give(slot, pages)
            starts.append((slot, entry, cached))
        return True

    def _restore(self, slot: int, entry: tuple[Group, int]) -> bool:
        """A preempted request back into `slot` if the pool has its pages: the published ones of its tokens first,
        the rest of its cache re-read (K/V only, a chunk per call), then its state row as it was."""
        pre = self.preempted[entry]
        r, batch, chunk = pre.running, self.batch, self.runtime.prefill_chunk
        got = self.pool.acquire(pre.tokens, len(pre.tokens) if self.prefix_cache else 0,
                                self._slots_now(r.request, pre.n_out))
        if got is None:
            return False
        pages, cached = got
        del self.preempted[entry]
        self.waiting.remove(entry)
        r.group.running += 1
        batch.give(slot, pages)
        for start in range(cached, len(pre.tokens), chunk):
            self.runtime.prefix(pre.tokens[start:start + chunk], start, batch.cache.rows(slot, slot + 1), batch.clock)
        if self.prefix_cache:
            self.pool.publish(pages, pre.tokens)
        batch.state.slot(slot).copy_(pre.state)
        if pre.entry_due:                            # preempted before the batch's first iteration (Linear-SS)
            self._enter(slot, slot + 1)
        batch.poll.start[slot].fill_(pre.n_out)
        r.slots.append((batch.poll.issued, slot))
        r.n_out, r.shared = pre.n_out, True
        self.running[slot] = r
        self._joined()
        self._limit += r.request.max_new_tokens + batch.poll.lag + 3
        batch.size = max(batch.size, self.runtime.batch_size(slot + 1))
        return True

    # -- prefill -------------------------------------------------------------------------------------------
    def _prefill_chunk(self) -> None:
        """The oldest long prompt's next chunk into its cache, or, when the rest fits one chunk, its prefill."""
        if not self.prefilling:
            return
        slot, p = next(iter(self.prefilling.items()))
        chunk, batch = self.runtime.prefill_chunk, self.batch
        if len(p.prompt) - p.cached > chunk:
            own = KVCache(batch.cache.k, batch.cache.v, staged(torch.tensor([p.pages]), batch.table.device))
            self.runtime.prefix(p.prompt[p.cached:p.cached + chunk], p.cached, own, batch.clock)
            p.cached += chunk
            return
        del self.prefilling[slot]
        batch.give(slot, p.pages)
        self._start(slot, [(p.group, p.index)], [p.cached], [p.hit], p.began, p.model_s)

    def _start(self, first: int, entries: list[tuple[Group, int]], cached: list[int], hits: list[int] | None = None,
               began: float | None = None, model_s: float | None = None) -> None:
        """Requests `entries` into slots first, first + 1, ... (their pages given): fresh states (built on the
        host, copied without waiting) and one prefill call for all of them (`cached`: the prompt tokens each one's
        cache holds already, from the prefix cache (`hits`, default all of them) or a long prompt's chunks). Their
        prompts' full pages are published. A program whose first iteration starts later than its others
        (`entry`, Linear-SS) runs that iteration for them too when they join a batch already running; any other
        joins the batch's next iteration."""
        batch, end, device = self.batch, first + len(entries), self.runtime.model.device
        requests = [group.requests[i] for group, i in entries]
        began = time.perf_counter() if began is None else began
        model_s = batch.clock.model_s if model_s is None else model_s
        st, cache = batch.state.rows(first, end), batch.cache.rows(first, end)
        fresh = [self.program.new_state(r, **batch.shape.kwargs(), device="cpu") for r in requests]
        st.copy_(type(st).cat(fresh).pinned(device), non_blocking=True)
        batch.poll.start[first:end].zero_()
        prompts = [torch.tensor(r.prompt[c:], dtype=torch.int64) for r, c in zip(requests, cached)]   # staged
        self.runtime.call(self.program.prefill(*prompts, cached=cached), st, cache, batch.clock)
        if self.iterations > 0:
            self._enter(first, end)
        for b, (group, i), hit in zip(range(first, end), entries, hits or cached):
            self.running[b] = Running(group, i, (batch.poll.issued, b), began, model_s, hit, self._admitted,
                                      self._unseen)
            self._admitted += 1
            self._limit += group.requests[i].max_new_tokens + batch.poll.lag + 3   # >= 1 token per live iteration
            if self.prefix_cache:
                self.pool.publish(batch.pages[b], group.requests[i].prompt)
        batch.size = max(batch.size, self.runtime.batch_size(end))
        self._joined()

    def _joined(self) -> None:
        """Requests joined the batch after the status table the call shape came from: an adaptive program's policy
        makes it a shape that treats them as unseen (Policy.joined). Without this, a step that reads no table
        (after a regrow, or on a new batch) would run the lean AR step over a newcomer that chose to verify a
        draft, and its tokens would differ from its tokens alone."""
        if self.program.policy is not None:
            self.shape = self.program.policy.joined(self.shape)

    def _enter(self, first: int, end: int) -> None:
        """A program whose first iteration starts later than its others (`entry`, Linear-SS: its prefill drafted
        already) runs that first iteration now for slots first..end-1, which join a batch already running."""
        entry, batch = self.program.entry, self.batch
        if not entry:
            return
        st, cache = batch.state.rows(first, end), batch.cache.rows(first, end)
        for step in self.program.steps[entry:]:
            self.runtime.call(step, st, cache, batch.clock)

    def _grow(self, more: int, most: int) -> None:
        """At least `more` free slots: the running requests move to a batch of twice the slots (or as many as
        needed; at most `most`)."""
        self._regrow(min(max(2 * self.batch.slots, self.occupied + more), most))

    def _lengthen(self, request: Request) -> bool:
        """A request that blocks the queue because it needs a longer cache than the batch's table holds (its other
        shapes fit): the batch moves to a table that long (True); otherwise the request waits for the batch to
        drain."""
        capacity = self.runtime.capacity(self.program, [request])
        if not self.batch.shape.fits(request):
            return False
        self._regrow(self.batch.slots, capacity)
        return True
