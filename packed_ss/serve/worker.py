"""The server's one decode loop: a thread that runs every HTTP request on one Engine.

A handler checks its request (`engine.request(...)`, on the event loop, before anything runs) and `submit`s
it. The thread adds it to the engine at once: the engine runs up to its `max_batch` of them at once and
queues the rest, the one admission layer (so the adaptive policy sees the queue it bets on). `submit` refuses
a request when `max_waiting` would wait beyond the batch's slots. Requests added together join the running
batch at the same step, so they prefill in one call; sampled ones are added first, so that greedy ones join
their batch (Engine.joining). Every step is one iteration of the whole batch (`engine.step()`), after which
each request's new tokens go to its handler's asyncio queue through its event loop (one wake-up of the loop
per step for all of them): the loop never blocks on decoding. A cancelled request (a client gone, a stop
string reached) is aborted and its slot freed.
"""
from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass, field

from ..runtime import GenerateResult
from .metrics import Metrics


class QueueFull(Exception):
    pass


@dataclass
class Pending:
    """A submitted request: the checked request, the handler's loop and queue, its group in the engine once added,
    and whether it was cancelled. The queue receives ("tokens", list), then ("done", GenerateResult),
    ("error", exception) or ("aborted", its GenerateResult so far, or None if it had not started)."""
    request: object
    prompt_tokens: int
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    group: object = None
    cancelled: bool = False
    submitted: float = field(default_factory=time.perf_counter)
    streamed: bool = False          # its first tokens went out (the time to first token is recorded)


def _put_all(items: list) -> None:
    for events, item in items:
        events.put_nowait(item)


class DecodeWorker:
    def __init__(self, engine, metrics: Metrics, max_waiting: int):
        self.engine, self.metrics, self.max_waiting = engine, metrics, max_waiting
        self.active: list[Pending] = []  # in the engine: running or in its queue
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._outbox: dict[asyncio.AbstractEventLoop, list] = {}   # events for the handlers, sent once per pass
        self._submitted = 0              # submitted, not yet ended
        self._running = 0                # of them, running at the last step (the engine's load)
        self._count_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="packed-ss decode", daemon=True)
        self._stopping = False

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._inbox.put(None)
        self._thread.join(timeout=30)

    # -- the handlers' side (event loop thread) -------------------------------------------------------------
    def submit(self, request, prompt_tokens: int) -> Pending:
        with self._count_lock:
            if self._submitted >= self.engine.max_batch + self.max_waiting:
                raise QueueFull(f"{self.max_waiting} requests are waiting already (--max-waiting)")
            self._submitted += 1
        pending = Pending(request, prompt_tokens, asyncio.get_running_loop())
        self._inbox.put(pending)
        return pending

    def cancel(self, pending: Pending) -> None:
        pending.cancelled = True
        self._inbox.put(())              # wake the thread if it is idle

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def counts(self) -> tuple[int, int]:
        """(running, waiting) at the last step."""
        return self._running, max(0, self._submitted - self._running)

    # -- the decode thread -----------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopping:
            for pending in sorted(self._take(block=not self.active), key=lambda p: p.request.params.greedy):
                self._add(pending)                                              # sampled ones first
            for pending in [p for p in self.active if p.cancelled]:
                self.engine.abort(pending.group)
                self._end(pending, "aborted", pending.group.results[0], request_aborted=1)
            if self.active:
                began = time.perf_counter()
                self.engine.step()
                self.metrics.add(decode_busy_seconds=time.perf_counter() - began)
            for pending in list(self.active):
                self._deliver(pending)
            self._running = self.engine.load()[0]
            self._flush()

    def _send(self, pending: Pending, kind: str, value) -> None:
        self._outbox.setdefault(pending.loop, []).append((pending.events, (kind, value)))

    def _flush(self) -> None:
        for loop, items in self._outbox.items():
            loop.call_soon_threadsafe(_put_all, items)
        self._outbox = {}

    def _take(self, block: bool) -> list[Pending]:
        """The requests submitted since the last pass (one cancelled already is answered here)."""
        taken = []
        try:
            item = self._inbox.get(block=block)
            while True:
                if isinstance(item, Pending):
                    taken.append(item)
                item = self._inbox.get_nowait()
        except queue.Empty:
            pass
        for pending in [p for p in taken if p.cancelled]:
            taken.remove(pending)
            self._ended()
            self._send(pending, "aborted", None)
        return taken

    def _add(self, pending: Pending) -> None:
        try:
            pending.group = self.engine.add(pending.request)
        except ValueError as err:         # e.g. a K/V budget it cannot fit
            self._ended()
            self.metrics.add(request_failure=1)
            self._send(pending, "error", err)
            return
        self.active.append(pending)

    def _ended(self) -> None:
        with self._count_lock:
            self._submitted -= 1

    def _deliver(self, pending: Pending) -> None:
        """The request's new tokens since the last step, and its end."""
        group = pending.group
        if group.error is not None:
            self._end(pending, "error", group.error, request_failure=1)
            return
        while group.events:
            _, event = group.events.popleft()
            if isinstance(event, GenerateResult):
                self.metrics.finished(pending.prompt_tokens, event)
                self._end(pending, "done", event)
                return
            if not pending.streamed:
                pending.streamed = True
                self.metrics.first_token(time.perf_counter() - pending.submitted)
            self._send(pending, "tokens", event)

    def _end(self, pending: Pending, kind: str, value, **counts) -> None:
        self.active.remove(pending)
        self._ended()
        if counts:
            self.metrics.add(**counts)
        self._send(pending, kind, value)
