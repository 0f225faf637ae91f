"""Command-line options the benchmarks share: output directory, model (and its dtype), the HumanEval prompt count and
response length with their full and --quick presets, the bootstrap and the thread count, and widths."""
from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

from ...model.loading import DTYPE_NAMES, dtype_named, dtype_said, load_model
from ...model.sources import resolve_model


def width(text: str) -> int | str:
    """A speculative width for argparse: an integer in [1, 64], or 'auto' (the engine's own choice)."""
    if text == "auto":
        return text
    value = int(text) if text.isdigit() else 0
    if not 1 <= value <= 64:
        raise argparse.ArgumentTypeError(f"must be an integer in [1, 64] or 'auto', got {text!r}")
    return value


def bench_parser(prog: str, doc: str) -> argparse.ArgumentParser:
    """A benchmark's parser, its module docstring as the description."""
    return argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def add_shared_args(p: argparse.ArgumentParser, full: dict, quick: dict, outputs: str, model: str) -> None:
    p.add_argument("--out", type=Path, required=True, help=f"output directory ({outputs})")
    p.add_argument("--model", default=None, help=model)
    p.add_argument("--quick", action="store_true",
                   help=f"about a minute: defaults become {quick} (explicit options still win)")
    p.add_argument("--limit", type=int, default=None, help=f"first N HumanEval prompts (default {full['limit']})")
    p.add_argument("--max-new-tokens", type=int, default=None, help=f"default {full['max_new_tokens']}")
    p.add_argument("--resamples", type=int, default=20000, help="bootstrap resamples (default 20000)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")


def add_model_args(p: argparse.ArgumentParser, outputs: str, full: dict, quick: dict) -> None:
    """The shared options of a benchmark that runs any model: a named one, a directory or a GGUF file, in a dtype."""
    add_shared_args(p, full, quick, outputs,
                    "a model name (smollm2-135m, ...), directory or GGUF file (default: the shipped model)")
    p.add_argument("--dtype", choices=DTYPE_NAMES, default="float32",
                   help="weights' dtype; 'auto' is the one measured faster on this machine (default float32)")


def load_bench_model(args, **kwargs):
    """The path and the model that --model and --dtype name (kwargs: load_model's others), its dtype said on
    stderr."""
    path = resolve_model(args.model)
    model = load_model(path, dtype=dtype_named(args.dtype), **kwargs)
    print(f"{path.name}: dtype {dtype_said(model)}", file=sys.stderr, flush=True)
    return path, model


def apply_preset(args, full: dict, quick: dict) -> None:
    """Options left unset take the --quick preset's value, or the full run's."""
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)


def cpu_name() -> str:
    """The processor's model name (`lscpu`'s), which every CPU timing names."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), platform.processor())
