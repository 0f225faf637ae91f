"""`python -m packed_ss bench-scale`: the engine at a released model's scale, with random weights.

Builds the model from a released config (nld-3b, nld-8b, nld-14b, or any config.json; --scale shrinks it for
the CPU) with random weights made on the device in the target dtype, and measures with the engine's own
kernels and epilogue, CUDA graph replays on CUDA:
  1. per-call latency against rows (packed-shaped calls of --rows and the schedules' own call shapes), per
     cache length and batch, fitted to tau + delta x rows; beside each point the bytes a call must read
     (weights + the K/V it attends to) and the bandwidth achieved as a share of the device's copy bandwidth,
     measured in the same run: the roofline of batch-1 decoding;
  2. one decode iteration of each schedule through the runtime, model time and everything else, per batch;
  3. projected tokens/s per schedule and width: measured iteration cost x tokens per iteration from an
     acceptance profile (published NLD-8B figures, or --profile), and the width width="auto" would choose;
  4. device memory per request (weights, K/V, stored draft distributions; peak and graph pools on CUDA);
  5. kernels per call from torch.profiler in each loop mode.
OUT/scale.json (rewritten as results come, so a cut run keeps what it measured), OUT/scale.md, OUT/latency.png,
OUT/projection.png.

    python -m packed_ss bench-scale --config nld-8b --device cuda --quick --out DIR     # about 90 s on an H200
    python -m packed_ss bench-scale --config nld-8b --scale 0.05 --out DIR             # the CPU, in seconds
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

import torch

from ....engine import MAX_BATCH, MAX_WIDTH
from ....model.config import model_config
from ....model.loading import DTYPES, default_dtype, random_model
from ....width import machine, read_profile
from ...progress import progress
from ..options import apply_preset, bench_parser
from . import iterations, projection, report, resources, roofline
from .configs import CONFIGS, resolve_config, scaled

FULL = dict(batch_sizes=[1, 8, 32], cache_lens=[512, 4096, 16384], widths=[7, 15, 31],
            rows=[1, 2, 4, 8, 16, 32, 64, 128], reps=20, new_tokens=64, prompt_len=64)
QUICK = dict(batch_sizes=[1, 8], cache_lens=[512, 16384], widths=[7, 31], rows=[1, 8, 32, 64, 128], reps=8,
             new_tokens=24, prompt_len=32)


def parser() -> argparse.ArgumentParser:
    p = bench_parser("python -m packed_ss bench-scale", __doc__)
    p.add_argument("--config", default="nld-8b",
                   help=f"model dimensions: {', '.join(CONFIGS)} (see configs.py for their sources) or a config.json "
                        "file or directory (default nld-8b)")
    p.add_argument("--scale", type=float, default=1.0,
                   help="shrink the config by this factor in (0, 1]: hidden, intermediate, vocabulary, layers and "
                        "heads (head_dim and the GQA ratio kept); 0.05 runs on a CPU in seconds (default 1)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="cpu or cuda (default cuda where available)")
    p.add_argument("--dtype", choices=list(DTYPES), default=None,
                   help="weights and K/V dtype (default: the config's torch_dtype on CUDA, float32 on the CPU)")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=None,
                   help=f"requests per call (default {FULL['batch_sizes']}, --quick {QUICK['batch_sizes']})")
    p.add_argument("--cache-lens", type=int, nargs="+", default=None,
                   help=f"cached tokens per request (default {FULL['cache_lens']}, --quick {QUICK['cache_lens']})")
    p.add_argument("--widths", type=int, nargs="+", default=None,
                   help=f"speculative widths W, 1..{MAX_WIDTH}: the schedules' call shapes and the iterations run "
                        f"(default {FULL['widths']}, --quick {QUICK['widths']})")
    p.add_argument("--rows", type=int, nargs="+", default=None,
                   help="rows of the packed-shaped calls timed beside the schedules' own; the largest also caps "
                        f"the calls timed (default {FULL['rows']})")
    p.add_argument("--reps", type=int, default=None, help=f"timed repetitions per call (default {FULL['reps']})")
    p.add_argument("--new-tokens", type=int, default=None,
                   help=f"new tokens per request of a timed decode (default {FULL['new_tokens']})")
    p.add_argument("--prompt-len", type=int, default=None,
                   help=f"prompt tokens per request of a timed decode (default {FULL['prompt_len']})")
    p.add_argument("--profile", type=Path, default=None,
                   help="an acceptance profile (draft_profile.json, or a directory holding one: what "
                        "profile-drafter writes) projected beside the published ones")
    p.add_argument("--kernel-modes", nargs="+", choices=list(resources.MODES), default=None,
                   help="loop modes whose kernels per call are counted (default: eager; on CUDA also graph, and "
                        "without --quick compile and graph+compile, which compile the whole step: minutes)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    p.add_argument("--quick", action="store_true",
                   help=f"about 90 s on an H200 at 8B: defaults become {QUICK} (explicit options still win)")
    p.add_argument("--out", type=Path, required=True,
                   help="output directory (scale.json, scale.md, latency.png, projection.png)")
    return p


def _check_ints(name: str, values: list[int], low: int, high: int | None = None) -> None:
    bad = [v for v in values if v < low or (high is not None and v > high)]
    if bad:
        bound = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be integers in {bound}, got {bad}")


def parse(argv) -> argparse.Namespace:
    """The options, checked: a ValueError names the first bad one and its allowed range."""
    args = parser().parse_args(argv)
    apply_preset(args, FULL, QUICK)
    if args.device not in ("cpu", "cuda") and not args.device.startswith("cuda:"):
        raise ValueError(f"--device must be cpu or cuda, got {args.device!r}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda needs a CUDA device, and torch.cuda.is_available() is False here")
    if not 0 < args.scale <= 1:
        raise ValueError(f"--scale must be in (0, 1], got {args.scale}")
    _check_ints("--widths", args.widths, 1, MAX_WIDTH)
    _check_ints("--batch-sizes", args.batch_sizes, 1, MAX_BATCH)
    _check_ints("--cache-lens", args.cache_lens, 1)
    _check_ints("--rows", args.rows, 1)
    _check_ints("--reps", [args.reps], 1)
    _check_ints("--new-tokens", [args.new_tokens], 2)
    _check_ints("--prompt-len", [args.prompt_len], 1)
    if args.profile is not None and read_profile(args.profile) is None:
        raise ValueError(f"--profile: no acceptance profile at {args.profile}")
    return args


class Record:
    """The result dictionary, rewritten to OUT/scale.json whenever a part of it changes."""

    def __init__(self, out: Path, result: dict):
        self.file, self.result = out / "scale.json", result
        out.mkdir(parents=True, exist_ok=True)
        self.save()

    def save(self) -> None:
        tmp = self.file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.result, indent=1) + "\n")
        tmp.replace(self.file)


def kernel_modes(args, cuda: bool) -> tuple[list[str], dict[str, str]]:
    """(loop modes whose kernels are counted, mode -> why it is not) for item 5."""
    compiled = ["compile", "graph+compile"] if cuda and not args.quick else []
    default = ["eager"] + (["graph"] if cuda else []) + compiled
    wanted, skipped = args.kernel_modes or default, {}
    for mode in resources.MODES:
        if "graph" in mode and not cuda:
            skipped[mode] = "CUDA only"
        elif mode not in wanted:
            skipped[mode] = ("not asked for (--kernel-modes)" if args.kernel_modes else
                             "compiles the whole step, minutes at scale: ask with --kernel-modes")
    return [m for m in wanted if m not in skipped], skipped


def run(args, argv: list[str]) -> dict:
    started = time.time()
    if args.threads:
        torch.set_num_threads(args.threads)
    name, raw = resolve_config(args.config)
    raw = scaled(raw, args.scale)
    cfg = model_config(raw, name)
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype] if args.dtype else default_dtype(cfg, device)
    began = time.perf_counter()
    model = random_model(cfg, device, dtype, seed=args.seed)
    if device.type == "cuda":
        torch.cuda.synchronize()
    dims = {k: raw.get(k) for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                                     "num_key_value_heads", "head_dim", "vocab_size")}
    meta = {"command": shlex.join(["python", "-m", "packed_ss", "bench-scale", *argv]), "config": name,
            "scale": args.scale, "dims": dims, "device": str(device),
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda"
            else machine(device)["processor"],
            "dtype": str(dtype).removeprefix("torch."), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "parameters": sum(p.numel() for p in model.parameters()), "build_s": time.perf_counter() - began,
            "quick": args.quick, "reps": args.reps, "mode": "graph" if device.type == "cuda" else "eager",
            "widths": args.widths, "batch_sizes": args.batch_sizes, "cache_lens": args.cache_lens, "rows": args.rows,
            "prompt_len": args.prompt_len, "new_tokens": args.new_tokens, "loadavg_start": os.getloadavg()[0]}
    rec = Record(args.out, {"meta": meta})
    rec.result["copy_bandwidth"] = roofline.copy_bandwidth(device)
    rec.save()

    fits = rec.result["latency"] = []
    grid = [(c, b) for c in args.cache_lens for b in args.batch_sizes]
    with progress(len(grid), "latency", unit="point") as bar:
        for cache_len, batch in grid:
            fits.append(roofline.sweep_point(model, args.widths, args.rows, max(args.rows), cache_len, batch,
                                             args.reps, rec.result["copy_bandwidth"]))
            rec.save()
            bar.update()
    rec.result["attention_bandwidth"] = roofline.attention_bandwidth(fits, rec.result["copy_bandwidth"])

    runs = rec.result["iterations"] = []
    plan = [(b, s, w) for b in args.batch_sizes for s, w in iterations.plan(args.widths)]
    with progress(len(plan), "iterations", unit="run") as bar:
        for batch, schedule, width in plan:
            runs.append(iterations.measure(model, schedule, width, batch, args.prompt_len, args.new_tokens,
                                           args.reps))
            rec.save()
            bar.update()

    user = read_profile(args.profile) if args.profile else None
    sources = projection.profiles(user, str(args.profile) if args.profile else None)
    calls = projection.call_rows(model, range(1, max(s["width"] for s in sources.values()) + 1))
    rows = []
    for fit in (f for f in fits if "points" in f):
        nonmodel = {r["schedule"]: r["nonmodel_ms"] for r in runs if r["batch"] == fit["batch"]}   # the widest
        rows += projection.project(fit, calls, nonmodel, sources, args.widths, cfg.any_order)
    rec.result["projection"] = {"label": "PROJECTION: measured iteration cost x tokens per iteration from an "
                                         "acceptance profile (what the random weights accept means nothing)",
                                "sources": {k: {"what": v["what"], "width": v["width"]} for k, v in sources.items()},
                                "rows": rows}
    rec.result["memory"] = resources.memory(model, args.cache_lens, args.batch_sizes, max(args.widths), runs)
    rec.result["targets"] = report.targets(rec.result)
    rec.save()
    modes, skipped = kernel_modes(args, device.type == "cuda")
    rec.result["kernels"] = resources.kernels(model, modes, skipped, max(args.widths), args.prompt_len)
    meta["elapsed_s"], meta["loadavg_end"] = time.time() - started, os.getloadavg()[0]
    rec.save()
    return rec.result


def main(argv=None) -> int:
    try:
        argv = sys.argv[1:] if argv is None else list(argv)
        args = parse(argv)
        result = run(args, argv)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    report.write(args.out, result)
    return 0
