"""The drafting calls the engine issues, batched over many prefixes of one sequence (training equals inference).

The base model runs the whole sequence causally once and leaves its K/V in a cache (a verifier's work: no
adapter). Then one call holds G drafting groups, one per prefix length n, each seeing cache slots < its own
cached length and nothing of the other groups:
- left to right (Packed-SS's proposal region, Linear-SS's draft call): `[x_(n-1), MASK^W]` at positions
  n-1 .. n-1+W over the cached x_(<n-1), full attention within the group; rows 1..W draft x_n .. x_(n+W-1);
- any-order (the R rows): W masks at positions n .. n+W-1, each alone over the cached x_(<n).
Every row of the call is a drafting row, so a drafting adapter applies to all of them; the cached length
is a per-row tensor, which the packed-attention reference's visibility rule takes as it is.
"""
from __future__ import annotations

import torch

from ...model.attention import Layout


def base_cache(model, seq: torch.Tensor):
    """The base model's K/V for every token of `seq` (a causal pass, no drafting rows)."""
    n = seq.numel()
    cache = model.new_cache(n)
    lay = Layout(n, torch.zeros(n, dtype=torch.int64, device=seq.device), torch.arange(n, device=seq.device))
    with torch.no_grad():
        model(seq, torch.arange(n, device=seq.device), lay, cache, torch.zeros((), dtype=torch.int64,
                                                                                 device=seq.device))
    return cache


def drafting_logits(model, seq: torch.Tensor, cache, starts: torch.Tensor, width: int,
                    any_order: bool) -> torch.Tensor:
    """Logits [G, W, vocab] of the drafts for positions n .. n+W-1, one group per n in `starts` (n >= 1)."""
    device, mask_id = seq.device, model.cfg.mask_token_id
    lead = 0 if any_order else 1
    per = width + lead
    groups = torch.arange(len(starts), device=device).repeat_interleave(per)
    slot = torch.arange(per, device=device).repeat(len(starts))
    first = starts.repeat_interleave(per) - lead    # each group's first position = its cached length
    tokens = torch.full((len(groups),), mask_id, dtype=torch.int64, device=device)
    if lead:
        tokens[slot == 0] = seq[starts - 1]
    seg = 1 + (groups * per + slot if any_order else groups)      # any-order: every mask alone
    lay = Layout(0, seg, torch.full_like(seg, -1), 0)
    logits = model(tokens, first + slot, lay, cache, first)
    return logits.view(len(starts), per, -1)[:, lead:]


def targets(seq: torch.Tensor, starts: torch.Tensor, width: int, ignore: int = -100) -> torch.Tensor:
    """[G, W] tokens x_n .. x_(n+W-1) per start n; `ignore` past the end of the sequence."""
    idx = starts[:, None] + torch.arange(width, device=seq.device)
    return torch.where(idx < seq.numel(), seq[idx.clamp(max=seq.numel() - 1)], ignore)
