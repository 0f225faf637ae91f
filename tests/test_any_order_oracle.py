"""The confidence order and the native threshold decoder against plain-Python oracles (tests/any_order_oracle.py).

The serial reference of Proposition C.1 (test_any_order.py) replays the orders the engine chose; here the
oracles choose them: which positions each iteration verifies, in which order, how many it must accept, and
what the threshold decoder commits, all recomputed from the model's own predictions. Compared token for token
and iteration for iteration on the shipped any-order model (with its drafting adapter and without) and on
random tiny models. Power: an order rule that ranks by increasing score, or a threshold decoder that commits
only the most confident position, diverges from its oracle (checked below).
"""
import pytest
import torch
from any_order_oracle import speculative, threshold
from tiny_models import checkpoint

import packed_ss.decode.any_order.schedules.base as schedule_base
from packed_ss import Engine, default_model_path, load_model, load_tokenizer
from packed_ss.decode.any_order.schedules.threshold import Threshold

PROMPTS = {"shipped": ["def fibonacci(n):", "import os\n\ndef list_files(path):\n    "],
           "random": [[5, 17, 33, 2, 8], [60, 3]]}


def _model(kind: str):
    if kind == "random":
        return load_model(checkpoint("qwen3-qknorm", any_order=True, std=0.5, seed=2), dtype=torch.float64), \
            PROMPTS["random"]
    path = default_model_path("any-order")
    tok = load_tokenizer(path)
    adapter = {"shipped": "auto", "shipped-base": None}[kind]
    return load_model(path, dtype=torch.float64, draft_adapter=adapter), [tok.encode(t).ids for t in PROMPTS["shipped"]]


@pytest.fixture(scope="module", params=["shipped", "shipped-base", "random"])
def model(request):
    return _model(request.param)


def engine_trace(out):
    return [(it.order, it.accepted) for it in out.iterations]


@pytest.mark.parametrize("schedule", ["packed", "quadratic", "linear"])
@pytest.mark.parametrize("order,width", [("confidence", 4), ("confidence", 8), ("ltr", 4)])
def test_order_and_acceptance_match_the_oracle(model, schedule, order, width):
    model, prompts = model
    reordered = 0
    for prompt in prompts:
        out = Engine(model, schedule, width=width, order=order).generate(prompt, 24, eos_token_id=[])
        tokens, trace = speculative(model, schedule, prompt, width, 24, order)
        assert out.tokens == tokens
        assert engine_trace(out) == trace
        reordered += sum(pi != sorted(pi) for pi, _ in trace)
    if order == "confidence" and width == 8:
        assert reordered > 0, "no iteration verified out of textual order: the order rule was not exercised"


@pytest.mark.parametrize("level", [0.9, 0.2])
def test_native_decoder_matches_the_oracle(model, monkeypatch, level):
    monkeypatch.setattr(Threshold, "threshold", level)
    model, prompts = model
    several = 0
    for prompt in prompts:
        out = Engine(model, "threshold", width=8).generate(prompt, 24, eos_token_id=[])
        tokens, committed = threshold(model, prompt, 8, 24, level)
        assert out.tokens == tokens
        assert [it.order for it in out.iterations] == committed
        several += sum(len(c) > 1 for c in committed)
    if level < 0.9:
        assert several > 0, "no call committed more than one position: the threshold was not exercised"


def test_oracles_see_broken_rules(monkeypatch):
    """The comparisons have power on the shipped model: ranking by increasing draft score changes the trace of
    the confidence order, and a threshold decoder that commits only the most confident position (its threshold
    out of reach) changes the trace of the oracle at threshold 0.2."""
    model, prompts = _model("shipped")
    plan = schedule_base.plan

    def increasing(st, order, active):
        st.draft_score.neg_()
        plan(st, order, active)
        st.draft_score.neg_()
    monkeypatch.setattr(schedule_base, "plan", increasing)
    out = Engine(model, "packed", width=8, order="confidence").generate(prompts[0], 24, eos_token_id=[])
    assert engine_trace(out) != speculative(model, "packed", prompts[0], 8, 24, "confidence")[1]
    monkeypatch.undo()
    monkeypatch.setattr(Threshold, "threshold", 1.1)
    out = Engine(model, "threshold", width=8).generate(prompts[0], 24, eos_token_id=[])
    assert [it.order for it in out.iterations] != threshold(model, prompts[0], 8, 24, 0.2)[1]
