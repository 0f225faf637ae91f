"""The stop poll: the one host read of an iteration.

After each iteration the device writes a small status row and the host copies it asynchronously into
pinned memory; the host reads a row `lag` iterations after it was issued: on CUDA one iteration late, so
the device always has the next iteration queued while the host waits; on the CPU at once (there is no
queue to keep full, an iteration of overshoot would be a wasted call, and the row is read in place). A
step after `done` changes nothing, so whatever ran past the stop is trimmed on the device already.

Two rows, one per way of consuming a request:
- generate: [done, hold] (hold: the program asks the host to step in before the next iteration; a state
  without `hold` has the row [done], which on the CPU is read straight from the state);
- stream:   [done, hold, n_out, start, out[start : start + B]], start being the output length at the
  previous publish and B the most tokens an iteration adds: the new tokens travel in the same read.
At the end of a request, `finish` reads the counts and (for generate) the output in one more read.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

STREAM_HEADER = 4   # done, hold, n_out, start


@dataclass
class Status:
    done: bool
    hold: bool
    tokens: list[int]   # streaming: tokens the iteration appended to the final output


class Poll:
    def __init__(self, device: torch.device, block: int, lag: int | None = None):
        self.cuda = device.type == "cuda"
        self.lag = (1 if self.cuda else 0) if lag is None else lag
        self.window = torch.arange(block, device=device)
        self.start = torch.zeros((), dtype=torch.int64, device=device)
        self.no_hold = torch.zeros((), dtype=torch.bool, device=device)
        self.rows = {False: torch.zeros(2, dtype=torch.bool, device=device),
                     True: torch.zeros(STREAM_HEADER + block, dtype=torch.int64, device=device)}
        # Read in place when the row is host memory read at once; else through `lag + 1` host buffers (pinned,
        # with their events, on CUDA).
        self.copied = self.cuda or self.lag > 0
        self.host = {kind: [torch.zeros(row.shape, dtype=row.dtype, pin_memory=self.cuda) for _ in range(self.lag + 1)]
                     if self.copied else [row] for kind, row in self.rows.items()}
        self.events = [torch.cuda.Event() for _ in range(self.lag + 1)] if self.cuda else None
        self.stream = False
        self.flags: list[torch.Tensor] = []
        self.in_flight: deque[int] = deque()
        self._issued = 0

    def reset(self, st, stream: bool) -> None:
        """A new request (streamed or not) on state `st`: its output starts empty, nothing is in flight."""
        self.stream = stream
        self.flags = [st.done, st.hold] if hasattr(st, "hold") else [st.done]
        if not self.copied:   # read in place: the generate row of a state without `hold` is its done flag
            self.host[False] = [st.done.view(1) if len(self.flags) == 1 else self.rows[False]]
        self.start.zero_()
        self.in_flight.clear()

    def publish(self, st, stream: bool | None = None) -> None:
        """Device side (capturable): write this iteration's status row."""
        hold = getattr(st, "hold", self.no_hold)
        if not (self.stream if stream is None else stream):
            if self.copied or len(self.flags) > 1:
                torch.stack(self.flags, out=self.rows[False][:len(self.flags)])
            return
        window = st.out.index_select(0, (self.start + self.window).clamp(max=st.out.numel() - 1))
        row = self.rows[True]
        torch.stack([st.done.long(), hold.long(), st.n_out, self.start], out=row[:STREAM_HEADER])
        row[STREAM_HEADER:].copy_(window)
        self.start.copy_(st.n_out)

    def issue(self) -> None:
        """Queue the copy of the status row to the host behind the iteration that wrote it."""
        slot = self._issued % (self.lag + 1)
        self._issued += 1
        if self.copied:
            self.host[self.stream][slot].copy_(self.rows[self.stream], non_blocking=True)
        if self.cuda:
            self.events[slot].record()
        self.in_flight.append(slot)

    @property
    def due(self) -> bool:
        """Whether the oldest row in flight is `lag` iterations old."""
        return len(self.in_flight) > self.lag

    def read(self) -> Status:
        """Wait for the oldest row in flight and read it: the one host read of an iteration."""
        slot = self.in_flight.popleft()
        if self.cuda:
            self.events[slot].synchronize()
        values = self.host[self.stream][slot].tolist()
        if not self.stream:
            return Status(values[0], len(values) > 1 and values[1], [])
        done, hold, n_out, start, *window = values
        return Status(bool(done), bool(hold), window[:n_out - start])

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
