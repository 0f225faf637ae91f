"""Sampled output of every schedule follows the AR distribution exactly (paper Theorem 3.3).

On a 4-token vocabulary the exact probability of every 3-token continuation is enumerated from
transformers' AR logits (64 outcomes), then compared with the empirical distribution of N seeded
generations by a G-test. Outcomes expected fewer than 5 times are pooled into one bin.

Threshold: a correct sampler gives a p-value uniform on [0, 1]; we fail below 1e-4 (8 cases: a
family-wise false alarm rate near 1e-3, and seeds are fixed so any alarm is reproducible). Power:
`test_detects_broken_acceptance` runs the same test against two deliberately wrong acceptance rules
(correction drawn from p instead of the residual max(p - Q, 0); acceptance ratio ignoring the stored Q)
and requires p < 1e-6 for both (measured: about 1e-30 and 1e-25), so this suite would catch them.
Batched requests (Engine.generate_batch) are tested the same way, plus a G-test of independence between
requests decoded side by side.
The engines use their default epilogue (the compiled one where it is built, which reproduces the torch
reference bit for bit, tests/test_epilogue.py); the broken rules are patched into the torch epilogue.
"""
import itertools
import math

import numpy as np
import pytest
import torch
from scipy.stats import chi2, chi2_contingency
from tiny_models import checkpoint, hf_model

import packed_ss
import packed_ss.decode.epilogue.reference as torch_epilogue
from packed_ss.decode.acceptance import verify_sampled
from packed_ss.decode.sampling import SamplingParams, densify, inverse_cdf, truncated_probs

VOCAB, LENGTH, N = 4, 3, 1500
PROMPT = [1, 0, 2]
T1, TOP_K, TOP_P = SamplingParams(1.0), SamplingParams(0.7, top_k=3), SamplingParams(1.3, top_p=0.8)
CASES = [("ar", 1, T1), ("linear", 2, T1), ("linear", 3, TOP_P), ("quadratic", 2, T1), ("quadratic", 3, TOP_K),
         ("packed", 2, T1), ("packed", 3, TOP_K), ("packed", 4, TOP_P)]
ALPHA = 1e-4


@pytest.fixture(scope="module")
def path():
    # std 0.4: no 3-token outcome above 0.3 probability and 24 of 64 expected >= 5 times, with drafter
    # and target far enough apart that broken rules shift the distribution visibly.
    return checkpoint("llama-gqa", vocab_size=VOCAB, std=0.4, seed=3)


def exact_distribution(path, params: SamplingParams) -> dict[tuple, float]:
    model = hf_model(path)
    probs = {}
    for seq in itertools.product(range(VOCAB), repeat=LENGTH):
        with torch.no_grad():
            logits = model(torch.tensor([PROMPT + list(seq[:-1])])).logits[0, len(PROMPT) - 1:]
        p = densify(*truncated_probs(logits, params), VOCAB)
        probs[seq] = math.prod(float(p[i, t]) for i, t in enumerate(seq))
    return probs


def g_test_pvalue(samples: list[tuple], exact: dict[tuple, float]) -> float:
    counts = {k: 0 for k in exact}
    for s in samples:
        counts[s] += 1
    n = len(samples)
    bins, pooled_obs, pooled_exp = [], 0, 0.0
    for k, p in exact.items():
        if p * n >= 5:
            bins.append((counts[k], p * n))
        else:
            pooled_obs, pooled_exp = pooled_obs + counts[k], pooled_exp + p * n
    if pooled_exp > 0:
        bins.append((pooled_obs, pooled_exp))
    g = 2 * sum(o * math.log(o / e) for o, e in bins if o > 0)
    return float(chi2.sf(g, len(bins) - 1))


def sample(path, schedule: str, width: int, params: SamplingParams, epilogue=None) -> list[tuple]:
    engine = packed_ss.Engine(packed_ss.load_model(path, dtype=torch.float64), schedule=schedule, width=width,
                              epilogue=epilogue)
    return [tuple(engine.generate(PROMPT, max_new_tokens=LENGTH, temperature=params.temperature,
                                  top_k=params.top_k, top_p=params.top_p, seed=seed, eos_token_id=[]).tokens)
            for seed in range(N)]


@pytest.mark.parametrize("schedule,width,params", CASES,
                         ids=[f"{s}-W{w}-T{p.temperature}-k{p.top_k}-p{p.top_p}" for s, w, p in CASES])
def test_first_tokens_follow_ar_distribution(path, schedule, width, params):
    p_value = g_test_pvalue(sample(path, schedule, width, params), exact_distribution(path, params))
    assert p_value > ALPHA, p_value


def sample_batched(path, schedule: str, width: int, params: SamplingParams, seeds) -> list[tuple]:
    """N requests through generate_batch, 16 at a time (continuous batching), request i with seed seeds[i]."""
    engine = packed_ss.Engine(packed_ss.load_model(path, dtype=torch.float64), schedule=schedule, width=width)
    seeds = list(seeds)
    results = engine.generate_batch([PROMPT] * len(seeds), max_new_tokens=LENGTH, temperature=params.temperature,
                                    top_k=params.top_k, top_p=params.top_p, seed=seeds, eos_token_id=[],
                                    batch_size=16)
    return [tuple(r.tokens) for r in results]


BATCHED = [("packed", 3, TOP_K), ("linear", 2, T1)]


@pytest.mark.parametrize("schedule,width,params", BATCHED, ids=[f"{s}-W{w}" for s, w, _ in BATCHED])
def test_batched_requests_follow_ar_distribution(path, schedule, width, params):
    """Requests decoded 16 at a time: each one's tokens still follow the AR distribution (measured p: packed
    0.87, linear 0.08; by hand, the residual-from-p rule decoded in batches gives p = 5e-42)."""
    p_value = g_test_pvalue(sample_batched(path, schedule, width, params, range(N)), exact_distribution(path, params))
    assert p_value > ALPHA, p_value


def independence_pvalue(samples: list[tuple]) -> float:
    """G-test of independence between the first tokens of requests 2j and 2j+1 (decoded side by side)."""
    table = np.ones((VOCAB, VOCAB))      # +1 per cell: no empty row or column
    for a, b in zip(samples[::2], samples[1::2]):
        table[a[0], b[0]] += 1
    return float(chi2_contingency(table, lambda_="log-likelihood").pvalue)


def test_requests_in_a_batch_are_independent(path):
    """Neighbours in a batch draw independent tokens (p > ALPHA); the same test on pairs that share a seed,
    as a rule keyed by batch position instead of each request's own seed would make them, finds the
    dependence (p < 1e-6): the test has the power to see it."""
    assert independence_pvalue(sample_batched(path, "packed", 3, T1, range(N))) > ALPHA
    shared = sample_batched(path, "packed", 3, T1, [i // 2 for i in range(N)])
    assert independence_pvalue(shared) < 1e-6


def residual_from_p(draft, draft_len, q_idx, q_prob, p, u):
    """Broken: after a rejection, draw the correction from p instead of max(p - Q, 0)."""
    emitted, n_accept = verify_sampled(draft, draft_len, q_idx, q_prob, p, u)
    h = n_accept - 1
    c = inverse_cdf(p[h], u[draft.shape[0]])
    return torch.where(torch.arange(emitted.numel()) == h, c, emitted), n_accept


def ignore_stored_q(draft, draft_len, q_idx, q_prob, p, u):
    """Broken: accept d with probability p(d), as if Q were a point mass."""
    return verify_sampled(draft, draft_len, q_idx, torch.ones_like(q_prob), p, u)


@pytest.mark.parametrize("broken", [residual_from_p, ignore_stored_q])
def test_detects_broken_acceptance(path, monkeypatch, broken):
    monkeypatch.setattr(torch_epilogue, "verify_sampled", broken)
    params = T1
    p_value = g_test_pvalue(sample(path, "packed", 2, params, epilogue="torch"), exact_distribution(path, params))
    assert p_value < 1e-6, p_value
