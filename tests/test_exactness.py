"""Greedy exactness: every schedule at every width reproduces transformers' own greedy generate."""
import pytest
import torch
from tiny_models import CONFIGS, checkpoint, hf_greedy

import packed_ss

SCHEDULES = ["ar", "linear", "quadratic", "packed"]
WIDTHS = [1, 2, 4, 8, 16]
PROMPTS = [[5], [3, 17, 42, 8, 9], [int(t) for t in torch.randint(0, 90, (23,), generator=torch.Generator().manual_seed(1))]]
MAX_NEW = 48


@pytest.fixture(scope="module", params=list(CONFIGS))
def case(request):
    path = checkpoint(request.param)
    model = packed_ss.load_model(path, dtype=torch.float64)
    refs = [hf_greedy(path, p, MAX_NEW, eos_token_id=None) for p in PROMPTS]
    return path, model, refs


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_greedy_matches_transformers(case, schedule):
    path, model, refs = case
    for width in WIDTHS:
        engine = packed_ss.Engine(model, schedule=schedule, width=width)
        for prompt, ref in zip(PROMPTS, refs):
            res = engine.generate(prompt, max_new_tokens=MAX_NEW, eos_token_id=[])
            assert res.tokens == ref, (schedule, width, prompt)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_eos_and_length_cap_match_transformers(case, schedule):
    """Stop at an EOS chosen inside the greedy run (HF stops there too); caps of 1, 7 and 30 tokens."""
    path, model, refs = case
    prompt, ref = PROMPTS[1], refs[1]
    eos = ref[11]
    expected = hf_greedy(path, prompt, MAX_NEW, eos_token_id=eos)
    assert expected[-1] == eos and len(expected) <= 12
    for width in (1, 4, 16):
        engine = packed_ss.Engine(model, schedule=schedule, width=width)
        assert engine.generate(prompt, max_new_tokens=MAX_NEW, eos_token_id=eos).tokens == expected
        for cap in (1, 7, 30):
            res = engine.generate(prompt, max_new_tokens=cap, eos_token_id=[])
            assert res.tokens == ref[:cap], (width, cap)
