"""Sampling primitives in plain tensor ops: logits processing, counter-based uniforms, inverse-CDF draws.

Everything here is shape-static and free of host synchronisation, so a decode step built from it
compiles with `torch.compile(fullgraph=True)` and can be captured in a CUDA graph.
"""
from __future__ import annotations

import torch

from .. import host
from ..runtime.request import Sampling, SamplingParams

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


PARTIAL = 64    # kept: the most probable tokens a partial sort ranks first
WIDE = 4096     # ... and a wider partial sort ranks, for the rows whose PARTIAL hold too little of the mass


def _per_row(setting: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A per-request setting [B] shaped to broadcast over rows like [B, ..., V]."""
    return setting.view(setting.shape + (1,) * (like.dim() - setting.dim()))


def _each_row(setting: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A per-request setting [B] repeated for each row of like [B, ..., V], flat: [B * ...]."""
    return _per_row(setting, like)[..., 0].expand(like.shape[:-1]).reshape(-1)


def kept(prob: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Which tokens top-k, then top-p, keep of dense distributions prob [B, ..., V] (top_k [B], 0: all; top_p [B],
    1: all), as a bool mask [B, ..., V]: top-k keeps the k most probable tokens, top-p of those the ones whose mass
    ranked before them is below top_p of the top-k mass (the rule of a sorted, truncated, renormalised
    distribution; tokens tied at a threshold are all kept). Where `host.reads_are_free`, no row is sorted whole
    that need not be: rows without top-k take the native module's cut (`nucleus_cut`, which sorts only the
    histogram bin where the cut falls: the 8 rows of a `packed` W = 3 call at T = 0.7 / top-p 0.95 take ~40 us,
    AMD EPYC, 2 threads), the other rows partial sorts: the PARTIAL most probable tokens find the threshold wherever
    k <= PARTIAL or they hold top_p of the mass, the WIDE most probable ones where they do, and the rows where
    neither does are ranked whole. On a device, or in a step being compiled, every row is sorted at once."""
    vocab = prob.shape[-1]
    flat = prob.reshape(-1, vocab)
    limited = (top_k > 0) & (top_k < vocab)             # the requests [B] whose top-k truncates
    eager = _eager(prob)
    k = _each_row(torch.where(limited, top_k, vocab), prob)
    p = _each_row(top_p, prob).to(prob.dtype)

    def threshold(values: torch.Tensor, k: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        """The smallest kept probability of rows whose `values` [N, n] are their n largest, sorted."""
        top = torch.arange(values.shape[-1], device=values.device) < k[:, None]
        mass = torch.where(k < vocab, (values * top).sum(-1), 1.0)
        before = values.cumsum(-1) - values
        keep = top & ((before < (p * mass)[:, None]) | (p >= 1)[:, None])
        return values.masked_fill(~keep, torch.inf).amin(-1)
    if not eager:
        cut = threshold(flat.sort(-1, descending=True).values, k, p)
    else:
        cut = nucleus_cut(flat, torch.where(k == vocab, p, 1.0))
        rows = torch.arange(flat.shape[0], device=flat.device)       # the rows whose threshold is still unknown
        rows = rows if cut is None else rows[k < vocab]
        cut = torch.empty_like(flat[:, 0]) if cut is None else cut
        for ranked in [n for n in (PARTIAL, WIDE) if n < vocab] + [vocab]:
            if not len(rows):
                break
            some = flat if len(rows) == len(flat) else flat[rows]
            head = some.topk(ranked, -1).values if ranked < vocab else some.sort(-1, descending=True).values
            cut[rows] = threshold(head, k[rows], p[rows])
            short = ((k[rows] > ranked) & (k[rows] < vocab)) | \
                ((k[rows] == vocab) & (p[rows] < 1) & (head.sum(-1) < p[rows]))
            rows = rows[short]
    cut = torch.where((k == vocab) & (p >= 1), 0.0, cut)          # nothing truncated: every token
    return (flat >= cut[:, None]).view(prob.shape)


def _eager(prob: torch.Tensor) -> bool:
    """Whether `kept` cuts rows of prob [..., V] one by one (eagerly on the CPU, a vocabulary wider than PARTIAL)."""
    return host.reads_are_free(prob) and prob.shape[-1] > PARTIAL


def _nucleus_module(prob: torch.Tensor):
    """The native module where it is built and cuts rows of prob's type (float32, float64), else None."""
    from .epilogue.extension import native_module     # here: the epilogue package imports this module
    mod = native_module()
    return mod if mod is not None and prob.dtype in (torch.float32, torch.float64) else None


def nucleus_cut(prob: torch.Tensor, top_p: torch.Tensor, truncated: torch.Tensor | None = None) -> torch.Tensor | None:
    """The smallest probability top-p keeps of each row of prob [N, V] on the CPU (0 where top-p is 1: every token),
    top_p [n] one setting for each N / n consecutive rows (a request's), by the native module (csrc/nucleus.h: the
    sorted rule's threshold bit for bit, without sorting the row); None where that module is not built or the rows
    are not float32 / float64. Given `truncated` (contiguous, like prob), the same pass writes prob zeroed below each
    row's cut into it."""
    mod = _nucleus_module(prob)
    if mod is None:
        return None
    prob, top_p = prob.contiguous(), top_p.to(torch.float64).contiguous()     # rounded to prob's type there
    cut = prob.new_empty(prob.shape[0])
    mod.nucleus_cpu(prob.data_ptr(), top_p.data_ptr(), top_p.shape[0], prob.shape[0], prob.shape[1],
                    32 if prob.dtype == torch.float32 else 64, cut.data_ptr(),
                    0 if truncated is None else truncated.data_ptr(), torch.get_num_threads())
    return cut


def truncate(prob: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, top_k_truncates=True) -> torch.Tensor:
    """prob [B, ..., V] zeroed outside the tokens `kept` keeps: the bits of prob * kept(prob, top_k, top_p). Where
    the caller knows that no request's top-k truncates (`top_k_truncates` False) and every row's cut is the native
    module's, the pass that finds a row's cut writes it, and no mask is made."""
    if not top_k_truncates and _eager(prob) and _nucleus_module(prob) is not None:
        truncated = torch.empty_like(prob, memory_format=torch.contiguous_format)
        nucleus_cut(prob.reshape(-1, prob.shape[-1]), top_p.reshape(-1), truncated)
        return truncated
    return prob * kept(prob, top_k, top_p)


def _top_k_head(logits: torch.Tensor, temperature: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """Dense distributions of requests whose top-k keeps at most PARTIAL tokens: the softmax of their k largest
    logits (of the PARTIAL a partial sort ranks, the rest masked), top-p applied to it in that order, scattered
    over the vocabulary. No pass over the vocabulary but the partial sort and the scatter."""
    vals, idx = logits.topk(min(PARTIAL, logits.shape[-1]), dim=-1)
    k = _per_row(torch.where(sampling.top_k > 0, sampling.top_k, PARTIAL), vals)
    vals = vals.masked_fill(torch.arange(vals.shape[-1], device=vals.device) >= k, -torch.inf)
    head = torch.softmax(vals / temperature, dim=-1)
    p = _per_row(sampling.top_p, head).to(head.dtype)
    cut = torch.where(head.cumsum(-1) - head < p, head, 0.0)
    head = torch.where(p < 1, cut / cut.sum(-1, keepdim=True), head)
    return torch.zeros_like(logits).scatter_(-1, idx, head)


def truncated_probs(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """Temperature, then top-k, then top-p, per request: dense distributions [B, ..., V] from logits [B, ..., V]
    and the requests' `sampling` [B], zero outside the kept tokens. The same function defines the target p and the
    drafter's Q. Each request's rows take one path, chosen by its own settings (`_paths`), so that what it gets
    never depends on its batch: top-k of at most PARTIAL tokens the sorted head (`_top_k_head`); else the softmax
    over the vocabulary, masked by `kept` and renormalised where top-k or top-p truncate (not where nothing does,
    so that untruncated sampling pays no mask); temperature 0 the point mass on the argmax (greedy, the limit,
    which every rule of the rejection sampler turns into greedy decoding). Where `host.reads_are_free`, the paths
    are told on the host (`_taken`): the paths no request takes are skipped and a path every request takes needs
    no merge."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    whole, truncates, head, cold, ranked = _taken(sampling, host.reads_are_free(logits))
    temperature = sampling.temperature
    if isinstance(cold, torch.Tensor):          # a cold request's rows divide by 1 (and are then replaced)
        temperature = torch.where(cold, 1.0, temperature)
    temperature = _per_row(temperature, logits).to(logits.dtype)
    paths = []          # (rows, their distributions), the rows of each path by its own settings
    if whole is not None:
        prob = torch.softmax(logits / temperature, dim=-1)
        if truncates is not None:
            cut = truncate(prob, sampling.top_k, sampling.top_p, top_k_truncates=ranked is not None)
            cut = cut / cut.sum(-1, keepdim=True)
            prob = cut if truncates is True else torch.where(_per_row(truncates, prob), cut, prob)
        paths.append((whole, prob))
    if head is not None:
        paths.append((head, _top_k_head(logits, temperature, sampling)))
    if cold is not None:
        paths.append((cold, torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)))
    prob = paths[0][1]
    for rows, other in paths[1:]:
        prob = torch.where(_per_row(rows, prob), other, prob)
    return prob


def _paths(temperature, top_k, top_p) -> tuple:
    """Which path of truncated_probs requests take by their settings (tensors [B], or one request's numbers):
    (whole, truncates, head, cold, ranked): the softmax over the vocabulary, and of those the ones top-k or top-p
    truncate; the sorted head; the argmax; and the whole rows a top-k ranks (it truncates them where k < V)."""
    warm = temperature != 0
    whole = warm & ((top_k <= 0) | (top_k > PARTIAL))
    head = warm & (top_k > 0) & (top_k <= PARTIAL)
    return whole, whole & ((top_k > 0) | (top_p < 1)), head, temperature == 0, whole & (top_k > 0)


def _taken(sampling: Sampling, eager: bool) -> tuple:
    """Each path's requests (`_paths`): [B] bool tensors, or, where reads are free (`eager`), told on the host from
    the settings: None for a path no request takes, True for one every request takes (no mask: the paths part the
    requests, so it is the only one taken). Not eager, every path is taken by its mask."""
    if not eager:
        return _paths(*sampling)
    settings = [s.reshape(-1).tolist() for s in sampling]       # [B], or [1] / 0-d for every request
    size = max(len(s) for s in settings)
    requests = [_paths(*(s[b % len(s)] for s in settings)) for b in range(size)]
    return tuple(None if not any(flags) else True if all(flags) else torch.tensor(flags, device=sampling.top_k.device)
                 for flags in zip(*requests))


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
