"""Train the tiny any-order (SetDLM-style) model: a Qwen3 network whose mask rows predict their own
position from the tokens earlier in a chosen order.

    python -m packed_ss.train_any_order --out DIR [options]

Objective (any-subset over random orders in windows of W positions). A sequence of T tokens is
cut into consecutive windows of W positions (W and the offset drawn per batch); windows follow
each other left to right, and inside each window the order is left-to-right with probability
--p-ltr, else a random permutation. One forward pass evaluates 3T rows, all at the textual
position ids of their targets, exactly as the decoder's `[N | O | M | R]` call queries them
(paper appendix D.2):

* token rows x_j see the token rows earlier in the order and themselves (the cache / O rows);
* verifier mask rows M_j see the token rows earlier in the order and themselves (predict x_j);
* drafting mask rows R_j see the token rows earlier in the order than a random cut inside the
  window (the window start with probability 1/2: the pure prefix) and themselves (predict x_j;
  rows at or before the cut have no target).

With the left-to-right order the M rows are exactly the AR mode the engine verifies with.
The network is warm-started from a Llama-layout checkpoint (default: the shipped default
model; same tokenizer, new q/k norms at 1), as SetDLM adapts a pretrained Qwen3.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from . import train as base
from .loading import default_model_path

IGNORE = base.IGNORE


def window_orders(T: int, W: int, offset: int, p_ltr: float, gen: torch.Generator):
    """(rank [T], window id [T], cut [T]): global order rank of each position, its window, and
    the rank before which its drafting row's context ends."""
    win = torch.div(torch.arange(T) - offset + W, W, rounding_mode="floor")
    rank = torch.empty(T, dtype=torch.int64)
    cut = torch.empty(T, dtype=torch.int64)
    for w in win.unique().tolist():
        pos = (win == w).nonzero().squeeze(1)
        n, start = pos.numel(), int(pos[0])
        order = torch.arange(n) if torch.rand((), generator=gen) < p_ltr else torch.randperm(n, generator=gen)
        rank[pos[order]] = start + torch.arange(n)
        pure = torch.rand((), generator=gen) < 0.5
        cut[pos] = start + (0 if pure else int(torch.randint(0, n, (), generator=gen)))
    return rank, win, cut


def any_order_batch(x: torch.Tensor, W: int, offset: int, p_ltr: float, gen: torch.Generator,
                    mask_id: int = base.MASK_ID):
    """Input ids, position ids, bool mask [b, 1, 3T, 3T] and labels [b, 2T] for clean x [b, T]."""
    b, T = x.shape
    ids, masks, labels = [], [], []
    eye = torch.eye(T, dtype=torch.bool)
    for i in range(b):
        rank, _, cut = window_orders(T, W, offset, p_ltr, gen)
        before = rank[None, :] < rank[:, None]                    # [query j, key k]: k earlier than j
        m = torch.zeros(3 * T, 3 * T, dtype=torch.bool)
        m[:T, :T] = before | eye
        m[T:2 * T, :T] = before
        m[T:2 * T, T:2 * T] = eye
        m[2 * T:, :T] = rank[None, :] < cut[:, None]
        m[2 * T:, 2 * T:] = eye
        masks.append(m)
        ids.append(torch.cat([x[i], torch.full((2 * T,), mask_id, dtype=x.dtype)]))
        labels.append(torch.cat([x[i], torch.where(rank >= cut, x[i], IGNORE)]))
    pos = torch.arange(T).repeat(3)
    return torch.stack(ids), pos.expand(b, 3 * T), torch.stack(masks)[:, None], torch.stack(labels)


def losses(model, x, W, offset, p_ltr, gen):
    """(verifier loss over M rows, drafting loss over R rows), mean CE in nats."""
    ids, pos, mask, labels = any_order_batch(x, W, offset, p_ltr, gen)
    T = x.shape[1]
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits[:, T:]
    V = logits.shape[-1]
    ce = [F.cross_entropy(logits[:, k * T:(k + 1) * T].reshape(-1, V).float(),
                          labels[:, k * T:(k + 1) * T].reshape(-1).long(), ignore_index=IGNORE) for k in (0, 1)]
    return ce[0], ce[1]


def build_model(init: Path, seed: int):
    """Qwen3ForCausalLM with the init checkpoint's shapes and weights (q/k norms start at 1)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    raw = json.loads((init / "config.json").read_text())
    keep = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
            "bos_token_id", "eos_token_id", "pad_token_id", "mask_token_id", "rope_parameters"]
    config = Qwen3Config(**{k: raw[k] for k in keep if k in raw}, any_order=True, use_sliding_window=False)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM._from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    from safetensors.torch import load_file
    missing, unexpected = model.load_state_dict(load_file(init / "model.safetensors"), strict=False)
    if unexpected or any("norm" not in n and n != "lm_head.weight" for n in missing):
        raise SystemExit(f"--init-from {init}: weights do not fit (missing {missing}, unexpected {unexpected})")
    model.tie_weights()
    return model


@torch.no_grad()
def evaluate(model, X: torch.Tensor, W: int = 8) -> dict:
    """Held-out CE: M rows in LTR order (= the AR mode), M rows in random orders, R rows from the
    pure prefix (the Packed-SS draft), windows of W from offset 0, fixed generator."""
    model.eval()
    out = {}
    for name, p_ltr in (("ltr", 1.0), ("random_order", 0.0)):
        gen = torch.Generator().manual_seed(1234)
        m, r = zip(*(losses(model, X[i:i + 4], W, 0, p_ltr, gen) for i in range(0, len(X), 4)))
        out[f"verify_{name}"] = round(float(torch.stack(m).mean()), 4)
        out[f"draft_{name}"] = round(float(torch.stack(r).mean()), 4)
    model.train()
    return out


def train(args) -> None:
    torch.set_num_threads(args.threads)
    out, init = Path(args.out), Path(args.init_from)
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    t0 = time.time()
    tok = Tokenizer.from_file(str(init / "tokenizer.json"))
    _, _, train_files, held_files = base.load_data(args)
    train_stream = base.encode_stream(tok, [t for _, t in train_files])
    held = base.heldout_sample(base.encode_stream(tok, [t for _, t in held_files]), args.eval_seqs, args.seq_len)
    model = build_model(init, args.seed)
    opts = base.make_optimizers(model, args)
    T, bsz = args.seq_len, args.batch
    g_data, g_order = torch.Generator().manual_seed(args.seed), torch.Generator().manual_seed(args.seed + 1)
    n_chunks = len(train_stream) // T
    order = torch.randperm(n_chunks, generator=g_data)
    print(f"data: {len(train_stream)} train tokens; model {sum(p.numel() for p in model.parameters()) / 1e6:.3f}M "
          f"params warm-started from {init}", flush=True)
    model.train()
    t_train, last_log, hist = time.time(), 0.0, []
    for step in range(args.steps):
        idx = order[(step * bsz) % (n_chunks - bsz):][:bsz].tolist()
        x = torch.stack([train_stream[i * T:(i + 1) * T] for i in idx]).long()
        W = int(torch.randint(args.min_width, args.max_width + 1, (), generator=g_order))
        offset = int(torch.randint(0, W, (), generator=g_order))
        verify, draft = losses(model, x, W, offset, args.p_ltr, g_order)
        loss = verify + draft
        for o, _ in opts:
            o.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        for o, lrs in opts:
            for group, lr in zip(o.param_groups, lrs):
                group["lr"] = lr * base.lr_mult(step, args)
            o.step()
        hist.append((verify.item(), draft.item()))
        if time.time() - last_log >= args.log_every_s or step == args.steps - 1:
            last_log, el = time.time(), time.time() - t_train
            k = min(len(hist), 20)
            print(f"step {step + 1}/{args.steps}  verify {sum(h[0] for h in hist[-k:]) / k:.3f}  "
                  f"draft {sum(h[1] for h in hist[-k:]) / k:.3f}  W={W}  elapsed {base.fmt_time(el)}  "
                  f"ETA {base.fmt_time(el / (step + 1) * (args.steps - step - 1))}", flush=True)
    train_wall = time.time() - t_train
    model.save_pretrained(out, safe_serialization=True)
    hf_tok = AutoTokenizer.from_pretrained(init)
    hf_tok.save_pretrained(out)
    (out / "tokenizer_config.json").write_text((init / "tokenizer_config.json").read_text())
    ev = evaluate(model, held)
    k = min(len(hist), 50)
    summary = {"train_wall_s": round(train_wall, 1), "total_wall_s": round(time.time() - t0, 1),
               "steps": args.steps, "clean_tokens": args.steps * bsz * T,
               "final_train_verify_loss": round(sum(h[0] for h in hist[-k:]) / k, 4),
               "final_train_draft_loss": round(sum(h[1] for h in hist[-k:]) / k, 4), "heldout": ev}
    (out / "training.json").write_text(json.dumps({"argv": args.argv, "versions": base.versions(), **summary},
                                                  indent=1) + "\n")
    print(json.dumps(summary, indent=1), flush=True)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m packed_ss.train_any_order", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output directory (HF Qwen3 layout, any_order: true)")
    ap.add_argument("--init-from", default=str(default_model_path()), help="Llama/Qwen3 checkpoint to start from")
    base.add_run_args(ap)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--min-width", type=int, default=2)
    ap.add_argument("--max-width", type=int, default=16)
    ap.add_argument("--p-ltr", type=float, default=0.5, help="probability that a window is ordered left to right")
    base.add_optimizer_args(ap, lr=1e-3, muon_lr=0.01, warmup=20)
    ap.add_argument("--eval-seqs", type=int, default=32)
    ap.add_argument("--log-every-s", type=float, default=20.0)
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def main(argv=None) -> None:
    train(parse_args(argv))


if __name__ == "__main__":
    main()
