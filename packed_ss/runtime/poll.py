"""The stop poll: the one host read of an iteration.

After each iteration the device writes a status row [done, hold, n_out, start, nfe, n_verify, n_accepted,
out[start : start + B]] (start: the output length at the previous publish; B: the most tokens an iteration
adds) and the host
copies it asynchronously into pinned memory. The host reads a row `lag` iterations after it was issued:
on CUDA one iteration late, so the device always has the next iteration queued while the host waits; on
the CPU at once (there is no queue to keep full, and an iteration of overshoot would be a wasted call).
A step after `done` changes nothing, so whatever ran past the stop is trimmed on the device already. The
same row carries the new tokens, which is how `Engine.stream` yields them without a second read.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

HEADER = 7   # done, hold, n_out, start, nfe, n_verify, n_accepted


@dataclass
class Status:
    done: bool
    hold: bool
    tokens: list[int]   # tokens the iteration appended to the final output
    counts: tuple[int, int, int]   # nfe, n_verify, n_accepted so far


class Poll:
    def __init__(self, device: torch.device, block: int, lag: int | None = None):
        cuda = device.type == "cuda"
        self.lag = (1 if cuda else 0) if lag is None else lag
        self.window = torch.arange(block, device=device)
        self.status = torch.zeros(HEADER + block, dtype=torch.int64, device=device)
        self.start = torch.zeros((), dtype=torch.int64, device=device)
        self.no_hold = torch.zeros((), dtype=torch.bool, device=device)
        self.host = [torch.zeros(HEADER + block, dtype=torch.int64, pin_memory=cuda) for _ in range(self.lag + 1)]
        self.events = [torch.cuda.Event() if cuda else None for _ in range(self.lag + 1)]
        self.in_flight: deque[int] = deque()
        self._issued = 0

    def reset(self) -> None:
        """A new request: its output starts empty, nothing is in flight."""
        self.start.zero_()
        self.in_flight.clear()

    def publish(self, st) -> None:
        """Device side (capturable): write this iteration's status row, then move `start` to n_out."""
        hold = getattr(st, "hold", self.no_hold)
        window = st.out.index_select(0, (self.start + self.window).clamp(max=st.out.numel() - 1))
        flags = torch.stack([st.done.long(), hold.long(), st.n_out, self.start, st.nfe, st.n_verify, st.n_accepted])
        self.status.copy_(torch.cat([flags, window]))
        self.start.copy_(st.n_out)

    def issue(self) -> None:
        """Queue the copy of the status row to the host behind the iteration that wrote it."""
        slot = self._issued % len(self.host)
        self._issued += 1
        self.host[slot].copy_(self.status, non_blocking=True)
        if self.events[slot] is not None:
            self.events[slot].record()
        self.in_flight.append(slot)

    @property
    def due(self) -> bool:
        """Whether the oldest row in flight is `lag` iterations old."""
        return len(self.in_flight) > self.lag

    def read(self) -> Status:
        """Wait for the oldest row in flight and read it: the one host read of an iteration."""
        slot = self.in_flight.popleft()
        if self.events[slot] is not None:
            self.events[slot].synchronize()
        done, hold, n_out, start, nfe, n_verify, n_accepted, *window = self.host[slot].tolist()
        return Status(bool(done), bool(hold), window[:n_out - start], (nfe, n_verify, n_accepted))

    def fetch(self, t: torch.Tensor) -> list:
        """A tensor's values on the host through a pinned copy and an event wait (no implicit sync): for
        what a program reads once at the end of a request, such as the any-order trace."""
        if self.events[0] is None:
            return t.tolist()
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        event.synchronize()
        return host.tolist()
