"""What a scheduler keeps of each request on the host: its caller's group, and where it is - in a slot, reading a
long prompt into its cache, or preempted and waiting to come back."""
from __future__ import annotations

from collections import deque

from .request import GenerateResult, Request


class Group:
    """A caller's requests: how many may run at once, when they came (`arrival`, counted across a runtime's
    schedulers), and what happened to them, in order (`events`: (index, tokens) as iterations add them when
    streamed, (index, GenerateResult) when one ends)."""

    def __init__(self, requests: list[Request], limit: int, stream: bool, arrival: int):
        self.requests, self.limit, self.stream, self.arrival = requests, limit, stream, arrival
        self.events: deque[tuple[int, list[int] | GenerateResult]] = deque()
        self.results: list[GenerateResult | None] = [None] * len(requests)
        self.running = self.finished = 0
        self.aborted = False
        self.error: BaseException | None = None
        self.scheduler = None                          # the scheduler it joined

    @property
    def done(self) -> bool:
        return self.finished == len(self.requests) or self.aborted or self.error is not None


class Running:
    """A request in a slot: its group and index, its slots (each from the first poll table that shows it
    there; None while preempted), its output length as of the last table read (before its first: the most it
    can have), its clocks, the prompt tokens its prefix-cache hit spared, when it was admitted (preemption
    takes the latest first), and whether another request shared an iteration with it."""

    def __init__(self, group: Group, index: int, slot: tuple[int, int], began: float, model_s: float,
                 cached: int, admitted: int, n_out: int):
        self.group, self.index = group, index
        self.request = group.requests[index]
        self.slots: list[tuple[int, int | None]] = [slot]
        self.began, self.model_s = began, model_s
        self.cached, self.admitted, self.n_out = cached, admitted, n_out
        self.shared = False

    def slot_at(self, seq: int) -> int | None:
        """Its row in the table published `seq`-th, None if it was not yet admitted then (or preempted)."""
        at = None
        for since, slot in self.slots:
            if since <= seq:
                at = slot
        return at


class Prefilling:
    """A request whose prompt is longer than the prefill chunk, in its slot: the first `cached` tokens of its
    prompt are in its `pages` (its row of the state stays idle, and its row of the page table names no page,
    until its prefill)."""

    def __init__(self, group: Group, index: int, began: float, model_s: float, pages: list[int], cached: int):
        self.group, self.index, self.began, self.model_s = group, index, began, model_s
        self.prompt = group.requests[index].prompt
        self.pages, self.cached, self.hit = pages, cached, cached


class Preempted:
    """A running request whose pages went back to the pool: its state row as it was (draft, stored Q, random
    number offset, statistics), and the tokens whose K/V its cache held, re-read into fresh pages when it comes
    back, so that it continues exactly where it stopped (`entry_due`: preempted before the batch's first
    iteration, which for some programs starts later than the others, so it still has that one to run)."""

    def __init__(self, running: Running, state, tokens: list[int], n_out: int, entry_due: bool):
        self.running, self.state, self.tokens, self.n_out = running, state, tokens, n_out
        self.entry_due = entry_due
