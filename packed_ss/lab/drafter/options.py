"""The options train-drafter and profile-drafter share: the corpus, the continuations, the widths, the machine.
With the same values both measure the acceptance on the same held-out continuations (data.prompt_sets)."""
from __future__ import annotations

import argparse

DEFAULT_WIDTH = 16


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--width", type=int, default=None,
                    help=f"largest draft width W trained and profiled (default: block_size - 1, else {DEFAULT_WIDTH})")
    ap.add_argument("--seed", type=int, default=0, help="seed of prompts, sampling, init and batches (default 0)")
    ap.add_argument("--prompt-tokens", type=int, default=64, help="prompt length in tokens (default 64)")
    ap.add_argument("--gen-tokens", type=int, default=128, help="continuation length in tokens (default 128)")
    ap.add_argument("--eval-sequences", type=int, default=16,
                    help="held-out greedy continuations the acceptance is measured on (default 16)")
    ap.add_argument("--eval-functions", type=int, default=16,
                    help="held-out prompts ending after a function's signature and docstring, added to "
                         "--eval-sequences (default 16; fewer when the corpus has fewer)")
    ap.add_argument("--data", default=None,
                    help="your own text: a directory (files ending in --data-suffix) or one file; default the "
                         "standard library's training split, which the shipped models were trained on")
    ap.add_argument("--data-suffix", default=".py", help="file suffix read from a --data directory (.py)")
    ap.add_argument("--heldout-pct", type=float, default=3.0,
                    help="percent of documents held out for evaluation, by name hash (default 3, as the models)")
    ap.add_argument("--device", default="cpu", help="torch device (default cpu)")
    ap.add_argument("--threads", type=int, default=1,
                    help="CPU threads for torch (default 1: on a shared machine more threads can run far slower)")


def check_arguments(args, model) -> None:
    """Raises ValueError naming the option and its range; sets args.width when it was left to the default."""
    for name, low in (("prompt_tokens", 1), ("gen_tokens", 2), ("eval_sequences", 1), ("eval_functions", 0),
                      ("threads", 1)):
        if getattr(args, name) < low:
            raise ValueError(f"--{name.replace('_', '-')} must be an integer >= {low}, got {getattr(args, name)}")
    limit = model.cfg.block_size - 1 if model.cfg.block_size else 64
    if args.width is None:
        args.width = min(limit, DEFAULT_WIDTH)
    if not 1 <= args.width <= limit:
        raise ValueError(f"--width must be in [1, {limit}], got {args.width}")
