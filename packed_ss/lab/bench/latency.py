"""Per-call latency of the model: forward time against input rows n over the schedules' own call layouts, at
a fixed cached length (and batch), fitted to tau + delta * n by least squares. On CUDA a call can be timed as
the replay of a captured CUDA graph, as the engine's graph mode runs it."""
from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np
import torch

from ...decode.sampling import SamplingParams
from ...decode.schedules.base import layout
from ...engine import Engine
from ...model.attention import Layout, attention_backend
from ...runtime.graphs import capture, warm_up
from ...runtime.program import call_layouts


def engine_capacity(prompt_len: int, max_new_tokens: int, width: int) -> int:
    """KV-cache view the engine gives a response's calls (the CPU attention reference attends over all of it)."""
    return 256 * math.ceil((prompt_len + max_new_tokens + 2 * (width + 1)) / 256)


def latency_points(model, widths: list[int], rows: list[int] | None = None,
                   max_rows: int | None = None) -> list[tuple[str, Layout]]:
    """(label, layout) per measured call: every decode call of every schedule at the given widths, and
    packed-shaped calls (n - n/2 causal anchors, n/2 cache-only scratch rows) of n in `rows` (default 2, 4, 8,
    ... below the widest packed call; n = 1 is the AR call). A schedule with two calls per iteration
    (Linear-SS) labels them by role: the verify call writes anchors to the cache, the draft call none.
    Calls of more than `max_rows` rows are left out."""
    points = {}

    def add(kind, lay):
        if max_rows is None or lay.rows <= max_rows:
            points.setdefault((lay.n_anchor, tuple(lay.seg.tolist()), tuple(lay.see.tolist())), (kind, lay))

    for w in widths:
        for name in ("ar", "linear", "quadratic", "packed"):
            layouts = call_layouts(Engine(model, schedule=name, width=w, epilogue="torch").program(SamplingParams()))
            for lay in layouts:
                add(name if len(layouts) == 1 else f"{name}-{'verify' if lay.n_anchor else 'draft'}", lay)
    top = 2 * (max(widths) + 1)
    for n in rows if rows is not None else [2 ** k for k in range(1, top.bit_length()) if 2 ** k < top]:
        add("packed-shape", layout(model.device, n - n // 2, [1] * (n // 2), [-1] * (n // 2)))
    return sorted(points.values(), key=lambda p: p[1].rows)


def _replayable(run: Callable[[], None], graph: bool, pool) -> Callable[[], None]:
    """run itself, or with `graph` (CUDA) the replay of its capture in the shared memory `pool`: the calls'
    outputs are never read, so one pool serves every capture whatever order they replay in."""
    if not graph:
        return run
    warm_up(run)
    return capture(run, pool)


def seconds(run: Callable[[], None], device: torch.device) -> float:
    """Wall time of one run: CUDA events around it on CUDA, the host clock elsewhere."""
    if device.type != "cuda":
        t0 = time.perf_counter()
        run()
        return time.perf_counter() - t0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    end.synchronize()
    return 1e-3 * start.elapsed_time(end)


@torch.inference_mode()
def time_layouts(model, layouts: list[Layout], cache_len: int, capacity: int, reps: int,
                 batch: int | None = None, graph: bool = False) -> list[list[float]]:
    """Seconds of each of `reps` forwards per layout at `cache_len` cached tokens in a cache view of
    `capacity` slots, one request (`batch` None) or `batch` requests per call, eager or (`graph`, CUDA)
    replayed from a CUDA graph. Calls are interleaved (one of each per repetition, in rotating order) so that
    load drift hits every size alike."""
    device = model.device
    attend = attention_backend("triton" if device.type == "cuda" else "torch")    # the engine's default
    cache = model.new_cache(capacity, batch)
    lead = () if batch is None else (batch,)
    clen = torch.full(lead, cache_len, device=device)
    gen = torch.Generator().manual_seed(0)
    pool = torch.cuda.graph_pool_handle() if graph else None
    runs = []
    for lay in layouts:
        tokens = torch.randint(0, model.cfg.vocab_size, (*lead, lay.rows), generator=gen)
        tokens[..., lay.n_anchor:] = model.cfg.mask_token_id
        offsets = torch.cat([torch.arange(lay.n_anchor), torch.arange(lay.rows - lay.n_anchor)])
        tokens, positions = tokens.to(device), (clen[..., None] if batch else clen) + offsets.to(device)
        run = (lambda t=tokens, p=positions, lay=lay: model(t, p, lay, cache, clen, attend=attend))
        runs.append(_replayable(run, graph, pool))
    for run in runs:          # warm up
        for _ in range(2):
            run()
    times = [[] for _ in runs]
    for r in range(reps):
        for j in range(len(runs)):
            i = (j + r) % len(runs)
            times[i].append(seconds(runs[i], device))
    return times


def fit_line(rows, ms) -> tuple[float, float]:
    """(tau, delta) of the least-squares line ms = tau + delta * rows."""
    rows, ms = np.asarray(rows, dtype=float), np.asarray(ms, dtype=float)
    (tau, delta), *_ = np.linalg.lstsq(np.stack([np.ones_like(rows), rows], 1), ms, rcond=None)
    return float(tau), float(delta)


def measure_latency(model, widths: list[int], cache_len: int, capacity: int, reps: int, batch: int | None = None,
                    graph: bool = False, rows: list[int] | None = None, max_rows: int | None = None) -> dict:
    """Median forward latency per call layout (latency_points) at `cache_len` cached tokens in a cache view of
    `capacity` slots (the engine's for the median prompt), and the fit tau + delta*n."""
    calls = latency_points(model, widths, rows, max_rows)
    times = time_layouts(model, [lay for _, lay in calls], cache_len, capacity, reps, batch, graph)
    rows_ = np.array([lay.rows for _, lay in calls], dtype=float)
    ms = np.array([1e3 * float(np.median(t)) for t in times])
    tau, delta = fit_line(rows_, ms)
    resid = ms - (tau + delta * rows_)
    return {
        "cache_len": cache_len, "capacity": capacity, "reps": reps, "batch": batch or 1, "graph": graph,
        "tau_ms": tau, "delta_ms": delta,
        "rms_residual_ms": float(np.sqrt(np.mean(resid ** 2))),
        "max_rel_residual": float(np.max(np.abs(resid) / ms)),
        "points": [{"kind": c[0], "rows": int(n), "median_ms": float(m), "fit_ms": float(tau + delta * n),
                    "iqr_ms": float(1e3 * (np.percentile(t, 75) - np.percentile(t, 25)))}
                   for c, n, m, t in zip(calls, rows_, ms, times)],
    }
