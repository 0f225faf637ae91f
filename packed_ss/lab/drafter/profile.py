"""How far ahead the drafter is right, measured on the model's own greedy continuations.

At every prefix n of a continuation the drafting call (calls.py, as the engine issues it) drafts W tokens;
against the continuation (the verifier's greedy output) we count per-slot accuracy and the leading match h.
The acceptance profile replays greedy decoding on the same continuations with these drafts, for every
width w = 1..W: tokens per iteration when each iteration verifies a draft from the current prefix ("fresh":
Linear-SS, Quadratic-SS), when it verifies the previous call's proposal, shifted by what that call
accepted ("lagged": Packed-SS, paper Alg. 1), and, for any-order models, when it verifies the branch drafted
before the correction token ("branch": their Quadratic-SS), and, left to right, with lookup drafts
(decode/lookup.py, from the current prefix, the continuation counting as output): alone ("lookup") or
where the lookup finds a match ("fresh+lookup", "lagged+lookup": drafts="both"). A width-w draft is taken as
the first w tokens of the width-W draft (one drafting call per prefix instead of W; the mask rows of a narrower call see fewer masks, so this
is an approximation, checked against the engine by the benchmark). `width="auto"` (packed_ss/width.py)
reads the profile.
"""
from __future__ import annotations

import torch

from ...decode.lookup import continuation
from ...width import LOOKUP_KINDS, profile_kinds
from ..progress import progress
from .calls import base_cache, drafting_logits


def leading(drafts: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """Leading matches per row: the number of first tokens of `drafts` equal to `truth` ([G, W] both)."""
    return (drafts == truth).int().cumprod(-1).sum(-1)


@torch.no_grad()
def greedy_drafts(model, seq, cache, starts, width: int, any_order: bool, chunk: int = 64) -> torch.Tensor:
    """[G, W] argmax drafts from each prefix in `starts`."""
    return torch.cat([drafting_logits(model, seq, cache, starts[i:i + chunk], width, any_order).argmax(-1)
                      for i in range(0, len(starts), chunk)])


def lookup_drafts(seq: torch.Tensor, starts: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(drafts [G, W], found [G]): the lookup drafter's continuation from each prefix seq[:m], m in `starts`."""
    drafts, order = continuation(seq[None].expand(len(starts), -1), starts, width)
    return drafts, order > 0


def replay(drafts: torch.Tensor, seq: torch.Tensor, first: int, width: int, kind: str,
           any_order: bool = False, lookup: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[int, int]:
    """(tokens, iterations) of greedy decoding at `width` from prefix `first` while there are drafts:
    drafts[m - first, j] is the proposal for position m + j from prefix m (rows up to len(seq) - drafts.shape[1]).
    An iteration accepts the leading matches and a correction or bonus token; an any-order iteration resolves
    positions of its window of `width` only (paper Alg. 3), so at most `width` tokens. The next draft (KINDS):
    "fresh" from the new prefix, "lagged" this call's proposal from the prefix before it, "branch" the
    selected branch's, from the prefix before the correction token (width.profile_kind). `lookup`
    (lookup_drafts, rows as `drafts`): where it found a match from the current prefix, that is the draft."""
    n, tokens, iterations = first, 0, 0
    row, lo, hi = 0, 0, width                    # the draft verified next: drafts[row, lo:hi]
    while n - first < len(drafts):
        if kind == "fresh":
            row, lo, hi = n - first, 0, width
        found = lookup is not None and bool(lookup[1][n - first])
        draft = lookup[0][n - first, :width] if found else drafts[row, lo:hi]
        h = int(leading(draft[None], seq[n:n + len(draft)][None])) if len(draft) else 0
        accepted = min(h + 1, width) if any_order else h + 1
        if kind == "lagged":
            row, lo, hi = n - first, accepted, width
        elif kind == "branch":
            row, lo, hi = n + accepted - 1 - first, 1, width - accepted + 1
        n, tokens, iterations = n + accepted, tokens + accepted, iterations + 1
    return tokens, iterations


def acceptance(model, sequences: list[tuple[int, torch.Tensor]], max_width: int, any_order: bool,
               desc: str) -> dict:
    """Per-slot accuracy, P(h >= k) and mean h of width-`max_width` drafts at every prefix of the greedy
    continuations, and the acceptance profile for widths 1..max_width."""
    model.eval()
    hits, at_least, n_drafts, mean_h = torch.zeros(max_width), torch.zeros(max_width), 0, 0.0
    kinds = profile_kinds(any_order) + (() if any_order else LOOKUP_KINDS)
    totals = {kind: torch.zeros(max_width, 2) for kind in kinds}
    slots = torch.arange(max_width)
    with progress(len(sequences), desc, unit="seq") as bar:
        for first, seq in sequences:
            bar.update()
            starts = torch.arange(first, max(first, seq.numel() - max_width + 1), device=seq.device)
            if len(starts) == 0:
                continue
            drafts = greedy_drafts(model, seq, base_cache(model, seq), starts, max_width, any_order).cpu()
            truth = seq[starts[:, None] + slots.to(seq.device)].cpu()
            h = leading(drafts, truth)
            hits += (drafts == truth).sum(0)
            at_least += (h[:, None] >= slots + 1).sum(0)
            n_drafts, mean_h = n_drafts + len(h), mean_h + float(h.sum())
            host = seq.cpu()
            lookup = None if any_order else lookup_drafts(host, starts.cpu(), max_width)
            none = torch.full_like(drafts, -1)                  # lookup alone: no draft without a match
            for width in range(1, max_width + 1):
                for kind in totals:
                    base, _, joined = kind.partition("+")
                    if kind == "lookup":
                        got = replay(none, host, first, width, "fresh", lookup=lookup)
                    else:
                        got = replay(drafts, host, first, width, base, any_order, lookup if joined else None)
                    totals[kind][width - 1] += torch.tensor(got)
    n = max(n_drafts, 1)
    rounded = lambda t: [round(float(x), 4) for x in t]  # noqa: E731
    return {"width": max_width, "drafts": n_drafts, "slot_accuracy": rounded(hits / n),
            "leading_at_least": rounded(at_least / n), "mean_leading": round(mean_h / n, 4),
            "profile": {kind: rounded(t[:, 0] / t[:, 1].clamp(min=1)) for kind, t in totals.items()}}
