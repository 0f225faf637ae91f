"""The server's one decode loop: a thread that drives every HTTP request's stream on one Engine.

A handler makes the request's `engine.stream(...)` generator (arguments checked there, on the event loop,
before anything runs) and `submit`s it. The thread starts up to `max_batch` of them (the rest wait, at most
`max_waiting`: beyond that `submit` refuses) and takes tokens from each in turn: all of them are requests of
the engine's one scheduler per sampling setting, so they decode in one running batch, each exactly as alone
(runtime/scheduler.py), and a request joins the batch at the next iteration. Tokens go to the handler's
asyncio queue through its event loop, so the loop never blocks on decoding; a cancelled request (a client
gone, a stop string reached) has its generator closed, which aborts it and frees its slot.
"""
from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass, field

from .metrics import Metrics


class QueueFull(Exception):
    pass


@dataclass
class Pending:
    """A submitted request: its generator, the handler's loop and queue, and whether it was cancelled. The
    queue receives ("tokens", list), then ("done", GenerateResult), ("error", exception) or ("aborted", None)."""
    stream: object
    prompt_tokens: int
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: bool = False

    def send(self, kind: str, value) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))


class DecodeWorker:
    def __init__(self, metrics: Metrics, max_batch: int, max_waiting: int):
        self.metrics, self.max_batch, self.max_waiting = metrics, max_batch, max_waiting
        self.waiting: list[Pending] = []
        self.active: list[Pending] = []
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._queued = 0                 # submitted, not yet started (the bound of max_waiting)
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
    def submit(self, stream, prompt_tokens: int) -> Pending:
        with self._count_lock:
            if self._queued >= self.max_waiting + max(0, self.max_batch - len(self.active)):
                raise QueueFull(f"{self._queued} requests are waiting (--max-waiting {self.max_waiting})")
            self._queued += 1
        pending = Pending(stream, prompt_tokens, asyncio.get_running_loop())
        self._inbox.put(pending)
        return pending

    def cancel(self, pending: Pending) -> None:
        pending.cancelled = True
        self._inbox.put(())              # wake the thread if it is idle

    @property
    def counts(self) -> tuple[int, int]:
        """(running, waiting)."""
        return len(self.active), self._queued

    # -- the decode thread -----------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopping:
            self._take(block=not self.active and not self.waiting)
            while self.waiting and len(self.active) < self.max_batch:
                self.active.append(self.waiting.pop(0))
                with self._count_lock:
                    self._queued -= 1
            for pending in list(self.active):
                self._advance(pending)

    def _take(self, block: bool) -> None:
        try:
            item = self._inbox.get(block=block)
            while True:
                if isinstance(item, Pending):
                    self.waiting.append(item)
                item = self._inbox.get_nowait()
        except queue.Empty:
            pass
        for pending in [p for p in self.waiting if p.cancelled]:
            self.waiting.remove(pending)
            with self._count_lock:
                self._queued -= 1
            pending.send("aborted", None)

    def _advance(self, pending: Pending) -> None:
        """The request's next tokens (running the batch's steps it needs), or its end."""
        if pending.cancelled:
            pending.stream.close()        # aborts the request: its slot is free at the next step
            self.active.remove(pending)
            self.metrics.add(request_aborted=1)
            pending.send("aborted", None)
            return
        began = time.perf_counter()
        try:
            tokens = next(pending.stream)
        except StopIteration as end:
            self.active.remove(pending)
            self.metrics.finished(pending.prompt_tokens, end.value)
            pending.send("done", end.value)
        except Exception as err:          # this request's (its batch's) failure; the loop serves on
            self.active.remove(pending)
            self.metrics.add(request_failure=1)
            pending.send("error", err)
        else:
            pending.send("tokens", tokens)
        finally:
            self.metrics.add(decode_busy_seconds=time.perf_counter() - began)
