"""Train the project's tiny dual-mode (AR + block-diffusion) default model on the CPU, or re-evaluate one.

    python -m packed_ss.lab.train --out DIR [options]          # train, evaluate, write DIR
    python -m packed_ss.lab.train --eval-only DIR [options]    # re-evaluate a saved model

A tokenizer is trained on the corpus, then one Llama network (``transformers.LlamaForCausalLM``) is trained
from scratch on the joint AR + diffusion objective (objective.py). The output directory is an ordinary HF
directory (config.json with ``mask_token_id``, model.safetensors, tokenizer.json, tokenizer_config.json, ...)
plus TRAINING.md.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from .data import (
    EOS_ID,
    add_corpus_args,
    encode_stream,
    epoch_batches,
    heldout_sample,
    load_corpus,
    train_tokenizer,
    wrap_tokenizer,
)
from .evaluate import check_roundtrip, draft_check, evaluate_heldout, greedy_sample, humaneval_texts
from .loop import fit, mean_last
from .model import new_dual_mode_model
from .objective import dual_mode_losses, make_batch, sample_batch_layout
from .optim import add_optimizer_args, make_optimizers
from .report import write_training_md


def train(args) -> None:
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()

    root, train_files, held_files = load_corpus(args)
    print(f"data: {root}: {len(train_files) + len(held_files)} files, {len(train_files)} train / "
          f"{len(held_files)} held-out", flush=True)
    tok = train_tokenizer([t for _, t in train_files], args.vocab)
    hf_tok = wrap_tokenizer(tok)
    he = humaneval_texts()
    bad = check_roundtrip(hf_tok, he + [t for _, t in held_files[:20]])
    if bad:
        raise SystemExit(f"tokenizer round-trip failed on {bad} texts")
    train_stream = encode_stream(tok, [t for _, t in train_files])
    held_stream = encode_stream(tok, [t for _, t in held_files])
    t_tok = time.time() - t0
    print(f"tokenizer: vocab {tok.get_vocab_size()}, train {len(train_stream)} tokens, held-out {len(held_stream)} "
          f"tokens, round-trip OK on {len(he)} HumanEval prompts ({t_tok:.0f}s)", flush=True)

    T, bsz = args.seq_len, args.batch
    model = new_dual_mode_model(args, tok.get_vocab_size())
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.3f}M parameters ({n_params * 4 / 1e6:.1f} MB fp32)", flush=True)
    opts = make_optimizers(model, args)

    g_data = torch.Generator().manual_seed(args.seed)
    g_layout = torch.Generator().manual_seed(args.seed + 1)
    offset = int(torch.randint(0, T, (1,), generator=g_data))    # chunks start at a random offset
    n_chunks = (len(train_stream) - offset) // T
    batches = epoch_batches(train_stream[offset:], T, bsz, g_data)

    def step_loss():
        x = next(batches)
        B, block_offset, pa = sample_batch_layout(bsz, T, g_layout, args.min_block, args.max_block, args.p_a)
        ar, df, _ = dual_mode_losses(model, make_batch(x, B, block_offset, pa))
        # Weighting (default 1:1): both terms are mean per-token cross-entropies in nats over about the same
        # number of rows (T-1 AR targets, 0.5T..T masked targets), so an equal-weight sum -- the
        # Nemotron-style joint objective -- gives verifier and drafter comparable gradient shares. The AR
        # mode alone decides the decoded output, so it is never down-weighted; the drafter only decides
        # speed, and its targets are intrinsically noisier (slot k predicts k tokens ahead), so it is not
        # up-weighted either. Measured: the joint loss does not slow AR learning per clean token (it costs
        # 2x compute/token).
        return ar + args.diff_weight * df, {"ar": ar, "diff": df}, {"B": B}

    t_train = time.time()
    history = fit(model, opts, args, step_loss)
    train_wall = time.time() - t_train

    model.save_pretrained(out, safe_serialization=True)
    hf_tok.save_pretrained(out)
    # transformers 5.x writes tokenizer_class "TokenizersBackend", which 4.x does not know;
    # "PreTrainedTokenizerFast" loads the same tokenizer.json in both.
    tc_path = out / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text())
    tc["tokenizer_class"] = "PreTrainedTokenizerFast"
    tc_path.write_text(json.dumps(tc, indent=2) + "\n")
    print(f"saved to {out} ({(out / 'model.safetensors').stat().st_size / 1e6:.1f} MB)", flush=True)

    summary = {
        "train_wall_s": round(train_wall, 1),
        "tokenizer_and_data_s": round(t_tok, 1),
        "steps": args.steps,
        "clean_tokens": args.steps * bsz * T,
        "epochs_completed": round(args.steps * bsz / n_chunks, 3),
        "train_tokens_available": len(train_stream),
        "heldout_tokens_available": len(held_stream),
        "n_train_files": len(train_files),
        "n_heldout_files": len(held_files),
        "n_params": n_params,
        "final_train_ar_loss_avg_last": mean_last(history, "ar"),
        "final_train_diff_loss_avg_last": mean_last(history, "diff"),
        "avg_over_last_steps": min(len(history), 50),
    }
    ev = evaluate_saved(out, args, held_stream=held_stream)
    summary["total_wall_s"] = round(time.time() - t0, 1)
    write_training_md(out, args, summary, ev)
    print(json.dumps({"summary": summary, **ev}, indent=1), flush=True)


def evaluate_saved(out: Path, args, held_stream: torch.Tensor | None = None) -> dict:
    """Reload the saved directory with the Auto* classes and evaluate it (held-out sample of the corpus
    split, tokenizer round trip, greedy sample, and the draft check unless --no-draft-check)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    hf_tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    he = humaneval_texts()
    res = {"roundtrip_failures_humaneval": check_roundtrip(hf_tok, he)}
    if held_stream is None:
        _, _, held_files = load_corpus(args)
        held_stream = torch.tensor(
            [i for _, t in held_files for i in hf_tok(t).input_ids + [EOS_ID]], dtype=torch.int32)
    X = heldout_sample(held_stream, args.eval_seqs, args.seq_len)
    t = time.time()
    res["heldout"] = evaluate_heldout(model, X)
    print(f"held-out eval ({time.time() - t:.0f}s): {json.dumps(res['heldout'])}", flush=True)
    res["sample_fibonacci"] = greedy_sample(model, hf_tok, "def fibonacci(n):", 64)
    print(res["sample_fibonacci"], flush=True)
    if args.draft_check and he:
        t = time.time()
        res["draft_check"] = draft_check(model, hf_tok, args.draft_prompts, args.draft_width, args.draft_new)
        print(f"draft check ({time.time() - t:.0f}s): {json.dumps(res['draft_check'])}", flush=True)
    return res


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m packed_ss.lab.train", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="output directory (HF layout)")
    ap.add_argument("--eval-only", metavar="DIR", help="evaluate a saved model directory instead of training")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    add_corpus_args(ap)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--intermediate", type=int, default=704)
    ap.add_argument("--max-pos", type=int, default=1024)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=400)
    add_optimizer_args(ap, lr=3e-3, muon_lr=0.02, warmup=30)
    ap.add_argument("--no-zero-init-out", dest="zero_init_out", action="store_false")
    ap.add_argument("--diff-weight", type=float, default=1.0)
    ap.add_argument("--p-a", type=float, default=0.75, help="probability of pattern (a) per block")
    ap.add_argument("--min-block", type=int, default=2)
    ap.add_argument("--max-block", type=int, default=17)
    ap.add_argument("--eval-seqs", type=int, default=64)
    ap.add_argument("--no-draft-check", dest="draft_check", action="store_false")
    ap.add_argument("--draft-prompts", type=int, default=20)
    ap.add_argument("--draft-width", type=int, default=8)
    ap.add_argument("--draft-new", type=int, default=128)
    ap.add_argument("--log-every-s", type=float, default=None,
                    help="seconds between progress-bar updates (default 0.1 on a terminal, 10 otherwise)")
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if not args.out and not args.eval_only:
        ap.error("--out or --eval-only is required")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.eval_only:
        res = evaluate_saved(Path(args.eval_only), args)
        print(json.dumps(res, indent=1))
    else:
        train(args)

