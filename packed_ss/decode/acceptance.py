"""Left-to-right verification of a draft: greedy matching or rejection sampling against the stored Q.

Per request of a batch, given the verifier's rows [last prefix token, d_1 .. d_W] (W+1 of them, already
processed: their argmax, or their target distribution p), returns the emitted tokens C (only the first A are meaningful)
and A = h + 1, where h is the accepted draft prefix and the last emitted token is the correction (after
a rejection) or the bonus (after full acceptance).
"""
from __future__ import annotations

import torch

from .sampling import densify, inverse_cdf, take_rows


def _accepted_prefix(accept: torch.Tensor) -> torch.Tensor:
    """Length of the leading run of True in each row of a [B, W] bool tensor."""
    return accept.long().cumprod(1).sum(1)


def verify_greedy(draft, draft_len, argmax):
    """Accept the leading draft tokens equal to the verifier argmax [B, W+1]; emit the argmax after them."""
    w = draft.shape[1]
    match = (draft == argmax[:, :w]) & (torch.arange(w, device=draft.device) < draft_len[:, None])
    return argmax, _accepted_prefix(match) + 1


def verify_sampled(draft, draft_len, q_idx, q_prob, p, u):
    """Rejection sampling (paper Alg. 2, lines 5-8) against the *stored* proposal distributions.

    Per request of the batch: draft [W]; q_idx / q_prob [W, K]: the sparse Q each draft token was drawn
    from; p [W+1, V]: the dense target at the verifier rows; u [W + 1] uniforms (all with a leading [B]).
    Accept d_i while u_i * Q_i(d_i) < p_i(d_i); at the first rejection draw from max(p - Q, 0),
    after full acceptance draw the bonus from p.
    """
    w, vocab = draft.shape[1], p.shape[-1]
    ranks = torch.arange(w, device=draft.device)
    p_d = p[:, :w].gather(2, draft[:, :, None])[:, :, 0]
    q_d = (q_prob * (q_idx == draft[:, :, None])).sum(-1).to(p.dtype)
    accept = (u[:, :w].to(p.dtype) * q_d < p_d) & (ranks < draft_len[:, None])
    h = _accepted_prefix(accept)
    p_h = take_rows(p, h)
    hq = h.clamp(max=w - 1)
    q_h = densify(take_rows(q_idx, hq), take_rows(q_prob, hq).to(p.dtype), vocab)
    residual = torch.where((h < draft_len)[:, None], (p_h - q_h).clamp(min=0), p_h)
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_h)  # p == Q up to rounding: fall back to p
    c = inverse_cdf(residual, u[:, w])
    emitted = torch.where(torch.arange(w + 1, device=draft.device) < h[:, None], torch.cat([draft, draft[:, :1]], 1),
                          c[:, None])
    return emitted, h + 1
