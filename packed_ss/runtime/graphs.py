"""CUDA-graph replay of a whole iteration: every step of the program and the poll's publish.

The first call runs the iteration eagerly on a side stream (lazy initialisation, Triton and cuBLAS
set-up, as torch's graph docs ask; it is also the first real iteration), then captures it; later calls
replay. The captured work reads and writes fixed addresses: the program's persistent state, the cache and
the poll's status row.
"""
from __future__ import annotations

from typing import Callable

import torch


def warm_up(run: Callable[[], None]) -> None:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)


def capture(run: Callable[[], None]) -> Callable[[], None]:
    """run() captured in a CUDA graph; returns its replay."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return graph.replay


class CapturedIteration:
    def __init__(self, run: Callable[[], None]):
        self.run = run
        self.replay: Callable[[], None] | None = None

    def __call__(self) -> None:
        if self.replay is None:
            warm_up(self.run)
            self.replay = capture(self.run)
        else:
            self.replay()
