"""Sampled any-order decoding in LTR order follows the model's AR distribution exactly.

Same method and threshold as tests/test_sampling_exactness.py (whose G-test and broken rules this
reuses): on a 4-token vocabulary, the exact probability of every 3-token continuation comes from
transformers' logits at a mask appended after the text (the any-order model's LTR conditional),
N = 1500 seeded generations per case (the same prompt, length and sampler settings), fail below p = 1e-4; the two broken acceptance rules patched
into the any-order schedules must be flagged at p < 1e-6 (measured 3e-8 and 1e-15).
"""
import itertools

import pytest
import torch
from test_sampling_exactness import (
    ALPHA,
    LENGTH,
    PROMPT,
    T1,
    TOP_K,
    TOP_P,
    VOCAB,
    g_test_pvalue,
    ignore_stored_q,
    residual_from_p,
    sample,
)
from tiny_models import checkpoint, hf_model

import packed_ss
import packed_ss.decode.any_order.schedules.base as any_order_schedules
from packed_ss.decode.sampling import SamplingParams, densify, truncated_probs

CASES = [("ar", 1, T1), ("linear", 2, TOP_P), ("quadratic", 2, TOP_K), ("packed", 2, T1), ("packed", 3, TOP_K)]


@pytest.fixture(scope="module")
def path():
    # std 0.45, seed 5: no outcome above 0.21 probability, and the drafter far enough from the target
    # that both broken rules are flagged (picked among 7 random checkpoints for that power).
    return checkpoint("qwen3-qknorm", vocab_size=VOCAB, std=0.45, seed=5, any_order=True)


def exact_distribution(path, params: SamplingParams) -> dict[tuple, float]:
    model, mask = hf_model(path), VOCAB - 1
    probs = {}
    for seq in itertools.product(range(VOCAB), repeat=LENGTH):
        p = 1.0
        for i, t in enumerate(seq):
            with torch.no_grad():
                logits = model(torch.tensor([PROMPT + list(seq[:i]) + [mask]])).logits[0, -1]
            p *= float(densify(*truncated_probs(logits, params), VOCAB)[t])
        probs[seq] = p
    return probs


@pytest.mark.parametrize("schedule,width,params", CASES,
                         ids=[f"{s}-W{w}-T{p.temperature}-k{p.top_k}-p{p.top_p}" for s, w, p in CASES])
def test_ltr_sampling_follows_ar_distribution(path, schedule, width, params):
    p_value = g_test_pvalue(sample(path, schedule, width, params), exact_distribution(path, params))
    assert p_value > ALPHA, p_value


@pytest.mark.parametrize("broken", [residual_from_p, ignore_stored_q])
def test_detects_broken_acceptance(path, monkeypatch, broken):
    monkeypatch.setattr(any_order_schedules, "verify_sampled", broken)
    p_value = g_test_pvalue(sample(path, "packed", 2, T1), exact_distribution(path, T1))
    assert p_value < 1e-6, p_value


def test_sampling_is_seeded_and_refused_where_inexact(path):
    model = packed_ss.load_model(path, dtype=torch.float64)
    engine = packed_ss.Engine(model, "packed", width=3)
    runs = [engine.generate(PROMPT, 12, temperature=1.0, seed=7, eos_token_id=[]).tokens for _ in range(2)]
    assert runs[0] == runs[1] and len(runs[0]) == 12
    for schedule, order in (("packed", "confidence"), ("native", None)):
        with pytest.raises(ValueError, match="temperature"):
            packed_ss.Engine(model, schedule, width=3, order=order).generate(PROMPT, 4, temperature=1.0)
