"""Host-built tensors onto the device without a host stall: built on the CPU, copied from pinned memory with a
non-blocking copy (on CUDA; elsewhere a plain move). Admission builds a request's fresh state, its prompt and
its prefill layout this way, so a request joining a running batch queues its copies behind the batch's
iterations instead of waiting for them (PyTorch's pinned-memory allocator keeps a buffer alive until its
copy has run)."""
from __future__ import annotations

import torch


def pinned(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host tensor `t`, in pinned memory when it is bound for a CUDA device."""
    return t.pin_memory() if torch.device(device).type == "cuda" and t.device.type == "cpu" else t


def staged(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`t` (built on the host) on `device`, copied without waiting."""
    return pinned(t, device).to(device, non_blocking=True)
