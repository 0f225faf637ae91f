"""What the sampling-exactness tests share: exact sequence laws, seeded draws, the G-test, broken rules.

A test draws N whole sequences of `length` tokens at width W, with `length` = W + 2 (W = 1: 3 tokens,
W = 2: 4), so that one full acceptance after the prefill's token puts the bonus token inside the output;
`Draws.bonus` is the share of samples in which that happened (GenerateResult.n_bonus), and the tests
require it to be at least BONUS_SEEN so that they observe every kind of emitted token: the prefill's
draw, accepted drafts, corrections (residual draws) and bonus tokens. On a VOCAB-token vocabulary the
exact probability of every sequence comes from transformers' float64 logits (the chain rule over the
prefix tree: 1 + 5 + 25 + 125 forward passes for 4 tokens), and the samples are compared with it by a
G-test; outcomes expected fewer than 5 times are pooled into one bin, and an outcome of probability 0
that is observed fails at once.

Thresholds: a correct sampler gives a p-value uniform on [0, 1]; a test fails below ALPHA = 1e-4 (about
30 G-tests in the suite: a family-wise false alarm rate near 3e-3, and the seeds are fixed, so an alarm
is reproducible, never flaky). The broken rules below must give p < POWER = 1e-6; each test that patches
one states the p-values measured, which are far below it.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
from scipy.stats import chi2
from tiny_models import checkpoint, hf_model

import packed_ss
from packed_ss.decode.acceptance import verify_sampled
from packed_ss.decode.sampling import SamplingParams, densify, inverse_cdf, take_rows, truncated_probs

VOCAB, N = 5, 1500
PROMPT = [1, 0, 2]
ALPHA, POWER = 1e-4, 1e-6
BONUS_SEEN = 0.3
T1, TOP_K, TOP_P = SamplingParams(1.0), SamplingParams(0.7, top_k=3), SamplingParams(1.3, top_p=0.8)


def ar_checkpoint():
    """The causal test model: std 0.35, seed 3 puts no 4-token outcome above 0.1 probability, gets drafts
    accepted often enough that the bonus lands in 41-76% of the outputs at every schedule and setting, and
    keeps drafter and target far enough apart that the broken rules are flagged."""
    return checkpoint("llama-gqa", vocab_size=VOCAB, std=0.35, seed=3)


def length_for(width: int) -> int:
    """Output length at which one full acceptance after the prefill's token emits its bonus in the output."""
    return width + 2


def case_id(schedule: str, width: int, params: SamplingParams) -> str:
    return f"{schedule}-W{width}-T{params.temperature}-k{params.top_k}-p{params.top_p}"


# -- exact laws ------------------------------------------------------------------------------------------------
def sequence_law(next_probs, length: int) -> dict[tuple, float]:
    """P(sequence) for every sequence of `length` tokens; next_probs(prefix) -> [VOCAB] float64 probabilities."""
    law, probs = {}, {}
    for seq in itertools.product(range(VOCAB), repeat=length):
        p = 1.0
        for i, t in enumerate(seq):
            if seq[:i] not in probs:
                probs[seq[:i]] = next_probs(list(seq[:i]))
            p *= float(probs[seq[:i]][t])
        law[seq] = p
    return law


def ar_law(path, params: SamplingParams, length: int, prompt=PROMPT) -> dict[tuple, float]:
    """The AR law of a causal checkpoint: transformers' logits at the last row, truncated as the engine does."""
    model = hf_model(path)

    def next_probs(prefix):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + prefix])).logits[0, -1]
        return truncated_probs(logits[None], params.rows(1))[0]
    return sequence_law(next_probs, length)


def ltr_law(path, params: SamplingParams, length: int) -> dict[tuple, float]:
    """The LTR law of an any-order checkpoint: transformers' logits at a mask appended after the text."""
    model, mask = hf_model(path), VOCAB - 1

    def next_probs(prefix):
        with torch.no_grad():
            logits = model(torch.tensor([PROMPT + prefix + [mask]])).logits[0, -1]
        return truncated_probs(logits[None], params.rows(1))[0]
    return sequence_law(next_probs, length)


# -- draws -------------------------------------------------------------------------------------------------------
@dataclass
class Draws:
    samples: list[tuple]
    bonus: float          # share of samples whose output holds a bonus token (a whole draft accepted)


def diffusion_drafts(schedule: str) -> str | None:
    """The `drafts` that make a schedule verify its own diffusion proposals (None for AR, which drafts nothing):
    under the default "both", lookup drafts (which the 1-gram fallback finds at nearly every step of a 5-token
    vocabulary) take their place. Lookup drafts have their own G-tests (tests/test_lookup_sampling.py)."""
    return None if schedule == "ar" else "diffusion"


def draw(path, schedule: str, width: int, params: SamplingParams, epilogue=None, order=None, seeds=range(N),
         prompt=PROMPT, drafts=None) -> Draws:
    """One seeded generate() per seed, each request alone."""
    engine = packed_ss.Engine(packed_ss.load_model(path, dtype=torch.float64), schedule=schedule, width=width,
                              epilogue=epilogue, order=order, drafts=drafts)
    results = [engine.generate(prompt, max_new_tokens=length_for(width), temperature=params.temperature,
                               top_k=params.top_k, top_p=params.top_p, seed=seed, eos_token_id=[]) for seed in seeds]
    return Draws([tuple(r.tokens) for r in results], sum(r.n_bonus > 0 for r in results) / len(results))


def draw_batched(path, schedule: str, width: int, params: SamplingParams, seeds=range(N), epilogue=None,
                 prompt=PROMPT, drafts=None) -> Draws:
    """Requests through generate_batch, 16 at a time (continuous batching), request i with seed seeds[i]: every
    token after the first comes from a batched step (the prefill, which draws the first, runs alone)."""
    engine = packed_ss.Engine(packed_ss.load_model(path, dtype=torch.float64), schedule=schedule, width=width,
                              epilogue=epilogue, drafts=drafts)
    seeds = list(seeds)
    results = engine.generate_batch([prompt] * len(seeds), max_new_tokens=length_for(width),
                                    temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
                                    seed=seeds, eos_token_id=[], batch_size=16)
    return Draws([tuple(r.tokens) for r in results], sum(r.n_bonus > 0 for r in results) / len(results))


def g_test_pvalue(samples: list[tuple], law: dict[tuple, float]) -> float:
    if any(s not in law for s in samples):
        return 0.0                                    # an outcome outside the law's support was observed
    counts = dict.fromkeys(law, 0)
    for s in samples:
        counts[s] += 1
    if any(counts[k] for k, p in law.items() if p == 0):
        return 0.0                                    # an impossible outcome was observed
    n = len(samples)
    bins, pooled_obs, pooled_exp = [], 0, 0.0
    for k, p in law.items():
        if p * n >= 5:
            bins.append((counts[k], p * n))
        else:
            pooled_obs, pooled_exp = pooled_obs + counts[k], pooled_exp + p * n
    if pooled_exp > 0:
        bins.append((pooled_obs, pooled_exp))
    g = 2 * sum(o * math.log(o / e) for o, e in bins if o > 0)
    return float(chi2.sf(g, len(bins) - 1))


def follows(draws: Draws, law: dict[tuple, float], bonus: bool = True, seen: float = BONUS_SEEN) -> float:
    """The G-test's p-value, after checking (and printing) that the bonus was observed often enough (`bonus`:
    the schedule emits one; AR and any-order Linear-SS, which drafts every rank, never do; `seen`: the share
    required)."""
    print(f"bonus observed in {draws.bonus:.0%} of {len(draws.samples)} samples")
    if bonus:
        assert draws.bonus >= seen, f"the bonus was observed in only {draws.bonus:.0%} of the samples"
    else:
        assert draws.bonus == 0, "a bonus where the schedule has none"
    return g_test_pvalue(draws.samples, law)


# -- broken rules: patched over packed_ss.decode.epilogue.reference.verify_sampled --------------------------------
def residual_from_p(draft, draft_len, q_idx, q_prob, p, u):
    """Broken: after a rejection, draw the correction from p instead of max(p - Q, 0)."""
    emitted, n_accept = verify_sampled(draft, draft_len, q_idx, q_prob, p, u)
    h = n_accept - 1
    c = inverse_cdf(take_rows(p, h), u[:, draft.shape[1]])
    at_h = (torch.arange(emitted.shape[1]) == h[:, None]) & (h < draft_len)[:, None]
    return torch.where(at_h, c[:, None], emitted), n_accept


def ignore_stored_q(draft, draft_len, q_idx, q_prob, p, u):
    """Broken: accept d with probability p(d), as if Q were a point mass."""
    return verify_sampled(draft, draft_len, q_idx, torch.ones_like(q_prob), p, u)


def _bonus_from(weights):
    def broken(draft, draft_len, q_idx, q_prob, p, u):
        emitted, n_accept = verify_sampled(draft, draft_len, q_idx, q_prob, p, u)
        h, w = n_accept - 1, draft.shape[1]
        last = (draft_len - 1).clamp(0, w - 1)                   # the last draft's stored Q
        q_last = densify(take_rows(q_idx, last), take_rows(q_prob, last).to(p.dtype), p.shape[-1])
        c = inverse_cdf(weights(take_rows(p, h.clamp(max=w)), q_last), u[:, w])
        bonus = (torch.arange(emitted.shape[1]) == h[:, None]) & ((h == draft_len) & (draft_len > 0))[:, None]
        return torch.where(bonus, c[:, None], emitted), n_accept
    return broken


bonus_from_residual = _bonus_from(lambda p, q: (p - q).clamp(min=0) + 1e-12 * p)
bonus_from_residual.__name__, bonus_from_residual.__doc__ = (
    "bonus_from_residual", "Broken: after full acceptance, draw the bonus from max(p - Q, 0) instead of p.")
bonus_from_q = _bonus_from(lambda p, q: q)
bonus_from_q.__name__, bonus_from_q.__doc__ = (
    "bonus_from_q", "Broken: after full acceptance, draw the bonus from the last draft's Q instead of p.")

VERIFY_RULES = [residual_from_p, ignore_stored_q, bonus_from_residual, bonus_from_q]

