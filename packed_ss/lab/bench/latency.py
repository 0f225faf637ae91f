"""Per-call latency of the model: forward time against input rows n over the schedules' own call layouts, at
a fixed cached length, fitted to tau + delta * n by least squares."""
from __future__ import annotations

import math
import time

import numpy as np
import torch

from ...decode.sampling import SamplingParams
from ...decode.schedules.base import layout
from ...engine import Engine
from ...model.attention import Layout, attention_backend
from ...runtime.program import call_layouts


def engine_capacity(prompt_len: int, max_new_tokens: int, width: int) -> int:
    """KV-cache view the engine gives a response's calls (the CPU attention reference attends over all of it)."""
    return 256 * math.ceil((prompt_len + max_new_tokens + 2 * (width + 1)) / 256)


def latency_points(model, widths: list[int]) -> list[tuple[str, Layout]]:
    """(label, layout) per measured call: every decode call of every schedule at the given widths, and
    packed-shaped calls (n - n/2 causal anchors, n/2 cache-only scratch rows) of n = 2, 4, 8, ... rows.
    A schedule with two calls per iteration (Linear-SS) labels them by role: the verify call writes
    anchors to the cache, the draft call none."""
    points = {}

    def add(kind, lay):
        points.setdefault((lay.n_anchor, tuple(lay.seg.tolist()), tuple(lay.see.tolist())), (kind, lay))

    for w in widths:
        for name in ("ar", "linear", "quadratic", "packed"):
            layouts = call_layouts(Engine(model, schedule=name, width=w, epilogue="torch").program(SamplingParams()))
            for lay in layouts:
                add(name if len(layouts) == 1 else f"{name}-{'verify' if lay.n_anchor else 'draft'}", lay)
    n, top = 2, 2 * (max(widths) + 1)
    while n < top:
        add("packed-shape", layout(model.device, n - n // 2, [1] * (n // 2), [-1] * (n // 2)))
        n *= 2
    return sorted(points.values(), key=lambda p: p[1].rows)


@torch.inference_mode()
def measure_latency(model, widths: list[int], cache_len: int, capacity: int, reps: int) -> dict:
    """Median forward latency per call layout at `cache_len` cached tokens in a cache view of `capacity`
    slots (the engine's for the median prompt), and the fit tau + delta*n.

    Calls are interleaved (one of each per repetition, in rotating order) so that load drift hits
    every size alike.
    """
    device = model.device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    attend = attention_backend("triton" if device.type == "cuda" else "torch")    # the engine's default
    cache = model.new_cache(capacity)
    clen = torch.tensor(cache_len, device=device)
    gen = torch.Generator().manual_seed(0)
    mask_id = model.cfg.mask_token_id
    calls = []
    for kind, lay in latency_points(model, widths):
        tokens = torch.randint(0, model.cfg.vocab_size, (lay.rows,), generator=gen)
        tokens[lay.n_anchor:] = mask_id
        offsets = torch.cat([torch.arange(lay.n_anchor), torch.arange(lay.rows - lay.n_anchor)])
        calls.append((kind, lay, tokens.to(device), (clen + offsets.to(device))))
    for kind, lay, tokens, positions in calls:          # warm up
        for _ in range(2):
            model(tokens, positions, lay, cache, clen, attend=attend)
    times = [[] for _ in calls]
    for r in range(reps):
        for j in range(len(calls)):
            i = (j + r) % len(calls)
            _, lay, tokens, positions = calls[i]
            sync()
            t0 = time.perf_counter()
            model(tokens, positions, lay, cache, clen, attend=attend)
            sync()
            times[i].append(time.perf_counter() - t0)
    rows = np.array([c[1].rows for c in calls], dtype=float)
    ms = np.array([1e3 * float(np.median(t)) for t in times])
    (tau, delta), *_ = np.linalg.lstsq(np.stack([np.ones_like(rows), rows], 1), ms, rcond=None)
    resid = ms - (tau + delta * rows)
    return {
        "cache_len": cache_len, "capacity": capacity, "reps": reps,
        "tau_ms": float(tau), "delta_ms": float(delta),
        "rms_residual_ms": float(np.sqrt(np.mean(resid ** 2))),
        "max_rel_residual": float(np.max(np.abs(resid) / ms)),
        "points": [{"kind": c[0], "rows": int(n), "median_ms": float(m), "fit_ms": float(tau + delta * n),
                    "iqr_ms": float(1e3 * (np.percentile(t, 75) - np.percentile(t, 25)))}
                   for c, n, m, t in zip(calls, rows, ms, times)],
    }
