"""The lookup drafter: n-gram matches in the prompt and the output so far, on the device, batch-shaped.

After a step's acceptance the verified sequence of request b is `context[b]` (the last prompt tokens,
right-aligned, -1 before them) followed by `out[b, :n_out[b]]`. Its last n tokens (n from `NGRAMS`, longest
first) are looked up at every earlier end e (the most recent one wins, one that overlaps the current end
included), and the draft is the W tokens that followed: hay[e + 1 + i], continued, where they run past the
end, as a copy of itself (a back-reference of period p = end - 1 - e repeats: d_i = hay[end - p + i mod p]).
The draft stops after its first stop token. Fixed shapes, no host read: it runs inside a captured iteration.

A lookup draft is a point mass: its stored Q is 1 on the token (Alg. 2 then accepts d with probability
p(d) and draws a rejection's correction from p without d, renormalised), laid out so that the sparse and the
dense readings of the Q rows agree.
"""
from __future__ import annotations

import torch

NGRAMS = (4, 3, 2, 1)  # match lengths tried, longest first (1: any earlier occurrence of the last token)
CONTEXT = 1024         # prompt tokens searched (the last ones of a longer prompt), besides the whole output


def drafts_by_lookup(drafts: str | None) -> bool:
    """Whether a draft source ("diffusion", "lookup", "both"; None: no drafts) has lookup drafts."""
    return drafts in ("lookup", "both")


def continuation(hay: torch.Tensor, end: torch.Tensor, width: int, ngrams=NGRAMS) -> tuple[torch.Tensor, torch.Tensor]:
    """(draft [B, W], order [B]): the lookup continuation of each row's sequence hay[b, :end[b]] (tokens >= 0;
    -1 marks no token) and the length n of the match it follows (its order). Rows without a match have order 0
    and a meaningless draft.

    The last n tokens end at e wherever hay[e - i] == hay[end - 1 - i] for i < n: one comparison of the whole
    row per suffix token, shifted and combined, serves every n."""
    batch, length = hay.shape
    device = hay.device
    i = torch.arange(max(ngrams), device=device)
    suffix = hay.gather(1, (end[:, None] - 1 - i).clamp(min=0))                      # [B, n_max]: last, last-1, ..
    valid = (end[:, None] > i) & (suffix >= 0)                                      # suffix token i exists
    ends = torch.arange(length, device=device)
    earlier = ends <= end[:, None] - 2                                              # e, an earlier end
    match, latest = torch.ones_like(hay, dtype=torch.bool), {}
    for k in range(max(ngrams)):                                  # match: the last k + 1 tokens end at e
        same = (hay == suffix[:, k:k + 1]) & valid[:, k:k + 1]
        match = match & torch.nn.functional.pad(same, (k, 0))[:, :length]         # hay[e - k] == suffix k
        if k + 1 in ngrams:
            latest[k + 1] = torch.where(match & earlier, ends, -1).amax(1)
    best = torch.full((batch,), -1, dtype=torch.int64, device=device)
    order = torch.zeros_like(best)
    for n in ngrams:                                              # longest first
        order = torch.where((best < 0) & (latest[n] >= 0), n, order)
        best = torch.where(best < 0, latest[n], best)
    period = (end - 1 - best).clamp(min=1)
    i = torch.arange(width, device=device)
    src = end[:, None] - period[:, None] + i % period[:, None]
    return hay.gather(1, src.clamp(0, length - 1)), order


def lookup_draft(st, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(draft [B, W], length [B], order [B]) for a DecodeState: the continuation, cut after its first stop, and the
    order of its match (0: none found)."""
    hay = torch.cat([st.context, st.out], 1)
    draft, order = continuation(hay, st.context.shape[1] + st.n_out, width)
    is_stop = (draft[:, :, None] == st.stop_ids[:, None, :]).any(-1)
    length = torch.where(is_stop.any(1), is_stop.long().argmax(1) + 1, width)
    return draft, length, order
