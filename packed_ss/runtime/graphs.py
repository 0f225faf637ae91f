"""CUDA-graph replay of a whole iteration: every step of the program and the poll's publish.

The first call runs the iteration eagerly on a side stream (lazy initialisation, Triton and cuBLAS
set-up, as torch's graph docs ask; it is also the first real iteration), then captures it; later calls
replay. The captured work reads and writes fixed addresses: the program's persistent state, the cache and
the poll's status row.
"""
from __future__ import annotations

import os
from typing import Callable

import torch


class SyncCheck:
    """With PACKED_SS_CHECK_SYNCS=1 on CUDA, the runtime runs its iterations and polls inside this context:
    torch.cuda.set_sync_debug_mode("error"), so any implicit host synchronisation in a step raises. The
    request's setup, the prefill, graph capture and the host's rare resume() stay outside it."""

    @staticmethod
    def wanted(device: torch.device) -> bool:
        return device.type == "cuda" and os.environ.get("PACKED_SS_CHECK_SYNCS", "0") == "1"

    def __enter__(self):
        torch.cuda.set_sync_debug_mode("error")

    def __exit__(self, *exc):
        torch.cuda.set_sync_debug_mode("default")


def _unchecked(run: Callable[[], None]) -> None:
    """run() with the sync debug mode off (capture synchronises the device by design)."""
    if not torch.cuda.is_available():   # the CPU stand-ins of tests/test_runtime.py
        run()
        return
    mode = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("default")
    try:
        run()
    finally:
        torch.cuda.set_sync_debug_mode(mode)


def warm_up(run: Callable[[], None]) -> None:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)


def capture(run: Callable[[], None], pool=None) -> Callable[[], None]:
    """run() captured in a CUDA graph (in memory pool `pool`, default its own); returns its replay."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        run()
    return graph.replay


class CapturedIteration:
    def __init__(self, run: Callable[[], None]):
        self.run = run
        self.replay: Callable[[], None] | None = None

    def __call__(self) -> None:
        if self.replay is None:
            def prepare():
                warm_up(self.run)
                self.replay = capture(self.run)
            _unchecked(prepare)
        else:
            self.replay()
