"""What a training run leaves beside the model: the software versions and the dual-mode model's
TRAINING.md (how to reproduce it, the model, the run and its evaluation)."""
from __future__ import annotations

import json
import platform
from pathlib import Path

import torch

from .data import stdlib_dir


def versions() -> dict:
    import numpy
    import tokenizers
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
            "numpy": numpy.__version__}


def fmt_time(s: float) -> str:
    s = int(s)
    return f"{s // 3600:d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def write_training_md(out: Path, args, summary: dict, ev: dict) -> None:
    """out/TRAINING.md for a dual-mode run: the command, the corpus, the model, the run, the evaluation."""
    cmd = "python -m packed_ss.lab.train " + " ".join(args.argv)
    cfg = json.loads((out / "config.json").read_text())
    ho = ev["heldout"]
    dc = ev.get("draft_check")
    lines = [
        "# Default dual-mode model: training record",
        "",
        "Tiny Llama-architecture model trained from scratch on the CPU with a joint causal-AR +",
        "Nemotron-style block-diffusion objective (see `packed_ss/lab/train/objective.py`). AR rows predict",
        "the next token (shifted); a `<|mask|>` row at position j predicts the token at j (unshifted),",
        "seeing the causal prefix before its block and its own block bidirectionally.",
        "",
        "## Reproduce",
        "",
        "```",
        cmd,
        "```",
        "",
        f"Seed {args.seed}, {args.threads} torch threads (results depend on the thread count and on the",
        "interpreter's standard library, which is the corpus). Versions: "
        + ", ".join(f"{k} {v}" for k, v in versions().items()) + ".",
        f"Corpus: `.py` files of `{stdlib_dir() if not args.data_dir else args.data_dir}` (site-packages excluded),",
        f"{summary['n_train_files']} train / {summary['n_heldout_files']} held-out files (held-out iff "
        f"sha1(relative path) mod 10000 < {args.heldout_pct * 100:.0f}).",
        f"Tokenizer: byte-level BPE, vocab {cfg['vocab_size']}, `<|endoftext|>`=0 (EOS, also BOS/PAD; not added",
        "automatically), `<|mask|>`=1. Documents are joined with EOS.",
        "",
        "## Model",
        "",
        f"LlamaForCausalLM: hidden {cfg['hidden_size']}, {cfg['num_hidden_layers']} layers, "
        f"{cfg['num_attention_heads']} query / {cfg['num_key_value_heads']} KV heads, head_dim {cfg['head_dim']},",
        f"intermediate {cfg['intermediate_size']}, vocab {cfg['vocab_size']}, max positions "
        f"{cfg['max_position_embeddings']}, rope_theta {args.rope_theta:g}, tied embeddings,",
        f"{summary['n_params'] / 1e6:.3f}M parameters, fp32. `mask_token_id` = {cfg.get('mask_token_id')}.",
        "",
        "## Training",
        "",
        f"- {summary['steps']} steps x batch {args.batch} x {args.seq_len} tokens = {summary['clean_tokens']:,} clean tokens "
        f"({summary['epochs_completed']} epochs of {summary['train_tokens_available']:,} train tokens);",
        "  every step runs 2T rows (clean + noisy stream).",
        f"- Block size B uniform in {{{args.min_block}..{args.max_block}}} per batch (W = B-1), random offset; "
        f"pattern (a) `[x_s, MASK...]` with p={args.p_a}, else pattern (b) `[MASK x B]`.",
        f"- Loss = AR CE + {args.diff_weight:g} x diffusion CE (mean over masked rows).",
        (f"- Muon (float32 Newton-Schulz, momentum 0.95 Nesterov) lr {args.muon_lr:g} on the hidden matrices, "
         f"AdamW lr {args.lr:g} (betas 0.9/0.95, no decay) on the tied embedding and norms; "
         if args.optimizer == "muon" else f"- AdamW lr {args.lr:g} (betas 0.9/0.95); ")
        + f"weight decay {args.weight_decay:g} on matrices; warmup {args.warmup} steps, cosine to {args.min_lr_ratio:g}x; "
        f"grad clip {args.grad_clip:g}; residual output projections zero-initialized: {args.zero_init_out}.",
        f"- Wall time: {fmt_time(summary['train_wall_s'])} training ({summary['train_wall_s']:.0f} s), "
        f"{fmt_time(summary['total_wall_s'])} total with tokenizer, data and evaluation.",
        f"- Final train losses (mean of the last {summary['avg_over_last_steps']} steps): AR "
        f"{summary['final_train_ar_loss_avg_last']:.4f}, diffusion {summary['final_train_diff_loss_avg_last']:.4f} nats/token.",
        "",
        "## Held-out evaluation",
        "",
        f"Fixed sample: {ho['n_seqs']} evenly spaced non-overlapping windows of {ho['seq_len']} tokens of the held-out",
        "stream. Blocks of fixed size B from offset 0; pattern (a) = every block `[x_s, MASK x (B-1)]`,",
        "pattern (b) = every block `[MASK x B]`. Losses are mean CE in nats/token.",
        "",
        "| metric | value |",
        "|---|---|",
        f"| held-out AR loss | {ho['ar_loss']:.4f} |",
    ]
    for key in sorted(k for k in ho if k.startswith("diff_")):
        lines.append(f"| held-out diffusion loss, {key[5]} pattern, B={key[8:]} | {ho[key]:.4f} |")
    lines += [""]
    for key in sorted(k for k in ho if k.startswith("acc_")):
        lines.append(f"- top-1 accuracy per mask slot, pattern {key[4]}, B={key[7:]}: {ho[key]}")
    if dc:
        lines += [
            "",
            "## Draft quality (HumanEval)",
            "",
            f"First {dc['n_prompts']} HumanEval prompts, AR greedy continuation of {args.draft_new} tokens (HF `generate`).",
            f"At every point n of the continuation (n = P..P+L-W), the pattern-(a) query `[x_(n-1), MASK x {dc['W']}]`",
            "over the causal prefix drafts W tokens; we count the leading draft tokens equal to the AR greedy ones.",
            "",
            f"- queries: {dc['n_queries']}",
            f"- **mean leading matched draft tokens per query (W={dc['W']}): {dc['mean_leading_match']}**",
            f"- fraction of queries with >= 1 match: {dc['frac_queries_ge1']}",
            f"- per-slot match rate: {dc['slot_accuracy']}",
            f"- simulated greedy Linear-SS tokens per iteration (advance leading+1): {dc['sim_linear_tokens_per_iter']}",
            f"- pattern (b) at the prompt boundary (W+1 masks), mean leading match: {dc['init_pattern_b_mean_leading_match']}",
            f"- packed-forward AR argmax vs `generate` agreement: {dc['packed_forward_vs_generate_agreement']}",
            f"- per-prompt mean leading match: {dc['per_prompt_mean_leading_match']}",
        ]
    lines += ["", "## Greedy sample", "", "```python", ev["sample_fibonacci"], "```", ""]
    (out / "TRAINING.md").write_text("\n".join(lines))
