"""Sampling primitives in plain tensor ops: logits processing, counter-based uniforms, inverse-CDF draws.

Everything here is shape-static and free of host synchronisation, so a decode step built from it
compiles with `torch.compile(fullgraph=True)` and can be captured in a CUDA graph.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

_M32 = 0xFFFFFFFF
_PHILOX_M = (0xD2511F53, 0xCD9E8D57)
_PHILOX_W = (0x9E3779B9, 0xBB67AE85)


def _mulhilo(a: int, b: torch.Tensor):
    """(hi, lo) 32-bit halves of a * b for 32-bit values held in int64, without int64 overflow."""
    t_lo = b * (a & 0xFFFF)      # < 2^48
    t_hi = b * (a >> 16)         # < 2^48
    s = t_lo + ((t_hi & 0xFFFF) << 16)
    return (t_hi >> 16) + (s >> 32), s & _M32


def philox_uniform(seed: torch.Tensor, offset: torch.Tensor, n: int, dtype=torch.float64) -> torch.Tensor:
    """n uniforms in [0, 1) from Philox4x32-10: key = seed, counter = (block i, offset lo, offset hi, 0).

    `seed` and `offset` are int64 device tensors (the CUDA-graph-safe pattern); the same (seed, offset)
    always gives the same numbers on any device, and distinct offsets never share a counter.
    """
    i = torch.arange((n + 3) // 4, device=offset.device)
    c = [i, (offset & _M32).expand_as(i), ((offset >> 32) & _M32).expand_as(i), torch.zeros_like(i)]
    k0, k1 = seed & _M32, (seed >> 32) & _M32
    for _ in range(10):
        hi0, lo0 = _mulhilo(_PHILOX_M[0], c[0])
        hi1, lo1 = _mulhilo(_PHILOX_M[1], c[2])
        c = [hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0]
        k0, k1 = (k0 + _PHILOX_W[0]) & _M32, (k1 + _PHILOX_W[1]) & _M32
    bits = torch.stack(c, dim=1).reshape(-1)[:n]
    return (bits >> 8).to(dtype) * (1.0 / (1 << 24))


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy; top_k / top_p None means no truncation."""
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def support(self, vocab_size: int) -> int:
        """Entries stored per truncated distribution (sparse when top-k truncates)."""
        return min(self.top_k, vocab_size) if self.top_k else vocab_size


def truncated_probs(logits: torch.Tensor, params: SamplingParams):
    """Temperature, then top-k, then top-p, as a sparse distribution sorted by decreasing probability.

    Returns (idx [..., K], prob [..., K]) with K = params.support(vocab); entries cut by top-p get
    probability 0. The same function defines the target p and the drafter's Q.
    """
    k = params.support(logits.shape[-1])
    vals, idx = logits.to(torch.promote_types(logits.dtype, torch.float32)).topk(k, dim=-1)
    prob = torch.softmax(vals / params.temperature, dim=-1)
    if params.top_p is not None and params.top_p < 1.0:
        mass_before = prob.cumsum(-1) - prob
        prob = torch.where(mass_before < params.top_p, prob, torch.zeros_like(prob))
        prob = prob / prob.sum(-1, keepdim=True)
    return idx, prob


def densify(idx: torch.Tensor, prob: torch.Tensor, vocab_size: int) -> torch.Tensor:
    return torch.zeros(*idx.shape[:-1], vocab_size, dtype=prob.dtype, device=prob.device).scatter(-1, idx, prob)


def inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Index drawn with probability proportional to non-negative `weights` [..., K] using uniforms u [...].

    Never returns an index of zero weight: the draw is clamped to the last positive entry, which
    guards against u * total rounding up to the full mass.
    """
    cum = weights.cumsum(-1)
    target = (u.to(cum.dtype) * cum[..., -1])[..., None]
    j = (cum <= target).sum(-1)
    positions = torch.arange(weights.shape[-1], device=weights.device)
    last_positive = torch.where(weights > 0, positions, torch.zeros_like(positions)).amax(-1)
    return torch.minimum(j, last_positive)


def sample_sparse(idx: torch.Tensor, prob: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Token ids drawn from sparse distributions (idx, prob) [..., K] with uniforms u [...]."""
    return idx.gather(-1, inverse_cdf(prob, u)[..., None])[..., 0]
