"""Train the tiny any-order (SetDLM-style) model: a Qwen3 network whose mask rows predict their own position
from the tokens earlier in a chosen order (the any-subset objective over random orders in windows of W
positions, objective.py).

    python -m packed_ss.lab.train.any_order --out DIR [options]

The network is warm-started from a Llama-layout checkpoint (default: the shipped default model; same
tokenizer, new q/k norms at 1), as SetDLM adapts a pretrained Qwen3. Writes an HF Qwen3 directory with
`any_order: true` in config.json, plus training.json (command, versions, losses, held-out evaluation).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from ...model.loading import default_model_path
from .data import add_corpus_args, cyclic_batches, encode_stream, heldout_sample, load_corpus
from .evaluate import evaluate_any_order
from .loop import fit, mean_last
from .model import any_order_model_from
from .objective import any_order_losses
from .optim import add_optimizer_args, make_optimizers
from .report import versions


def train(args) -> None:
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    torch.set_num_threads(args.threads)
    out, init = Path(args.out), Path(args.init_from)
    t0 = time.time()
    tok = Tokenizer.from_file(str(init / "tokenizer.json"))
    _, train_files, held_files = load_corpus(args)
    train_stream = encode_stream(tok, [t for _, t in train_files])
    held = heldout_sample(encode_stream(tok, [t for _, t in held_files]), args.eval_seqs, args.seq_len)
    model = any_order_model_from(init, args.seed)
    opts = make_optimizers(model, args)
    T, bsz = args.seq_len, args.batch
    g_data, g_order = torch.Generator().manual_seed(args.seed), torch.Generator().manual_seed(args.seed + 1)
    batches = cyclic_batches(train_stream, T, bsz, g_data)
    print(f"data: {len(train_stream)} train tokens; model {sum(p.numel() for p in model.parameters()) / 1e6:.3f}M "
          f"params warm-started from {init}", flush=True)

    def step_loss():
        x = next(batches)
        W = int(torch.randint(args.min_width, args.max_width + 1, (), generator=g_order))
        offset = int(torch.randint(0, W, (), generator=g_order))
        verify, draft = any_order_losses(model, x, W, offset, args.p_ltr, g_order)
        return verify + draft, {"verify": verify, "draft": draft}, {"W": W}

    t_train = time.time()
    history = fit(model, opts, args, step_loss)
    train_wall = time.time() - t_train
    model.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(init).save_pretrained(out)
    (out / "tokenizer_config.json").write_text((init / "tokenizer_config.json").read_text())
    ev = evaluate_any_order(model, held)
    summary = {"train_wall_s": round(train_wall, 1), "total_wall_s": round(time.time() - t0, 1),
               "steps": args.steps, "clean_tokens": args.steps * bsz * T,
               "final_train_verify_loss": mean_last(history, "verify"),
               "final_train_draft_loss": mean_last(history, "draft"), "heldout": ev}
    (out / "training.json").write_text(json.dumps({"argv": args.argv, "versions": versions(), **summary},
                                                  indent=1) + "\n")
    print(json.dumps(summary, indent=1), flush=True)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m packed_ss.lab.train.any_order",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output directory (HF Qwen3 layout, any_order: true)")
    ap.add_argument("--init-from", default=str(default_model_path()), help="Llama/Qwen3 checkpoint to start from")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    add_corpus_args(ap)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--min-width", type=int, default=2)
    ap.add_argument("--max-width", type=int, default=16)
    ap.add_argument("--p-ltr", type=float, default=0.5, help="probability that a window is ordered left to right")
    add_optimizer_args(ap, lr=1e-3, muon_lr=0.01, warmup=20)
    ap.add_argument("--eval-seqs", type=int, default=32)
    ap.add_argument("--log-every-s", type=float, default=None,
                    help="seconds between progress-bar updates (default 0.1 on a terminal, 10 otherwise)")
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def main(argv=None) -> None:
    train(parse_args(argv))


if __name__ == "__main__":
    main()
