"""Whether the host may read a tensor's values to skip work: on the CPU, eagerly, where a read costs nothing.

The logits processing (decode/sampling.py) skips the paths no request of a batch takes, the torch attention
(model/attention.py) reads only the pages its rows see, and the epilogue skips the stop sequences no request has.
On another device, or in a step being compiled, nothing reads: every row takes every rule and every call reads
its whole page table (the device path). tests/host_reads.py counts the reads of that path, what a GPU would pay,
by patching `reads_are_free` here, so callers look it up through the module (`host.reads_are_free`)."""
from __future__ import annotations

import torch


def reads_are_free(t: torch.Tensor) -> bool:
    return t.device.type == "cpu" and not torch.compiler.is_compiling()
