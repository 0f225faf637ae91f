"""What a request holds and what a call launches: device memory per request (weights, K/V, the stored draft
distributions from tensor sizes; peak and graph pools where the device reports them), and kernels per call
counted by torch.profiler in each loop mode (device kernels on CUDA; on the CPU, top-level aten ops)."""
from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

from ....decode.sampling import SamplingParams
from ....engine import Engine
from ....runtime.program import call_layouts
from ....runtime.request import Request
from ..iteration import timed
from .iterations import prompts
from .roofline import kv_bytes_per_token

MODES = {"eager": {}, "graph": dict(cuda_graph=True), "compile": dict(compile=True),
         "graph+compile": dict(cuda_graph=True, compile=True)}
PROFILED_TOKENS = (4, 12)      # new tokens of the two profiled decodes whose difference is counted


def stored_draft_bytes(model, width: int) -> int:
    """Bytes of one request's stored draft distributions (q_idx, q_prob of its decode state) when sampled at
    T = 1 with the whole vocabulary as support (the rejection sampler; Packed-SS at `width`)."""
    program = Engine(model, schedule="packed", width=width, epilogue="torch").program(SamplingParams(temperature=1.0))
    state = program.new_state(Request(prompt=[0], max_new_tokens=1, seed=0, stop_ids=[], stop_sequences=[]))
    return sum(t.numel() * t.element_size() for t in (state.q_idx, state.q_prob))


def memory(model, cache_lens: list[int], batches: list[int], width: int, iterations: list[dict]) -> dict:
    """Bytes per request at each batch and cache length: a batch's share of the weights, its K/V, its stored
    draft distributions; the measured peak (CUDA; None on the CPU) from the decode iterations at each batch."""
    weights = sum(p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values())
    kv, q = kv_bytes_per_token(model), stored_draft_bytes(model, width)
    rows = [{"batch": b, "cache_len": c, "weights": weights / b, "kv": kv * c, "stored_drafts": q,
             "total": weights / b + kv * c + q} for b in batches for c in cache_lens]
    peaks = [{"batch": r["batch"], "schedule": r["schedule"], "width": r["width"],
              "peak_per_request": None if r["peak_allocated_bytes"] is None else r["peak_allocated_bytes"] / r["batch"],
              "graph_pool_bytes": r["graph_pool_bytes"]} for r in iterations]
    device_only = None if model.device.type == "cuda" else "device-only figures (peak, graph pools): null on the CPU"
    return {"weights_bytes": weights, "kv_bytes_per_token": kv, "stored_draft_bytes": q, "stored_draft_width": width,
            "per_request": rows, "measured": peaks, "note": device_only}


def _count(prof, device: torch.device) -> int:
    """Device kernels (CUDA, copies and fills left out) or top-level aten ops (CPU) in a profile."""
    if device.type == "cuda":
        return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                   and not e.name.startswith(("Memcpy", "Memset")))
    return sum(1 for e in prof.events() if e.name.startswith("aten::")
               and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))


def kernels(model, modes: list[str], skipped: dict[str, str], width: int, prompt_len: int) -> list[dict]:
    """Kernels per iteration and per call of Packed-SS at `width`, batch 1, in each of `modes` (MODES): the
    difference between two profiled decodes of PROFILED_TOKENS new tokens over their difference in
    iterations (admission and prefill cancel). `skipped`: mode -> why it is not run (reported null)."""
    device = model.device
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    out = [{"mode": m, "per_iteration": None, "per_call": None, "reason": why} for m, why in skipped.items()]
    for mode in modes:
        engine = Engine(model, schedule="packed", width=width, **MODES[mode])
        batch = prompts(model, 1, prompt_len, seed=0)
        timed(engine, batch, PROFILED_TOKENS[-1])                 # warm-up: compile, capture
        counts = []
        for new in PROFILED_TOKENS:
            with profile(activities=activities) as prof:
                _, iterations, _ = timed(engine, batch, new)
            counts.append((_count(prof, device), iterations))
        per_iteration = (counts[1][0] - counts[0][0]) / max(1, counts[1][1] - counts[0][1])
        calls = len(call_layouts(engine.program(SamplingParams())))
        out.append({"mode": mode, "per_iteration": per_iteration, "per_call": per_iteration / calls,
                    "what": "device kernels" if device.type == "cuda" else "top-level aten ops" + (
                        " (inductor's fused C++ kernels are no profiler events)" if "compile" in mode else ""),
                    "reason": None})
    return sorted(out, key=lambda k: list(MODES).index(k["mode"]))
