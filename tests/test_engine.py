"""Engine behaviour: NFE accounting, input validation, state isolation between calls, compiled steps."""
import pytest
import torch
from tiny_models import checkpoint, config_eos, mid_output_token

import packed_ss

PROMPT = [3, 17, 42, 8, 9]


@pytest.fixture(scope="module")
def model():
    return packed_ss.load_model(checkpoint("llama-gqa"), dtype=torch.float32)


@pytest.mark.parametrize("schedule", ["ar", "linear", "quadratic", "packed"])
def test_nfe_counts_every_forward_pass(model, schedule):
    """Prefill counts once; packed and quadratic then use one call per iteration, linear two, ar one per token."""
    engine = packed_ss.Engine(model, schedule=schedule, width=4)
    calls = []
    model.register_forward_hook(lambda *_: calls.append(1))
    res = engine.generate(PROMPT, max_new_tokens=40, eos_token_id=[])
    model._forward_hooks.clear()
    assert res.nfe == len(calls)
    if schedule == "ar":
        assert res.nfe == len(res.tokens) == 40
    elif schedule == "linear":
        assert res.nfe == 1 + 2 * res.n_verify - 1     # no draft call after the final verification
    else:
        assert res.nfe == 1 + res.n_verify
    if schedule != "ar":
        assert len(res.tokens) == 1 + res.n_verify + res.n_accepted
    assert 0 <= res.model_s <= res.wall_s


@pytest.mark.parametrize("kwargs,message", [
    (dict(prompt_ids=[]), "prompt_ids must contain at least one token"),
    (dict(prompt_ids=[5, 97]), r"token ids in \[0, 97\)"),
    (dict(max_new_tokens=0), "max_new_tokens must be an integer >= 1"),
    (dict(max_new_tokens=600), "exceeds the engine's max_seq_len 512"),
    (dict(temperature=-0.5), "temperature must be a finite number >= 0"),
    (dict(temperature=float("nan")), "temperature must be a finite number >= 0"),
    (dict(temperature=1.0, top_p=0.0), r"top_p must be in \(0, 1\]"),
    (dict(temperature=1.0, top_p=1.5), r"top_p must be in \(0, 1\]"),
    (dict(temperature=1.0, top_k=0), "top_k must be an integer >= 1"),
    (dict(seed=-1), "seed must be an integer"),
    (dict(stop_token_ids=[1000]), "stop token id must be an integer"),
])
def test_bad_generate_arguments_raise_value_error(model, kwargs, message):
    engine = packed_ss.Engine(model, schedule="packed", width=4)
    args = dict(prompt_ids=PROMPT, max_new_tokens=8) | kwargs
    with pytest.raises(ValueError, match=message):
        engine.generate(**args)


@pytest.mark.parametrize("kwargs,message", [
    (dict(schedule="beam"), "schedule must be one of"),
    (dict(width=0), r"width must be an integer \[1, 64\]"),
    (dict(width=65), r"width must be an integer \[1, 64\]"),
    (dict(backend="cuda-magic"), "backend must be one of"),
])
def test_bad_engine_arguments_raise_value_error(model, kwargs, message):
    with pytest.raises(ValueError, match=message):
        packed_ss.Engine(model, **({"schedule": "packed"} | kwargs))


@pytest.mark.parametrize("schedule", ["linear", "quadratic", "packed"])
def test_engine_reuse_leaks_no_state(model, schedule):
    """Same seed, same result, whatever ran before on the same engine (longer prompts, other settings)."""
    engine = packed_ss.Engine(model, schedule=schedule, width=3)
    sampled = dict(max_new_tokens=24, temperature=1.0, top_k=20, seed=7, eos_token_id=[])
    first = engine.generate(PROMPT, **sampled).tokens
    greedy = engine.generate(PROMPT, max_new_tokens=24, eos_token_id=[]).tokens
    engine.generate(list(range(60)), max_new_tokens=100, temperature=0.8, seed=1)
    assert engine.generate(PROMPT, **sampled).tokens == first
    assert engine.generate(PROMPT, max_new_tokens=24, eos_token_id=[]).tokens == greedy
    assert engine.generate(PROMPT, **(sampled | {"seed": 8})).tokens != first


def test_stop_token_ids_and_default_eos(model, monkeypatch):
    engine = packed_ss.Engine(model, schedule="packed", width=4)
    ref = engine.generate(PROMPT, max_new_tokens=30, eos_token_id=[]).tokens
    stop = mid_output_token(ref)
    cut = ref[: ref.index(stop) + 1]
    assert len(cut) < len(ref)
    assert engine.generate(PROMPT, max_new_tokens=30, eos_token_id=[], stop_token_ids=[stop]).tokens == cut
    config_eos(monkeypatch, model, stop)
    assert engine.generate(PROMPT, max_new_tokens=30).tokens == cut      # the config's EOS by default


@pytest.mark.parametrize("schedule,temperature,backend", [
    ("ar", 0.0, "aot_eager"), ("linear", 0.0, "aot_eager"), ("linear", 1.0, "aot_eager"),
    ("quadratic", 0.0, "aot_eager"), ("quadratic", 1.0, "aot_eager"), ("packed", 0.0, "aot_eager"),
    ("packed", 1.0, "inductor"),
])
def test_compiled_step_matches_eager(model, schedule, temperature, backend):
    """Each step compiles with fullgraph=True: no data-dependent host control flow inside an iteration.

    aot_eager traces and functionalises the whole step exactly as inductor does, minus code generation
    (about 20 s per step on 2 cores); one case runs the full inductor pipeline.
    """
    kwargs = dict(max_new_tokens=12, temperature=temperature, top_p=0.9 if temperature else None, seed=3,
                  eos_token_id=[])
    torch._dynamo.reset()   # every Engine compiles new closures of one code object: stay under the recompile limit
    eager = packed_ss.Engine(model, schedule=schedule, width=3).generate(PROMPT, **kwargs)
    compiled = packed_ss.Engine(model, schedule=schedule, width=3, compile=backend).generate(PROMPT, **kwargs)
    assert compiled.tokens == eager.tokens and compiled.nfe == eager.nfe
