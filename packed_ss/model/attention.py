"""Packed attention over a KV cache: the plain-torch reference (CPU backend and test oracle).

One call of the engine processes R rows. The first `n_anchor` rows are *anchors*: causal rows whose
K/V belong in the cache (prompt rows, the verifier region, quadratic anchors). They are written in place
into cache slots `cache_len .. cache_len + n_anchor - 1` before attention. The remaining rows are
*scratch* rows; their K/V never touch the cache. Rows `draft_from ..` are *drafting* rows, whose logits only
become proposals: a drafting adapter (adapter.py) applies to them alone, so every other row computes the
base model. In the left-to-right layouts the drafting rows are exactly the scratch rows; any-order layouts
also have scratch rows that verify, which must stay base rows.

The mask is never materialised by the caller; it follows from O(rows) metadata:
- row r sees cache slot j  iff  j < cache_len + see[r] + 1   (anchors: see[r] = r, i.e. causal;
  a scratch row sees the cache plus the anchors up to see[r], -1 for none; in a batch, see may also be
  [B, R], a row per request: the prefill of prompts of several lengths);
- scratch rows r, c see each other iff seg[r] == seg[c]       (anchors have seg 0, scratch seg >= 1).

A call may also be a batch of B requests that share the Layout but each have their own cache and cache
length: q [B, R, H, D], k/v [B, R, Hkv, D], caches [B, Hkv, S, D], cache_len [B]; row r of request b sees
slot j of its own cache iff j < cache_len[b] + see[r] + 1. Backends implement the batched form only;
`batchable` turns one request's call (no batch dim, 0-d cache_len) into a batch of 1.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Layout:
    """Static shape of one call: anchors first, then scratch rows grouped by segment id."""
    n_anchor: int
    seg: torch.Tensor   # [R] int64, 0 for anchors, >= 1 for scratch rows
    see: torch.Tensor   # [R] (or [B, R], per request) int64: last visible anchor relative to cache_len (-1: none)
    draft_from: int | None = None   # rows >= draft_from are drafting rows (a static slice); None: none

    @property
    def rows(self) -> int:
        return self.seg.numel()

    def to(self, device) -> "Layout":
        return Layout(self.n_anchor, self.seg.to(device), self.see.to(device), self.draft_from)


def batchable(fn):
    """Let a batched function (first argument [B, ...]: q [B, R, H, D] or caches [B, Hkv, S, D]; cache_len
    [B]) also take one request's call (first argument 3-D, 0-d cache_len): every tensor argument gains a
    batch of 1 (a view, so in-place anchor writes land in the caller's caches) and a returned tensor loses it.
    """
    @functools.wraps(fn)
    def call(*args, **kwargs):
        if args[0].dim() != 3:
            return fn(*args, **kwargs)
        out = fn(*(a[None] if isinstance(a, torch.Tensor) else a for a in args), **kwargs)
        return None if out is None else out[0]
    return call


def dense_mask(layout: Layout, cache_len: torch.Tensor, capacity: int) -> torch.Tensor:
    """Boolean [R, capacity + scratch] mask equivalent to the metadata rule (for SDPA and for tests);
    [B, R, capacity + scratch] for a batch's cache_len [B], or a cached length per row, [B, R] (the drafter's
    training calls, lab/drafter/calls.py: one request, many prefixes)."""
    slots = torch.arange(capacity, device=layout.seg.device)
    per_row = cache_len if cache_len.dim() == 2 else cache_len[..., None]
    cache_vis = slots < (per_row + layout.see + 1)[..., None]
    scratch_seg = layout.seg[layout.n_anchor:]
    scratch_vis = (layout.seg[:, None] == scratch_seg[None, :]) & (layout.seg[:, None] > 0)
    return torch.cat([cache_vis, scratch_vis.expand(*cache_vis.shape[:-1], -1)], dim=-1)


@batchable
def write_anchors(k_cache, v_cache, k, v, cache_len: torch.Tensor, n_anchor: int) -> None:
    """Write the anchors' K/V ([B, R, Hkv, D]) into slots cache_len[b] + i of each request's caches
    ([B, Hkv, S, D], views allowed): one index_put_ per cache for the whole batch, no host read."""
    if n_anchor == 0:
        return
    batch, kv_heads = k_cache.shape[:2]
    b = torch.arange(batch, device=k.device)[:, None, None]
    h = torch.arange(kv_heads, device=k.device)[None, :, None]
    slots = (cache_len[:, None] + torch.arange(n_anchor, device=k.device))[:, None, :]   # [B, 1, n_anchor]
    k_cache.index_put_((b, h, slots), k[:, :n_anchor].transpose(1, 2))
    v_cache.index_put_((b, h, slots), v[:, :n_anchor].transpose(1, 2))


@batchable
def packed_attention_ref(q, k, v, k_cache, v_cache, cache_len, layout: Layout, scale: float):
    """q [B, R, H, D], k/v [B, R, Hkv, D]; caches [B, Hkv, S, D] (anchors written in place); cache_len [B].
    Returns [B, R, H, D]. Without the batch dim (0-d cache_len): one request, [R, H, D]."""
    write_anchors(k_cache, v_cache, k, v, cache_len, layout.n_anchor)
    n = layout.n_anchor
    keys = torch.cat([k_cache, k[:, n:].transpose(1, 2)], dim=2)
    values = torch.cat([v_cache, v[:, n:].transpose(1, 2)], dim=2)
    mask = dense_mask(layout, cache_len, k_cache.shape[2])
    out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=mask[:, None],
                                         scale=scale, enable_gqa=True)
    return out.transpose(1, 2)


BACKENDS = ("torch", "triton")


def attention_backend(name: str):
    """The packed-attention function for a backend name: "torch" (reference) or "triton" (fused)."""
    if name == "torch":
        return packed_attention_ref
    if name == "triton":
        from ..kernels.attention import packed_attention_op
        return packed_attention_op
    raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
