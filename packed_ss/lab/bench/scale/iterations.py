"""One decode iteration of each schedule through the real runtime (CUDA graphs on CUDA, the engine's default
epilogue - native where built -, the status poll), split into model time and everything else, per batch.

The model time is the runtime's own clock where it has one (eager); under CUDA graphs, where a replay cannot
be split, it is the graph-replayed forward of the iteration's own call layouts at the same batch and the
iteration's mean cache length (latency.time_layouts), and everything else is the rest of the iteration."""
from __future__ import annotations

import math

import numpy as np
import torch

from ....decode.sampling import SamplingParams
from ....engine import Engine
from ....runtime.program import call_layouts
from ..iteration import iteration_cost
from ..latency import time_layouts

QUADRATIC_MAX_ROWS = 128     # Quadratic-SS runs at the widths whose call, B(B+1) rows, is at most this
REPEATS = 3                  # timed pairs of decodes, the median kept (a loaded CPU varies run to run)


def graph_pool_bytes(device: torch.device) -> int | None:
    """Bytes reserved in CUDA-graph private memory pools now (segments of a pool other than the default)."""
    if device.type != "cuda":
        return None
    return sum(s["total_size"] for s in torch.cuda.memory_snapshot()
               if tuple(s.get("segment_pool_id", (0, 0))) != (0, 0))


def plan(widths: list[int]) -> list[tuple[str, int]]:
    """(schedule, width) pairs run: AR once, Linear-SS and Packed-SS at every width, Quadratic-SS at the small
    ones (at least the smallest)."""
    small = [w for w in widths if (w + 1) * (w + 2) <= QUADRATIC_MAX_ROWS] or [min(widths)]
    return [("ar", 1)] + [(s, w) for s in ("linear", "packed") for w in widths] + [("quadratic", w) for w in small]


def prompts(model, batch: int, length: int, seed: int) -> list[list[int]]:
    """`batch` random prompts of `length` tokens, none of them the mask token."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.cfg.vocab_size - 1, (batch, length), generator=gen)
    return (ids + (ids >= model.cfg.mask_token_id).long()).tolist()


def measure(model, schedule: str, width: int, batch: int, prompt_len: int, new: int, reps: int) -> dict:
    """Milliseconds per iteration, model and non-model, of `batch` requests of `prompt_len` + `new` tokens."""
    graph = model.device.type == "cuda"
    engine = Engine(model, schedule=schedule, width=width, cuda_graph=graph)
    if graph:
        torch.cuda.reset_peak_memory_stats(model.device)
    cost = iteration_cost(engine, prompts(model, batch, prompt_len, seed=batch), new, REPEATS)
    peak = torch.cuda.max_memory_allocated(model.device) if graph else None
    pool = graph_pool_bytes(model.device)
    model_ms, source = cost["model_ms_per_iteration"], "runtime clock"
    if math.isnan(model_ms):
        layouts = call_layouts(engine.program(SamplingParams()))
        cache_len = prompt_len + new // 2
        times = time_layouts(model, layouts, cache_len, cache_len + new + max(lay.rows for lay in layouts), reps,
                             batch, graph)
        model_ms, source = sum(1e3 * float(np.median(t)) for t in times), "graph replay of the iteration's calls"
    other = cost["ms_per_iteration"] - model_ms
    return {"schedule": schedule, "width": None if schedule == "ar" else width, "batch": batch,
            "mode": "graph" if graph else "eager", "epilogue": cost["epilogue"],
            "ms_per_iteration": cost["ms_per_iteration"], "model_ms": model_ms, "nonmodel_ms": other,
            "nonmodel_share": other / cost["ms_per_iteration"], "model_time": source,
            "iterations": cost["iterations"], "prefill_share": cost["prefill_share"], "peak_allocated_bytes": peak,
            "graph_pool_bytes": pool}
