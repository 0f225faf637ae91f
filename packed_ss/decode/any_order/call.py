"""The fixed-shape input of an any-order call: anchors [N | O | padding], then mask queries (paper D.2).

Anchors are causal rows written into the cache in place: the pending rows N (acceptance order), then
the old draft O in rank order (a mask where a rank has no draft). Padding anchors come after every live
one, so no live row sees them, and their K/V land in slots past the accepted ones (overwritten later,
never visible). Each mask query has a segment of its own and sees the cache plus a prefix of the
anchors; a padding query sees the cache only. Position ids are textual: prompt length + output position;
padding rows sit one past the output buffer, after every position a live row can have.
"""
from __future__ import annotations

import torch

from ...model.attention import Layout
from ...runtime import ModelInput
from .rules import gather, pending
from .state import AnyOrderState


class Call:
    """`n_pending` N slots and `n_old` O slots of anchors, then `n_query` mask queries, the last `n_draft` of
    which are drafting rows (their logits only become proposals: a drafting adapter applies to them)."""

    def __init__(self, device, mask_id: int, n_pending: int, n_old: int, n_query: int, n_draft: int = 0):
        self.n_anchor, self.n_old = n_pending + n_old, n_old
        rows = self.n_anchor + n_query
        self.draft_from = rows - n_draft if n_draft else None
        self.anchors = torch.arange(self.n_anchor, device=device)
        self.seg = torch.cat([torch.zeros(self.n_anchor, dtype=torch.int64, device=device),
                              torch.arange(1, n_query + 1, device=device)])
        self.masks = torch.full((n_query,), mask_id, dtype=torch.int64, device=device)
        self.mask_id = mask_id

    def build(self, st: AnyOrderState, query_pos, query_see, old_tokens=None, after_pending=False) -> ModelInput:
        """Queries at output positions `query_pos` (-1: padding), query r seeing anchors 0..query_see[r].

        `old_tokens` [W]: the O row of each rank of pi_t (a mask where no draft). `after_pending`: this call
        has no N rows because the previous call of the iteration wrote them (Linear-SS's verify call)."""
        i, p, pad = self.anchors, pending(st), st.out.shape[0]
        n_cached = st.n_acc if after_pending else st.n_cached
        pos = gather(st.acc_pos, n_cached + i)
        is_n = i < (0 if after_pending else p)
        tok = torch.where(is_n, gather(st.out, pos), self.mask_id)
        pos = torch.where(is_n, pos, pad)
        if old_tokens is not None:
            rank = i - (0 if after_pending else p)
            is_o = (rank >= 0) & (gather(st.rank_pos, rank) >= 0) & (rank < self.n_old)
            pos = torch.where(is_o, gather(st.rank_pos, rank), pos)
            tok = torch.where(is_o, gather(old_tokens, rank), tok)
        live = query_pos >= 0
        see = torch.where(live, query_see, -1)
        positions = st.prompt_len + torch.cat([pos, torch.where(live, query_pos, pad)])
        layout = Layout(self.n_anchor, self.seg, torch.cat([i, see]), self.draft_from)
        return ModelInput(torch.cat([tok, self.masks]), positions, layout, st.prompt_len + n_cached)
