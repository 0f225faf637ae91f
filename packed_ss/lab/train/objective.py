"""The training objectives: which rows one forward pass evaluates, what each row may attend to, what it
predicts, and the cross-entropy losses. Every row is laid out exactly as the decoding engine queries it.

Dual-mode (the default model): one Llama network, two modes that differ only in the attention mask, over
``2T`` rows: the clean sequence x (T rows, positions 0..T-1) and a noisy copy (the noisy row j has
position id j).

* AR mode: clean row i predicts the token at i+1 (shifted next-token loss), plain causal.
* Diffusion (drafting) mode, Nemotron style: positions are split into consecutive blocks of size B (B = W+1,
  drawn per batch, with a random offset). The noisy rows of the block starting at s are either
  (a) ``[x_s, MASK, ..., MASK]`` ("last verified token followed by W masks") or
  (b) ``[MASK, ..., MASK]`` ("B masks right after the cached prefix"); they see the clean rows at positions
  < s plus every row of their own block (bidirectional), and a MASK row at j predicts the token at j.

Any-order (the SetDLM-style model, paper appendix D.2): a sequence of T tokens is cut into windows of W
positions (W and the offset drawn per batch) that follow each other left to right; inside each window the
order is left-to-right with probability p_ltr, else a random permutation. One pass evaluates 3T rows at the
position ids of their targets, as the decoder's ``[N | O | M | R]`` call queries them:

* token rows x_j see the token rows earlier in the order and themselves (the cache / O rows);
* verifier mask rows M_j see the token rows earlier in the order and themselves (predict x_j);
* drafting mask rows R_j see the token rows earlier in the order than a random cut inside the window (the
  window start with probability 1/2: the pure prefix) and themselves (predict x_j; rows before the cut in
  the order have no target).

With the left-to-right order the M rows are exactly the AR mode the engine verifies with.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .data import MASK_ID

IGNORE = -100   # label of a row without a target


# -- dual-mode ------------------------------------------------------------------------------------------
def dual_stream_mask(T: int, ctx_len: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """Boolean attention mask ``[b, 1, T+N, T+N]`` (True = may attend) for a clean stream of T rows followed
    by N noisy (query) rows.

    * clean row i sees clean rows <= i (causal), never a noisy row;
    * noisy row r sees the clean rows at positions < ``ctx_len[:, r]`` and every noisy row with the same
      ``group`` id (its own block, bidirectional), nothing else.

    ``ctx_len`` / ``group``: integer tensors ``[b, N]``. For a block starting at position s, ``ctx_len`` is
    s for all of its rows.
    """
    b, N = ctx_len.shape
    L = T + N
    m = torch.zeros(b, L, L, dtype=torch.bool)
    m[:, :T, :T] = torch.ones(T, T, dtype=torch.bool).tril()
    cols = torch.arange(T)
    m[:, T:, :T] = cols.view(1, 1, T) < ctx_len.view(b, N, 1)
    m[:, T:, T:] = group.view(b, N, 1) == group.view(b, 1, N)
    return m.unsqueeze(1)


def block_layout(T: int, B: int, offset: int):
    """Split positions 0..T-1 into consecutive blocks of B starting at ``offset`` (the positions before
    ``offset`` form a shorter first block; the last block may be cut short).
    Returns (block id [T], block start [T])."""
    assert B >= 1 and 0 <= offset < B
    j = torch.arange(T)
    bid = torch.div(j - offset + B, B, rounding_mode="floor")
    start = (offset + (bid - 1) * B).clamp(min=0)
    return bid, start


@dataclass
class Batch:
    input_ids: torch.Tensor  # [b, 2T]
    position_ids: torch.Tensor  # [b, 2T]
    attention_mask: torch.Tensor  # [b, 1, 2T, 2T] bool
    ar_labels: torch.Tensor  # [b, T]  label for clean row i = x[i+1] (IGNORE at T-1)
    diff_labels: torch.Tensor  # [b, T] label for noisy row j = x[j] if MASK else IGNORE


def make_batch(x: torch.Tensor, B: int, offset: int, pattern_a: torch.Tensor, mask_id: int = MASK_ID) -> Batch:
    """Build the joint AR + block-diffusion input for clean sequences x ``[b, T]``.

    ``pattern_a``: bool ``[b, n_blocks]`` (indexed by block id): True -> the block's noisy rows are
    ``[x_s, MASK...]`` (pattern a), False -> ``[MASK...]`` (pattern b)."""
    b, T = x.shape
    bid, start = block_layout(T, B, offset)
    is_first = torch.arange(T) == start
    keep = pattern_a[:, bid] & is_first.view(1, T)  # [b, T] rows that keep the clean token
    noisy = torch.where(keep, x, torch.full_like(x, mask_id))
    input_ids = torch.cat([x, noisy], dim=1)
    pos = torch.arange(T).view(1, T).expand(b, T)
    position_ids = torch.cat([pos, pos], dim=1)
    mask = dual_stream_mask(T, start.view(1, T).expand(b, T), bid.view(1, T).expand(b, T))
    ar_labels = torch.cat([x[:, 1:], torch.full_like(x[:, :1], IGNORE)], dim=1)
    diff_labels = torch.where(keep, torch.full_like(x, IGNORE), x)
    return Batch(input_ids, position_ids, mask, ar_labels, diff_labels)


def sample_batch_layout(b: int, T: int, gen: torch.Generator, min_b: int, max_b: int, p_a: float):
    """(B, offset, pattern_a) for one batch: B uniform in min_b..max_b, offset in 0..B-1, pattern (a) per
    block with probability p_a."""
    B = int(torch.randint(min_b, max_b + 1, (1,), generator=gen))
    offset = int(torch.randint(0, B, (1,), generator=gen))
    n_blocks = T // B + 2
    pattern_a = torch.rand(b, n_blocks, generator=gen) < p_a
    return B, offset, pattern_a


def dual_mode_losses(model, batch: Batch):
    """(AR loss, diffusion loss, logits [b, 2T, V]); both losses are mean token CE in nats."""
    x = batch.input_ids.long()
    out = model(input_ids=x, attention_mask=batch.attention_mask, position_ids=batch.position_ids, use_cache=False)
    logits = out.logits
    T = batch.ar_labels.shape[1]
    V = logits.shape[-1]
    ar = F.cross_entropy(logits[:, :T].reshape(-1, V).float(), batch.ar_labels.reshape(-1).long(), ignore_index=IGNORE)
    df = F.cross_entropy(logits[:, T:].reshape(-1, V).float(), batch.diff_labels.reshape(-1).long(), ignore_index=IGNORE)
    return ar, df, logits


# -- any-order ------------------------------------------------------------------------------------------
def window_orders(T: int, W: int, offset: int, p_ltr: float, gen: torch.Generator):
    """(rank [T], window id [T], cut [T]): global order rank of each position, its window, and the rank
    before which its drafting row's context ends."""
    win = torch.div(torch.arange(T) - offset + W, W, rounding_mode="floor")
    rank = torch.empty(T, dtype=torch.int64)
    cut = torch.empty(T, dtype=torch.int64)
    for w in win.unique().tolist():
        pos = (win == w).nonzero().squeeze(1)
        n, start = pos.numel(), int(pos[0])
        order = torch.arange(n) if torch.rand((), generator=gen) < p_ltr else torch.randperm(n, generator=gen)
        rank[pos[order]] = start + torch.arange(n)
        pure = torch.rand((), generator=gen) < 0.5
        cut[pos] = start + (0 if pure else int(torch.randint(0, n, (), generator=gen)))
    return rank, win, cut


def any_order_batch(x: torch.Tensor, W: int, offset: int, p_ltr: float, gen: torch.Generator,
                    mask_id: int = MASK_ID):
    """Input ids, position ids, bool mask [b, 1, 3T, 3T] and labels [b, 2T] for clean x [b, T]."""
    b, T = x.shape
    ids, masks, labels = [], [], []
    eye = torch.eye(T, dtype=torch.bool)
    for i in range(b):
        rank, _, cut = window_orders(T, W, offset, p_ltr, gen)
        before = rank[None, :] < rank[:, None]                    # [query j, key k]: k earlier than j
        m = torch.zeros(3 * T, 3 * T, dtype=torch.bool)
        m[:T, :T] = before | eye
        m[T:2 * T, :T] = before
        m[T:2 * T, T:2 * T] = eye
        m[2 * T:, :T] = rank[None, :] < cut[:, None]
        m[2 * T:, 2 * T:] = eye
        masks.append(m)
        ids.append(torch.cat([x[i], torch.full((2 * T,), mask_id, dtype=x.dtype)]))
        labels.append(torch.cat([x[i], torch.where(rank >= cut, x[i], IGNORE)]))
    pos = torch.arange(T).repeat(3)
    return torch.stack(ids), pos.expand(b, 3 * T), torch.stack(masks)[:, None], torch.stack(labels)


def any_order_losses(model, x, W, offset, p_ltr, gen):
    """(verifier loss over M rows, drafting loss over R rows), mean CE in nats."""
    ids, pos, mask, labels = any_order_batch(x, W, offset, p_ltr, gen)
    T = x.shape[1]
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits[:, T:]
    V = logits.shape[-1]
    ce = [F.cross_entropy(logits[:, k * T:(k + 1) * T].reshape(-1, V).float(),
                          labels[:, k * T:(k + 1) * T].reshape(-1).long(), ignore_index=IGNORE) for k in (0, 1)]
    return ce[0], ce[1]
