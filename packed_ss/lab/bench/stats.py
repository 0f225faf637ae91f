"""Paired bootstrap statistics shared by the benchmarks: every method is resampled over the same prompt
indices, so a ratio's interval reflects the methods' difference, not the prompts' spread."""
from __future__ import annotations

import numpy as np


def bootstrap_counts(n_prompts: int, resamples: int, seed: int) -> np.ndarray:
    """[resamples, n_prompts] multiplicity of each prompt in each resample (shared by every method)."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n_prompts, size=(resamples, n_prompts))
    flat = (np.arange(resamples)[:, None] * n_prompts + idx).ravel()
    return np.bincount(flat, minlength=resamples * n_prompts).reshape(resamples, n_prompts).astype(float)


def per_prompt(records, n_prompts: int) -> dict[str, np.ndarray]:
    """Per-prompt sums (over the repeated responses of each prompt) of tokens, wall and NFE; records are any
    objects with `prompt`, `tokens`, `wall_s` and `nfe`."""
    out = {k: np.zeros(n_prompts) for k in ("tokens", "wall_s", "nfe", "n")}
    for r in records:
        out["tokens"][r.prompt] += r.tokens
        out["wall_s"][r.prompt] += r.wall_s
        out["nfe"][r.prompt] += r.nfe
        out["n"][r.prompt] += 1
    return out


def paired(a: dict, b: dict, counts: np.ndarray) -> dict:
    """Method a against baseline b on the same resampled prompts: point estimate and 95% percentile CI.

    throughput ratio = (tokens_a / wall_a) / (tokens_b / wall_b) over totals; wall difference = mean per
    response of wall_a - wall_b (seconds); tokens/NFE and time/NFE ratios likewise over totals.
    """
    def stats(w):   # w: prompt weights, [..., P]
        t_a, s_a, n_a = w @ a["tokens"], w @ a["wall_s"], w @ a["nfe"]
        t_b, s_b, n_b = w @ b["tokens"], w @ b["wall_s"], w @ b["nfe"]
        return {"throughput_ratio": (t_a / s_a) / (t_b / s_b),
                "wall_diff_s": (s_a - s_b) / (w @ a["n"]),
                "tokens_per_nfe_ratio": (t_a / n_a) / (t_b / n_b),
                "time_per_nfe_ratio": (s_a / n_a) / (s_b / n_b)}
    point = stats(np.ones(counts.shape[1]))
    boot = stats(counts)
    return {k: {"point": float(point[k]), "lo": float(np.percentile(boot[k], 2.5)),
                "hi": float(np.percentile(boot[k], 97.5))} for k in point}
