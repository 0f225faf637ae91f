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


def _mulhilo(a_lo: torch.Tensor, a_hi: torch.Tensor, b: torch.Tensor):
    """(hi, lo) 32-bit halves of a * b for 32-bit values in int64, a = a_hi * 2^16 + a_lo, no overflow."""
    t_lo = b * a_lo              # < 2^48
    t_hi = b * a_hi              # < 2^48
    s = t_lo + ((t_hi & 0xFFFF) << 16)
    return (t_hi >> 16) + (s >> 32), s & _M32


_constants: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


def _philox_constants(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The round multipliers and key bumps as device tensors, made once per device by fill kernels: a decode
    step must not copy Python data to the device (a synchronising transfer, and none can be captured), and
    the first step of a process may be the one that makes them."""
    if device not in _constants:
        def words(values):
            return torch.stack([torch.full((), v, dtype=torch.int64, device=device) for v in values])
        _constants[device] = (words(_PHILOX_M), words(_PHILOX_W))
    return _constants[device]


def philox4x32(c0, c1, c2, c3, k0, k1) -> torch.Tensor:
    """Philox4x32-10 (Salmon et al., 2011) on int64 tensors holding 32-bit words; returns [..., 4].

    The two multiplications of a round run as one op on stacked lanes (words 0 and 2).
    """
    even, odd = torch.stack([c0, c2]), torch.stack([c1, c3])
    mult, bump = (t.view(2, *([1] * c0.dim())) for t in _philox_constants(c0.device))
    a_lo, a_hi = mult & 0xFFFF, mult >> 16
    key = torch.stack([k0.expand_as(c0), k1.expand_as(c0)])
    for _ in range(10):
        hi, lo = _mulhilo(a_lo, a_hi, even)
        # (c0, c1, c2, c3) <- (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0)
        even = hi.flip(0) ^ odd ^ key
        odd = lo.flip(0)
        key = (key + bump) & _M32
    return torch.stack([even[0], odd[0], even[1], odd[1]], dim=-1)


def philox_words(seed: torch.Tensor, offset: torch.Tensor, n: int, stream: int = 0) -> torch.Tensor:
    """n 32-bit words per key from Philox4x32-10: key = seed, counter = (block i, offset lo, offset hi, stream).

    `seed` and `offset` are int64 device tensors of one shape [...] (a request's, or a batch's [B]: the
    CUDA-graph-safe pattern); returns [..., n] int64. The same (seed, offset, stream) always gives the same
    words on any device and in any batch, and distinct offsets or streams never share a counter.
    """
    i = torch.arange((n + 3) // 4, device=offset.device).expand(*offset.shape, -1)
    seed, offset = seed[..., None], offset[..., None]
    bits = philox4x32(i, (offset & _M32).expand_as(i), ((offset >> 32) & _M32).expand_as(i),
                      torch.full_like(i, stream), seed & _M32, (seed >> 32) & _M32)
    return bits.flatten(-2)[..., :n]


def philox_uniform(seed: torch.Tensor, offset: torch.Tensor, n: int, dtype=torch.float64) -> torch.Tensor:
    """n uniforms in [0, 1) per key (24 bits each): the rejection rule's, counter stream 0 (philox_words)."""
    return (philox_words(seed, offset, n) >> 8).to(dtype) * (1.0 / (1 << 24))


NOISE_STREAM = 1


def exponential_noise(seed: torch.Tensor, position: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Standard exponential noise E(seed, position, x) = -log(u) of the tokens x in `tokens` [..., K] for `seed`
    and `position` [...] (a request's seed, an output position): [..., K] float64. Token x's uniform u in (0, 1)
    has 53 bits from words 2 (x % 2) and 2 (x % 2) + 1 of the Philox block at counter (x / 2, position lo,
    position hi, NOISE_STREAM), key (seed lo, seed hi): keyed by (seed, position, x) alone. Gumbel-max as an
    exponential race: argmax_x p(x) / E(x) = argmax_x (log p(x) + g(x)), g = -log E standard Gumbel noise."""
    seed, position = seed[..., None].expand_as(tokens), position[..., None].expand_as(tokens)
    bits = philox4x32(tokens >> 1, position & _M32, (position >> 32) & _M32, torch.full_like(tokens, NOISE_STREAM),
                      seed & _M32, (seed >> 32) & _M32)                                     # [..., K, 4]
    word = ((tokens & 1) * 2)[..., None]
    hi, lo = bits.gather(-1, word)[..., 0], bits.gather(-1, word + 1)[..., 0]
    u = ((hi >> 5) * (1 << 26) + (lo >> 6)).to(torch.float64).add_(0.5).mul_(2.0 ** -53)
    return -torch.log(u)


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
    """Temperature, then top-k, then top-p, as a sparse distribution (idx [..., K], prob [..., K]).

    K = params.support(vocab). With top-k or top-p the entries are sorted by decreasing probability
    and those cut by top-p get probability 0; without truncation the distribution is dense
    (idx = token id) and no sort is paid. The same function defines the target p and the drafter's Q.
    """
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if params.top_k is None and params.top_p is None:
        idx = torch.arange(logits.shape[-1], device=logits.device).expand(logits.shape)
        return idx, torch.softmax(logits / params.temperature, dim=-1)
    vals, idx = logits.topk(params.support(logits.shape[-1]), dim=-1)
    prob = torch.softmax(vals / params.temperature, dim=-1)
    if params.top_p is not None and params.top_p < 1.0:
        mass_before = prob.cumsum(-1) - prob
        prob = torch.where(mass_before < params.top_p, prob, torch.zeros_like(prob))
        prob = prob / prob.sum(-1, keepdim=True)
    return idx, prob


PARTIAL = 64    # top_p_kept: the most probable tokens a partial sort ranks first


def top_p_kept(prob: torch.Tensor, top_p: float) -> torch.Tensor:
    """Which tokens top-p keeps of dense distributions prob [..., V]: those whose mass ranked before them is below
    top_p, the rule `truncated_probs` applies to the sorted distribution (the same set, but that tokens tied at
    the threshold are all kept here), as a bool mask [..., V] without a full sort. A partial sort of the PARTIAL
    most probable tokens finds the threshold wherever they hold top_p of the mass; the rows where they do not
    are ranked whole (on the CPU, eagerly: those rows alone, found by a host read that costs nothing there;
    compiled or on another device, every row, so that nothing reads the device)."""
    def threshold(values: torch.Tensor) -> torch.Tensor:      # values sorted decreasing: the smallest kept one
        before = values.cumsum(-1) - values
        return values.masked_fill(before >= top_p, torch.inf).amin(-1)
    vocab = prob.shape[-1]
    if prob.device.type != "cpu" or torch.compiler.is_compiling() or vocab <= PARTIAL:
        return prob >= threshold(prob.sort(-1, descending=True).values)[..., None]
    head = prob.topk(PARTIAL, -1).values
    cut = threshold(head)
    short = head.sum(-1) < top_p
    if short.any():
        cut[short] = threshold(prob[short].sort(-1, descending=True).values)
    return prob >= cut[..., None]


def take_rows(t: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    """t[b, i[b]] for every request b of t [B, R, K] and i [B], without a host read (compile-safe)."""
    return t.gather(1, i[:, None, None].expand(-1, 1, t.shape[2]))[:, 0]


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
