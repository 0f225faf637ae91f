"""dtype="auto": on a CPU, float32 or bfloat16, whichever runs this model's calls faster on this machine.

A CPU's bf16 speed depends on the processor more than on the model (DESIGN §13). On an AMD EPYC with
avx512_bf16 a bf16 call is faster than an fp32 one at every row count. On an Intel Xeon with AMX (torch 2.13.0),
a bf16 call of 64 rows costs 1.3x one of one row, but the one-row call is 1.3x slower than in fp32
(bench/RESULTS.md, "The Intel Xeon with AMX"). So the choice is measured, never assumed: the
median time of the model's calls at ROWS rows (AR's one row and a speculative call's), in each dtype, and the
dtype with the smaller total wins. The choice is remembered per model and machine, as the auto widths are
(width.remembered), so a process measures it once and later ones read it. On CUDA "auto" is the checkpoint's
own dtype (width.py's call cost is not needed there: bf16 is what the GPU is built for).

bf16 trades exactness for speed: float32 keeps greedy output equal to `schedule="ar"` in the same dtype on
all but near-ties, bf16 flips more of them (the README's exactness table). A user who needs the exact path
passes dtype=torch.float32, the CPU default.
"""
from __future__ import annotations

import copy

import torch

from .model.attention import attention_backend
from .width import call_cost, machine, model_fingerprint, remembered

AUTO = "auto"
CANDIDATES = (torch.float32, torch.bfloat16)
ROWS = (1, 16)


def faster_dtype(model) -> tuple[torch.dtype, str]:
    """(the CPU dtype among CANDIDATES whose calls run faster for `model`, how that was known). `model` is
    loaded in float32 without a drafting adapter; it is not changed."""
    if model.dtype != torch.float32:
        raise ValueError(f"dtype='auto' measures from a float32 load, got a {model.dtype} model")
    key = {"question": "dtype", "model": model_fingerprint(model), "device": str(model.device),
           **machine(model.device), "rows": list(ROWS)}
    entry, measured = remembered(key, lambda: _measure(model))
    source = "measured now" if measured else f"remembered from {entry['measured_at']}"
    return getattr(torch, entry["dtype"]), f"{source}: ms per call at {list(ROWS)} rows {entry['ms']}"


def _measure(model) -> dict:
    ms = {}
    for dtype in CANDIDATES:
        candidate = model if dtype == model.dtype else copy.deepcopy(model).to(dtype)
        cost = call_cost(candidate, attention_backend("torch"), "torch", list(ROWS))
        ms[str(dtype).removeprefix("torch.")] = [round(cost.tau_ms + cost.delta_ms * n, 3) for n in ROWS]
    fastest = min(ms, key=lambda name: sum(ms[name]))
    return {"dtype": fastest, "ms": ms}
