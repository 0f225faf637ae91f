"""Per-call latency against rows, float32 against bfloat16, on this machine: what dtype="auto" decides from.

    python bench/call_rows.py --model smollm2-135m --threads 2 --out bench/results/call-rows-cpu

A CPU's bf16 speed depends on the processor (DESIGN §13: on an AMD EPYC with avx512_bf16 bf16 is faster at
every row count; on a Xeon with AMX one row falls off the fast path), so the table names the processor and
its bf16 flags. Each point: the median of --reps timed calls (after two untimed ones) of the model's own
cached-only drafting-shaped call (width.call_times, the call dtype.py times) over 256 cached tokens.
Writes OUT/call_rows.json and OUT/call_rows.md (also printed).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from packed_ss.model.attention import attention_backend
from packed_ss.model.loading import DTYPES, load_model
from packed_ss.model.sources import resolve_model
from packed_ss.width import call_times, machine

ROWS = [1, 2, 4, 8, 16, 32, 64]


def cpu_flags() -> str:
    info = Path("/proc/cpuinfo")
    flags = next((line.split(":", 1)[1].split() for line in info.read_text().splitlines()
                  if line.startswith("flags")), []) if info.is_file() else []
    return ", ".join(f for f in ("avx512_bf16", "amx_bf16", "amx_tile") if f in flags) or "none of avx512_bf16, amx"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="a model directory, GGUF file or name (smollm2-135m)")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=DTYPES)
    ap.add_argument("--rows", type=int, nargs="+", default=ROWS)
    ap.add_argument("--reps", type=int, default=7, help="timed calls per point (default 7)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.reps < 1 or min(args.rows) < 1:
        ap.error("--reps and every --rows must be >= 1")
    torch.set_num_threads(args.threads)
    path = resolve_model(args.model)
    ms = {}
    for name in args.dtypes:
        model = load_model(path, dtype=DTYPES[name], draft_adapter=None)
        ms[name] = dict(call_times(model, attention_backend("torch"), args.rows, args.reps))
        del model
    host = machine(torch.device("cpu"))
    lines = [f"Model `{path.name}`; {host['processor']} ({cpu_flags()}), {host['threads']} threads, torch "
             f"{host['torch']}; median of {args.reps} calls at 256 cached tokens.", "",
             f"| rows | {' | '.join(f'{d} ms' for d in args.dtypes)} | {' | '.join(f'{d} / {args.rows[0]} rows' for d in args.dtypes)} |",
             "|---:|" + "---:|" * 2 * len(args.dtypes)]
    for n in args.rows:
        lines.append(f"| {n} | {' | '.join(f'{ms[d][n]:.1f}' for d in args.dtypes)} | "
                     f"{' | '.join(f'{ms[d][n] / ms[d][args.rows[0]]:.2f}' for d in args.dtypes)} |")
    markdown = "\n".join(lines) + "\n"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "call_rows.json").write_text(json.dumps({"model": str(path), "machine": host, "flags": cpu_flags(),
                                                         "reps": args.reps, "ms": ms}, indent=1) + "\n")
    (args.out / "call_rows.md").write_text(markdown)
    print(markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
