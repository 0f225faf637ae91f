"""The rules of paper Alg. 3 that every any-order schedule shares, as fixed-shape device updates.

Each function takes the state and `active` (False once the state is done or held: every write is
gated by it, so a step after the stop changes nothing). Nothing reads the device from the host.
"""
from __future__ import annotations

import torch

from .state import TRACE, AnyOrderState


def put(buf: torch.Tensor, idx: torch.Tensor, val: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """buf with buf[idx[k]] = val[k] wherever keep[k] (kept indices distinct); out of place, any index:
    the entries not kept (or out of range) go to one extra slot past the end, which is dropped."""
    n = buf.shape[0]
    spill = torch.cat([buf, buf[:1]])
    spill.index_copy_(0, torch.where(keep & (idx >= 0) & (idx < n), idx, n), val.to(buf.dtype))
    return spill[:n]


def gather(buf: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """buf[idx] with idx clamped into range (callers mask the entries whose index was out of range)."""
    return buf[idx.clamp(0, buf.shape[0] - 1)]


def pending(st: AnyOrderState) -> torch.Tensor:
    """p: accepted pairs whose K/V the next call computes (its N rows)."""
    return st.n_acc - st.n_cached


def window_size(st: AnyOrderState) -> torch.Tensor:
    """u_t of the planned call."""
    return (st.rank_pos >= 0).sum()


def slots(st: AnyOrderState, positions: torch.Tensor):
    """The draft slot holding each position: (slot, found)."""
    eq = (st.draft_pos[None, :] == positions[:, None]) & (positions[:, None] >= 0)
    return eq.long().argmax(1), eq.any(1)


def plan(st: AnyOrderState, order: str, active: torch.Tensor) -> None:
    """Lines 3-5: U_t = unresolved positions among the W from the leftmost unresolved one, up to E, and
    pi_t over it: textual ("ltr"), or by decreasing draft score, ties by position, positions without a
    finite score last in textual order ("confidence", E.6). Written to `rank_pos` for the next call."""
    width = st.rank_pos.shape[0]
    cand = st.n_out + torch.arange(width, device=st.out.device)   # out[:n_out] is resolved
    live = (cand <= st.end) & (gather(st.out, cand) < 0)
    if order == "confidence":
        slot, found = slots(st, cand)
        score = torch.where(found, st.draft_score[slot], torch.nan)
        scored = live & score.isfinite()
        key = torch.where(scored, -score, torch.where(live, 2.0, 3.0))
    else:
        key = torch.where(live, 0.0, 1.0)
    perm = torch.sort(key, stable=True).indices
    ranks = torch.arange(width, device=cand.device)
    st.assign(active, rank_pos=torch.where(ranks < live.sum(), cand[perm], -1))


def drafts(st: AnyOrderState):
    """D_{t-1} at each rank of pi_t: tokens (-1: none), kappa_t (line 6) and the stored Q rows (dense)."""
    slot, found = slots(st, st.rank_pos)
    tok = torch.where(found, st.draft_tok[slot], -1)
    kappa = (tok >= 0).long().cumprod(0).sum()
    return tok, kappa, st.q_prob[slot]


def commit(st: AnyOrderState, active, positions, tokens, keep, n_cached) -> None:
    """P_t <- (P_{t-1}, C_t) for C_t = the kept (position, token) pairs in rank order (line 13); the cache
    then holds the first `n_cached` pairs of P_t. Then the stopping rule (lines 11-12)."""
    dest = st.n_acc + keep.long().cumsum(0) - 1
    st.assign(active, out=put(st.out, positions, tokens, keep), acc_pos=put(st.acc_pos, dest, positions, keep),
              n_cached=n_cached, n_acc=st.n_acc + keep.sum())
    apply_stops(st, active)


def apply_stops(st: AnyOrderState, active) -> None:
    """E <- end of the earliest fully accepted stop sequence; drop the pairs after E (lines 11-12).

    Every accepted position lies in the window of W from the leftmost unresolved one, n_out, which never
    decreases; a sequence completed in this iteration ends at one of those W positions (earlier ones set E
    when they were completed), so only they are checked, and n_out only moves within them. Cache rows after
    the first dropped pair saw it: they leave the cache and wait, in the same order, as pending rows, which
    keeps the cache equal to the ordered context P_t. Then `n_out` and `done`."""
    n, length, width = st.out.shape[0], st.stops.shape[1], st.rank_pos.shape[0]
    ends = st.n_out + torch.arange(width, device=st.out.device)
    at = ends[:, None] - (length - 1) + torch.arange(length, device=ends.device)      # [W, Ls]
    tokens = torch.where((at >= 0) & (at < n), gather(st.out, at), -1)
    match = (st.stops[None] == -1) | (tokens[:, None, :] == st.stops[None])          # [W, S, Ls]
    end = torch.minimum(st.end, torch.where(match.all(-1).any(-1), ends, n).amin())
    pos = torch.arange(n, device=ends.device)
    listed = pos < st.n_acc
    dropped = listed & (st.acc_pos > end)
    first = torch.where(dropped.any(), dropped.long().argmax(), st.n_acc)
    kept = listed & ~dropped
    nth_kept = torch.searchsorted(kept.long().cumsum(0), pos + 1)   # the index of the k-th kept pair
    st.assign(active, end=end, out=torch.where(pos > end, -1, st.out), acc_pos=gather(st.acc_pos, nth_kept),
              n_acc=kept.sum(), n_cached=torch.minimum(st.n_cached, first))
    resolved = (gather(st.out, ends) >= 0) & (ends <= st.end) & (ends < n)
    n_out = st.n_out + resolved.long().cumprod(0).sum()
    st.assign(active, n_out=n_out, done=n_out > st.end)


def set_draft(st: AnyOrderState, active, tokens, scores, q_prob=None) -> None:
    """D_t: the proposals at the ranks of pi_t still unresolved and not after E (lines 14-15), with their
    scores and, when sampled, their Q. Tokens -1: scores alone (Linear-SS orders by its verifier, E.6)."""
    pos = st.rank_pos
    open_ = (pos >= 0) & (pos <= st.end) & (gather(st.out, pos) < 0)
    values = {"draft_pos": torch.where(open_, pos, -1), "draft_tok": tokens, "draft_score": scores}
    if q_prob is not None:
        values.update(q_prob=q_prob)
    st.assign(active, **values)


def record(st: AnyOrderState, active, order, **stats) -> None:
    """Trace row n_iter <- this iteration (`order` and TRACE columns); then the next row."""
    row = st.n_iter.clamp(max=st.trace_order.shape[0] - 1)[None]
    values = torch.stack([stats[name] for name in TRACE]).to(st.trace_stats.dtype)
    for table, new in ((st.trace_order, order), (st.trace_stats, values)):
        table.index_copy_(0, row, torch.where(active, new, table.index_select(0, row)[0])[None])
    st.assign(active, n_iter=st.n_iter + 1)


def hold_if_crowded(st: AnyOrderState, active, capacity: int) -> None:
    """Ask the host for `resume()` when more rows are pending than the fixed call has N slots for."""
    st.assign(active, hold=~st.done & (pending(st) > capacity))
