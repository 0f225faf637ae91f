"""Sampled output of every schedule follows the AR distribution exactly (paper Theorem 3.3).

Whole sequences of W + 2 tokens (W = 1: 3, W = 2: 4) on a 5-token vocabulary, N = 1500 seeded
generations per case, against the exact law of every sequence from transformers' float64 logits
(tests/sampling_law.py: method, thresholds, the bonus-frequency requirement). Every schedule, verifying its
diffusion drafts (lookup drafts: tests/test_lookup_sampling.py), with plain temperature, top-k and top-p;
requests decoded alone and 16 at a time. Power: each broken rule below is patched into the torch epilogue (the engines otherwise use their default, the compiled epilogue where it is
built, which reproduces the torch one bit for bit: tests/test_epilogue.py) and must be flagged at p < 1e-6.
"""
import numpy as np
import pytest
import torch
from sampling_law import (
    ALPHA,
    N,
    POWER,
    T1,
    TOP_K,
    TOP_P,
    VERIFY_RULES,
    VOCAB,
    ar_checkpoint,
    ar_law,
    bonus_from_q,
    bonus_from_residual,
    case_id,
    diffusion_drafts,
    draw,
    draw_batched,
    follows,
    g_test_pvalue,
    ignore_stored_q,
    length_for,
    residual_from_p,
)
from scipy.stats import chi2_contingency

import packed_ss.decode.epilogue.reference as torch_epilogue
from packed_ss.decode.epilogue import TorchEpilogue
from packed_ss.decode.sampling import Sampling
from packed_ss.decode.schedules.packed import Packed

CASES = [("ar", 1, T1), ("ar", 2, TOP_P)] + [(s, w, p) for s in ("linear", "quadratic", "packed")
                                             for w, p in ((1, T1), (2, TOP_K), (2, TOP_P))]


@pytest.fixture(scope="module")
def path():
    return ar_checkpoint()


@pytest.mark.parametrize("schedule,width,params", CASES, ids=[case_id(*c) for c in CASES])
def test_sequences_follow_ar_distribution(path, schedule, width, params):
    draws = draw(path, schedule, width, params, drafts=diffusion_drafts(schedule))
    assert follows(draws, ar_law(path, params, length_for(width)), bonus=schedule != "ar") > ALPHA


# (rule, schedule, width, params): each rule on two of the speculative schedules, at plain temperature or truncated.
# The p-values measured (seeds 0..1499) are in the comments. The power depends on the setting: ignoring the stored
# Q gave p = 3e-3 at packed W = 2, T = 1 and 5e-6 at quadratic W = 1, top-p (this drafter is close to the target
# there), the residual drawn from p 3e-6 at linear W = 2, T = 1; the cases below are those the test resolves.
BROKEN = [
    (residual_from_p, "linear", 2, TOP_K),         # 1e-29
    (residual_from_p, "linear", 1, TOP_K),         # 2e-9
    (ignore_stored_q, "packed", 2, TOP_K),         # < 1e-300
    (ignore_stored_q, "quadratic", 1, TOP_K),      # < 1e-300
    (bonus_from_residual, "packed", 2, T1),        # 3e-92
    (bonus_from_residual, "quadratic", 1, TOP_P),  # 3e-134
    (bonus_from_q, "linear", 1, T1),               # 5e-44
    (bonus_from_q, "packed", 2, TOP_K),            # < 1e-300
]


@pytest.mark.parametrize("broken,schedule,width,params", BROKEN,
                         ids=[f"{b.__name__}-{case_id(s, w, p)}" for b, s, w, p in BROKEN])
def test_detects_broken_acceptance(path, monkeypatch, broken, schedule, width, params):
    monkeypatch.setattr(torch_epilogue, "verify_sampled", broken)
    draws = draw(path, schedule, width, params, epilogue="torch", drafts=diffusion_drafts(schedule))
    p_value = g_test_pvalue(draws.samples, ar_law(path, params, length_for(width)))
    print(f"{broken.__name__}: p = {p_value:.1e}")
    assert p_value < POWER, p_value


def target_untruncated(self, st, logits):
    """Broken Packed.update: top-k / top-p applied to the drafter's proposals only, the verifier's p untruncated."""
    b = self.block
    untruncated = Sampling(st.temperature, torch.zeros_like(st.top_k), torch.ones_like(st.top_p))
    target = TorchEpilogue(self.device, self.width, True).rows(logits[:, :b], untruncated)
    self.epilogue.step(st, verify=target, propose=self.epilogue.rows(logits, st.sampling)[b + 1:], retain="a")


@pytest.mark.parametrize("params", [TOP_K, TOP_P], ids=["top-k", "top-p"])
def test_detects_truncation_missing_from_the_target(path, monkeypatch, params):
    """Measured: p < 1e-300 for both: the target puts mass on tokens truncation removes."""
    monkeypatch.setattr(Packed, "update", target_untruncated)
    p_value = g_test_pvalue(draw(path, "packed", 2, params, epilogue="torch").samples, ar_law(path, params, 4))
    print(f"target_untruncated: p = {p_value:.1e}")
    assert p_value < POWER, p_value


def test_every_rule_is_tried():
    assert {b for b, *_ in BROKEN} == set(VERIFY_RULES)
    assert {s for _, s, *_ in BROKEN} == {"linear", "quadratic", "packed"}


# -- batched requests ----------------------------------------------------------------------------------------------
BATCHED = [("packed", 2, TOP_K), ("linear", 1, T1), ("quadratic", 2, T1)]


@pytest.mark.parametrize("schedule,width,params", BATCHED, ids=[case_id(*c) for c in BATCHED])
def test_batched_requests_follow_ar_distribution(path, schedule, width, params):
    draws = draw_batched(path, schedule, width, params, drafts=diffusion_drafts(schedule))
    assert follows(draws, ar_law(path, params, length_for(width))) > ALPHA


def test_batched_detects_broken_bonus(path, monkeypatch):
    """Measured: p = 3e-92 for the bonus drawn from the residual in batched packed decoding (the samples of the
    requests decoded alone: a batched output equals its request alone, tests/test_batch.py)."""
    monkeypatch.setattr(torch_epilogue, "verify_sampled", bonus_from_residual)
    p_value = g_test_pvalue(draw_batched(path, "packed", 2, T1, epilogue="torch").samples, ar_law(path, T1, 4))
    print(f"bonus_from_residual, batched: p = {p_value:.1e}")
    assert p_value < POWER, p_value


def independence_pvalue(samples: list[tuple]) -> float:
    """G-test of independence between the second tokens of requests 2j and 2j+1, decoded side by side: the second
    token is the first one a batched step draws (the prefill, which draws the first, runs alone)."""
    table = np.ones((VOCAB, VOCAB))      # +1 per cell: no empty row or column
    for a, b in zip(samples[::2], samples[1::2]):
        table[a[1], b[1]] += 1
    return float(chi2_contingency(table, lambda_="log-likelihood").pvalue)


def neighbours_share_uniforms(self, st):
    """Broken: after its prefill, request 2j and request 2j+1 draw with one key (seed // 2), as a step that keyed
    its random numbers by position in the batch would: each request alone still follows the AR law (its draws
    stay independent of each other), but neighbours in a batch share their random numbers."""
    if not self.sampled:
        return None
    u = torch_epilogue.philox_uniform(torch.where(st.offset > 0, st.seed // 2, st.seed), st.offset, self.n_uniform)
    st.offset.add_(1)
    return u


def test_requests_in_a_batch_are_independent(path, monkeypatch):
    """Neighbours' batched draws are independent (p > ALPHA), 3000 requests; with shared random numbers each
    request still follows the AR law, and only the independence test sees it (measured p = 1e-19; 7e-7
    with 1500 requests)."""
    seeds = range(2 * N)
    assert independence_pvalue(draw_batched(path, "packed", 1, T1, seeds).samples) > ALPHA
    monkeypatch.setattr(torch_epilogue.TorchEpilogue, "_uniforms", neighbours_share_uniforms)
    shared = draw_batched(path, "packed", 1, T1, seeds, epilogue="torch")
    assert g_test_pvalue(shared.samples, ar_law(path, T1, 3)) > ALPHA
    p_value = independence_pvalue(shared.samples)
    print(f"neighbours_share_uniforms: p = {p_value:.1e}")
    assert p_value < POWER, p_value
