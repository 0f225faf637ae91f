"""Packed attention over a KV cache: the plain-torch reference (CPU backend and test oracle).

One call of the engine processes R rows. The first `n_anchor` rows are *anchors*: causal rows whose
K/V belong in the cache (prompt rows, the verifier region, quadratic anchors). They are written in place
into cache positions `cache_len .. cache_len + n_anchor - 1` before attention. The remaining rows are
*scratch* rows; their K/V never touch the cache. Rows `draft_from ..` are *drafting* rows, whose logits only
become proposals: a drafting adapter (adapter.py) applies to them alone, so every other row computes the
base model. In the left-to-right layouts the drafting rows are exactly the scratch rows; any-order layouts
also have scratch rows that verify, which must stay base rows.

The mask is never materialised by the caller; it follows from O(rows) metadata:
- row r sees cache position j  iff  j < cache_len + see[r] + 1   (anchors: see[r] = r, i.e. causal;
  a scratch row sees the cache plus the anchors up to see[r], -1 for none; in a batch, see may also be
  [B, R], a row per request: the prefill of prompts of several lengths);
- scratch rows r, c see each other iff seg[r] == seg[c]       (anchors have seg 0, scratch seg >= 1).

A call is a batch of B requests that share the Layout but each have their own cache positions and cache length:
q [B, R, H, D], k/v [B, R, Hkv, D], cache_len [B]; the cache is paged (dual_mode.KVCache): pools
[pages, page_size, Hkv, D] per layer and a page table [B, n], position j of request b at
pool[table[b, j // page_size], j % page_size]. Row r of request b sees position j of its own cache iff
j < cache_len[b] + see[r] + 1. An anchor whose position lies past the table is written to the null page (0),
which no visible position reads.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .. import host


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


def dense_mask(layout: Layout, cache_len: torch.Tensor, capacity: int) -> torch.Tensor:
    """Boolean [R, capacity + scratch] mask equivalent to the metadata rule (for SDPA and for tests);
    [B, R, capacity + scratch] for a batch's cache_len [B], or a cached length per row, [B, R] (the drafter's
    training calls, lab/drafter/calls.py: one request, many prefixes)."""
    positions = torch.arange(capacity, device=layout.seg.device)
    per_row = cache_len if cache_len.dim() == 2 else cache_len[..., None]
    cache_vis = positions < (per_row + layout.see + 1)[..., None]
    scratch_seg = layout.seg[layout.n_anchor:]
    scratch_vis = (layout.seg[:, None] == scratch_seg[None, :]) & (layout.seg[:, None] > 0)
    return torch.cat([cache_vis, scratch_vis.expand(*cache_vis.shape[:-1], -1)], dim=-1)


def anchor_pages(table: torch.Tensor, cache_len: torch.Tensor, n_anchor: int, page_size: int):
    """(page, offset) [B, n_anchor] of the cache positions cache_len[b] + i the anchors go to; past the table,
    the null page."""
    positions = cache_len[:, None] + torch.arange(n_anchor, device=cache_len.device)
    column = positions // page_size
    inside = column < table.shape[1]
    page = torch.where(inside, table.gather(1, column.clamp(max=table.shape[1] - 1)), 0)
    return page, positions % page_size


def write_anchors(k_pool, v_pool, slots, k, v) -> None:
    """Write the anchors' K/V ([B, R, Hkv, D], the first n_anchor rows) into their cache slots (`slots`: the
    (page, offset) [B, n_anchor] of anchor_pages) of pools [pages, page_size, Hkv, D]: one index_put_ per pool for
    the whole batch, no host read."""
    n_anchor = slots[0].shape[1]
    k_pool.index_put_(slots, k[:, :n_anchor])
    v_pool.index_put_(slots, v[:, :n_anchor])


def gather_positions(pool: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Each request's cache positions in order, [B, Hkv, n * page_size, D], from pool [pages, page_size, Hkv, D]."""
    batch, n = table.shape
    return pool[table].reshape(batch, n * pool.shape[1], *pool.shape[2:]).transpose(1, 2)


def pages_seen(layout: Layout, cache_len: torch.Tensor, table: torch.Tensor, page_size: int) -> int:
    """The leading columns of the page table that hold a position some row of the call sees: where reading
    cache_len on the host is free (host.reads_are_free), those up to the furthest visible position, else all."""
    if not host.reads_are_free(cache_len):
        return table.shape[1]
    per_row = cache_len if cache_len.dim() == 2 else cache_len[..., None]
    seen = int((per_row + layout.see + 1).max())
    return min(max(-(-seen // page_size), 1), table.shape[1])


def reference_attention(table, cache_len, layout: Layout, page_size: int):
    """The torch reference for one model call (table [B, n], cache_len [B]), as the function of each layer's
    (q [B, R, H, D], k/v [B, R, Hkv, D], pools [pages, page_size, Hkv, D], scale) -> [B, R, H, D] that writes the
    anchors in place and attends. What every layer of the call shares, where the anchors go and the visibility
    mask, is made once. On the CPU, eagerly, each layer gathers only the pages up to the furthest position a row
    sees (pages_seen), not the whole table: at batch 8 on SmolLM2 that made AR's step about 5% cheaper."""
    n = layout.n_anchor
    slots = anchor_pages(table, cache_len, n, page_size) if n else None
    table = table[:, :pages_seen(layout, cache_len, table, page_size)]
    mask = dense_mask(layout, cache_len, table.shape[1] * page_size)[:, None]

    def attend(q, k, v, k_pool, v_pool, scale: float) -> torch.Tensor:
        if slots is not None:
            write_anchors(k_pool, v_pool, slots, k, v)
        keys = torch.cat([gather_positions(k_pool, table), k[:, n:].transpose(1, 2)], dim=2)
        values = torch.cat([gather_positions(v_pool, table), v[:, n:].transpose(1, 2)], dim=2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=mask, scale=scale,
                                             enable_gqa=True)
        return out.transpose(1, 2)
    return attend


def packed_attention_ref(q, k, v, k_pool, v_pool, table, cache_len, layout: Layout, scale: float):
    """One layer of one call by the torch reference (reference_attention): q [B, R, H, D], k/v [B, R, Hkv, D];
    pools [pages, page_size, Hkv, D] (anchors written in place), table [B, n], cache_len [B]. Returns
    [B, R, H, D]."""
    return reference_attention(table, cache_len, layout, k_pool.shape[1])(q, k, v, k_pool, v_pool, scale)


BACKENDS = ("torch", "triton")


def attention_backend(name: str):
    """The packed attention of a backend name, "torch" (reference_attention) or "triton" (the fused kernel), as
    the function of a model call's (table, cache_len, layout, page_size) that returns its layers' attention."""
    if name == "torch":
        return reference_attention
    if name == "triton":
        from ..kernels.attention import fused_attention
        return fused_attention
    raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
