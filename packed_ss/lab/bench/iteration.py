"""The decode iteration through the real runtime: `generate_batch` of B prompts, `new` tokens each (EOS off),
timed against the same call with one new token (its prefills), per iteration. bench/iteration.py and
bench-scale time the loop modes and schedules with it."""
from __future__ import annotations

import math
import statistics
import time

import torch


def timed(engine, prompts, new: int, **sampling) -> tuple[float, int, float]:
    """(wall seconds, batch iterations, the runtime's model seconds: NaN under CUDA graphs) of one
    generate_batch (`sampling`: its temperature, top_k, top_p and seed; default greedy)."""
    cuda = engine.model.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    began = time.perf_counter()
    engine.generate_batch(prompts, max_new_tokens=new, eos_token_id=[], **sampling)
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - began, engine.runtime.iterations, engine.runtime.model_s


def iteration_cost(engine, prompts, new: int, repeats: int = 1, **sampling) -> dict:
    """Milliseconds per decode iteration of `prompts` decoded together, after a warm-up run (compile, capture):
    (wall - the one-token run's wall) / iterations, the median over `repeats` such pairs run back to back (so
    that a drifting load hits both runs of a pair alike), with the model's share where the runtime times it
    (eager and compiled loops; NaN under CUDA graphs) and the prefill's share of the wall."""
    timed(engine, prompts, new, **sampling)
    pairs = [(timed(engine, prompts, 1, **sampling), timed(engine, prompts, new, **sampling)) for _ in range(repeats)]
    iterations = pairs[-1][1][1]
    per = max(1, iterations)
    model_ms = statistics.median(1e3 * (run[2] - prefill[2]) / per for prefill, run in pairs)
    return {"ms_per_iteration": statistics.median(1e3 * (run[0] - prefill[0]) / per for prefill, run in pairs),
            "iterations": iterations, "model_ms_per_iteration": model_ms if math.isfinite(model_ms) else math.nan,
            "prefill_share": statistics.median(prefill[0] / run[0] for prefill, run in pairs),
            "epilogue": engine.epilogue}
