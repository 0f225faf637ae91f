"""The drafting adapters the shipped models carry in `drafter/`: loaded with their acceptance profile, they
change the drafts, never the output:
greedy output with the adapter equals the output without it, for every left-to-right schedule and order
(the golden cases pin the models without it; test_default_model checks the adapted default model against
transformers). A confidence order ranks positions by the drafts' own confidence, so there the output is
the serial reference's for the run's own orders (Proposition C.1), computed by the base model."""
import pytest
import torch

import packed_ss
from packed_ss.decode.any_order import serial_reference
from packed_ss.decode.registry import schedules
from packed_ss.lab.humaneval import tokenized_prompts

MAX_NEW = 48


@pytest.fixture(scope="module", params=["default", "any-order"])
def pair(request):
    path = packed_ss.default_model_path(request.param)
    adapted = packed_ss.load_model(path, dtype=torch.float64, draft_adapter=path / "drafter")
    base = packed_ss.load_model(path, dtype=torch.float64, draft_adapter=None)
    prompts = [ids for _, ids in tokenized_prompts(packed_ss.load_tokenizer(path), 3)]
    return adapted, base, prompts


def test_the_shipped_adapter_is_attached(pair):
    adapted, base, _ = pair
    assert adapted.model.layers[0].mlp.down_proj.lora is not None
    assert base.model.layers[0].mlp.down_proj.lora is None
    assert adapted.draft_profile is not None and adapted.draft_profile != base.draft_profile


def cases(model):
    """(schedule, order, drafts): every drafting schedule with its default drafts and, left to right, the diffusion
    schedules with the adapter's drafts alone (under the default "both", lookup drafts stand in nearly everywhere)."""
    if not model.cfg.any_order:
        return ([(s, None, None) for s in schedules() if s != "ar"]
                + [(s, None, "diffusion") for s in ("linear", "quadratic", "packed")])
    return [(s, o, None) for s in schedules(any_order=True) if s not in ("ar", "threshold") for o in ("ltr", "confidence")]


@pytest.mark.parametrize("width", [3, 8])
def test_greedy_output_unchanged_by_the_adapter(pair, width):
    adapted, base, prompts = pair
    accepted = {True: [], False: []}
    for schedule, order, drafts in cases(adapted):
        for ids in prompts:
            a, b = (packed_ss.Engine(model, schedule, width=width, order=order, drafts=drafts).generate(
                ids, MAX_NEW, eos_token_id=[]) for model in (adapted, base))
            if order == "confidence":
                assert a.tokens == serial_reference(base, ids, a.iterations, MAX_NEW, []), schedule
            else:
                assert a.tokens == b.tokens, (schedule, order)
            accepted[True].append(a.n_accepted)
            accepted[False].append(b.n_accepted)
    assert accepted[True] != accepted[False], "the adapter must be live: it changes which drafts are accepted"
