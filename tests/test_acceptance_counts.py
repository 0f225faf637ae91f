"""Acceptance per draft position (`GenerateResult.accepted_at`, the server's `..._per_pos` counter): how many
verifications accepted draft token k. Checked against an observer of every verification in the torch epilogue
(the tokens it accepted), against the torch epilogue from the native one, alone against batched, and for
any-order models against the decoder's own trace."""
import pytest
import torch
from tiny_models import checkpoint

import packed_ss
from packed_ss.decode.epilogue.reference import TorchEpilogue
from packed_ss.model.loading import default_model_path

PROMPTS = [[3, 17, 42, 8, 9], [5, 6, 7], [11, 12, 13, 14, 15, 16, 17]]
SAMPLINGS = [dict(), dict(temperature=1.0, seed=5)]


@pytest.fixture(scope="module")
def model():
    return packed_ss.load_model(checkpoint("llama-gqa"), dtype=torch.float32)


def histogram(accepted: list[int], width: int) -> list[int]:
    """Per position k: the verifications that accepted more than k draft tokens."""
    return [sum(a > k for a in accepted) for k in range(width)]


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["greedy", "T1"])
@pytest.mark.parametrize("schedule", ["linear", "quadratic", "packed"])
def test_accepted_at_counts_each_verification(model, monkeypatch, schedule, sampling):
    """The tokens each verification accepted, seen inside the torch epilogue, give accepted_at per request."""
    seen = {}
    emit = TorchEpilogue._emit

    def observed(self, st, emitted, n_accept, verified):
        active = ~st.done
        a, act = emit(self, st, emitted, n_accept, verified)
        if verified:
            for b, (on, n) in enumerate(zip(active.tolist(), a.tolist())):
                if on:
                    seen.setdefault(b, []).append(max(n - 1, 0))
        return a, act

    monkeypatch.setattr(TorchEpilogue, "_emit", observed)
    width = 4
    engine = packed_ss.Engine(model, schedule=schedule, width=width, epilogue="torch")
    deepest = 0
    for prompt in PROMPTS:
        seen.clear()
        res = engine.generate(prompt, max_new_tokens=40, eos_token_id=[], **sampling)
        assert res.n_verify == len(seen[0]) and res.n_accepted == sum(seen[0])
        assert res.accepted_at == histogram(seen[0], width), (res.accepted_at, seen[0])
        deepest = max([deepest] + [k + 1 for k, n in enumerate(res.accepted_at) if n])
    assert deepest >= 2      # not vacuous: drafts were accepted, some beyond the first position


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["greedy", "T1"])
def test_accepted_at_native_batched_and_alone_agree(model, sampling):
    if not packed_ss.decode.epilogue.native_available("cpu"):
        pytest.skip("native epilogue not built")
    kw = dict(max_new_tokens=40, eos_token_id=[], **sampling)
    alone = [packed_ss.Engine(model, "packed", width=3, epilogue="torch").generate(
        p, **dict(kw, seed=kw["seed"] + i) if "seed" in kw else kw) for i, p in enumerate(PROMPTS)]
    batched = packed_ss.Engine(model, "packed", width=3, epilogue="native").generate_batch(PROMPTS, **kw)
    for a, b in zip(alone, batched):
        assert b.tokens == a.tokens and b.accepted_at == a.accepted_at
        assert sum(a.accepted_at) == a.n_accepted and a.accepted_at == sorted(a.accepted_at, reverse=True)


def test_ar_accepts_nothing(model):
    res = packed_ss.Engine(model, schedule="ar", width=3).generate(PROMPTS[0], max_new_tokens=8)
    assert res.n_verify == 0 and res.accepted_at == [0, 0, 0]


@pytest.mark.parametrize("schedule", ["linear", "packed"])
def test_any_order_accepted_at_matches_its_trace(schedule):
    """An any-order decoder's trace records the drafts each iteration accepted (held iterations included)."""
    model = packed_ss.load_model(default_model_path("any-order"), dtype=torch.float32)
    engine = packed_ss.Engine(model, schedule=schedule, width=4)
    res = engine.generate([3, 17, 42, 8, 9], max_new_tokens=40, eos_token_id=[])
    accepted = [it.drafts_accepted for it in res.iterations]
    assert res.accepted_at == histogram(accepted, 4) and sum(res.accepted_at) == res.n_accepted
    assert res.accepted_at[0] > 0
