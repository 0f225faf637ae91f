"""The stop poll: the one host read of an iteration, for every request in the batch at once.

After each iteration the device writes a small status table, one row per batch slot, and the host copies
it asynchronously into pinned memory; the host reads a table `lag` iterations after it was issued: on
CUDA one iteration late, so the device always has the next iteration queued while the host waits; on the
CPU at once (there is no queue to keep full, an iteration of overshoot would be a wasted call, and the
table is read in place). A step after `done` changes nothing, so whatever ran past the stop is trimmed on
the device already.

Each row is [done, hold, n_out, start, choice, quiet, out[start : start + window]]: hold asks the host to step in
before the next iteration (a program's `resume`), start is the output length at the previous publish, choice the
call shape the request chose for the next iteration and quiet the calls it stays quiet for (an adaptive program's,
decode/policy.py; 0 for the others), and window the most tokens a table may have to carry for a request, so the
new tokens travel in the same read. At the end of a request, `fetch` reads
its counts and output in one more read.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

HEADER = 6   # done, hold, n_out, start, choice, quiet


@dataclass
class Status:
    seq: int                   # which publish this is (0: after the first prefills), to tell requests apart
    done: list[bool]           # per slot
    hold: list[bool]
    n_out: list[int]           # per slot, the output length
    choice: list[int]          # per slot, the call shape the request chose for the next iteration
    quiet: list[int]           # per slot, the calls the request stays quiet for
    tokens: list[list[int]]    # per slot, the tokens the iteration appended to its output


class Poll:
    def __init__(self, device: torch.device, window: int, slots: int = 1, lag: int | None = None):
        self.cuda = device.type == "cuda"
        self.lag = (1 if self.cuda else 0) if lag is None else lag
        self.window = torch.arange(window, device=device)
        self.start = torch.zeros(slots, dtype=torch.int64, device=device)
        self.no_hold = torch.zeros(slots, dtype=torch.bool, device=device)
        self.zeros = torch.zeros(slots, dtype=torch.int64, device=device)    # choice and quiet of other programs
        self.table = torch.zeros(slots, HEADER + window, dtype=torch.int64, device=device)
        # Read in place when the table is host memory read at once; else through `lag + 1` host buffers
        # (pinned, with their events, on CUDA).
        self.copied = self.cuda or self.lag > 0
        self.host = ([torch.zeros(self.table.shape, dtype=torch.int64, pin_memory=self.cuda)
                      for _ in range(self.lag + 1)] if self.copied else [self.table])
        self.events = [torch.cuda.Event() for _ in range(self.lag + 1)] if self.cuda else None
        self.in_flight: deque[tuple[int, int]] = deque()   # (host buffer, seq)
        self.issued = 0

    def move(self, src: int, dst: int) -> None:
        """The request in slot `src` continues in slot `dst` (device side)."""
        self.start[dst].copy_(self.start[src])

    def publish(self, st) -> None:
        """Device side (capturable): write this iteration's status table for the batch `st` (rows of slots
        past it are left as they are: nobody reads them), in a few batched ops."""
        n = st.batch
        hold = getattr(st, "hold", self.no_hold[:n])
        choice = getattr(st, "choice", self.zeros[:n])
        quiet = getattr(st, "quiet", self.zeros[:n])
        start = self.start[:n]
        window = st.out.gather(1, (start[:, None] + self.window).clamp(max=st.out.shape[1] - 1))
        header = torch.stack([st.done.long(), hold.long(), st.n_out, start, choice, quiet], 1)
        torch.cat([header, window], 1, out=self.table[:n])
        start.copy_(st.n_out)

    def issue(self) -> None:
        """Queue the copy of the status table to the host behind the iteration that wrote it."""
        buffer = self.issued % (self.lag + 1)
        if self.copied:
            self.host[buffer].copy_(self.table, non_blocking=True)
        if self.cuda:
            self.events[buffer].record()
        self.in_flight.append((buffer, self.issued))
        self.issued += 1

    @property
    def due(self) -> bool:
        """Whether the oldest table in flight is `lag` iterations old."""
        return len(self.in_flight) > self.lag

    def read(self) -> Status:
        """Wait for the oldest table in flight and read it: the one host read of an iteration."""
        buffer, seq = self.in_flight.popleft()
        if self.cuda:
            self.events[buffer].synchronize()
        rows = self.host[buffer].tolist()
        return Status(seq, [bool(r[0]) for r in rows], [bool(r[1]) for r in rows], [r[2] for r in rows],
                      [r[4] for r in rows], [r[5] for r in rows], [r[HEADER:][:r[2] - r[3]] for r in rows])
    def fetch(self, t: torch.Tensor) -> list:
        """A tensor's values on the host through a pinned copy and an event wait (no implicit sync): for
        what a request reads once at its end."""
        if not self.cuda:
            return t.tolist()
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        event.synchronize()
        return host.tolist()
