"""Projected decode throughput per schedule and width: the measured cost of an iteration times the tokens an
iteration yields by an acceptance profile, and the width `width="auto"` would choose (width.choose_width).

A PROJECTION, not a measurement: the model's weights are random, so how often its drafts are right (they
repeat tokens, and are now and then accepted) says nothing of a trained model; the tokens per iteration come
from published NLD-8B figures (SOURCES) or a profile the user gives (--profile, the format of
draft_profile.json, width.read_profile). The published figures are at block 32 (W = 31) only; for the other
widths a source's profile is the geometric acceptance curve through its point, E(W) = (1 - a^(W+1)) / (1 - a)
(each draft token right with probability a given the ones before it), which is a model, not a figure.
The cost of an iteration at width W is width.CallCost: per call tau + delta x rows from the fit at that cache
length and batch, tau raised by the measured non-model time of the schedule's iteration over its calls.
"""
from __future__ import annotations

from ....decode.registry import schedules
from ....decode.sampling import SamplingParams
from ....engine import Engine
from ....runtime.program import call_layouts
from ....width import CallCost, choose_width, profile_kind

PUBLISHED_WIDTH = 31          # the published figures' block of 32
NLD_LINEAR_PER_FORWARD = 3.47
SOURCES = {   # tokens per iteration at W = 31 on NLD-8B: "fresh" (Linear-SS, Quadratic-SS), "lagged" (Packed-SS)
    "paper": {"fresh": 2 * NLD_LINEAR_PER_FORWARD, "lagged": 1.165 * NLD_LINEAR_PER_FORWARD,
              "what": "the paper: Packed-SS +13-20% tokens/NFE over Linear-SS on NLD-8B (+16.5% taken), on NLD's "
                      f"linear_spec_generate {NLD_LINEAR_PER_FORWARD} tokens per forward (Linear-SS: 2 forwards "
                      "per iteration)"},
    "nld-linear-spec": {"fresh": 2 * NLD_LINEAR_PER_FORWARD,
                        "what": f"NLD's own linear_spec_generate: {NLD_LINEAR_PER_FORWARD} tokens per forward, "
                                f"{2 * NLD_LINEAR_PER_FORWARD:.2f} per iteration of two forwards"},
    "sglang-linearspec": {"fresh": 6.8,
                          "what": "SGLang LinearSpec: 3.3-3.5 tokens per forward, 6.6-7.0 per block of 32 "
                                  "(6.8 taken)"},
}


def geometric(tokens_at: float, width: int, widths: int) -> list[float]:
    """E(w) = (1 - a^(w+1)) / (1 - a) for w = 1..`widths`, a chosen (bisection) so that E(width) = tokens_at."""
    if not 1 <= tokens_at <= width + 1:
        raise ValueError(f"tokens per iteration at W={width} must be in [1, {width + 1}], got {tokens_at}")
    lo, hi = 0.0, 1.0 - 1e-12
    expected = lambda a, w: sum(a ** k for k in range(w + 1))  # noqa: E731
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected(mid, width) < tokens_at else (lo, mid)
    return [round(expected(lo, w), 4) for w in range(1, widths + 1)]


def profiles(user: dict | None, user_name: str | None) -> dict[str, dict]:
    """Every profile source: name -> {"what", "width", and per kind the tokens per iteration at widths 1..width}."""
    out = {}
    for name, src in SOURCES.items():
        kinds = {k: geometric(v, PUBLISHED_WIDTH, PUBLISHED_WIDTH) for k, v in src.items() if k != "what"}
        out[name] = {"what": src["what"] + "; other widths: the geometric curve through W = 31",
                     "width": PUBLISHED_WIDTH, **kinds}
    if user is not None:
        out["user"] = {"what": f"--profile {user_name}", **user}
    return out


def call_rows(model, widths: range) -> dict[str, dict[int, list[int]]]:
    """Per schedule, the rows of each call of one iteration at each width (runtime.program.call_layouts)."""
    def rows(schedule, w):
        program = Engine(model, schedule=schedule, width=w, epilogue="torch").program(SamplingParams())
        return [lay.rows for lay in call_layouts(program)]
    return {s: {w: rows(s, w) for w in (widths if s != "ar" else [1])} for s in ("ar", "linear", "quadratic", "packed")}


def project(fit: dict, rows: dict[str, dict[int, list[int]]], nonmodel_ms: dict[str, float],
            sources: dict[str, dict], widths: list[int], any_order: bool = False) -> list:
    """Projected tokens/s of each schedule, source and width at one (cache length, batch) fit: the `widths` asked
    for (up to the profile's width) and the one choose_width picks ("auto": True); AR once per source, width
    None. `rows`: call_rows up to the widest profile; `nonmodel_ms`: the measured non-model ms per iteration, by
    schedule."""
    batch, out = fit["batch"], []
    for name, src in sources.items():
        for schedule, calls in rows.items():
            kind = profile_kind(schedules(any_order)[schedule].replay)
            if kind is not None and kind not in src:
                continue
            tokens = src[kind] if kind else [1.0]
            cost = CallCost(fit["tau_ms"] + nonmodel_ms.get(schedule, 0.0) / len(calls[1]), fit["delta_ms"])
            auto = choose_width(tokens, calls.__getitem__, cost) if kind else None
            shown = sorted({w for w in widths if w <= len(tokens)} | {auto}) if kind else [None]
            for w in shown:
                t, ms = tokens[(w or 1) - 1], cost.iteration_ms(calls[w or 1])
                out.append({"source": name, "schedule": schedule, "width": w, "auto": kind is not None and w == auto,
                            "cache_len": fit["cache_len"], "batch": batch, "tokens_per_iteration": t,
                            "iteration_ms": ms, "tokens_per_s": 1e3 * batch * t / ms})
    return out
